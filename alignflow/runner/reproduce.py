"""Compare the fingerprints of a reproduction with those of the original run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class FingerprintDiff:
    """One recorded value that differs between the original and the reproduction."""

    what: str
    original: str | None
    reproduction: str | None


def diff_runs(store: Any, original_id: str, reproduction_id: str) -> list[FingerprintDiff]:
    """Every artifact sha256, input fingerprint, code version and host snapshot field that differs."""
    diffs: list[FingerprintDiff] = []
    a_steps = {s.step: s for s in store.steps(original_id)}
    b_steps = {s.step: s for s in store.steps(reproduction_id)}
    for step in sorted(set(a_steps) | set(b_steps)):
        sa, sb = a_steps.get(step), b_steps.get(step)
        if sa is None or sb is None:
            diffs.append(FingerprintDiff(f"{step}: step", sa.status if sa else None, sb.status if sb else None))
            continue
        arts_a = {x.name: x.sha256 for x in store.artifacts(sa.id)}
        arts_b = {x.name: x.sha256 for x in store.artifacts(sb.id)}
        for name in sorted(set(arts_a) | set(arts_b)):
            if arts_a.get(name) != arts_b.get(name):
                diffs.append(FingerprintDiff(f"{step}: {name} sha256", arts_a.get(name), arts_b.get(name)))
        ins_a = {k: v.get("sha256") for k, v in (sa.inputs or {}).items()}
        ins_b = {k: v.get("sha256") for k, v in (sb.inputs or {}).items()}
        for name in sorted(set(ins_a) | set(ins_b)):
            if ins_a.get(name) != ins_b.get(name):
                diffs.append(FingerprintDiff(f"{step}: input {name} sha256", ins_a.get(name), ins_b.get(name)))
        if sa.cache_key != sb.cache_key:
            diffs.append(FingerprintDiff(f"{step}: cache key (command, config or code version)", sa.cache_key,
                                         sb.cache_key))
    snaps_a = {s.host: s.data for s in store.snapshots(original_id)}
    snaps_b = {s.host: s.data for s in store.snapshots(reproduction_id)}
    for host in sorted(set(snaps_a) | set(snaps_b)):
        flat_a, flat_b = _flatten(snaps_a.get(host, {})), _flatten(snaps_b.get(host, {}))
        for key in sorted(set(flat_a) | set(flat_b)):
            if key.endswith(("taken_at", "latency_ms", "uptime")):
                continue
            if flat_a.get(key) != flat_b.get(key):
                diffs.append(FingerprintDiff(f"{host}: snapshot {key}", flat_a.get(key), flat_b.get(key)))
    return diffs


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
