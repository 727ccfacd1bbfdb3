"""A GPU host without Megatron-LM at `gpu.entry` is a preflight error, found before step 1 — not a gpu_train
failure after the NPU base training and both conversions.

The probe runs for real over the local transport with this machine's Python. The "checkout" is a directory laid
out as Megatron-LM's (`pretrain_gpt.py`, `megatron/training/arguments.py`, `megatron/core/package_info.py` with
the MAJOR/MINOR/PATCH lines of core_v0.19.0): the probe reads files, it does not import Megatron.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from alignflow.config import load_experiment, load_hosts
from alignflow.config.placement import place
from alignflow.preflight import check_experiment
from alignflow.preflight.gpu_host import check_megatron_hosts
from alignflow.preflight.sides import SIDE_STEPS
from alignflow.runner.run import execute_pipeline, start_run
from alignflow.store import Store
from alignflow.transport import open_transport

pytestmark = pytest.mark.integration  # probes a host through a real local transport (processes)


def checkout(root: Path, minor: int = 19) -> Path:
    (root / "megatron" / "training").mkdir(parents=True)
    (root / "megatron" / "core").mkdir(parents=True)
    (root / "megatron" / "training" / "arguments.py").write_text("# Megatron-LM's argument parser\n")
    (root / "megatron" / "core" / "package_info.py").write_text(f"MAJOR = 0\nMINOR = {minor}\nPATCH = 1\n")
    (root / "pretrain_gpt.py").write_text("# pretrain_gpt\n")
    return root / "pretrain_gpt.py"


def experiment(repo_root: Path, tmp_path: Path, entry: str, extensions: list[str] | None = None,
               **gpu: str) -> Path:
    exp = yaml.safe_load((repo_root / "experiments" / "demo-megatron.yaml").read_text())
    exp["gpu"]["entry"] = entry
    exp["gpu"].update(gpu)
    exp["data"]["path"] = str(tmp_path / "data")
    hosts = {name: {"role": name, "transport": "local", "workdir": str(tmp_path / "hosts" / name)}
             for name in ("ascend", "cpu", "cuda")}
    if extensions is not None:
        hosts["cuda"]["cuda_extensions"] = extensions
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump({"hosts": hosts}))
    path = tmp_path / "demo-megatron.yaml"
    path.write_text(yaml.safe_dump(exp, sort_keys=False))
    return path


def problems(path: Path) -> list[str]:
    inventory = load_hosts(path.parent / "hosts.yaml")
    experiment = load_experiment(path, inventory)
    placement = place(experiment, inventory, steps=SIDE_STEPS)
    return check_megatron_hosts(experiment, placement, open_transport).get("gpu", [])


def test_a_megatron_checkout_of_the_declared_version_passes(repo_root: Path, tmp_path: Path) -> None:
    entry = checkout(tmp_path / "Megatron-LM")
    assert problems(experiment(repo_root, tmp_path, str(entry))) == []


def test_no_megatron_at_gpu_entry_is_named(repo_root: Path, tmp_path: Path) -> None:
    (found,) = problems(experiment(repo_root, tmp_path, str(tmp_path / "nowhere" / "pretrain_gpt.py")))
    assert found == (f"host cuda: gpu.entry {tmp_path}/nowhere/pretrain_gpt.py does not exist: no Megatron-LM "
                     "pretrain_gpt.py there (clone Megatron-LM at core_v0.19.0 there, or point gpu.entry at the "
                     "checkout's pretrain_gpt.py)")


@pytest.mark.parametrize(("setup", "message"), [
    ("version", "is megatron-core 0.16.1, but gpu.megatron_version is 0.19"),
    ("not-a-checkout", "is not in a Megatron-LM checkout (no megatron/training/arguments.py beside it)"),
    ("extension", "its Python has no apex (declared in cuda_extensions (gpu.extensions))"),
    ("relative", "must be an absolute path"),
    ("patch", "is megatron-core 0.19.1, but gpu.megatron_version is 0.19.0"),
    ("te", "its Python has no transformer_engine (gpu.transformer_impl transformer_engine)"),
])
def test_each_way_the_host_differs_from_the_experiment_is_named(repo_root: Path, tmp_path: Path, setup: str,
                                                                message: str) -> None:
    entry = checkout(tmp_path / "Megatron-LM", minor=16 if setup == "version" else 19)
    if setup == "not-a-checkout":
        (tmp_path / "Megatron-LM" / "megatron" / "training" / "arguments.py").unlink()
    where = "Megatron-LM/pretrain_gpt.py" if setup == "relative" else str(entry)
    gpu = {"patch": {"megatron_version": "0.19.0"}, "te": {"transformer_impl": "transformer_engine"}}.get(setup, {})
    path = experiment(repo_root, tmp_path, where, extensions=["apex"] if setup == "extension" else None, **gpu)
    found = problems(path)
    assert any(message in p for p in found), found


def test_the_cli_probes_the_host_on_request(repo_root: Path, tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    import subprocess
    import sys

    path = experiment(repo_root, tmp_path, "/nonexistent/Megatron-LM/pretrain_gpt.py")
    base = [sys.executable, "-m", "alignflow", "preflight", str(path), "--hosts", str(tmp_path / "hosts.yaml")]
    quiet = subprocess.run(base, capture_output=True, text=True, env=subprocess_env, timeout=300, check=False)
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr  # no host contacted without --check-hosts
    probed = subprocess.run([*base, "--check-hosts", "--json"], capture_output=True, text=True, env=subprocess_env,
                            timeout=300, check=False)
    assert probed.returncode == 1
    (finding,) = [f for f in json.loads(probed.stdout)["findings"] if f["status"] == "mismatch"]
    assert finding["setting"] == "megatron.host"
    assert "gpu.entry /nonexistent/Megatron-LM/pretrain_gpt.py does not exist" in finding["gpu"]["source"]


def test_a_run_on_a_host_without_megatron_fails_at_preflight_with_nothing_run(
        repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(repo_root), os.environ.get("PYTHONPATH")])))
    path = experiment(repo_root, tmp_path, "/nonexistent/Megatron-LM/pretrain_gpt.py")
    state = tmp_path / "state"
    with Store.open(state_dir=state) as store:
        run_id = start_run(path, tmp_path / "hosts.yaml", store=store, state_dir=state)
        record = execute_pipeline(run_id, store=store, state_dir=state, transport_factory=open_transport)
        steps = {s.step: s.status for s in store.steps(run_id)}
    assert (record.status, record.verdict) == ("error", None)  # the environment, not the alignment
    assert "Megatron-LM at the side's entry on its host: GPU refused (host cuda: gpu.entry " in (record.error or "")
    assert set(steps.values()) == {"skipped"}
    assert not (tmp_path / "data").exists()  # not even the data was generated


def test_without_a_host_probe_the_report_says_not_checked(repo_root: Path, tmp_path: Path) -> None:
    path = experiment(repo_root, tmp_path, "/nonexistent/pretrain_gpt.py")
    report = check_experiment(load_experiment(path))
    (host,) = [f for f in report.findings if f.setting == "megatron.host"]
    assert host.status == "ok"
    assert host.gpu is not None
    assert host.gpu.value == "not checked"


@pytest.mark.parametrize(("backend", "refused"), [(None, True), ("auto", True), ("fused", True), ("unfused", False),
                                                  ("flash", False)])
def test_a_te_and_cudnn_pair_known_to_fail_in_fused_attention_is_refused_unless_the_backend_avoids_it(
        backend: str | None, refused: bool) -> None:
    from alignflow.preflight.gpu_host import attention_kernel_problems

    found = {"te_version": "2.17.1", "cudnn": 91900}
    out = attention_kernel_problems(found, where="host gpu-a", backend=backend, side="gpu")
    assert bool(out) is refused
    if refused:
        assert out == [f"host gpu-a: Transformer Engine 2.17.1 with cuDNN 91900 fails in fused attention (cuDNN "
                       "Error: ... CUDNN_STATUS_BAD_PARAM in fused_attn_bwd, the first backward of qwen35_dense and "
                       f"qwen35_moe on an H100 (issue 50)), and --attention-backend {backend or 'auto'} may pick it: "
                       "set gpu.attention_backend: unfused"]
    assert attention_kernel_problems({"te_version": "2.17.1", "cudnn": 91000}, where="h", backend=backend,
                                     side="gpu") == []


def test_dsa_on_a_host_without_fast_hadamard_transform_is_named(repo_root: Path, tmp_path: Path) -> None:
    """DSA's indexer calls fast_hadamard_transform on every forward (dsa_indexer_rotate_activation defaults to true)."""
    entry = checkout(tmp_path / "Megatron-LM")
    exp = yaml.safe_load((repo_root / "experiments" / "glm52_mini.yaml").read_text())
    exp["gpu"]["entry"] = str(entry)
    exp["data"] = {"path": str(tmp_path / "data"), "prefix": "glm52_mini_text_document"}
    (tmp_path / "data").mkdir()  # validate refuses a data path the controller lacks (issue 45)
    for suffix in (".bin", ".idx"):
        (tmp_path / "data" / f"glm52_mini_text_document{suffix}").write_bytes(b"")
    exp["npu"]["template"] = str(repo_root / "experiments" / "templates" / "glm52_mini.yaml")
    exp["hosts"] = {"ascend": "ascend", "cpu": "cpu", "cuda": "cuda"}
    hosts = {name: {"role": name, "transport": "local", "workdir": str(tmp_path / "hosts" / name)}
             for name in ("ascend", "cpu", "cuda")}
    hosts["cuda"]["cuda_extensions"] = ["transformer_engine"]
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump({"hosts": hosts}))
    path = tmp_path / "glm52_mini.yaml"
    path.write_text(yaml.safe_dump(exp, sort_keys=False))
    found = problems(path)
    assert any("its Python has no fast_hadamard_transform" in p for p in found), found
