"""Config models and loaders: committed files validate; broken files fail with file:line: key messages."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.cli.validate import default_paths
from alignflow.config import load_experiment, load_hosts, validate_file
from alignflow.errors import ConfigError


def test_every_committed_yaml_validates(repo_root: Path) -> None:
    paths = default_paths(repo_root)
    assert any(p.name == "hosts.yaml" for p in paths)
    assert any(p.parent.name == "experiments" for p in paths)
    for path in paths:
        validate_file(path)


def test_committed_experiments_reference_hosts_of_the_default_inventory(repo_root: Path) -> None:
    inventory = load_hosts(repo_root / "hosts.yaml")
    assert {h.role for h in inventory.hosts.values()} >= {"ascend", "cpu", "cuda"}
    assert all(h.transport == "local" for h in inventory.hosts.values())
    load_experiment(repo_root / "experiments" / "demo.yaml", inventory)


def test_relative_workdir_of_a_local_host_lives_under_the_state_dir(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "conf" / "hosts.yaml"
    f.parent.mkdir()
    f.write_text("hosts:\n  a: {role: cpu, workdir: hosts/a}\n  b: {role: cuda, workdir: ~/b}\n"
                 "  c: {role: ascend, transport: ssh, address: h, user: u, workdir: rel/c}\n")
    monkeypatch.setenv("ALIGNFLOW_STATE_DIR", str(tmp_path / "elsewhere"))
    inv = load_hosts(f)
    assert inv.get("a").workdir == str(tmp_path / "elsewhere" / "hosts" / "a")
    assert inv.get("b").workdir == "~/b"
    assert inv.get("c").workdir == "rel/c"  # a remote host's business
    assert load_hosts(f, state_dir=tmp_path / "given").get("a").workdir == str(tmp_path / "given" / "hosts" / "a")


def test_the_demo_keeps_its_hosts_workdirs_and_its_data_in_the_state_dir(repo_root: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALIGNFLOW_STATE_DIR", str(tmp_path / "x"))
    inv = load_hosts(repo_root / "hosts.yaml")
    assert {h.workdir for h in inv.hosts.values()} == {str(tmp_path / "x" / "hosts" / n) for n in inv.hosts}
    demo = load_experiment(repo_root / "experiments" / "demo.yaml", inv)
    assert demo.resolve_path(demo.data.path) == tmp_path / "x" / "data" / "demo"


def test_unknown_host_lookup_lists_the_alternatives(repo_root: Path) -> None:
    inv = load_hosts(repo_root / "hosts.yaml")
    with pytest.raises(ConfigError, match=r"unknown host 'gpu-b'; .* defines: ascend, cpu, cuda"):
        inv.get("gpu-b")
    with pytest.raises(ConfigError, match=r"unknown host 'cdua' \(did you mean 'cuda'\?\); .* defines"):
        inv.get("cdua")


HOSTS_OK = """\
hosts:
  npu-a:
    role: ascend
    transport: ssh
    address: 192.0.2.10
    user: alice
    workdir: /data/alignflow
  cpu-a: {role: cpu, transport: local, workdir: /tmp/x}
"""

# (file name, content, expected line, expected message fragment)
BROKEN_HOSTS = [
    ("malformed.yaml", "hosts:\n  a: {role: cpu, workdir: /x\n  b: 1\n", 3, "malformed YAML"),
    ("tab.yaml", "hosts:\n\ta: 1\n", 2, "malformed YAML"),
    ("wrong_type.yaml", HOSTS_OK.replace("    user: alice\n", "    user: alice\n    port: twenty\n"), 7,
     "hosts.npu-a.port: Input should be a valid integer"),
    ("unknown_key.yaml", HOSTS_OK.replace("    user: alice\n", "    user: alice\n    adress: x\n"), 7,
     "hosts.npu-a.adress: unknown key"),
    ("bad_role.yaml", HOSTS_OK.replace("role: ascend", "role: tpu"), 3, "hosts.npu-a.role: Input should be"),
    ("duplicate.yaml", HOSTS_OK + "  cpu-a: {role: cpu, workdir: /y}\n", 9, "hosts.cpu-a: duplicate key (first "
     "defined at line 8)"),
    ("ssh_no_user.yaml", HOSTS_OK.replace("    user: alice\n", ""), 2, "transport ssh needs user"),
    ("password.yaml", HOSTS_OK.replace("    user: alice\n", "    user: alice\n    password: hunter2\n"), 2,
     "passwords are not accepted"),
    ("missing_workdir.yaml", "hosts:\n  a:\n    role: cpu\n", 2, "hosts.a.workdir: required key is missing"),
    ("bad_env.yaml", "hosts:\n  a:\n    role: cpu\n    workdir: /x\n    env: {'A-B': '1'}\n", 5,
     "not a valid environment variable name"),
]


@pytest.mark.parametrize(("name", "content", "line", "fragment"), BROKEN_HOSTS, ids=[b[0] for b in BROKEN_HOSTS])
def test_broken_hosts_file_names_file_line_and_key(
    tmp_path: Path, name: str, content: str, line: int, fragment: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ConfigError) as info:
        load_hosts(path)
    rendered = str(info.value)
    assert f"{path}:{line}: " in rendered, rendered
    assert fragment in rendered, rendered


def test_missing_file_is_reported_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: file not found"):
        load_hosts(tmp_path / "nope.yaml")


def _experiment(repo_root: Path) -> str:
    return (repo_root / "experiments" / "demo.yaml").read_text()


def test_experiment_with_undefined_host_names_the_line_and_the_alternatives(repo_root: Path, tmp_path: Path) -> None:
    text = _experiment(repo_root).replace("data:\n", "hosts:\n  cuda: gpu-b\ndata:\n", 1)
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    line = text.splitlines().index("  cuda: gpu-b") + 1
    with pytest.raises(ConfigError) as info:
        load_experiment(path, load_hosts(repo_root / "hosts.yaml"))
    assert f"{path}:{line}: hosts.cuda: unknown host 'gpu-b'" in str(info.value)
    assert "defines: ascend, cpu, cuda" in str(info.value)


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ("  hidden_size: 128\n", "  hidden_size: 128\n  hiden: 1\n", "model.hiden: unknown key"),
        ("  steps: 30\n", "  steps: thirty\n", "training.steps: Input should be a valid integer"),
        ("    router_topk: 2\n", "    router_topk: 9\n", "router_topk 9 exceeds num_experts 4"),
        ("conversion:\n", "steps:\n  gpu_trian: {timeout_s: 5}\nconversion:\n", "unknown step(s) gpu_trian"),
        ("  sha256: 97ac", "  sha256: xyz\n  old: 97ac", "data.sha256: sha256 must be 64 hexadecimal characters"),
    ],
)
def test_broken_experiment_names_key(repo_root: Path, tmp_path: Path, old: str, new: str, fragment: str) -> None:
    text = _experiment(repo_root)
    assert old in text
    path = tmp_path / "exp.yaml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ConfigError) as info:
        load_experiment(path)
    assert fragment in str(info.value)
    assert f"{path}:" in str(info.value)


def test_cli_validate_exit_codes_and_messages(repo_root: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    good = runner.invoke(app, ["validate", str(repo_root / "hosts.yaml")])
    assert good.exit_code == 0, good.output
    bad = tmp_path / "hosts.yaml"
    bad.write_text(BROKEN_HOSTS[3][1])
    result = runner.invoke(app, ["validate", str(bad), str(repo_root / "hosts.yaml")])
    assert result.exit_code == 2  # a configuration error
    assert f"{bad}:7: hosts.npu-a.adress: unknown key" in result.output
