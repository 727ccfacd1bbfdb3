"""A side is one registered backend: a third twin defined in this one module is validated, rendered, planned,
preflighted and placed like the built-in ones — no other module names it — and every per-side table follows from
the registry and the pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

from alignflow.backends import Backend, SideFormats, backend, backends, pipeline_for, register, render_training
from alignflow.backends.commands import step_command, train_spec
from alignflow.backends.registry import own_config
from alignflow.backends.template import CommandTemplate, MegatronArgs, TrainSpec
from alignflow.backends.twin import TORCH_MODULE, megatron_args
from alignflow.codeversion import code_version_for
from alignflow.config import load_experiment
from alignflow.config.experiment import Experiment
from alignflow.config.sides import SideConfig
from alignflow.errors import ConfigError
from alignflow.preflight import check_experiment
from alignflow.step_render import pipeline_view
from tests.recipes.copies import copy_twin


class ThirdTwinConfig(SideConfig):
    """The third twin's section: the PyTorch twin under its own name, with a megatron-core version of its own."""

    kind: Literal["twin-third"] = Field("twin-third", description="A third twin, registered by this test module.")
    megatron_version: str = Field("0.17", description="The megatron-core version whose flags it takes.")


def _render(experiment: Experiment, spec: TrainSpec) -> CommandTemplate:
    cfg = own_config(experiment, spec.side, ThirdTwinConfig)
    flags = megatron_args(experiment.model, experiment.training, data_path=spec.data, load=spec.load, save=spec.save,
                          steps=spec.steps, megatron_version=cfg.megatron_version)
    return CommandTemplate(argv=("{python}", "-m", TORCH_MODULE, *flags), log_format="megatron",
                           code_version=code_version_for(("twin",)), env=dict(cfg.env),
                           checkpoint="checkpoint" if spec.save else None,
                           required_lines=("successfully loaded checkpoint from",) if spec.load else ())


def _settings(experiment: Experiment, spec: TrainSpec, template: CommandTemplate) -> MegatronArgs:
    cfg = own_config(experiment, spec.side, ThirdTwinConfig)
    return MegatronArgs(template.argv[3:], cfg.megatron_version, None, real=False)


THIRD = register(Backend(
    kind="twin-third", title="a third twin (test)", config=ThirdTwinConfig, roles=frozenset({"ascend", "cuda"}),
    formats=lambda cfg: SideFormats(log="megatron", loads=("megatron",), saves="megatron"),
    render=_render, settings=_settings, dumps="native", real=False,
))


def test_the_third_twin_is_registered_and_its_section_validated(repo_root: Path, tmp_path: Path) -> None:
    assert backend("twin-third") is THIRD
    assert "twin-third" in {b.kind for b in backends()}
    exp = load_experiment(copy_twin(repo_root, tmp_path, edits={"npu": {"kind": "twin-third"}}))
    assert type(exp.npu) is ThirdTwinConfig
    bad = copy_twin(repo_root, tmp_path / "bad", edits={"npu": {"kind": "twin-third", "template": "x.yaml"}})
    with pytest.raises(ConfigError, match=r"tiny.yaml:\d+: npu.template: unknown key \(not allowed here\)"):
        load_experiment(bad)


def test_an_unknown_kind_names_the_closest_registered_one_with_its_line(repo_root: Path, tmp_path: Path) -> None:
    bad = copy_twin(repo_root, tmp_path, edits={"gpu": {"kind": "twni-torch"}})
    with pytest.raises(ConfigError, match=r"tiny.yaml:\d+: gpu.kind: unknown side backend 'twni-torch' \(did you mean "
                                          r"'twin-torch'\?\); backends: command, megatron, mindformers"):
        load_experiment(bad)


def test_the_third_twin_plays_a_side_end_to_end_through_the_derived_tables(repo_root: Path, tmp_path: Path) -> None:
    exp = load_experiment(copy_twin(repo_root, tmp_path, edits={"npu": {"kind": "twin-third"},
                                                               "gpu": {"kind": "twin-torch"}}))
    pipe = pipeline_for(exp)
    # two Megatron-format sides: the third twin trains the base, both load it as saved, no conversion
    assert pipe.names == ("npu_base_train", "early_gate", "gpu_train", "npu_reload_train", "compare", "diagnose")
    assert pipe.load("npu") == pipe.load("gpu") == "base_ckpt"
    base = step_command(exp, "npu_base_train", data_sha256="ab" * 32).template
    assert base.argv[:3] == ("{python}", "-m", TORCH_MODULE)
    assert base.argv[base.argv.index("--save") + 1] == "{out}/checkpoint"
    reload = step_command(exp, "npu_reload_train", data_sha256="ab" * 32).template
    assert reload.argv[reload.argv.index("--load") + 1] == "{in:base_ckpt}"
    gate = render_training(exp, train_spec(exp, "early_gate", "npu", 2, "{in:base_ckpt}", None, data_sha256="",
                                           host=None))
    assert gate.argv[gate.argv.index("--train-iters") + 1] == "2"
    report = check_experiment(exp)
    assert report.ok, report.summary()
    assert next(f for f in report.findings if f.setting == "data.eod").npu is not None
    assert pipeline_view(exp).sides["npu"]["kind"] == "twin-third"


def test_a_kind_is_registered_once(repo_root: Path) -> None:
    other = Backend(kind="twin-third", title="another", config=ThirdTwinConfig, roles=frozenset({"cuda"}),
                    formats=THIRD.formats, render=_render, settings=_settings)
    with pytest.raises(ValueError, match="side backend 'twin-third' is already registered"):
        register(other)
    assert register(THIRD) is THIRD  # the same bundle again is a no-op (a module imported twice)


def test_a_backend_refuses_a_host_role_it_does_not_train_on(repo_root: Path, tmp_path: Path) -> None:
    path = copy_twin(repo_root, tmp_path, edits={"gpu": {"kind": "mindformers", "template": "t.yaml",
                                                          "entry": "run.py"}})
    (tmp_path / "t.yaml").write_text("training: {}\n")
    exp = load_experiment(path)
    with pytest.raises(ConfigError, match=r"gpu.kind mindformers trains on ascend hosts; gpu_train would run on a cuda "
                                          "host"):
        step_command(exp, "gpu_train", data_sha256="")


def _both_megatron_from_mindformers(repo_root: Path, tmp_path: Path, fmt: str) -> Experiment:
    """demo with a given MindFormers base and the PyTorch twin on both sides: both load one converted Megatron
    checkpoint, the NPU side at tp 2 x pp 2, the GPU side on one rank."""
    text = (repo_root / "experiments" / "demo.yaml").read_text()
    assert "conversion:\n" in text
    text = text.replace("conversion:\n", f"conversion:\n  format: {fmt}\n", 1)
    text += ("base: {path: base, format: mindformers}\nnpu:\n  kind: twin-torch\n  parallel: {tp: 2, pp: 2}\n"
             "gpu:\n  kind: twin-torch\n")
    path = tmp_path / "both.yaml"
    path.write_text(text)
    (tmp_path / "base").mkdir(exist_ok=True)  # the base exists on the controller (validated where it is read)
    return load_experiment(path)


def test_the_converted_checkpoint_is_laid_out_for_the_side_that_loads_it(repo_root: Path, tmp_path: Path) -> None:
    # conversion.format torch_dist: one checkpoint both layouts load; each training asks for torch_dist
    exp = _both_megatron_from_mindformers(repo_root, tmp_path, "torch_dist")
    assert [s.name for s in pipeline_for(exp).steps if s.converts] == ["convert_megatron"]
    convert = step_command(exp, "convert_megatron", data_sha256="").template.argv
    assert convert[convert.index("--ckpt-format") + 1] == "torch_dist"
    for step in ("npu_reload_train", "gpu_train"):
        argv = step_command(exp, step, data_sha256="").template.argv
        assert argv[argv.index("--ckpt-format") + 1] == "torch_dist"
    npu = step_command(exp, "npu_reload_train", data_sha256="").template.argv
    assert npu[npu.index("--tensor-model-parallel-size") + 1] == "2"
    # auto: legacy files for one rank (the GPU side) and torch_dist for tp 2 x pp 2 (the NPU side) cannot be one
    # checkpoint: refused, naming both sides' needs and the way out
    auto = _both_megatron_from_mindformers(repo_root, tmp_path, "auto")
    with pytest.raises(ConfigError, match=r"npu: torch_dist; gpu: legacy files for tp 1 pp 1 ep 1.*"
                                          r"conversion.format: torch_dist"):
        step_command(auto, "convert_megatron", data_sha256="")
