"""torchrun and msrun command lines generated from the layout and the host (golden argv)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from alignflow.backends.commands import step_command
from alignflow.backends.launch import Layout, layout_for, msrun, torchrun
from alignflow.config.experiment import Experiment, load_experiment
from alignflow.config.hosts import Host
from alignflow.config.parallel import ParallelConfig
from alignflow.errors import ConfigError

DP2 = ParallelConfig(dp=2)


def _slurm_host(nodes: int, gpus: int) -> Host:
    return Host(name="h200", role="cuda", workdir="/w", scheduler="slurm",
                slurm={"partition": "gpu", "nodes": nodes, "gpus_per_node": gpus})


def test_one_process_is_the_plain_command_or_the_experiments_own_torchrun() -> None:
    layout = Layout(ParallelConfig())
    assert torchrun(layout, ["pretrain_gpt.py", "--x"]) == (["{python}", "pretrain_gpt.py", "--x"], {})
    argv, _ = torchrun(layout, ["pretrain_gpt.py"], {"nproc_per_node": 1, "nnodes": 1, "master_port": 6000})
    assert argv == ["{python}", "-m", "torch.distributed.run", "--master_port", "6000", "--nnodes", "1",
                    "--nproc_per_node", "1", "pretrain_gpt.py"]


def test_one_node_several_processes_is_standalone_torchrun_with_rank_logs() -> None:
    argv, env = torchrun(layout_for(DP2, Host(name="g", role="cuda", workdir="/w", devices=2), side="gpu"),
                         ["pretrain_gpt.py", "--x"])
    assert argv == ["{python}", "-m", "torch.distributed.run", "--nproc_per_node", "2", "--nnodes", "1",
                    "--standalone", "--log_dir", "{out}/rank_logs", "--redirects", "3", "--tee", "3",
                    "pretrain_gpt.py", "--x"]
    assert env == {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${rank}]:"}


def test_several_slurm_nodes_run_one_torchrun_per_node_with_the_first_node_as_rendezvous() -> None:
    layout = layout_for(ParallelConfig(tp=8, dp=2), _slurm_host(2, 8), side="gpu")
    assert (layout.nodes, layout.per_node, layout.world) == (2, 8, 16)
    argv, _ = torchrun(layout, ["pretrain_gpt.py"], {"master_port": 6000})
    assert argv[:2] == ["bash", "-c"]
    script = argv[2]
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in script
    assert 'export PET_RDZV_ENDPOINT="$head:6000" PET_RDZV_ID="$SLURM_JOB_ID"' in script
    assert 'exec srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=1 "$@"' in script
    assert argv[3:] == ["alignflow-launch", "{python}", "-m", "torch.distributed.run", "--nproc_per_node", "8",
                        "--nnodes", "2", "--rdzv_backend", "c10d", "--log_dir", "{out}/rank_logs", "--redirects",
                        "3", "--tee", "3", "pretrain_gpt.py"]


@pytest.mark.integration
def test_the_slurm_wrapper_passes_the_launcher_through_srun_literally(tmp_path: Path) -> None:
    """Run the generated wrapper with stand-ins for scontrol and srun (no allocation here): srun gets the launcher
    argv unchanged and the rendezvous endpoint of the first node."""
    layout = layout_for(ParallelConfig(dp=4), _slurm_host(2, 2), side="gpu")
    argv, _ = torchrun(layout, ["pretrain_gpt.py", "--data-path", "a b"])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf 'node-a\\nnode-b\\n'\n")
    (bin_dir / "srun").write_text('#!/bin/sh\nprintf "%s|" "$PET_RDZV_ENDPOINT" "$PET_RDZV_ID" "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_JOB_NUM_NODES": "2",
           "SLURM_JOB_ID": "42"}
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    assert out.split("|")[:6] == ["node-a:29500", "42", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                                  "{python}"]
    assert out.endswith("pretrain_gpt.py|--data-path|a b|")


def test_msrun_gets_worker_counts_from_the_layout_and_the_last_ranks_log_is_parsed() -> None:
    argv, log = msrun(layout_for(ParallelConfig(pp=2, dp=2), Host(name="n", role="ascend", workdir="/w", devices=8),
                                 side="npu"), ["run_mindformer.py", "--config", "c.yaml"])
    assert argv == ["msrun", "--worker_num", "4", "--local_worker_num", "4", "--master_port", "8118", "--join",
                    "True", "--log_dir", "{out}/msrun_log", "run_mindformer.py", "--config", "c.yaml"]
    assert log == "msrun_log/worker_3.log"
    argv, log = msrun(layout_for(ParallelConfig(dp=16), _slurm_host(2, 8), side="npu"), ["run_mindformer.py"])
    assert argv[:2] == ["bash", "-c"]
    assert '--node_rank="$SLURM_NODEID"' in argv[2]
    assert argv[4:9] == ["msrun", "--worker_num", "16", "--local_worker_num", "8"]
    assert log == "msrun_log/worker_15.log"


def test_a_launcher_option_that_contradicts_the_layout_is_refused() -> None:
    layout = Layout(DP2, 1, 2)
    with pytest.raises(ConfigError, match=r"gpu\.torchrun option nproc_per_node=4 contradicts the layout"):
        torchrun(layout, ["x.py"], {"nproc_per_node": 4})
    with pytest.raises(ConfigError, match=r"npu\.msrun option worker_num=8 contradicts"):
        msrun(layout, ["x.py"], {"worker_num": 8})


def test_a_layout_larger_than_the_host_is_refused_naming_both() -> None:
    with pytest.raises(ConfigError, match="needs 2 per node on host g, which has 1"):
        layout_for(DP2, Host(name="g", role="cuda", workdir="/w"), side="gpu")
    with pytest.raises(ConfigError, match="cannot spread evenly over host h200's 2 nodes"):
        layout_for(ParallelConfig(dp=3), _slurm_host(2, 8), side="gpu")


@pytest.fixture
def demo(repo_root: Path) -> Experiment:
    return load_experiment(repo_root / "experiments" / "demo.yaml")


def test_the_twins_gpu_training_runs_under_torchrun_on_a_two_device_host(demo: Experiment) -> None:
    exp = demo.model_copy(update={"gpu": demo.gpu.model_copy(update={"parallel": DP2})})
    host = Host(name="cuda", role="cuda", workdir="/w", devices=2)
    argv = step_command(exp, "gpu_train", data_sha256="", host=host).template.argv
    assert argv[:10] == ("{python}", "-m", "torch.distributed.run", "--nproc_per_node", "2", "--nnodes", "1",
                         "--standalone", "--log_dir", "{out}/rank_logs")
    assert argv[13:17] == ("3", "-m", "alignflow.twin.torch_train", "--transformer-impl")
    assert step_command(demo, "gpu_train", data_sha256="", host=host).template.argv[:3] == (
        "{python}", "-m", "alignflow.twin.torch_train")  # one process: no launcher


def test_the_twins_limits_are_render_errors_not_job_failures(demo: Experiment) -> None:
    with pytest.raises(ConfigError, match="the PyTorch twin has tensor, pipeline and data parallelism, not expert"):
        step_command(demo.model_copy(update={"gpu": demo.gpu.model_copy(update={"parallel": ParallelConfig(ep=2,
                                                                                                           dp=2)})}),
                     "gpu_train", data_sha256="")
    with pytest.raises(ConfigError, match="the MindSpore twin is data-parallel only"):
        step_command(demo.model_copy(update={"npu": demo.npu.model_copy(update={"parallel": ParallelConfig(tp=2)})}),
                     "npu_reload_train", data_sha256="")
    dp = step_command(demo.model_copy(update={"npu": demo.npu.model_copy(update={"parallel": DP2})}),
                      "npu_reload_train", data_sha256="").template
    assert dp.argv[:11] == ("msrun", "--worker_num", "2", "--local_worker_num", "2", "--master_port", "8118",
                            "--join", "True", "--log_dir", "{out}/msrun_log")
    assert dp.argv[11:] == ("{out}/mindspore_train.py", "--config", "{out}/config.yaml", "--mode", "1")
    assert dp.log == "msrun_log/worker_1.log"
    assert "from alignflow.twin.mindspore_train import main" in dp.files["mindspore_train.py"]


def test_a_layout_whose_global_batch_does_not_fit_is_refused_at_load(repo_root: Path, tmp_path: Path) -> None:
    text = (repo_root / "experiments" / "demo.yaml").read_text().replace(
        "conversion:", "gpu:\n  parallel: {dp: 2}\nconversion:")
    path = tmp_path / "demo.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="global_batch_size 4 is not a multiple of micro_batch_size 4 x dp 2"):
        load_experiment(path)


def test_a_failed_torchrun_job_names_the_rank_that_died_first() -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from alignflow.backends.launch import failed_rank

    # torchrun's own summary (its formatter, as `torch.distributed.run` prints it when a worker fails)
    failures = {2: ProcessFailure(local_rank=2, pid=123, exitcode=-9, error_file="/nonexistent"),
                3: ProcessFailure(local_rank=3, pid=124, exitcode=1, error_file="/nonexistent")}
    summary = ChildFailedError("alignflow.twin.torch_train", failures).format_msg()
    got = failed_rank("Traceback (most recent call last):\n...\n" + summary)
    assert got is not None
    assert got.startswith("rank 2 (local rank 2) on host ")
    assert got.endswith("failed first: exit code -9 (SIGKILL)")
    assert failed_rank("RuntimeError: something else\n") is None
