"""The reference twins as backends: `twin-mindspore` (MindFormers-kind) and `twin-torch` (Megatron-kind).

Their command lines mirror `run_mindformer.py --config X.yaml --mode 1` and `pretrain_gpt.py <flags>`, so the
rest of the pipeline (conversion, log parsing, sentinels, comparison) meets exactly the formats it meets in
production. Either twin may play either side: the PyTorch twin on both hosts stands in for a Megatron-on-NPU
(MindSpeed) against Megatron-on-GPU alignment, where both sides load the same checkpoint with no conversion.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import yaml
from pydantic import Field

from alignflow.backends.launch import layout_for, msrun, parallel_flags, torchrun
from alignflow.backends.megatron import pretrain_flags
from alignflow.backends.mindformers import set_dotted
from alignflow.backends.quoting import yaml_text
from alignflow.backends.registry import Backend, SideFormats, megatron_load_format, own_config, register
from alignflow.backends.template import CommandTemplate, MegatronArgs, MindFormersYaml, TrainSpec
from alignflow.codeversion import code_version_for
from alignflow.config.experiment import Experiment
from alignflow.config.hosts import CudaExtension
from alignflow.config.model import ModelConfig, TrainingConfig
from alignflow.config.sides import SideConfig
from alignflow.errors import ConfigError
from alignflow.twin.flavours import Flavour
from alignflow.twin.memory import MS_MEMORY_STATISTIC
from alignflow.twin.render import mindformers_config, twin_env

_CODE = ("twin", "config", "frameworks")  # the twin reads msprobe dumps and megatron-core facts from frameworks
TORCH_MODULE = "alignflow.twin.torch_train"
MINDSPORE_MODULE = "alignflow.twin.mindspore_train"


class TwinMindSporeConfig(SideConfig):
    """The MindSpore twin: MindFormers' YAML, checkpoints and log lines; data-parallel ranks under msrun."""

    kind: Literal["twin-mindspore"] = Field("twin-mindspore", description="The MindSpore twin.")
    msrun: dict[str, Any] | None = Field(
        None, description="Run under msrun with these options (worker_num, local_worker_num, master_port, log_dir).")
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="Dotted-key overrides applied last to the rendered MindFormers YAML (as "
        "for MindFormers: `context.max_device_memory`, a recompute switch).")


class TwinTorchConfig(SideConfig):
    """The PyTorch twin: Megatron-LM's flags, checkpoints (legacy or torch_dist) and `training_log` lines; tensor,
    pipeline and data parallelism under torchrun."""

    kind: Literal["twin-torch"] = Field("twin-torch", description="The PyTorch twin.")
    torchrun: dict[str, Any] | None = Field(
        None, description="Run under torchrun with these options (nproc_per_node, master_port).")
    transformer_impl: Literal["local", "transformer_engine"] = Field(
        "local", description="`--transformer-impl`; also picks the converted checkpoint's flavour.")
    megatron_version: str = Field("0.16", description="megatron-core version whose flags and formats the twin "
                                  "reproduces: the flags it accepts, NullTokenizer's vocabulary and EOD id, the MTP "
                                  "layer's name.")
    extensions: list[CudaExtension] | None = Field(
        None, description="What the host has besides PyTorch (transformer_engine, apex): picks Megatron's fused "
        "kernels. Left out, it is filled in from hosts.yaml (`cuda_extensions` of the side's training host).")
    extra_args: list[str] = Field(default_factory=list, description="Flags appended to the generated ones.")


def _mindspore_command(experiment: Experiment, spec: TrainSpec) -> CommandTemplate:
    """`python -m alignflow.twin.mindspore_train --config {out}/config.yaml --mode 1`; with data-parallel ranks,
    under msrun (which runs `python <script>` with the `python` of the host's PATH, as it does run_mindformer.py:
    the script is a two-line launcher written into {out})."""
    cfg = own_config(experiment, spec.side, TwinMindSporeConfig)
    layout = spec.layout or layout_for(experiment.parallel(spec.side), None, side=spec.side)
    p = layout.parallel
    if (p.tp, p.pp, p.ep) != (1, 1, 1):
        raise ConfigError(f"{spec.side} layout tp {p.tp} x pp {p.pp} x ep {p.ep}: the MindSpore twin is "
                          "data-parallel only (MindSpore's CPU build compiles no sharded graph); set "
                          f"{spec.side}.parallel to dp only (the sides may differ in layout), or use {spec.side}.kind "
                          "mindformers")
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
    for key, value in cfg.overrides.items():  # the user's MindFormers keys last, as for MindFormers
        set_dotted(config, key, value)
    files = {"config.yaml": yaml_text(config)}
    required = ("All Network parameters are loaded.",) if spec.load else ()
    argv: tuple[str, ...] = ("{python}", "-m", MINDSPORE_MODULE, "--config", "{out}/config.yaml", "--mode", "1")
    log = "stdout"
    if layout.world > 1 or cfg.msrun is not None:
        files[TWIN_MSRUN_SCRIPT] = f"from {MINDSPORE_MODULE} import main\nraise SystemExit(main())\n"
        launched, log = msrun(layout, [f"{{out}}/{TWIN_MSRUN_SCRIPT}", *argv[3:]], cfg.msrun)
        argv = tuple(launched)
    return CommandTemplate(
        argv=argv,
        log_format="mindformers",
        code_version=code_version_for(_CODE),
        files=files,
        # MindSpore prints its peak device memory at the end of a run with this set (the twin: its allocator model)
        env={MS_MEMORY_STATISTIC: "1", **cfg.env},
        log=log,
        checkpoint="checkpoint" if spec.save else None,
        required_lines=required,
    )


TWIN_MSRUN_SCRIPT = "mindspore_train.py"


def _torch_command(experiment: Experiment, spec: TrainSpec) -> CommandTemplate:
    """`python -m alignflow.twin.torch_train <Megatron flags>`: the flags real Megatron-LM would get; the twin's
    own settings (the data's sha256, the megatron-core version it mimics) in its environment."""
    cfg = own_config(experiment, spec.side, TwinTorchConfig)
    layout = spec.layout or layout_for(experiment.parallel(spec.side), None, side=spec.side)
    p = layout.parallel
    if p.ep != 1:
        raise ConfigError(f"{spec.side} layout ep {p.ep}: the PyTorch twin has tensor, pipeline and data parallelism, "
                          f"not expert parallelism; use {spec.side}.kind megatron for ep > 1")
    args = megatron_args(
        experiment.model,
        experiment.training,
        data_path=spec.data,
        load=spec.load,
        save=spec.save,
        steps=spec.steps,
        transformer_impl=cfg.transformer_impl,
        megatron_version=cfg.megatron_version,
        extensions=cfg.extensions,
        save_interval=experiment.training.save_interval if spec.save else None,
        data_cache_path="{out}/data_cache",
        extra_args=[*parallel_flags(p), *cfg.extra_args],
        ckpt_format=megatron_load_format(experiment, spec, p),
    )
    env = twin_env(data_sha256=spec.data_sha256, megatron_version=cfg.megatron_version)
    argv, launch_env = torchrun(layout, ["-m", TORCH_MODULE, *args], cfg.torchrun)
    return CommandTemplate(
        argv=tuple(argv),
        log_format="megatron",
        code_version=code_version_for(_CODE),
        env={**env, **launch_env, **cfg.env},
        checkpoint="checkpoint" if spec.save else None,
        required_lines=("successfully loaded checkpoint from",) if spec.load else (),
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


def _mindspore_settings(experiment: Experiment, spec: TrainSpec, template: CommandTemplate) -> MindFormersYaml:
    config = yaml.safe_load(template.files["config.yaml"])
    return MindFormersYaml(config, "twin", "the twin's renderer")


def _torch_settings(experiment: Experiment, spec: TrainSpec, template: CommandTemplate) -> MegatronArgs:
    cfg = own_config(experiment, spec.side, TwinTorchConfig)
    argv = template.argv
    if TORCH_MODULE not in argv:
        raise ConfigError(f"{experiment.source or experiment.name}: the {spec.step} command does not run "
                          f"{TORCH_MODULE} (steps.{spec.step}.command replaces it?): preflight cannot read its "
                          "Megatron flags")
    return MegatronArgs(argv[argv.index(TORCH_MODULE) + 1:], cfg.megatron_version,
                        tuple(cfg.extensions) if cfg.extensions is not None else None, real=False)


TWIN_MINDSPORE = register(Backend(
    kind="twin-mindspore", title="MindSpore twin (MindFormers formats)", config=TwinMindSporeConfig,
    roles=frozenset({"ascend", "cuda"}),
    formats=lambda cfg: SideFormats(log="mindformers", loads=("mindformers",), saves="mindformers"),
    render=_mindspore_command, settings=_mindspore_settings, dumps="native", real=False,
))
TWIN_TORCH = register(Backend(
    kind="twin-torch", title="PyTorch twin (Megatron formats)", config=TwinTorchConfig,
    roles=frozenset({"ascend", "cuda"}),
    formats=lambda cfg: SideFormats(log="megatron", loads=("megatron", "torch_dist"), saves="megatron"),
    render=_torch_command, settings=_torch_settings, dumps="native", real=False,
))
