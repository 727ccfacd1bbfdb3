"""Megatron on either side: on an Ascend host through MindSpeed — MindSpeed-LLM's own `pretrain_gpt.py` (which
imports `mindspeed_llm.megatron_adaptor` before Megatron), or Megatron-LM's with `mindspeed.megatron_adaptor`
imported first by a launcher the step writes —, with MindSpeed's determinism switch, HCCL's deterministic
collectives and `ASCEND_RT_VISIBLE_DEVICES`; preflight reads its Megatron flags like the GPU side's."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
import yaml

from alignflow.backends import pipeline_for
from alignflow.backends.commands import step_command
from alignflow.backends.megatron import ADAPTOR_LAUNCHER
from alignflow.config import load_experiment, load_hosts
from alignflow.errors import ConfigError
from alignflow.preflight import check_experiment
from alignflow.runner.placeholders import fill

MINDSPEED_LLM = "/opt/MindSpeed-LLM/pretrain_gpt.py"
MEGATRON_LM = "/opt/Megatron-LM/pretrain_gpt.py"


def _experiment(repo_root: Path, tmp_path: Path, npu: dict[str, object], **edits: object) -> Path:
    """demo-megatron with a Megatron side on the NPU host too (no conversion: both load Megatron checkpoints)."""
    data = yaml.safe_load((repo_root / "experiments" / "demo-megatron.yaml").read_text())
    data["npu"] = {"kind": "megatron", "megatron_version": "0.19", **npu}
    data["training"]["deterministic"] = True
    data.update(edits)
    path = tmp_path / "megatron-both.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _hosts(tmp_path: Path) -> Path:
    hosts = {name: {"role": name, "transport": "local", "workdir": f"/w/{name}"} for name in ("ascend", "cpu", "cuda")}
    hosts["ascend"]["env"] = {"HCCL_DETERMINISTIC": "true"}
    hosts["cuda"]["env"] = {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0", "NCCL_ALGO": "Ring",
                            "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": hosts}))
    return path


def test_mindspeed_llm_on_the_npu_host_renders_megatrons_flags_with_npu_determinism(
        repo_root: Path, tmp_path: Path) -> None:
    exp = load_experiment(_experiment(repo_root, tmp_path, {"entry": MINDSPEED_LLM, "devices": [4, 5]}))
    assert [s.name for s in pipeline_for(exp).steps if s.converts] == []  # Megatron on both sides: no conversion
    npu = step_command(exp, "npu_reload_train", data_sha256="ab" * 32).template
    gpu = step_command(exp, "gpu_train", data_sha256="ab" * 32).template
    assert MINDSPEED_LLM in npu.argv
    assert "--use-deter-comp" in npu.argv  # MindSpeed-LLM's switch ...
    assert "--deterministic-mode" not in npu.argv  # ... not Megatron's, which checks CUDA's NCCL/NVTE settings
    assert npu.env["HCCL_DETERMINISTIC"] == "true"
    assert npu.env["LCCL_DETERMINISTIC"] == "1"
    assert npu.env["ASCEND_RT_VISIBLE_DEVICES"] == "4,5"
    assert "NCCL_ALGO" not in npu.env
    assert "--deterministic-mode" in gpu.argv
    assert gpu.env["NCCL_ALGO"] == "Ring"
    # every other flag is the same on both sides: one model, one schedule, one data order
    strip = {"--use-deter-comp", "--deterministic-mode"}
    assert [a for a in npu.argv[npu.argv.index(MINDSPEED_LLM) + 1:] if a not in strip] == \
        [a for a in gpu.argv[gpu.argv.index(MEGATRON_LM) + 1:] if a not in strip]
    assert npu.argv[npu.argv.index("--load") + 1] == gpu.argv[gpu.argv.index("--load") + 1] == "{in:base_ckpt}"


def test_a_plain_megatron_entry_on_the_npu_gets_mindspeeds_adaptor_imported_first(
        repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exp = load_experiment(_experiment(repo_root, tmp_path, {"entry": str(tmp_path / "Megatron-LM" / "pretrain_gpt.py"),
                                                            "adaptor": "mindspeed.megatron_adaptor"}))
    template = step_command(exp, "npu_reload_train", data_sha256="").template
    assert "--npu-deterministic" in template.argv  # MindSpeed core's switch
    launcher = "{out}/" + ADAPTOR_LAUNCHER
    assert template.argv[1] == launcher
    # run the rendered launcher as the job would: the adaptor is imported before the entry, which gets its flags
    out = tmp_path / "out"
    out.mkdir()
    (out / ADAPTOR_LAUNCHER).write_text(fill(template.files[ADAPTOR_LAUNCHER], {"out": str(out)}))
    (tmp_path / "Megatron-LM").mkdir()
    (tmp_path / "Megatron-LM" / "pretrain_gpt.py").write_text(
        "import sys\nimport launch_order\nlaunch_order.seen.append(('entry', __name__, sys.argv[0], sys.argv[1:]))\n")
    (tmp_path / "mindspeed").mkdir()
    (tmp_path / "mindspeed" / "__init__.py").write_text("")
    (tmp_path / "mindspeed" / "megatron_adaptor.py").write_text(
        "import launch_order\nlaunch_order.seen.append(('adaptor',))\n")
    (tmp_path / "launch_order.py").write_text("seen = []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "argv", [str(out / ADAPTOR_LAUNCHER), "--num-layers", "4"])
    for name in ("mindspeed", "mindspeed.megatron_adaptor", "launch_order"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    runpy.run_path(str(out / ADAPTOR_LAUNCHER), run_name="__main__")
    entry = str(tmp_path / "Megatron-LM" / "pretrain_gpt.py")
    assert sys.modules["launch_order"].seen == [("adaptor",), ("entry", "__main__", entry, ["--num-layers", "4"])]


def test_an_adaptor_on_a_gpu_host_is_refused(repo_root: Path, tmp_path: Path) -> None:
    data = yaml.safe_load((repo_root / "experiments" / "demo-megatron.yaml").read_text())
    data["gpu"]["adaptor"] = "mindspeed.megatron_adaptor"
    path = tmp_path / "gpu-adaptor.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError, match=r"gpu.adaptor mindspeed.megatron_adaptor: an adaptor is for an Ascend host"):
        step_command(load_experiment(path), "gpu_train", data_sha256="")


def test_preflight_reads_megatron_flags_on_both_sides_and_each_hosts_determinism(
        repo_root: Path, tmp_path: Path) -> None:
    inventory = load_hosts(_hosts(tmp_path))
    path = _experiment(repo_root, tmp_path, {"entry": MINDSPEED_LLM})
    report = check_experiment(load_experiment(path, inventory), inventory=inventory)
    assert report.ok, report.summary()
    found = {f.setting: f for f in report.findings}
    assert (found["det.hccl"].npu is not None, found["det.hccl"].gpu) == (True, None)  # an Ascend host's
    assert (found["det.nvte"].gpu is not None, found["det.nvte"].npu) == (True, None)  # a GPU host's
    flags = found["megatron.flags"]
    assert flags.gpu is not None
    assert flags.gpu.value == "accepted"
    assert flags.npu is not None
    assert flags.npu.value == "not checked"
    assert "MindSpeed on an NPU host" in flags.npu.source
    seed = _experiment(repo_root, tmp_path, {"entry": MINDSPEED_LLM, "extra_args": ["--seed", "42"]})
    mismatches = {f.setting for f in check_experiment(load_experiment(seed, inventory), inventory=inventory).mismatches}
    assert mismatches == {"data.seed", "train.init_seed"}


@pytest.mark.integration  # probes the host through a real local transport (a process with this machine's Python)
def test_the_npu_host_probe_names_what_mindspeed_needs(repo_root: Path, tmp_path: Path) -> None:
    from alignflow.config.placement import place
    from alignflow.preflight.gpu_host import check_megatron_hosts
    from alignflow.preflight.sides import SIDE_STEPS
    from alignflow.transport import open_transport
    from tests.preflight.test_gpu_host import checkout

    entry = checkout(tmp_path / "MindSpeed-LLM")  # a Megatron tree beside it, as MindSpeed-LLM's install puts one
    hosts = {name: {"role": name, "transport": "local", "workdir": str(tmp_path / "hosts" / name)}
             for name in ("ascend", "cpu", "cuda")}
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump({"hosts": hosts}))
    inventory = load_hosts(tmp_path / "hosts.yaml")
    exp = load_experiment(_experiment(repo_root, tmp_path, {"entry": str(entry)}), inventory)
    found = check_megatron_hosts(exp, place(exp, inventory, steps=SIDE_STEPS), open_transport)["npu"]
    assert any("its Python has no torch_npu (needed by pretrain_gpt.py)" in p for p in found), found
    assert any("its Python has no mindspeed_llm (MindSpeed, whose adaptor runs Megatron on the NPU)" in p
               for p in found), found
    assert any(f"{entry} does not import mindspeed_llm.megatron_adaptor" in p for p in found), found
    entry.write_text("import torch\nfrom mindspeed_llm import megatron_adaptor  # noqa: F401\n")
    found = check_megatron_hosts(exp, place(exp, inventory, steps=SIDE_STEPS), open_transport)["npu"]
    assert not any("does not import" in p for p in found), found
