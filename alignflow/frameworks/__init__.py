"""What the real frameworks do and accept, as data read from their own source: megatron-core's facts per version
(`megatron_versions`), Megatron-LM's argument parser (`megatron_lm`, with its tables in `megatron_flags/`) and
msprobe's dump files (`dumpfile`).

A leaf of alignflow: the backends, preflight, the reference twin and diagnose all build on it, and it imports none
of them.
"""
