"""MindFormers backend: `run_mindformer.py --config <rendered YAML> --mode 1`, optionally under `msrun`.

The rendered YAML is the experiment's template (the user's real PyNative training YAML) plus the overrides that
make it one step of an alignment experiment: where to load and save, how many steps, the seed and the data order,
determinism. Everything else — the model, the optimizer, the schedule — stays as the template says; preflight
then compares those values with the Megatron flags instead of alignflow silently overwriting them.

Alignment-critical overrides and why (docs/mindformers.md#checkpoint-layout, docs/mindformers.md#seeds-and-determinism,
docs/mindformers.md#npu-side-checklist-per-pipeline-step):
- `checkpoint.no_load_optim: True` — weights only; LR schedule and data restart at step 0, the equivalent of
  Megatron's `--finetune --no-load-optim --no-load-rng`;
- `checkpoint.no_save_optim: True` for the base training — the bf16 conversion drops optimizer state anyway;
- `train_dataset.dataloader.sizes[0] = steps * global_batch_size` — the GPTDataset shuffle index depends on
  `num_samples`; Megatron uses `train_iters * GBS`, so both sides get the same order only with the same number;
- `train_dataset.dataloader.config.seed` and `training.seed` — Megatron's `--seed` seeds both
  (docs/seeds.md#data-order);
- `train_dataset.dataloader.shuffle: False` — the order comes from the GPTDataset index, not a second shuffle;
- `train_dataset.dataloader.config.path_to_cache` — the job's own directory: MindFormers' GPTDataset otherwise
  writes its index cache into the data directory (`<prefix>/cache/GPTDataset_indices/`, seen with MindFormers
  2.1.0), which changes the fingerprint of an input every other step verifies;
- `training.deterministic` — the experiment's; with it on, the job also gets `HCCL_DETERMINISTIC=true` and
  `LCCL_DETERMINISTIC=1` (deterministic collectives; docs/mindformers.md#seeds-and-determinism), which `npu.env` or the
  host's env may still override — preflight reports the effective value.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import yaml
from pydantic import Field

from alignflow.backends.launch import layout_for, mindformers_parallel, msrun
from alignflow.backends.quoting import yaml_text
from alignflow.backends.registry import Backend, SideFormats, own_config, register
from alignflow.backends.template import CommandTemplate, MindFormersYaml, TrainSpec
from alignflow.config.experiment import Experiment
from alignflow.config.sides import SideConfig
from alignflow.config.yamlsource import load_yaml
from alignflow.errors import ConfigError


class MindFormersConfig(SideConfig):
    """MindFormers `run_mindformer.py` with a YAML template (PyNative), optionally under msrun."""

    kind: Literal["mindformers"] = Field("mindformers", description="MindFormers.")
    template: str = Field(description="MindFormers YAML template (relative to the experiment file); alignflow "
                          "overrides load/save paths, steps, seed and determinism in it.")
    overrides: dict[str, Any] = Field(default_factory=dict, description="Dotted-key overrides applied last to the "
                                      "rendered YAML.")
    entry: str = Field(description="Path of run_mindformer.py on the host, or `-m <module>` to run a module (the "
                       "CPU lab: `-m alignflow.labs.mindformers_cpu.launcher`).")
    msrun: dict[str, Any] | None = Field(
        None, description="Run under msrun with these options (worker_num, local_worker_num, master_port, log_dir).")
    repo: str | None = Field("mindformers", description="Name under the host's `repos:` whose git commit versions "
                             "the side (part of each step's cache key).")


def set_dotted(config: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `a.b.c` in nested dicts, creating mappings on the way; list items are addressed by index."""
    node: Any = config
    parts = dotted.split(".")
    for i, part in enumerate(parts[:-1]):
        key: Any = int(part) if isinstance(node, list) else part
        if isinstance(node, dict):
            if not isinstance(node.get(key), dict | list):
                node[key] = {}
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and key < len(node):
            node = node[key]
        else:
            raise ConfigError(f"override {dotted}: {'.'.join(parts[:i + 1])} is not a mapping or list index")
    last: Any = parts[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def get_dotted(config: dict[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return default
    return node


def render_config(experiment: Experiment, spec: TrainSpec) -> dict[str, Any]:
    """The template with alignflow's overrides, then the experiment's own `npu.overrides` last."""
    npu = own_config(experiment, spec.side, MindFormersConfig)
    doc = load_yaml(experiment.resolve_path(npu.template))
    if not isinstance(doc.data, dict):
        raise ConfigError(f"{doc.path}: a MindFormers YAML must be a mapping")
    config = copy.deepcopy(doc.data)
    training = experiment.training
    gbs = training.global_batch_size
    overrides: dict[str, Any] = {
        "training.steps": spec.steps,
        "training.seed": training.seed,
        "training.deterministic": training.deterministic,
        "checkpoint.load_path": spec.load or "",
        "checkpoint.no_load_optim": True,
        "checkpoint.enable_save": spec.save is not None,
        "checkpoint.save_path": spec.save or "",
        "checkpoint.no_save_optim": True,
        "checkpoint.save_interleaved_steps": training.save_interval or spec.steps,
        "train_dataset.dataloader.shuffle": False,
        "train_dataset.dataloader.config.seed": training.seed,
        "train_dataset.dataloader.config.data_path": ["1", spec.data],
        "train_dataset.dataloader.config.path_to_cache": "{out}/gpt_dataset_cache",
    }
    sizes = get_dotted(config, "train_dataset.dataloader.sizes")
    overrides["train_dataset.dataloader.sizes"] = [spec.steps * gbs, *(list(sizes[1:]) if isinstance(sizes, list)
                                                                     else [0, 0])]
    layout = spec.layout or layout_for(experiment.parallel(spec.side), None, side=spec.side)
    overrides |= mindformers_parallel(layout.parallel)
    if get_dotted(config, "parallelism.data_parallel_shard") not in (None, -1):  # -1: derived from the world size
        overrides["parallelism.data_parallel_shard"] = layout.parallel.dp
    for key, value in {**overrides, **npu.overrides}.items():
        set_dotted(config, key, value)
    return config


def _command(experiment: Experiment, spec: TrainSpec) -> CommandTemplate:
    npu = own_config(experiment, spec.side, MindFormersConfig)
    if spec.role not in (None, "ascend"):
        raise ConfigError(f"{spec.step}: MindFormers trains on an Ascend host (role ascend), not on a {spec.role} host")
    config = render_config(experiment, spec)
    # `entry: -m <module>` runs a module instead of a script (the CPU lab's launcher, which stands in for the
    # run_mindformer.py the MindFormers wheel does not ship)
    entry = ["-m", npu.entry.removeprefix("-m ").strip()] if npu.entry.startswith("-m ") else [npu.entry]
    script = [*entry, "--config", "{out}/config.yaml", "--mode", "1"]
    log = "stdout"
    layout = spec.layout or layout_for(experiment.parallel(spec.side), None, side=spec.side)
    if npu.msrun is not None or layout.world > 1:
        # PyNative prints real losses on the last pipeline stage only: the last rank's worker log is parsed
        argv, log = msrun(layout, script, npu.msrun)
    else:
        argv = ["{python}", *script]
    env = {"LOCAL_DEFAULT_PATH": "{out}/output", "LOG_MF_PATH": "{out}/output/log"}
    if experiment.training.deterministic:
        env |= {"HCCL_DETERMINISTIC": "true", "LCCL_DETERMINISTIC": "1"}
    env |= npu.env
    required = ("All Network parameters are loaded.",) if spec.load else ()
    return CommandTemplate(
        argv=tuple(argv),
        log_format="mindformers",
        code_version=f"entry {npu.entry}",
        files={"config.yaml": yaml_text(config)},
        env=env,
        log=log,
        checkpoint="checkpoint" if spec.save else None,
        required_lines=required,
        code_repo=npu.repo,
    )


def _settings(experiment: Experiment, spec: TrainSpec, template: CommandTemplate) -> MindFormersYaml:
    text = template.files.get("config.yaml")
    if text is None:
        raise ConfigError(f"{experiment.source or experiment.name}: {spec.step} renders no config.yaml; preflight "
                          "has nothing to read")
    config = yaml.safe_load(text)
    if not isinstance(config, dict):
        raise ConfigError(f"{experiment.source or experiment.name}: the rendered MindFormers config is not a mapping")
    return MindFormersYaml(config, "mindformers", own_config(experiment, spec.side, MindFormersConfig).template)


MINDFORMERS = register(Backend(
    kind="mindformers", title="MindFormers (run_mindformer.py, PyNative)", config=MindFormersConfig,
    roles=frozenset({"ascend"}),
    formats=lambda cfg: SideFormats(log="mindformers", loads=("mindformers",), saves="mindformers"),
    render=_command, settings=_settings, dumps="msprobe",
))
