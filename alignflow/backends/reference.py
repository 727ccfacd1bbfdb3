"""Reference-twin backend: the MindSpore twin plays the NPU side, the PyTorch twin the GPU side.

Their command lines mirror `run_mindformer.py --config X.yaml --mode 1` and `pretrain_gpt.py <flags>`, so the
rest of the pipeline (conversion, log parsing, sentinels, comparison) meets exactly the formats it meets in
production.
"""

from __future__ import annotations

import yaml

from alignflow.backends import CommandTemplate, TrainSpec
from alignflow.config.experiment import Experiment
from alignflow.runner.cache import code_version_for

_CODE = ("reference", "config")


def npu_command(experiment: Experiment, spec: TrainSpec) -> CommandTemplate:
    """`python -m alignflow.reference.mindspore_train --config {out}/config.yaml --mode 1`."""
    from alignflow.reference.render import mindformers_config

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
    text = yaml.safe_dump(config, sort_keys=False)
    required = ("All Network parameters are loaded.",) if spec.load else ()
    return CommandTemplate(
        argv=("{python}", "-m", "alignflow.reference.mindspore_train", "--config", "{out}/config.yaml", "--mode", "1"),
        log_format="mindformers",
        code_version=code_version_for(_CODE),
        files={"config.yaml": text},
        env=dict(experiment.npu.env),
        checkpoint="checkpoint" if spec.save else None,
        required_lines=required,
    )


def gpu_command(experiment: Experiment, spec: TrainSpec) -> CommandTemplate:
    """`python -m alignflow.reference.torch_train <Megatron flags>`."""
    from alignflow.reference.render import megatron_args

    assert spec.load is not None, "the GPU side always trains from the converted checkpoint"
    args = megatron_args(
        experiment.model,
        experiment.training,
        data_path=spec.data,
        data_sha256=spec.data_sha256,
        load=spec.load,
        save=spec.save,
        steps=spec.steps,
        transformer_impl=experiment.gpu.transformer_impl,
        megatron_version=experiment.gpu.megatron_version,
    )
    return CommandTemplate(
        argv=("{python}", "-m", "alignflow.reference.torch_train", *args, *experiment.gpu.extra_args),
        log_format="megatron",
        code_version=code_version_for(_CODE),
        env=dict(experiment.gpu.env),
        required_lines=("successfully loaded checkpoint from",),
    )
