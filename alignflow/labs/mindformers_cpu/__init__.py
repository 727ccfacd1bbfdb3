"""The MindFormers CPU lab: real MindFormers 2.1.0 training on a CPU host.

Why it lives in the package and not under tests/: the `mindformers` backend runs it as a module on a host
(`npu.entry: -m alignflow.labs.mindformers_cpu.launcher`) — it is what lets a CPU host play the Ascend host of an
experiment, in CI and on a laptop. A real Ascend host never needs it: there `run_mindformer.py` runs MindFormers
with its Ascend kernels and the real hyper_parallel.

What it changes, and nothing else (MindFormers' trainer, model code, data pipeline, checkpointing and logging run
as shipped):
- `kernels.install()`: CPU compositions of the MindSpore kernels that exist for Ascend only (and of `mint.split`,
  whose CPU backward is wrong), plus the CPU device for `Cell.to_empty`;
- `hyper_parallel_standin.install()`: the four hyper_parallel names one process uses, and `Tensor.backward`;
- `launcher`: `run_mindformer.py --mode 1` (absent from the wheel), with synchronous op launch (same numbers,
  much faster on few cores) and its interpreter first on PATH (MindFormers compiles its dataset helpers with
  `python3 -m pybind11`).
"""

REQUIRED_MINDFORMERS = "2.1.0"
