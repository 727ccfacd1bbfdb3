"""A run recorded the way the pipeline records one (steps, artifacts, both sides' metrics, snapshots, the
comparison), written into a real SQLite store: for the run view, `show`, `history` and the exports."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from alignflow.compare.comparison import compare
from alignflow.compare.report import write_report
from alignflow.config.criteria import default_criteria
from alignflow.logs import parse_log
from alignflow.store import ArtifactRef, Store
from tests.logfixtures import make_run, megatron_lines, mindformers_lines, perturbed
from tests.store.sample import TickingClock, run_params

DATA_SHA = "d" * 64
STEPS = 30
# What a run records of its experiment (`experiment` is the validated experiment file), in part.
CONFIG = {"experiment_path": "experiments/glm-mini.yaml", "experiment": {
    "name": "glm-mini", "data": {"path": "/w/data", "prefix": "data", "sha256": DATA_SHA},
    "model": {"family": "glm-mini", "num_layers": 4, "hidden_size": 128, "moe": {"num_experts": 4}},
    "training": {"seed": 1234, "steps": STEPS, "lr": 1e-3, "micro_batch_size": 4, "global_batch_size": 8},
    "npu": {"kind": "mindformers", "template": "glm52_mini.yaml"}, "gpu": {"kind": "megatron", "extra_args": []},
    "conversion": {"spec": "glm-mini"}}}


@dataclass(frozen=True)
class Recorded:
    url: str
    run_id: str
    npu: object  # ParsedLog of the NPU side
    gpu: object


def snapshot(host: str, **packages: str) -> dict[str, object]:
    return {"host": host, "taken_at": "2026-01-01T00:00:00+00:00", "hostname": host, "os": "Linux",
            "python": {"version": "3.11.9"}, "packages": {"numpy": "1.26.4", **packages},
            "repos": {}, "accelerators": {}, "tools": {}, "env": {"HCCL_DETERMINISTIC": "true"} if host == "ascend"
            else {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}, "declared_env_missing": [], "error": None}


def record_run(root: Path, *, loss_offset: float = 0.003, fail_step: str | None = None,
               steps: int = STEPS) -> Recorded:
    """Record a finished run: base training, conversions, both trainings (metrics from real log text), compare."""
    url = f"sqlite:///{root / 'store.sqlite'}"
    ref_run = make_run(steps, seed=41)
    gpu = parse_log(megatron_lines(ref_run), source="cuda:/w/gpu.log")
    npu = parse_log(mindformers_lines(perturbed(ref_run, loss_noise=1e-4, loss_offset=loss_offset, seed=42)),
                    source="ascend:/w/npu.log")
    with Store.open(url, clock=TickingClock()) as store:
        store.ensure_experiment("glm-mini", config=CONFIG, config_sha256="a" * 64)
        run = store.create_run("glm-mini", trigger="cli", code_version="alignflow 0.1.0", params=run_params("glm-mini"))
        store.add_snapshot(run.id, "ascend", snapshot("ascend", mindspore="2.10.0"))
        store.add_snapshot(run.id, "cuda", snapshot("cuda", torch="2.6.0"))
        data = ArtifactRef(name="data", host="cpu", path="/w/data.bin", sha256=DATA_SHA, size=4096, kind="file")
        outputs = {"npu_base_train": ("base_ckpt", "ascend", "e" * 64), "convert_bf16": ("bf16_ckpt", "cpu", "f" * 64),
                   "convert_megatron": ("megatron_ckpt", "cpu", "1" * 64), "gpu_train": ("gpu_log", "cuda", "2" * 64),
                   "npu_reload_train": ("npu_log", "ascend", "3" * 64)}
        # recorded in the order the DAG ran them (npu_reload_train beside the conversions), not pipeline order
        for step in ("npu_base_train", "convert_bf16", "npu_reload_train", "convert_megatron", "gpu_train"):
            name, host, sha = outputs[step]
            sr = store.start_step(run.id, step, host=host, command=f"run {step}", cache_key=f"k-{step}",
                                  inputs={"data": data})
            store.add_artifact(sr.id, name=name, host=host, path=f"/w/{name}", kind="log" if "log" in name else "dir",
                               sha256=sha, size_bytes=2**20)
            if step == "gpu_train":
                store.add_metrics(run.id, source="gpu", frame=gpu.frame, step_run_id=sr.id)
            if step == "npu_reload_train":
                store.add_metrics(run.id, source="npu", frame=npu.frame, step_run_id=sr.id)
            failed = step == fail_step
            store.finish_step(sr.id, status="failed" if failed else "ran", exit_code=1 if failed else 0,
                              stdout_tail="", stderr_tail="", error="exited 1: out of memory" if failed else None)
        result = compare(npu, gpu, default_criteria())
        sr = store.start_step(run.id, "compare", host="controller", command="compare", cache_key="k-compare",
                              inputs={})
        doc = result.to_json()
        store.add_comparison(run.id, verdict=result.verdict, criteria=doc["criteria"], summary=doc)
        store.finish_step(sr.id, status="ran", exit_code=0, stdout_tail="", stderr_tail="")
        files = write_report(result, root / "reports" / f"{run.id}-0a1b2c", labels=("NPU", "GPU"), plots=False)
        store.finish_run(run.id, status="completed", verdict=result.verdict, report=str(files.html))
        return Recorded(url, run.id, npu, gpu)
