"""`alignflow diagnose`: below the curves — which tensor of which module diverges first, and which kind of bug.

```
run_diagnosis(experiment, checkpoints, data, transport, ...) -> Diagnosis     re-run one step, both sides, dumped
diagnose_dumps(npu_dump, gpu_dump, mapping, tolerance) -> Diagnosis           compare two dumps (pure)
measure_noise(experiment, ...) -> NoiseFloor                                  the reference side's self-noise
```
Import the submodules (`core`, `compare`, `noise`, `msprobe`, `report`): this package imports nothing heavy.
"""
