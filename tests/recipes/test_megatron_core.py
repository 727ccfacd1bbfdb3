"""Every shipped Megatron experiment, rendered for every checked megatron-core release and both implementations,
walked through that release's own code as deep as a CPU allows (`alignflow.frameworks.megatron_build`).

The levels: `flags` (the release's argument parser, from its flag table), `config` (the real `TransformerConfig` /
`MLATransformerConfig`, every `__post_init__` check), `spec` (the layer specs `pretrain_gpt.py` selects), `model`
(the real `GPTModel` on the CPU) and `load` (the converted checkpoint, strictly). Each test's id ends with the
deepest level it must reach; `transformer_engine` cases run megatron-core's TE code paths against a stand-in
Transformer Engine (`alignflow.frameworks.te_stand_in`: TE cannot exist on a CPU), so they stop at `spec` — what
only a TE box proves is in docs/recipes/. Where the real code refuses (every recipe's `local` case, the glm52
recipes as rendered before `--no-rope-fusion`), the test checks that megatron-core raises the message and at the
source line `alignflow.frameworks.megatron_refusals` cites, and that preflight refuses the same command line naming
that line.

Each release runs in its own interpreter, with TE's stand-in or without: `python -m
alignflow.frameworks.megatron_installs install` puts the releases side by side under `.venv/megatron-core`
(`make test` does it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from alignflow.backends.commands import step_command
from alignflow.config import load_experiment
from alignflow.config.experiment import Experiment
from alignflow.frameworks.megatron_fixes import resolve_fix
from alignflow.frameworks.megatron_installs import DEFAULT_DIR, python_path, releases
from alignflow.frameworks.megatron_refusals import REFUSALS
from alignflow.preflight.megatron_combos import combination_problems
from alignflow.preflight.sides import _megatron_flags

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = ("demo-megatron", "glm52_mini", "glm52_1b", "qwen35_dense", "qwen35_moe")
IMPLS = ("transformer_engine", "local")
ROW = {r.key: r for r in REFUSALS}

# (experiment, implementation) -> the deepest level reached, or the refusal row that stops it.
EXPECTED: dict[tuple[str, str], str] = {
    ("demo-megatron", "local"): "load",
    ("demo-megatron", "transformer_engine"): "spec",
    ("glm52_mini", "transformer_engine"): "spec",
    ("glm52_mini", "local"): "refused:variant-needs-te",
    ("glm52_1b", "transformer_engine"): "spec",
    ("glm52_1b", "local"): "refused:variant-needs-te",
    ("qwen35_dense", "transformer_engine"): "spec",
    ("qwen35_dense", "local"): "refused:variant-needs-te",
    ("qwen35_moe", "transformer_engine"): "spec",
    ("qwen35_moe", "local"): "refused:variant-needs-te",
}
# megatron-core 0.16 and 0.17 have no DSA block spec: GLM-5.2 needs 0.18 or later.
BEFORE_DSA = {"0.16", "0.17"}


def expected(name: str, impl: str, series: str) -> str:
    if name.startswith("glm52") and impl == "transformer_engine" and series in BEFORE_DSA:
        return "refused:dsa-needs-0.18"
    if name.startswith("glm52") and impl == "transformer_engine" and series == "0.18":
        return "refused:mtp-dsa-plain-mla"  # builds; its first forward fails (seen on the H100, issue 50)
    if name.startswith("qwen35") and impl == "transformer_engine" and series == "0.19":
        return "refused:mtp-variant-builder"  # declared for 0.17; on 0.19 the ModelBuilder needs the declared fix
    return EXPECTED[(name, impl)]


def _ids(release: str, name: str, impl: str) -> str:
    return f"{release}-{name}-{impl}-" + expected(name, impl, _series(release)).replace("refused:", "refused-")


@dataclass(frozen=True)
class Case:
    """A command line to walk, the refusal row it must meet (None: it must pass) and the level it must reach."""

    name: str
    impl: str
    argv: tuple[str, ...]
    expect: str
    checkpoint: str | None = None
    fixes: tuple[str, ...] = ()  # the side's declared Megatron fixes


def _series(release: str) -> str:
    return ".".join(release.split(".")[:2])


def rendered(name: str, series: str, impl: str, **model: Any) -> tuple[Experiment, list[str]]:
    """The gpu_train flags of experiment `name` rendered for megatron-core `series` and `impl` (model edits)."""
    exp = load_experiment(REPO / "experiments" / f"{name}.yaml")
    fixes = [f for f in exp.gpu.fixes if series in (resolve_fix(f).releases or (series,))]  # those for `series`
    gpu = exp.gpu.model_copy(update={"megatron_version": series, "transformer_impl": impl, "fixes": fixes})
    exp = exp.model_copy(update={"gpu": gpu, "model": exp.model.model_copy(update=model)})
    return exp, list(_megatron_flags(exp, step_command(exp, "gpu_train", data_sha256="").template.argv))


def _converted_demo(tmp: Path, series: str) -> str:
    """demo-megatron's model as a bf16 MindFormers checkpoint, converted for `series` (local names)."""
    import torch

    from alignflow.convert import convert_to_megatron
    from tests.convert.synthetic import source_state, write_mindformers

    exp = load_experiment(REPO / "experiments" / "demo-megatron.yaml")
    write_mindformers(tmp / "bf16", source_state(exp.conversion.spec, exp.model, dtype=torch.bfloat16))
    convert_to_megatron(tmp / "bf16", tmp / "mg", spec=exp.conversion.spec, model=exp.model, flavor="local",
                        megatron_version=series)
    return str(tmp / "mg")


def cases(series: str, impl: str, tmp: Path) -> list[Case]:
    """The shipped experiments, then the refusals the table cites, for one release and implementation."""
    out = []
    for name in EXPERIMENTS:
        exp, argv = rendered(name, series, impl)
        level = expected(name, impl, series)
        checkpoint = _converted_demo(tmp, series) if level == "load" else None
        out.append(Case(name, impl, tuple(argv), level, checkpoint, tuple(exp.gpu.fixes)))
    if impl == "transformer_engine" and series == "0.19":
        # as shipped before the declared fix: what the real entry's ModelBuilder raised on the H100 (issue 50)
        _, argv = rendered("glm52_mini", series, impl)
        out.append(Case("glm52_mini without the declared fix", impl, tuple(argv), "refused:mtp-variant-builder"))
    if impl == "transformer_engine":
        # as alignflow rendered glm52 before DSA got --no-rope-fusion on TE: what the H100 raised
        _, argv = rendered("glm52_mini", series, impl)
        out.append(Case("glm52_mini without --no-rope-fusion", impl, tuple(a for a in argv if a != "--no-rope-fusion"),
                        "refused:dsa-rope-fusion"))
        _, argv = rendered("glm52_mini", series, impl, mla=None)
        out.append(Case("glm52_mini, DSA without MLA", impl, tuple(argv),
                        "refused:dsa-needs-0.18" if series in BEFORE_DSA else "refused:dsa-without-mla"))
        if series in ROW["dsa-linear-bias"].source:
            _, argv = rendered("glm52_mini", series, impl, add_bias_linear=True)
            out.append(Case("glm52_mini with linear biases", impl, tuple(argv), "refused:dsa-linear-bias"))
    else:
        _, argv = rendered("glm52_mini", series, impl, dsa=None)
        out.append(Case("glm52_mini, MLA without DSA", impl, tuple(argv), "refused:mla-needs-te"))
    return out


def walk(release: str, batch: list[Case]) -> dict[str, dict[str, Any]]:
    """Run `megatron_build` on `batch` in an interpreter of megatron-core `release`."""
    root = REPO / DEFAULT_DIR
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([python_path(release, root), str(REPO)])}
    te = batch[0].impl == "transformer_engine"
    done = subprocess.run([sys.executable, "-m", "alignflow.frameworks.megatron_build",
                           *(["--te-stand-in"] if te else [])],
                          input=json.dumps([{"name": c.name, "argv": list(c.argv), "checkpoint": c.checkpoint,
                                             "fixes": list(c.fixes)} for c in batch]),
                          capture_output=True, text=True, env=env, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return {r["name"]: r for r in map(json.loads, done.stdout.splitlines())}


_RESULTS: dict[tuple[str, str], tuple[list[Case], dict[str, dict[str, Any]]]] = {}


@pytest.fixture
def walked(tmp_path_factory: pytest.TempPathFactory):
    """One interpreter per (release, implementation), shared by that pair's tests."""
    def get(release: str, impl: str) -> tuple[list[Case], dict[str, dict[str, Any]]]:
        if (release, impl) not in _RESULTS:
            if not (REPO / DEFAULT_DIR / release).is_dir():
                pytest.fail(f"megatron-core {release} is not installed side by side: run `python -m "
                            "alignflow.frameworks.megatron_installs install` (make test does)")
            batch = cases(_series(release), impl, tmp_path_factory.mktemp(f"mcore-{release}-{impl}"))
            _RESULTS[(release, impl)] = (batch, walk(release, batch))
        return _RESULTS[(release, impl)]
    return get


def _check(case: Case, result: dict[str, Any], series: str) -> None:
    extensions = ["transformer_engine"] if case.impl != "local" else []
    if not case.expect.startswith("refused:"):
        assert result["refused"] is None, result
        assert result["reached"] == case.expect, result["levels"]
        # preflight passes what megatron-core builds (TE declared for TE command lines)
        ok, problems = combination_problems(list(case.argv), env={"NCCL_ALGO": "Ring"}, version=series,
                                            extensions=extensions, fixes=case.fixes)
        assert [p for p in problems if "megatron-core" in p and "refuses it" in p] == [], problems
        return
    row = ROW[case.expect.removeprefix("refused:")]
    refused = result["refused"]
    if row.level == "forward":  # the model builds (a CPU reaches the spec level with TE); its first step fails on a GPU
        assert refused is None, result
        assert result["reached"] == "spec", result
    else:
        assert refused is not None, f"{case.name}: megatron-core {result['megatron_core']} built it: {result['levels']}"
        assert refused["level"] == row.level, refused
        assert row.raised(refused["error"].split(" when instantiating")[0]), (refused, row.error)
    if row.level not in ("model", "forward"):  # a module's constructor error is re-raised by spec_utils.build_module:
        assert refused["where"] == row.source[series], refused  # the row cites the line that passes k_channels
    # preflight refuses the same command line before anything runs, with the same line
    ok, problems = combination_problems(list(case.argv), env={"NCCL_ALGO": "Ring"}, version=series,
                                        extensions=extensions, fixes=case.fixes)
    assert ok is False
    assert row.line(series) in problems, problems
    assert row.source[series] in row.line(series)


MATRIX = [(r, n, i) for r in releases() for n in EXPERIMENTS for i in IMPLS]


@pytest.mark.parametrize(("release", "name", "impl"), MATRIX, ids=[_ids(*m) for m in MATRIX])
def test_shipped_experiment_reaches_its_level_on_real_megatron_core(walked, release: str, name: str,
                                                                    impl: str) -> None:
    batch, results = walked(release, impl)
    case = next(c for c in batch if c.name == name)
    _check(case, results[name], _series(release))


@pytest.mark.parametrize("release", releases())
@pytest.mark.parametrize("impl", IMPLS)
def test_every_cited_refusal_is_raised_by_megatron_core_where_cited(walked, release: str, impl: str) -> None:
    batch, results = walked(release, impl)
    extra = [c for c in batch if c.name not in EXPERIMENTS]
    assert extra
    for case in extra:
        _check(case, results[case.name], _series(release))
