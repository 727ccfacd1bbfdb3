"""What a PyTorch trainer needs on an Ascend NPU host: torch_npu's device variable, MindSpeed's adaptor and its
determinism switches, HCCL's deterministic collectives.

Facts from the frameworks' own code and documentation:

- MindSpeed-LLM's `pretrain_gpt.py` imports `from mindspeed_llm import megatron_adaptor` before any Megatron module
  ("MindSpeed patches must be applied before any Megatron modules"); a plain Megatron-LM `pretrain_gpt.py` runs on
  an NPU once MindSpeed's `mindspeed.megatron_adaptor` is imported first (MindSpeed's README).
- Deterministic computation: MindSpeed-LLM's `--use-deter-comp` (its `initialize_megatron` then calls
  `seed_all(args.seed)`) with `HCCL_DETERMINISTIC=True` in the environment; MindSpeed core's switch is
  `--npu-deterministic` (MindSpeed docs/features/npu_deterministic.md). `LCCL_DETERMINISTIC=1` makes the LCCL
  collectives deterministic too (MindSpeed-RL's deterministic-computation guide sets both).
- `ASCEND_RT_VISIBLE_DEVICES` is the NPU's `CUDA_VISIBLE_DEVICES`: the device ids the process may use, renumbered
  from 0 (CANN runtime).
"""

from __future__ import annotations

DEVICE_VARIABLE = {"ascend": "ASCEND_RT_VISIBLE_DEVICES", "cuda": "CUDA_VISIBLE_DEVICES"}
"""The variable that restricts a process to some of the host's accelerators, by host role."""

HCCL_DETERMINISM_ENV = {"HCCL_DETERMINISTIC": "true", "LCCL_DETERMINISTIC": "1"}
"""Deterministic collectives on an Ascend host (MindFormers and MindSpeed alike)."""

MINDSPEED_LLM_ADAPTOR = "mindspeed_llm.megatron_adaptor"
MINDSPEED_ADAPTOR = "mindspeed.megatron_adaptor"

_DETERMINISTIC_FLAG = {"mindspeed_llm": "--use-deter-comp", "mindspeed": "--npu-deterministic"}


def deterministic_flag(adaptor: str) -> str:
    """The determinism switch of the MindSpeed flavour whose adaptor is `adaptor` (`--use-deter-comp` for
    MindSpeed-LLM, `--npu-deterministic` for MindSpeed core)."""
    return _DETERMINISTIC_FLAG.get(adaptor.split(".")[0], "--use-deter-comp")


def adaptor_bootstrap(adaptor: str, entry: str) -> str:
    """A launcher script that imports `adaptor` and then runs `entry` as `__main__` (a plain Megatron-LM entry on an
    NPU host: the adaptor must patch Megatron before the entry imports it). Its argv is the entry's."""
    return (
        "# rendered by alignflow: MindSpeed patches Megatron before the entry imports it\n"
        "import importlib\nimport os\nimport runpy\nimport sys\n\n"
        f"importlib.import_module({adaptor!r})\n"
        f"ENTRY = {entry!r}\n"
        "sys.argv[0] = ENTRY\n"
        "sys.path.insert(0, os.path.dirname(ENTRY))\n"
        "runpy.run_path(ENTRY, run_name='__main__')\n"
    )
