"""Compare the fingerprints of a reproduction with those of the original run.

Checkpoints, data and configs are compared byte for byte (sha256). A training log's bytes always differ between
two executions (timestamps, step times), so a differing log is also compared by what it *measured*: when every
logged metric except the bookkeeping columns (timings, throughput, sample counters:
`alignflow.logs.schema.BOOKKEEPING_COLUMNS`) is identical, the difference is reported as timing-only, not as a
divergence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from alignflow.logs.schema import BOOKKEEPING_COLUMNS


@dataclass(frozen=True, slots=True)
class FingerprintDiff:
    """One recorded value that differs between the original and the reproduction."""

    what: str
    original: str | None
    reproduction: str | None
    note: str = ""
    substantive: bool = True  # False when the bytes differ but nothing about the model does


def diff_runs(store: Any, original_id: str, reproduction_id: str) -> list[FingerprintDiff]:
    """Every artifact sha256, input fingerprint, cache key and host snapshot field that differs."""
    diffs: list[FingerprintDiff] = []
    a_steps = {s.step: s for s in store.steps(original_id)}
    b_steps = {s.step: s for s in store.steps(reproduction_id)}
    benign: set[str] = set()  # sha256 pairs of artifacts whose bytes differ without meaning (timing-only logs)
    for step in _pipeline_order(set(a_steps) | set(b_steps)):
        sa, sb = a_steps.get(step), b_steps.get(step)
        if sa is None or sb is None:
            diffs.append(FingerprintDiff(f"{step}: step", sa.status if sa else None, sb.status if sb else None))
            continue
        step_outputs_differ = False
        arts_a = {x.name: x for x in store.artifacts(sa.id)}
        arts_b = {x.name: x for x in store.artifacts(sb.id)}
        for name in sorted(set(arts_a) | set(arts_b)):
            xa, xb = arts_a.get(name), arts_b.get(name)
            if xa is not None and xb is not None and xa.sha256 == xb.sha256:
                continue
            note, substantive = "", True
            if xa is not None and xb is not None and xa.kind == "log":
                note, substantive = _log_note(store, sa, sb)
            elif xa is not None and xb is not None and xa.kind == "report":
                note, substantive = "the report names its run; the verdicts are compared below", False
            if not substantive and xa is not None and xb is not None:
                benign.add(f"{xa.sha256}:{xb.sha256}")
            step_outputs_differ = step_outputs_differ or substantive
            diffs.append(FingerprintDiff(f"{step}: {name} sha256", xa.sha256 if xa else None,
                                         xb.sha256 if xb else None, note, substantive))
        inputs_differ = False
        ins_a = {k: v.get("sha256") for k, v in (sa.inputs or {}).items()}
        ins_b = {k: v.get("sha256") for k, v in (sb.inputs or {}).items()}
        for name in sorted(set(ins_a) | set(ins_b)):
            if ins_a.get(name) != ins_b.get(name):
                same = f"{ins_a.get(name)}:{ins_b.get(name)}" in benign
                inputs_differ = inputs_differ or not same
                diffs.append(FingerprintDiff(f"{step}: input {name} sha256", ins_a.get(name), ins_b.get(name),
                                             "the upstream log differs in timings only" if same else "", not same))
        if sa.cache_key != sb.cache_key:
            # A different key means a different command, config file (a spec, a template) or code version. When
            # the outputs are nonetheless identical the run is reproduced with a changed recipe: say so, do not
            # count it as a divergence.
            real = step_outputs_differ or inputs_differ
            diffs.append(FingerprintDiff(
                f"{step}: cache key (command, config or code version)", sa.cache_key, sb.cache_key,
                "" if real else "the command, a config file or the code changed; the outputs did not", real))
    ca, cb = store.comparison(original_id), store.comparison(reproduction_id)
    if ca is not None and cb is not None and ca.verdict != cb.verdict:
        diffs.append(FingerprintDiff("compare: verdict", ca.verdict, cb.verdict))
    snaps_a = {s.host: s.data for s in store.snapshots(original_id)}
    snaps_b = {s.host: s.data for s in store.snapshots(reproduction_id)}
    for host in sorted(set(snaps_a) | set(snaps_b)):
        flat_a, flat_b = _flatten(snaps_a.get(host, {})), _flatten(snaps_b.get(host, {}))
        for key in sorted(set(flat_a) | set(flat_b)):
            if key.endswith(("taken_at", "latency_ms", "uptime", "duration_s", "load", "memory_free")):
                continue
            if flat_a.get(key) != flat_b.get(key):
                diffs.append(FingerprintDiff(f"{host}: snapshot {key}", flat_a.get(key), flat_b.get(key)))
    return diffs


def _pipeline_order(steps: set[str]) -> list[str]:
    from alignflow.pipeline import STEP_NAMES

    return [s for s in STEP_NAMES if s in steps] + sorted(steps - set(STEP_NAMES))


def _origin(store: Any, step_run: Any) -> Any:
    """The step run that actually executed (a cached step points at it)."""
    return store.get_step(step_run.reused_from) if step_run.reused_from else step_run


def _log_note(store: Any, sa: Any, sb: Any) -> tuple[str, bool]:
    ma, mb = _metrics_of(store, _origin(store, sa)), _metrics_of(store, _origin(store, sb))
    if ma is None or mb is None:
        return "log bytes differ; no recorded metrics to compare", True
    if ma == mb:
        return "timing only: every logged metric is identical (timestamps and step times differ)", False
    changed = sorted({k[0] for k in set(ma) ^ set(mb)} | {k[0] for k in set(ma) & set(mb) if ma[k] != mb[k]})
    return f"logged metrics differ: {', '.join(changed)}", True


def _metrics_of(store: Any, step_run: Any) -> dict[tuple[str, int], float] | None:
    frame = store.metrics(step_run.run_id)
    rows = frame[frame["step_run_id"] == step_run.id]
    if rows.empty:
        return None
    return {(str(r.metric), int(r.step)): float(r.value) for r in rows.itertuples()
            if str(r.metric) not in BOOKKEEPING_COLUMNS and r.value == r.value}


def _flatten(data: Any, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(data, list):
        out[prefix] = ",".join(str(x) for x in data)
    else:
        out[prefix] = str(data)
    return out
