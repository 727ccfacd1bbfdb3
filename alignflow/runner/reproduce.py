"""Judge a reproduction against the original run: reproduced or diverged, with every difference and its cause.

Checkpoints, data and configs are compared byte for byte (sha256). A training log's bytes always differ between
two executions (timestamps, step times), so a differing log is also compared by what it *measured*: when every
logged metric except the bookkeeping columns (timings, throughput, sample counters:
`alignflow.logs.schema.BOOKKEEPING_COLUMNS`) is identical, the difference is reported as timing-only, not as a
divergence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from alignflow.compare.context import VOLATILE_SNAPSHOT_KEYS
from alignflow.logs.schema import BOOKKEEPING_COLUMNS

Verdict = Literal["reproduced", "diverged"]


@dataclass(frozen=True, slots=True)
class FingerprintDiff:
    """One recorded value that differs between the original and the reproduction, and why."""

    what: str
    original: str | None
    reproduction: str | None
    note: str = ""  # the cause: what changed that explains the difference
    substantive: bool = True  # False when the bytes differ but nothing about the model does
    step: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"what": self.what, "step": self.step, "original": self.original, "reproduction": self.reproduction,
                "cause": self.note, "substantive": self.substantive}


@dataclass(frozen=True, slots=True)
class Reproduction:
    """The judgement of a reproduction: reproduced when nothing substantive differs."""

    original: str
    reproduction: str
    differences: tuple[FingerprintDiff, ...]

    @property
    def substantive(self) -> tuple[FingerprintDiff, ...]:
        return tuple(d for d in self.differences if d.substantive)

    @property
    def verdict(self) -> Verdict:
        return "diverged" if self.substantive else "reproduced"

    @property
    def headline(self) -> str:
        """`REPRODUCED ...` or `DIVERGED ...: first at step X (cause)`: the line `alignflow reproduce` opens with."""
        real = self.substantive
        other = len(self.differences) - len(real)
        if not real:
            tail = f"; {other} difference(s) that change nothing (listed below)" if other else ""
            return (f"REPRODUCED: run {self.reproduction} gives every checkpoint, input, logged metric and verdict "
                    f"of run {self.original}{tail}")
        first = real[0]
        where = f"at step {first.step}" if first.step else f"in {first.what}"
        return (f"DIVERGED: {len(real)} substantive difference(s) from run {self.original}; the first {where}: "
                f"{first.what}" + (f" ({first.note})" if first.note else ""))

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reproduced": self.verdict == "reproduced", "original": self.original,
                "reproduction": self.reproduction, "headline": self.headline,
                "differences": [d.to_json() for d in self.differences]}


def judge_reproduction(store: Any, original_id: str, reproduction_id: str) -> Reproduction:
    """The verdict of a reproduction with every difference and its cause (see `diff_runs`)."""
    return Reproduction(original_id, reproduction_id, tuple(diff_runs(store, original_id, reproduction_id)))


def diff_runs(store: Any, original_id: str, reproduction_id: str) -> list[FingerprintDiff]:
    """Every artifact sha256, input fingerprint, cache key and host snapshot field that differs, in pipeline order,
    each with its cause: a step whose inputs differ passes the difference on (the cause is upstream); a step with
    the same inputs and cache key whose outputs differ is not deterministic; a cache key that differs with the
    same inputs means the command, a config file or the code changed. Host snapshot differences are listed as
    context (what may explain a divergence) and decide nothing by themselves.

    A cache key is a hash of the step's command, config files, code version and input fingerprints, so when it
    differs the cause named is the part that is known to differ: inputs that differ (or differ in timings only:
    two executions of a training never log the same timestamps), else the recorded command, else "a config file,
    the environment or the code version" — never a list of what might have changed when the inputs explain it.
    """
    from alignflow.pipeline import producer

    diffs: list[FingerprintDiff] = []
    a_steps = {s.step: s for s in store.steps(original_id)}
    b_steps = {s.step: s for s in store.steps(reproduction_id)}
    benign: set[str] = set()  # sha256 pairs of artifacts whose bytes differ without meaning (timing-only logs)
    changed_outputs: dict[str, str] = {}  # artifact name -> the step whose output it is
    for step in _pipeline_order(set(a_steps) | set(b_steps)):
        sa, sb = a_steps.get(step), b_steps.get(step)
        if sa is None or sb is None:
            diffs.append(FingerprintDiff(f"{step}: step", sa.status if sa else None, sb.status if sb else None,
                                         "the step ran in one of the runs only", step=step))
            continue
        ins_a = {k: v.get("sha256") for k, v in (sa.inputs or {}).items()}
        ins_b = {k: v.get("sha256") for k, v in (sb.inputs or {}).items()}
        real_inputs: list[str] = []
        timing_inputs: list[str] = []  # inputs whose bytes differ, not what they measured (timing-only logs)
        input_diffs: list[FingerprintDiff] = []
        for name in sorted(set(ins_a) | set(ins_b)):
            if ins_a.get(name) == ins_b.get(name):
                continue
            same = f"{ins_a.get(name)}:{ins_b.get(name)}" in benign
            made_by = producer(name)
            if same:
                cause = "the upstream log differs in timings only"
            elif name in changed_outputs:
                cause = f"output of step {changed_outputs[name]}, which differs (above)"
            elif made_by is not None:
                cause = f"output of step {made_by.name}"
            else:
                cause = "a run input changed (not produced by a step)"
            (timing_inputs if same else real_inputs).append(name)
            input_diffs.append(FingerprintDiff(f"{step}: input {name} sha256", ins_a.get(name), ins_b.get(name),
                                               cause, not same, step))
        recipe = _recipe_change(sa, sb) if sa.cache_key != sb.cache_key and not (real_inputs or timing_inputs) \
            else None
        arts_a = {x.name: x for x in store.artifacts(sa.id)}
        arts_b = {x.name: x for x in store.artifacts(sb.id)}
        output_diffs: list[FingerprintDiff] = []
        outputs_differ = False
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
            if substantive:
                changed_outputs[name] = step
                outputs_differ = True
                why = (f"its inputs differ ({', '.join(real_inputs)})" if real_inputs
                       else f"its inputs differ in timings only ({', '.join(timing_inputs)})" if timing_inputs
                       else recipe if recipe
                       else "same inputs and recipe: the step is not deterministic")
                note = f"{note}; {why}" if note else why
            output_diffs.append(FingerprintDiff(f"{step}: {name} sha256", xa.sha256 if xa else None,
                                                xb.sha256 if xb else None, note, substantive, step))
        diffs += input_diffs + output_diffs
        if sa.cache_key != sb.cache_key:
            if real_inputs:
                cause, real = f"its inputs changed ({', '.join(real_inputs)})", False  # counted with the inputs
            elif timing_inputs:
                cause, real = (f"its inputs differ in timings only ({', '.join(timing_inputs)}): the logs' bytes, "
                               "not what they measured; its command, config and code are not known to differ"), False
            elif outputs_differ:
                cause, real = str(recipe), True
            else:
                cause, real = f"{recipe}; the outputs did not", False
            diffs.append(FingerprintDiff(f"{step}: cache key (command, config, code, inputs)", sa.cache_key,
                                         sb.cache_key, cause, real, step))
    ca, cb = store.comparison(original_id), store.comparison(reproduction_id)
    if ca is not None and cb is not None and ca.verdict != cb.verdict:
        diffs.append(FingerprintDiff("compare: verdict", ca.verdict, cb.verdict,
                                     "the compared logs differ (above)" if changed_outputs else "", True, "compare"))
    snaps_a = {s.host: s.data for s in store.snapshots(original_id)}
    snaps_b = {s.host: s.data for s in store.snapshots(reproduction_id)}
    diverged = any(d.substantive for d in diffs)
    for host in sorted(set(snaps_a) | set(snaps_b)):
        flat_a, flat_b = _flatten(snaps_a.get(host, {})), _flatten(snaps_b.get(host, {}))
        for key in sorted(set(flat_a) | set(flat_b)):
            if key.endswith(VOLATILE_SNAPSHOT_KEYS):
                continue
            if flat_a.get(key) != flat_b.get(key):
                diffs.append(FingerprintDiff(
                    f"{host}: snapshot {key}", flat_a.get(key), flat_b.get(key),
                    "host environment changed: a candidate cause of the divergence" if diverged
                    else "host environment changed; every output is the same", False))
    return diffs


def _recipe_change(sa: Any, sb: Any) -> str:
    """What differs of a step whose key changed with the same inputs: the recorded command when it differs (its
    first differing word), else what the key covers and the record does not keep."""
    if (sa.command or "") != (sb.command or ""):
        words_a, words_b = (sa.command or "").split(), (sb.command or "").split()
        first = next((i for i, (x, y) in enumerate(zip(words_a, words_b, strict=False)) if x != y),
                     min(len(words_a), len(words_b)))
        was = words_a[first] if first < len(words_a) else "(nothing)"
        now = words_b[first] if first < len(words_b) else "(nothing)"
        return f"the command changed ({_clip(was)} -> {_clip(now)})"
    return "a config file, the environment or the code version changed (the command and inputs are the same)"


def _clip(word: str, limit: int = 60) -> str:
    return word if len(word) <= limit else word[: limit - 1] + "…"


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
