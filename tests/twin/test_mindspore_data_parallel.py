"""The MindSpore twin under msrun: two data-parallel ranks on MindSpore's CPU backend train as one process does.

MindSpore's CPU build runs msrun's workers, `mindspore.communication.init()` and PyNative AllReduce; what it does
not run is an operator-sharded (semi-auto parallel) graph ("Invalid backend: CPU"), so the twin's NPU side has
data parallelism only. Same seed, same global batch (4 = micro batch 2 x dp 2): the logged lines equal the
one-process run's within one printed unit (the gradient sums of two ranks round differently).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from alignflow.backends.quoting import yaml_text
from alignflow.config.experiment import load_experiment
from alignflow.logs import parse_log
from alignflow.twin.data import make_data
from alignflow.twin.render import mindformers_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest.importorskip("mindspore")


def test_two_msrun_ranks_log_what_one_process_logs(repo_root: Path, tmp_path: Path,
                                                   subprocess_env: dict[str, str]) -> None:
    exp = load_experiment(repo_root / "tests" / "data" / "flow" / "tiny.yaml")
    training = exp.training.model_copy(update={"micro_batch_size": 2, "global_batch_size": 4})
    sha = make_data(tmp_path / "data" / "tiny", 20000, 7)
    config = mindformers_config(exp.model, training, data_path=str(tmp_path / "data" / "tiny"), data_sha256=sha,
                                load_path=None, save_path=None, steps=3, jit=False)
    (tmp_path / "config.yaml").write_text(yaml_text(config))
    (tmp_path / "launch.py").write_text("from alignflow.twin.mindspore_train import main\nraise SystemExit(main())\n")
    args = ["--config", str(tmp_path / "config.yaml"), "--mode", "1"]
    # msrun runs `python <script>` with the PATH's python: this interpreter's directory first
    env = {**subprocess_env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{subprocess_env['PATH']}"}
    one = subprocess.run([sys.executable, "-m", "alignflow.twin.mindspore_train", *args], env=env,
                         capture_output=True, text=True, timeout=900, check=False)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run([str(Path(sys.executable).parent / "msrun"), "--worker_num", "2", "--local_worker_num", "2",
                          "--master_port", "8139", "--log_dir", str(tmp_path / "msrun_log"), "--join", "True",
                          str(tmp_path / "launch.py"), *args], env=env, capture_output=True, text=True,
                         timeout=900, check=False)
    logs = [tmp_path / "msrun_log" / f"worker_{r}.log" for r in (0, 1)]
    assert two.returncode == 0, (two.stdout[-2000:], [p.read_text()[-2000:] for p in logs if p.is_file()])
    single = parse_log(one.stdout.splitlines(), fmt="mindformers")
    assert list(single.frame.index) == [1, 2, 3]
    for log in logs:
        ranked = parse_log(log.read_text().splitlines(), fmt="mindformers")
        assert list(ranked.frame.index) == [1, 2, 3]
        for column in ("lm_loss", "mtp_1_loss", "load_balancing_loss"):
            resolution = single.resolution[column]
            for step in single.frame.index:
                a, b = float(single.frame.loc[step, column]), float(ranked.frame.loc[step, column])
                assert abs(a - b) <= resolution.quantum(a) * 1.0001, (log.name, column, step, a, b)
