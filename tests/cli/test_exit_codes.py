"""Usage and configuration mistakes: exit 2, a message naming the closest valid name, and never a Prefect start.

Every test runs the real command line (`python -m alignflow`, so `main()` chooses the exit code) in a fresh state
dir; none of these may get far enough to record a run or start a server (the state dir stays without a store).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration  # real processes: the command line, hosts' commands


@pytest.fixture
def cli(repo_root: Path, tmp_path: Path, subprocess_env: dict[str, str]):  # type: ignore[no-untyped-def]
    state = tmp_path / "state"
    env = {k: v for k, v in subprocess_env.items() if not k.startswith("PREFECT_API")}
    env.update(ALIGNFLOW_STATE_DIR=str(state), PREFECT_HOME=str(tmp_path / "prefect-home"))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "-m", "alignflow", *args], cwd=repo_root, env=env,
                              capture_output=True, text=True, timeout=300, check=False)
        assert not (state / "store.sqlite").exists(), "a usage error recorded something"
        assert not (state / "prefect").exists(), "a usage error started a Prefect server"
        return done

    return run


@pytest.mark.parametrize(("args", "message"), [
    (["run", "demoo"], "unknown experiment 'demoo' (did you mean 'demo'?); experiments/ has: demo"),
    (["run", "demo", "--only", "convert_megatorn"],
     "unknown step 'convert_megatorn' (did you mean 'convert_megatron'?)"),
    (["run", "demo", "--from", "npu_base_trian"], "(did you mean 'npu_base_train'?)"),
    (["run", "demo", "--force", "compare", "--force", "gpu_trian"], "(did you mean 'gpu_train'?)"),
    (["run", "demo", "--hosts", "nope.yaml"], "nope.yaml"),
    (["run", "demo", "--quiet", "--verbose"], "--quiet and --verbose exclude each other"),
    (["rerun", "abcd", "--step", "convert_bf1"], "(did you mean 'convert_bf16'?)"),
    (["preflight", "demoo"], "did you mean 'demo'?"),
    (["run", "demo", "--only", "bogus"],
     "unknown step 'bogus'; demo's steps are: npu_base_train, convert_bf16, convert_megatron, early_gate, gpu_train, "
     "npu_reload_train, compare, diagnose"),
    (["run", "demo", "--force", "convert_hf"], "demo has no step 'convert_hf'"),
])
def test_usage_mistakes_exit_2_with_the_closest_name(cli, args: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    done = cli(*args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_a_mistyped_yaml_key_names_the_line_and_the_key_meant(cli, repo_root: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    doc = yaml.safe_load((repo_root / "experiments" / "demo.yaml").read_text())
    doc["training"]["base_stepz"] = doc["training"].pop("base_steps")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = cli("validate", str(bad))
    assert done.returncode == 2
    assert f"{bad}:" in done.stderr
    assert "training.base_stepz: unknown key (did you mean 'base_steps'?)" in done.stderr
    ran = cli("run", str(bad))
    assert ran.returncode == 2
    assert "base_stepz" in ran.stderr


def test_an_unknown_host_in_an_experiment_names_the_closest_host(cli, repo_root: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    doc = yaml.safe_load((repo_root / "experiments" / "demo.yaml").read_text())
    doc["hosts"] = {"ascend": "ascnd"}
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = cli("run", str(exp))
    assert done.returncode == 2
    assert "hosts.ascend: unknown host 'ascnd' (did you mean 'ascend'?)" in done.stderr


def test_a_run_against_a_host_whose_name_does_not_resolve_is_refused_before_anything_starts(  # type: ignore[no-untyped-def]
        cli, repo_root: Path, tmp_path: Path) -> None:
    """Issue 45's acceptance: hosts.ssh.example.yaml with npu-a at `npu-nonexistent.invalid`. The run started a
    Prefect server, recorded a run and ended `error` at its first step, 12 to 43 s later; the name is looked up
    first, and the command is refused as a configuration error (the fixture: no store, no Prefect)."""
    example = (repo_root / "hosts.ssh.example.yaml").read_text()
    assert "address: 192.0.2.10" in example
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(example.replace("address: 192.0.2.10", "address: npu-nonexistent.invalid"))
    line = 1 + hosts.read_text().splitlines().index("    address: npu-nonexistent.invalid")
    started = time.monotonic()
    done = cli("run", "experiments/demo.yaml", "--hosts", str(hosts))
    assert time.monotonic() - started < 15
    assert done.returncode == 2, done.stderr
    assert (f"{hosts}:{line}: hosts.npu-a.address: cannot resolve 'npu-nonexistent.invalid': a `.invalid` name never "
            "resolves (RFC 6761)") in done.stderr
    assert f"`alignflow doctor --hosts {hosts}` shows it (check: npu-a reachable)" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("args", [["show", "ffffffff"], ["history", "ffffffff"], ["rerun", "ffffffff"],
                                  ["cancel", "ffffffff"], ["show", "not-an-id"]])
def test_an_unknown_run_is_a_usage_error(cli, args: list[str]) -> None:  # type: ignore[no-untyped-def]
    done = cli(*args)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr


def test_version_completion_and_flags_shown_as_flags(cli) -> None:  # type: ignore[no-untyped-def]
    version = cli("--version")
    assert version.returncode == 0
    assert version.stdout.startswith("alignflow ")
    helped = cli("--help")
    assert "--install-completion" in helped.stdout
    for command in ("run", "history", "doctor"):
        text = cli(command, "--help").stdout
        assert "--json" in text
        assert "<bool>" not in text


def test_a_mistyped_spec_is_refused_by_validate_preflight_and_run_before_anything_starts(  # type: ignore[no-untyped-def]
        cli, repo_root: Path, tmp_path: Path) -> None:
    # issue 40: `conversion.spec: twin-mo` passed validate and preflight, then failed convert_megatron as a run
    text = (repo_root / "experiments" / "demo.yaml").read_text()
    exp = tmp_path / "exp.yaml"
    exp.write_text(text.replace("spec: twin-moe", "spec: twin-mo"))
    line = next(i for i, t in enumerate(exp.read_text().splitlines(), 1) if "spec: twin-mo" in t)
    for args in (["validate", str(exp)], ["preflight", str(exp)], ["run", str(exp)]):
        done = cli(*args)  # the fixture asserts that nothing was recorded and no Prefect server started
        assert done.returncode == 2, (args, done.stderr)
        assert (f"{exp}:{line}: conversion.spec: unknown conversion spec 'twin-mo' (did you mean 'twin-moe'?)"
                in " ".join(done.stderr.split())), (args, done.stderr)
