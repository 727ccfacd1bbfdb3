"""The early gate: both sides train a few steps from the converted weights before the long trainings start.

Seed 001 §6.4: the most reliable proof of a correct conversion is that step 1 — a forward pass on the same batch
from the same weights, before any update — gives the same lm loss (and MTP loss) on both sides, within 0.005%
relative. A failing gate stops the run hours before the long trainings would have shown the same thing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from alignflow.backends import LogFormat, TrainSpec, render_training
from alignflow.errors import PipelineError, RemoteJobError
from alignflow.runner.artifacts import ArtifactRef
from alignflow.runner.cache import cache_key
from alignflow.runner.commands import data_placeholder
from alignflow.runner.engine import StepRunner
from alignflow.runner.placeholders import fill, fill_all
from alignflow.runner.session import StepOutcome


class GateFailed(PipelineError):
    """Step-1 losses of the two sides differ beyond the gate's tolerance."""


def run_gate(runner: StepRunner, inputs: Mapping[str, ArtifactRef]) -> StepOutcome:
    exp = runner.experiment
    gate = exp.gate
    data = inputs["data"]
    sides = {
        "npu": (runner.host("npu_reload_train"),
                TrainSpec("early_gate", "npu", gate.steps, data_placeholder(exp), data.sha256, "{in:bf16_ckpt}", None)),
        "gpu": (runner.host("gpu_train"),
                TrainSpec("early_gate", "gpu", gate.steps, data_placeholder(exp), data.sha256, "{in:megatron_ckpt}",
                          None)),
    }
    templates = {side: render_training(exp, spec) for side, (_, spec) in sides.items()}
    key = cache_key(step="early_gate", argv=[*templates["npu"].argv, "|", *templates["gpu"].argv],
                    files={f"{s}/{k}": v for s, t in templates.items() for k, v in t.files.items()}, env={},
                    code_version=templates["npu"].code_version + "|" + templates["gpu"].code_version,
                    inputs={n: inputs[n].sha256 for n in ("data", "bf16_ckpt", "megatron_ckpt")},
                    extra={"rel_tol": gate.rel_tol, "metrics": gate.metrics})
    if "early_gate" not in runner.forced:
        reused = runner._reuse("early_gate", key, runner.host("early_gate"), None)
        if reused is not None:
            return reused
    controller = runner.host("early_gate")
    step_run = runner.store.start_step(runner.run_id, "early_gate", host=controller.name,
                                       command=" | ".join(" ".join(t.argv) for t in templates.values()),
                                       cache_key=key, inputs={n: inputs[n].to_dict() for n in inputs})
    try:
        jobs: dict[str, tuple[Any, Any, str]] = {}
        from alignflow.transport import JobSpec

        for side, (host, _spec) in sides.items():
            t = runner.transport(host)
            load_name = "bf16_ckpt" if side == "npu" else "megatron_ckpt"
            local = {"data": runner.stage(data, host), load_name: runner.stage(inputs[load_name], host)}
            out = str(t.path(f"artifacts/early_gate/{key[:12]}-{side}-{uuid.uuid4().hex[:8]}"))
            values = {"python": t.python(), "out": out, **{f"in:{n}": p for n, p in local.items()}}
            template = templates[side]
            t.mkdir(out)
            for rel, text in template.files.items():
                t.write_text(f"{out}/{rel}", fill(text, values))
            handle = t.launch(JobSpec(argv=fill_all(template.argv, values), name=f"{runner.run_id}-gate-{side}",
                                      env={k: fill(v, values) for k, v in template.env.items()}, cwd=out))
            jobs[side] = (t, handle, out)
        results: dict[str, Any] = {}
        for side, (t, handle, _out) in jobs.items():
            state = runner._wait(f"early_gate/{side}", t, handle, 2 * 3600.0)
            if not state.ok:
                raise RemoteJobError(f"{t.host.name}: early gate ({side}) {state}; job dir "
                                     f"{handle.job_dir}", handle=handle, state=state)
            results[side] = _step1(runner, side, t, f"{handle.job_dir}/stdout", templates[side].log_format)
        rows, failed = [], []
        for metric in gate.metrics:
            npu, gpu = results["npu"].get(metric), results["gpu"].get(metric)
            if npu is None or gpu is None:
                continue
            rel = abs(npu - gpu) / (abs(gpu) + 1e-8)
            ok = rel < gate.rel_tol
            rows.append({"metric": metric, "npu": npu, "gpu": gpu, "rel_diff": rel, "tolerance": gate.rel_tol,
                         "passed": ok})
            if not ok:
                failed.append(f"{metric}: NPU {npu:.6f} vs GPU {gpu:.6f}, relative difference {rel:.3e} > "
                              f"{gate.rel_tol:.1e}")
        if not rows:
            raise GateFailed("early gate: no common step-1 metric in the two logs")
        report_dir = runner.state_dir / "runs" / runner.run_id / "early_gate"
        report_dir.mkdir(parents=True, exist_ok=True)
        (report_dir / "gate.json").write_text(json.dumps({"rows": rows, "passed": not failed}, indent=2))
        ctl = runner.transport(controller)
        fp = ctl.sha256([str(report_dir)])[str(report_dir)]
        ref = ArtifactRef("gate_report", controller.name, str(report_dir), fp.sha256, fp.size, "report")
        runner.store.add_artifact(step_run.id, name=ref.name, host=ref.host, path=ref.path, kind=ref.kind,
                                  sha256=ref.sha256, size_bytes=ref.size)
        if failed:
            raise GateFailed(
                "early gate failed — step 1 runs the same batch through the same weights on both sides, so a "
                "difference here means the conversion spec or the model configuration differs, not numerics:\n  "
                + "\n  ".join(failed))
        runner.store.finish_step(step_run.id, status="ran", exit_code=0, stdout_tail=json.dumps(rows),
                                 stderr_tail="")
        runner.emit("early_gate: passed (" + ", ".join(f"{r['metric']} rel {r['rel_diff']:.2e}" for r in rows) + ")")
        return StepOutcome("early_gate", "ran", {"gate_report": ref}, step_run.id, key)
    except Exception as exc:
        if not getattr(exc, "retryable", False):
            runner.store.finish_step(step_run.id, status="failed", exit_code=None, stdout_tail="", stderr_tail="",
                                     error=str(exc))
        raise


def _step1(runner: StepRunner, side: str, transport: Any, path: str, fmt: LogFormat) -> dict[str, float]:
    from alignflow.logs import check_sentinels, parse_log

    local = runner.state_dir / "runs" / runner.run_id / "logs" / f"early_gate-{side}.log"
    local.parent.mkdir(parents=True, exist_ok=True)
    transport.get(path, str(local), overwrite=True)
    parsed = parse_log(local.read_text(encoding="utf-8", errors="replace").splitlines(), fmt=fmt,
                       source=f"early_gate/{side}")
    check_sentinels(parsed)
    if 1 not in parsed.frame.index:
        raise GateFailed(f"early gate ({side}): the log has no step 1")
    row = parsed.frame.loc[1]
    return {k: float(v) for k, v in row.items() if isinstance(v, int | float) and v == v}
