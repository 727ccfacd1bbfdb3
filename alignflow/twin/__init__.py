"""The twin: one small model in MindSpore (the "NPU" side) and in PyTorch (the "GPU" side).

The two sides reproduce the real frameworks' formats on purpose (docs/architecture.md#the-reference-twin), so that
alignflow's converter, log parsers, sentinels and comparison run on exactly what they meet in production:

- `mindspore_train` — `python -m alignflow.twin.mindspore_train --config X.yaml --mode 1`: a MindFormers
  PyNative YAML (`mindformers_yaml`), MindFormers parameter names and layouts (`ms_model`), PyNative
  checkpoints (`ms_checkpoint`) and G3 `LossCallback` log lines (`logformats`).
- `torch_train` — `python -m alignflow.twin.torch_train <Megatron flags>` (`megatron_flags`): megatron-core
  `GPTModel` names (`torch_model`, `flavours` for local / Transformer-Engine names and the MTP layer name per
  megatron-core version), legacy checkpoints loaded like Megatron (`torch_checkpoint`) and `training_log` lines.
- Shared: the model presets and checks (`presets`), the token data file and sample order (`data`), the
  learning-rate schedule (`schedule`), and the renderers of both command lines (`render`).

Importing this package imports neither MindSpore nor PyTorch.
"""
