"""Reference-twin backend: the MindSpore twin plays the NPU side, the PyTorch twin the GPU side.

Their command lines mirror `run_mindformer.py --config X.yaml --mode 1` and `pretrain_gpt.py <flags>`, so the
rest of the pipeline (conversion, log parsing, sentinels, comparison) meets exactly the formats it meets in
production.
"""

from __future__ import annotations

from collections.abc import Sequence

from alignflow.backends.launch import layout_for, msrun, parallel_flags, torchrun
from alignflow.backends.megatron import pretrain_flags
from alignflow.backends.mindformers import set_dotted
from alignflow.backends.quoting import yaml_text
from alignflow.backends.template import CommandTemplate, TrainSpec
from alignflow.codeversion import code_version_for
from alignflow.config.experiment import Experiment
from alignflow.config.model import ModelConfig, TrainingConfig
from alignflow.convert.layout import megatron_checkpoint_layout
from alignflow.errors import ConfigError
from alignflow.twin.flavours import Flavour
from alignflow.twin.memory import MS_MEMORY_STATISTIC
from alignflow.twin.render import mindformers_config, twin_env

_CODE = ("twin", "config", "frameworks")  # the twin reads msprobe dumps and megatron-core facts from frameworks


def npu_command(experiment: Experiment, spec: TrainSpec) -> CommandTemplate:
    """`python -m alignflow.twin.mindspore_train --config {out}/config.yaml --mode 1`; with data-parallel ranks,
    under msrun (which runs `python <script>` with the `python` of the host's PATH, as it does run_mindformer.py:
    the script is a two-line launcher written into {out})."""
    layout = spec.layout or layout_for(experiment.parallel("npu"), None, side="npu")
    p = layout.parallel
    if (p.tp, p.pp, p.ep) != (1, 1, 1):
        raise ConfigError(f"npu layout tp {p.tp} x pp {p.pp} x ep {p.ep}: the MindSpore twin is data-parallel only "
                          "(MindSpore's CPU build compiles no sharded graph); set npu.parallel to dp only, or use "
                          "npu.kind mindformers")
    config = mindformers_config(
        experiment.model,
        experiment.training,
        data_path=spec.data,
        data_sha256=spec.data_sha256,
        load_path=spec.load,
        save_path=spec.save,
        steps=spec.steps,
        save_interval=experiment.training.save_interval or spec.steps,
    )
    for key, value in experiment.npu.overrides.items():  # the user's MindFormers keys last, as for MindFormers
        set_dotted(config, key, value)
    files = {"config.yaml": yaml_text(config)}
    required = ("All Network parameters are loaded.",) if spec.load else ()
    argv: tuple[str, ...] = ("{python}", "-m", "alignflow.twin.mindspore_train", "--config", "{out}/config.yaml",
                             "--mode", "1")
    log = "stdout"
    if layout.world > 1 or experiment.npu.msrun is not None:
        files[TWIN_MSRUN_SCRIPT] = "from alignflow.twin.mindspore_train import main\nraise SystemExit(main())\n"
        launched, log = msrun(layout, [f"{{out}}/{TWIN_MSRUN_SCRIPT}", *argv[3:]], experiment.npu.msrun)
        argv = tuple(launched)
    return CommandTemplate(
        argv=argv,
        log_format="mindformers",
        code_version=code_version_for(_CODE),
        files=files,
        # MindSpore prints its peak device memory at the end of a run with this set (the twin: its allocator model)
        env={MS_MEMORY_STATISTIC: "1", **experiment.npu.env},
        log=log,
        checkpoint="checkpoint" if spec.save else None,
        required_lines=required,
    )


TWIN_MSRUN_SCRIPT = "mindspore_train.py"


def gpu_command(experiment: Experiment, spec: TrainSpec) -> CommandTemplate:
    """`python -m alignflow.twin.torch_train <Megatron flags>`: the flags real Megatron-LM would get; the twin's
    own settings (the data's sha256, the megatron-core version it mimics) in its environment."""
    assert spec.load is not None, "the GPU side always trains from the converted checkpoint"
    gpu = experiment.gpu
    layout = spec.layout or layout_for(experiment.parallel("gpu"), None, side="gpu")
    p = layout.parallel
    if p.ep != 1:
        raise ConfigError(f"gpu layout ep {p.ep}: the PyTorch twin has tensor, pipeline and data parallelism, not "
                          "expert parallelism; use gpu.kind megatron for ep > 1")
    ckpt_format, _ = megatron_checkpoint_layout(experiment.conversion.format, p)
    args = megatron_args(
        experiment.model,
        experiment.training,
        data_path=spec.data,
        load=spec.load,
        save=spec.save,
        steps=spec.steps,
        transformer_impl=gpu.transformer_impl,
        megatron_version=gpu.megatron_version,
        extensions=gpu.extensions,
        data_cache_path="{out}/data_cache",
        extra_args=[*parallel_flags(p), *gpu.extra_args],
        ckpt_format=ckpt_format,
    )
    env = twin_env(data_sha256=spec.data_sha256, megatron_version=gpu.megatron_version)
    argv, launch_env = torchrun(layout, ["-m", "alignflow.twin.torch_train", *args], gpu.torchrun)
    return CommandTemplate(
        argv=tuple(argv),
        log_format="megatron",
        code_version=code_version_for(_CODE),
        env={**env, **launch_env, **gpu.env},
        required_lines=("successfully loaded checkpoint from",),
    )


def megatron_args(
    model: ModelConfig,
    training: TrainingConfig,
    *,
    data_path: str,
    load: str | None,
    save: str | None,
    steps: int,
    transformer_impl: Flavour = "local",
    megatron_version: str = "0.16",
    extensions: Sequence[str] | None = None,
    save_interval: int | None = None,
    data_cache_path: str | None = None,
    extra_args: Sequence[str] = (),
    ckpt_format: str = "torch",
) -> list[str]:
    """The twin's `pretrain_gpt.py` flags: exactly the real backend's (`backends.megatron.pretrain_flags`), which
    megatron-core `megatron_version`'s own parser accepts; the twin's own settings go in `twin_env`."""
    return pretrain_flags(model, training, steps=steps, data_path=data_path, load=load,
                          transformer_impl=transformer_impl, megatron_version=megatron_version, extensions=extensions,
                          data_cache_path=data_cache_path, save=save, save_interval=save_interval,
                          extra_args=extra_args, ckpt_format=ckpt_format)
