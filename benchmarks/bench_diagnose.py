"""How long `alignflow diagnose` takes on the demo's twin (issue 21: under 60 s on the 2-core machine).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_diagnose.py

Builds a converted checkpoint pair for the demo's model (a seeded twin, bf16, through the twin-moe spec), then
times, on two local hosts launched exactly as the pipeline launches them:
  baseline  both sides training the same one step without dumps (the cost diagnose cannot avoid)
  diagnose  run_diagnosis(step 1): both dumped steps, the fetch, the comparison and the report
and prints both, their ratio and the dump sizes.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from alignflow.config.experiment import load_experiment
from alignflow.config.hosts import Host
from alignflow.diagnose.core import Checkpoints, DataRef, run_diagnosis
from alignflow.transport import JobSpec, open_transport
from alignflow.twin.data import make_data

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.diagnose.conftest import make_checkpoints  # noqa: E402


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-diagnose-"))
    demo = load_experiment(ROOT / "experiments" / "demo.yaml")
    assert demo.data.generate is not None
    data = work / "data"  # an indexed dataset: data/demo.bin + data/demo.idx, as the demo generates it
    sha = make_data(data / demo.data.prefix, demo.data.generate.tokens, seed=demo.data.generate.seed)
    exp = demo.model_copy(update={"data": demo.data.model_copy(update={"path": str(data), "sha256": sha})})
    bf16, megatron = make_checkpoints(work / "ckpt")
    env = {"PYTHONPATH": str(ROOT), "GLOG_v": "3"}
    hosts = {side: Host(name=name, role=role, transport="local", workdir=str(work / name), python=sys.executable,
                        env=env) for side, name, role in (("npu", "ascend", "ascend"), ("gpu", "cuda", "cuda"))}
    transports = {side: open_transport(h) for side, h in hosts.items()}

    t0 = time.perf_counter()
    result = run_diagnosis(exp, checkpoints=Checkpoints(str(bf16), str(megatron)),
                           data=DataRef(str(data), str(data), sha),
                           transport=transports, out_dir=work / "out", step=1)
    diagnose_s = time.perf_counter() - t0

    # baseline: the same two commands, one step, no dumps
    from alignflow.backends import TrainSpec, render_training
    from alignflow.diagnose.core import fill_placeholders

    short = exp.model_copy(update={"training": exp.training.model_copy(update={"steps": 1})})
    t0 = time.perf_counter()
    handles = []
    for side, load in (("npu", str(bf16)), ("gpu", str(megatron))):
        t = transports[side]
        template = render_training(short, TrainSpec("bench", side, 1, f"{{in:data}}/{exp.data.prefix}", sha,
                                                    "{in:checkpoint}", None))
        out = str(t.path(f"artifacts/bench/{side}"))
        values = {"python": t.python(), "out": out, "in:data": str(data), "in:checkpoint": load}
        t.mkdir(out)
        for rel, text in template.files.items():
            t.write_text(f"{out}/{rel}", fill_placeholders(text, values))
        handles.append((t, t.launch(JobSpec([fill_placeholders(a, values) for a in template.argv], name=side,
                                            env=template.env, cwd=out, take_slot=True))))
    for t, h in handles:
        assert t.wait(h, poll_s=0.5).ok
    baseline_s = time.perf_counter() - t0

    d = result.diagnosis
    print(f"diagnose (demo twin, step 1): {diagnose_s:.1f} s  (target < 60 s) -> verdict {d.verdict}")
    print(f"baseline (both sides, 1 step, no dumps): {baseline_s:.1f} s")
    print(f"ratio diagnose / baseline: {diagnose_s / baseline_s:.2f}")
    print(f"dump sizes: npu {d.dump_bytes['npu'] / 1e6:.1f} MB, gpu {d.dump_bytes['gpu'] / 1e6:.1f} MB; "
          f"{len(d.rows)} module calls compared")


if __name__ == "__main__":
    main()
