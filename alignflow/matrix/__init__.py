"""Switch matrices (seed 004): a reference configuration and its variants, trained side by side, each compared with
its reference by the one criteria engine, in tables that read like the seed's.

```
memory.py   per-rank device memory from the frameworks' own lines (megatron `report_memory`, MindSpore statistics)
status.py   how a training ended: completed, OOM (both frameworks' messages), failed, exit code unknown
compare.py  the matrix comparison: rows per switch (OFF -> ON), verdicts per variant and for the matrix (pure)
report.py   the report: markdown and HTML tables, bar charts of ms/iter and memory, matrix.json
```

A matrix run — one child run per training, shared trainings reused by fingerprint, then this comparison — is the
runner's: `alignflow.runner.matrix`.
"""
