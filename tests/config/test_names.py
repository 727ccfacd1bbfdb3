"""Every name an experiment refers to is resolved where the file is read (issue 40): `alignflow validate` and
`alignflow preflight` exit 2 with `file:line` and the closest name, for keys and values alike.

Driven through the console script's own entry point (`alignflow.cli.main`, which chooses the exit code and prints
the error) on copies of the committed experiments, as a user edits them; the subprocess walk (`run` refuses before
recording anything) is tests/cli/test_exit_codes.py.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from alignflow.cli import main


def alignflow(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str]:
    """`alignflow ARGS` as typed: its exit code and what it printed (stdout and stderr)."""
    monkeypatch.setattr("sys.argv", ["alignflow", *args])
    with pytest.raises(SystemExit) as ended:
        main()
    out = capsys.readouterr()
    code = ended.value.code
    return (code if isinstance(code, int) else 0), out.out + out.err


def edited(src: Path, dest: Path, old: str, new: str) -> Path:
    text = src.read_text()
    assert old in text, old
    dest.write_text(text.replace(old, new, 1))
    return dest


def line_of(path: Path, fragment: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if fragment in line)


def demo(tmp_path: Path, repo_root: Path, old: str, new: str) -> Path:
    return edited(repo_root / "experiments" / "demo.yaml", tmp_path / "exp.yaml", old, new)


def spec_typo(tmp: Path, root: Path) -> tuple[Path, str, str]:
    return (demo(tmp, root, "spec: twin-moe", "spec: twin-mo"), "spec: twin-mo",
            "conversion.spec: unknown conversion spec 'twin-mo' (did you mean 'twin-moe'?)")


def spec_file_typo(tmp: Path, root: Path) -> tuple[Path, str, str]:
    shutil.copy(root / "alignflow" / "convert" / "specs" / "twin-moe.yaml", tmp / "my-spec.yaml")
    return (demo(tmp, root, "spec: twin-moe", "spec: my-spce.yaml"), "spec: my-spce.yaml",
            "conversion.spec: spec file 'my-spce.yaml' not found")


def flavour(tmp: Path, root: Path) -> tuple[Path, str, str]:
    # qwen35-dense writes only Transformer Engine names; a local GPU side could never load its checkpoint
    exp = edited(root / "experiments" / "qwen35_dense.yaml", tmp / "qwen.yaml", "transformer_impl: transformer_engine",
                 "transformer_impl: local")
    text = exp.read_text().replace("template: templates/", f"template: {root}/experiments/templates/")
    exp.write_text(text)
    return (exp, "transformer_impl: local",
            "gpu.transformer_impl: local needs the 'local' flavour of the converted checkpoint, and conversion.spec "
            "'qwen35-dense' writes only: te")


def template_typo(tmp: Path, root: Path) -> tuple[Path, str, str]:
    exp = edited(root / "experiments" / "qwen35_dense.yaml", tmp / "qwen.yaml", "template: templates/qwen35_dense.yaml",
                 "template: templates/qwen35_dens.yaml")
    (tmp / "templates").mkdir()
    shutil.copy(root / "experiments" / "templates" / "qwen35_dense.yaml", tmp / "templates")
    return (exp, "template: templates/qwen35_dens.yaml",
            "npu.template: 'templates/qwen35_dens.yaml' not found")


def data_prefix(tmp: Path, root: Path) -> tuple[Path, str, str]:
    data = tmp / "data"
    data.mkdir()
    for ext in (".bin", ".idx"):
        (data / f"demo{ext}").write_bytes(b"")
    exp = demo(tmp, root, 'path: "{state_dir}/data/demo"', f"path: {data}")
    return (edited(exp, exp, "prefix: demo", "prefix: dmeo"), "prefix: dmeo",
            f"data.prefix: {data} has no dmeo.bin / dmeo.idx (did you mean 'demo'?)")


def criteria_file(tmp: Path, root: Path) -> tuple[Path, str, str]:
    (tmp / "criteria.yaml").write_text("criteria:\n  - {metric: lm_loss, statistic: me, threshold: 0.001}\n")
    exp = demo(tmp, root, "conversion:\n", "criteria: criterias.yaml\nconversion:\n")
    return (exp, "criteria: criterias.yaml",
            "criteria: criteria file 'criterias.yaml' not found")


def backend_typo(tmp: Path, root: Path) -> tuple[Path, str, str]:
    exp = edited(root / "experiments" / "demo-same-format.yaml", tmp / "same.yaml", "npu:\n  kind: twin-torch",
                 "npu:\n  kind: twin-trch")
    return (exp, "kind: twin-trch", "npu.kind: unknown side backend 'twin-trch' (did you mean 'twin-torch'?)")


def backend_key_typo(tmp: Path, root: Path) -> tuple[Path, str, str]:
    # a key of the megatron backend's own section (not of what every side has): the closest of its keys
    exp = edited(root / "experiments" / "demo-megatron.yaml", tmp / "meg.yaml", "  megatron_version:",
                 "  megatron_versoin:")
    return (exp, "megatron_versoin:", "gpu.megatron_versoin: unknown key (did you mean 'megatron_version'?)")


def conversion_missing(tmp: Path, root: Path) -> tuple[Path, str, str]:
    # the base is Hugging Face's and neither twin loads it: the derived pipeline converts, with no spec to do it
    exp = edited(root / "experiments" / "demo-hf-base.yaml", tmp / "hf.yaml", "conversion:\n  spec: qwen3\n", "")
    return (exp, "  format: hf", "base.format: convert_mindformers converts hf -> mindformers (the sides load other "
                               "formats than the base's): the experiment needs `conversion: {spec: <model family>}`")


def unconverted_format(tmp: Path, root: Path) -> tuple[Path, str, str]:
    # a torch_dist base and a side that loads Hugging Face's: torch_dist converts only from and to MindFormers
    exp = edited(root / "experiments" / "demo-hf-base.yaml", tmp / "td.yaml", "  format: hf\n  generate: {seed: 0}",
                 "  format: torch_dist")
    exp.write_text(exp.read_text() + "gpu:\n  kind: command\n  launch: [train.py, --load, '{load}']\n"
                   "  log: {format: megatron}\n  checkpoint: {loads: hf}\n")
    return (exp, "  format: torch_dist", "base.format: convert_hf would convert torch_dist -> hf: alignflow converts "
                                         "torch_dist only from and to mindformers")


def distributed_from_hf(tmp: Path, root: Path) -> tuple[Path, str, str]:
    # the GPU side at tp 2 loads a Megatron checkpoint converted from Hugging Face's: torch_dist (auto), which
    # alignflow writes from MindFormers only
    exp = edited(root / "experiments" / "demo-hf-base.yaml", tmp / "hf.yaml", "conversion:\n",
                 "gpu:\n  parallel: {tp: 2}\nconversion:\n")
    return (exp, "  parallel: {tp: 2}", "gpu.parallel: convert_megatron would write torch_dist from a hf checkpoint "
                                        "for the gpu side's layout")


def test_a_torch_dist_base_is_converted_to_mindformers_and_loaded_as_given(tmp_path: Path, repo_root: Path) -> None:
    # megatron-core's dist_checkpointing reads it into MindFormers; a Megatron-kind side loads it unconverted
    from alignflow.backends.registry import pipeline_for
    from alignflow.config.experiment import load_experiment

    exp = edited(repo_root / "experiments" / "demo-hf-base.yaml", tmp_path / "td.yaml",
                 '  path: "{state_dir}/base/demo-hf-qwen3"\n  format: hf\n  generate: {seed: 0}',
                 f"  path: {tmp_path}\n  format: torch_dist")
    pipe = pipeline_for(load_experiment(exp))
    assert [s.name for s in pipe.steps if s.converts] == ["convert_mindformers"]
    assert pipe.load_format("npu") == "mindformers"
    assert pipe.load_format("gpu") == "torch_dist"


def family_typo(tmp: Path, root: Path) -> tuple[Path, str, str]:
    # issue 45: `twin-mo` trained with the field ignored; the families are those the conversion specs declare
    return (demo(tmp, root, "family: twin-moe", "family: twin-mo"), "family: twin-mo",
            "model.family: unknown model family 'twin-mo' (did you mean 'twin-moe'?); the conversion specs declare: ")


def base_path_missing(tmp: Path, root: Path) -> tuple[Path, str, str]:
    # issue 45: a base.path that does not exist passed validate; the run then failed without a line
    (tmp / "base-ckpt").mkdir()
    exp = edited(root / "experiments" / "demo-hf-base.yaml", tmp / "hf.yaml",
                 "  path: \"{state_dir}/base/demo-hf-qwen3\"\n  format: hf\n  generate: {seed: 0}",
                 f"  path: {tmp}/base-ckpts\n  format: hf")
    return (exp, "base-ckpts", f"base.path: checkpoint '{tmp}/base-ckpts' does not exist on this machine "
            f"({tmp}/base-ckpts) (did you mean '{tmp}/base-ckpt'?); give an existing path, or `base.generate` to "
            "make it")


def data_path_missing(tmp: Path, root: Path) -> tuple[Path, str, str]:
    exp = demo(tmp, root, 'path: "{state_dir}/data/demo"', f"path: {tmp}/nowhere/demo")
    exp = edited(exp, exp, "  generate: {tokens: 131072, seed: 7}\n", "")
    return (exp, "nowhere/demo", f"data.path: data '{tmp}/nowhere/demo' does not exist on this machine "
            f"({tmp}/nowhere/demo); its directory {tmp}/nowhere does not exist; give an existing path, or "
            "`data.generate` to make it")


def diagnose_step(tmp: Path, root: Path) -> tuple[Path, str, str]:
    exp = demo(tmp, root, "conversion:\n", "diagnose: {step: 99}\nconversion:\n")
    return (exp, "diagnose: {step: 99}", "diagnose.step: 99 is not a step of the trainings (training.steps: 30); "
            "choose a step from 1 to 30")


CASES: dict[str, Callable[[Path, Path], tuple[Path, str, str]]] = {
    "family": family_typo, "base path": base_path_missing, "data path": data_path_missing,
    "diagnose step": diagnose_step,
    "spec": spec_typo, "spec file": spec_file_typo, "flavour": flavour, "template": template_typo,
    "data prefix": data_prefix, "criteria file": criteria_file, "backend": backend_typo,
    "backend key": backend_key_typo, "conversion missing": conversion_missing,
    "unconverted format": unconverted_format, "distributed from hf": distributed_from_hf,
}


@pytest.mark.parametrize("case", CASES)
def test_a_name_that_does_not_resolve_is_refused_with_its_line_and_the_closest_name(
        case: str, tmp_path: Path, repo_root: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ALIGNFLOW_STATE_DIR", str(tmp_path / "state"))
    exp, fragment, message = CASES[case](tmp_path, repo_root)
    where = f"{exp}:{line_of(exp, fragment)}: "
    monkeypatch.setenv("COLUMNS", "1000")  # one line per problem, as a wide terminal shows it
    for command in ("validate", "preflight"):
        code, output = alignflow(capsys, monkeypatch, command, str(exp))
        assert code == 2, (command, output)
        assert where + message in output, (command, output)
    if case in ("spec file", "template", "criteria file"):  # the file meant is beside the one named
        close = {"spec file": "my-spec.yaml", "template": "templates/qwen35_dense.yaml",
                 "criteria file": "criteria.yaml"}[case]
        assert f"(did you mean '{close}'?)" in output


def test_a_criteria_file_is_read_into_the_experiment(tmp_path: Path, repo_root: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from alignflow.config import load_experiment

    (tmp_path / "criteria.yaml").write_text("criteria:\n  - {metric: lm_loss, statistic: me, threshold: 0.002}\n")
    exp = demo(tmp_path, repo_root, "conversion:\n", "criteria: criteria.yaml\nconversion:\n")
    loaded = load_experiment(exp)
    assert [(c.metric, c.statistic, c.threshold) for c in loaded.criteria] == [("lm_loss", "me", 0.002)]
    assert alignflow(capsys, monkeypatch, "validate", str(exp))[0] == 0


def test_a_key_that_is_part_of_a_longer_key_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n  gpu:\n    role: cuda\n    workdir: w\n    scheduler: slurm\n"
                     "    slurm: {partition: a, time: '1:00:00'}\n")
    code, output = alignflow(capsys, monkeypatch, "validate", str(hosts))
    assert code == 2
    assert re.search(rf"{re.escape(str(hosts))}:6: hosts\.gpu\.slurm\.time: unknown key \(did you mean "
                     r"'time_limit'\?\)", output), output
