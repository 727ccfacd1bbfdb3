"""The matrix report: seed 004's tables in markdown and HTML, bar charts of ms/iter and memory, `matrix.json`.

Per group and side (docs/seeds.md#switch-matrix):

1. precision and time, OFF→ON: switch, configs, loss mean relative error, loss max absolute error, ms/iter off→on,
   samples/s off→on, throughput change — with the row's verdict;
2. every config against the reference: loss mean and max relative error, grad-norm mean relative error, P95/P99;
3. per-rank peak memory (GiB, the allocator's peak): max-rank and avg-rank off→on and their saving;
4. the run status of every training (completed, OOM, failed, exit code unknown), the load it was timed under, and
   each variant's verdict.

A training timed on a loaded host makes its speed figures unreliable (`Row.timing_unreliable`): the report says so
above the tables, naming each such training's load, and marks each change it enters `unreliable`, as the single-run
report refuses a ratio between unlike timings. A variant that shows what it was expected to show (a bf16 write-back
that fails, a capacity probe that runs out of memory) is `FAIL as expected`, in a neutral colour, not a red row under a
passing matrix (issue 47).

Bar charts (PNG, matplotlib's object API on Agg), one image per group and side: ms/iter per switch, OFF blue and
ON orange, as the seed's 4.1 figure; memory per config, max-rank blue and avg-rank orange, in config order (not
paired), as its 4.2 figure.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from alignflow.compare.context import LOADED_PER_CPU, TimingConditions
from alignflow.compare.formatting import criterion_label
from alignflow.matrix.compare import SIDE_ORDER, MatrixResult, Row, SidePerf, VariantResult, short_name
from alignflow.matrix.status import clip

OFF_COLOR, ON_COLOR = "#1f77b4", "#ff7f0e"  # the seed's blue OFF / orange ON


@dataclass(frozen=True, slots=True)
class MatrixFiles:
    directory: Path
    markdown: Path
    html: Path
    json: Path
    charts: tuple[Path, ...]


def pct(value: float | None, digits: int = 6) -> str:
    """A fraction as the seed writes it: `0.000395%`, `-56.95%`."""
    if value is None:
        return "n/a"
    return f"{value * 100:.{digits}f}%"


def signed_pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:+.2f}%"


UNRELIABLE = " unreliable (loaded host)"
AS_EXPECTED = " as expected"


def speed_change(value: float | None, unreliable: bool) -> str:
    """`-33.33%`, or `+1104.00% unreliable (loaded host)` when either side was timed on a loaded host."""
    return signed_pct(value) + (UNRELIABLE if unreliable and value is not None else "")


def load_text(timing: TimingConditions | None) -> str:
    """`2.95 on 2 CPU(s) (loaded)`: the host's 1-minute load when the training's run started; `n/a` unrecorded."""
    if timing is None or timing.load_1m is None:
        return "n/a"
    return f"{timing.load_1m:.2f} on {timing.cpus or '?'} CPU(s)" + (" (loaded)" if timing.loaded else "")


def load_caveat(result: MatrixResult) -> str:
    """One sentence naming every training timed on a loaded host ('' when none was): its speed figures measure the
    sharing as much as the switch."""
    seen: set[object] = set()
    timed, loaded = 0, []
    for c in result.configs:
        for side, t in c.sides.items():
            key = t.identity or (c.group, c.name, side)  # a side shared with the reference is its training
            if t.timing is None or t.timing.load_1m is None or key in seen:
                continue
            seen.add(key)
            timed += 1
            if t.timing.loaded:
                loaded.append(f"{c.name} {result.side_labels.get(side, side)}: load {load_text(t.timing)}")
    if not loaded:
        return ""
    return (f"Timings unreliable: {len(loaded)} of {timed} training(s) ran on a loaded host (a 1-minute load of at "
            f"least {LOADED_PER_CPU:g} per CPU when its run started: {'; '.join(loaded)}). Their ms/iter, samples/s "
            "and throughput changes measure the sharing as much as the switch: each change they enter is marked "
            "'unreliable'. The memory figures are allocator peaks, counted, not timed: the load does not move them.")


def _verdict(r: Row, variants: dict[tuple[str, str], VariantResult]) -> str:
    """`PASS`, `FAIL (why)`, or `FAIL as expected (why)` when the row shows what its variant was expected to."""
    v = variants.get((r.group, r.variant)) if r.variant is not None else None
    expected = v is not None and r.verdict not in ("pass", "n/a") and r.verdict == v.expect
    return r.verdict.upper() + (AS_EXPECTED if expected else "") + (
        f" ({'; '.join(r.failed)})" if r.failed else f" ({r.note})" if r.note else "")


def num(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def arrow(off: str, on: str) -> str:
    return f"{off} → {on}"


def _perf(p: SidePerf | None, attr: str, digits: int = 3) -> str:
    return num(getattr(p, attr) if p is not None else None, digits)


def _sections(result: MatrixResult) -> list[tuple[str, str, list[Row]]]:
    """(group, side, rows) in group order, sides NPU then GPU, only where rows exist."""
    out: list[tuple[str, str, list[Row]]] = []
    for group in result.groups:
        for side in SIDE_ORDER:
            rows = [r for r in result.rows if r.group == group and r.side == side]
            if rows:
                out.append((group, side, rows))
    return out


def tables(result: MatrixResult) -> list[tuple[str, list[str], list[list[str]]]]:
    """Every table of the report as (title, header, rows) — one source for markdown, HTML and the UI artifact."""
    out: list[tuple[str, list[str], list[list[str]]]] = []
    labels = result.side_labels
    variants = {(v.group, v.name): v for v in result.variants}
    for group, side, rows in _sections(result):
        where = f"{group} — " if len(result.groups) > 1 or group != "default" else ""
        window = result.warmup[group]
        title = f"{where}{labels.get(side, side)} side: precision and time (OFF = reference of the errors; " \
                f"performance over the steps after {window})"
        out.append((title, ["switch", "configs", "loss mean rel. error", "loss max abs. error", "ms/iter off→on",
                            "samples/s off→on", "throughput change", "verdict"],
                    [[r.switch, r.configs, pct(r.loss_mean_rel), num(r.loss_max_abs, 6),
                      arrow(_perf(r.perf_off, "ms_per_iter"), _perf(r.perf_on, "ms_per_iter")),
                      arrow(_perf(r.perf_off, "samples_per_s"), _perf(r.perf_on, "samples_per_s")),
                      speed_change(r.throughput_change, r.timing_unreliable), _verdict(r, variants)]
                     for r in rows]))
        mem = [r for r in rows if r.mem_max_off is not None or r.mem_max_on is not None]
        if mem:
            whole = any(c.group == group and side in c.sides and any(
                m.source == "mindspore" for m in c.sides[side].memory.ranks.values()) for c in result.configs)
            out.append((f"{where}{labels.get(side, side)} side: per-rank peak memory (GiB, allocator peak; saving = "
                        "(off - on) / off" + ("; MindSpore prints its peaks in whole MB: a smaller change does not "
                                              "show" if whole else "") + ")",
                        ["switch", "configs", "max-rank off→on", "avg-rank off→on", "max-rank saving",
                         "avg-rank saving"],
                        [[r.switch, r.configs, arrow(num(r.mem_max_off, 6), num(r.mem_max_on, 6)),
                          arrow(num(r.mem_avg_off, 6), num(r.mem_avg_on, 6)), signed_pct(r.mem_max_saving),
                          signed_pct(r.mem_avg_saving)] for r in mem]))
    for group in result.groups:
        where = f"{group} — " if len(result.groups) > 1 or group != "default" else ""
        lines = []
        for c in (c for c in result.configs if c.group == group):
            for side, t in c.sides.items():
                p = c.perf.get(side)
                row = next((r for r in result.rows if r.group == group and r.side == side and r.on == c.name
                            and r.off == result.reference), None) or next(
                    (r for r in result.rows if r.group == group and r.side == side and r.off == c.name
                     and r.on == result.reference), None)
                lines.append([c.name, labels.get(side, side), t.status.status + (" (reused)" if t.status.reused
                                                                                  else ""),
                              "n/a" if t.status.exit_code is None else str(t.status.exit_code),
                              str(len(t.parsed.frame)) if t.parsed is not None else "0",
                              pct(row.loss_mean_rel) if row else ("—" if c.name == result.reference else "shared"),
                              pct(row.loss_max_rel) if row else "—",
                              pct(row.grad_norm_mean_rel, 4) if row else "—",
                              f"{_perf(p, 'p95', 1)} / {_perf(p, 'p99', 1)}", load_text(t.timing),
                              t.status.reason])  # whole: classify bounds it between words
        out.append((f"{where}every training against {result.reference}: status, errors, P95/P99 ms, the load "
                    "it was timed under",
                    ["config", "side", "status", "exit code", "steps", "loss mean rel.", "loss max rel.",
                     "grad norm mean rel.", "P95 / P99 ms", "load (1 min)", "note"], lines))
    out.append(("verdicts", ["group", "variant", "switch", "verdict", "expected", "as expected", "changed sides",
                             "shared with the reference", "why"],
                [[v.group, v.name, v.switch,
                  v.outcome.upper() + (AS_EXPECTED if v.as_expected and v.outcome != "pass" else ""), v.expect,
                  "yes" if v.as_expected else "NO",
                  ", ".join(labels.get(s, s) for s in v.changed_sides) or "—",
                  ", ".join(labels.get(s, s) for s in v.shared_sides) or "—", clip("; ".join(v.reasons))]
                 for v in result.variants]))
    return out


def markdown(result: MatrixResult, *, charts: Iterable[str] = ()) -> str:
    """The report as markdown (the summary artifact and `matrix.md`)."""
    parts = [f"# Switch matrix: {result.experiment}", "",
             f"**Matrix verdict: {result.verdict.upper()}** — reference `{result.reference}`, "
             f"{len(result.variants)} variant(s)" + (f", groups {', '.join(result.groups)}"
                                                     if result.groups != ("default",) else ""), ""]
    parts += [f"- {r}" for r in result.reasons]
    if result.reasons:
        parts.append("")
    if caveat := load_caveat(result):
        parts += [f"**{caveat}**", ""]
    parts += ["Criteria of each OFF→ON comparison: " + "; ".join(criterion_label(c) for c in result.criteria), ""]
    for title, header, rows in tables(result):
        parts += [f"## {title}", "", _md_row(header), _md_row(["---"] * len(header))]
        parts += [_md_row(r) for r in rows]
        parts.append("")
    for chart in charts:
        parts += [f"![{chart}]({chart})", ""]
    return "\n".join(parts)


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def html_page(result: MatrixResult, *, charts: Iterable[str] = ()) -> str:
    """A self-contained HTML page of the tables and charts (opens offline)."""
    esc: Callable[[str], str] = html.escape
    body = [f"<h1>Switch matrix: {esc(result.experiment)}</h1>",
            f"<p class='verdict {result.verdict}'>Matrix verdict: <b>{result.verdict.upper()}</b> — reference "
            f"<code>{esc(result.reference)}</code>, {len(result.variants)} variant(s)</p>"]
    if result.reasons:
        body.append("<ul>" + "".join(f"<li>{esc(r)}</li>" for r in result.reasons) + "</ul>")
    if caveat := load_caveat(result):
        body.append(f"<p class='caveat'>{esc(caveat)}</p>")
    body.append("<p>Criteria of each OFF→ON comparison: "
                + esc("; ".join(criterion_label(c) for c in result.criteria)) + "</p>")
    for title, header, rows in tables(result):
        body.append(f"<h2>{esc(title)}</h2><table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>")
        for row in rows:
            body.append(f"<tr{_row_class(row)}>" + "".join(
                f"<td{' class=unreliable' if c.endswith(UNRELIABLE) else ''}>{esc(c)}</td>" for c in row) + "</tr>")
        body.append("</table>")
    for chart in charts:
        body.append(f"<h2>{esc(Path(chart).stem.replace('_', ' '))}</h2><img src='{esc(chart)}' alt='{esc(chart)}'>")
    style = ("body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #bbb;padding:3px 8px;font-size:13px;text-align:left}th{background:#eee}"
             "tr.fail td{background:#fde2e1}tr.expected td{background:#eef1f5}td.unreliable{color:#8a6d00}"
             ".caveat{background:#fff6d5;border-left:4px solid #d4a800;padding:6px 10px}"
             ".verdict.fail b{color:#c0392b}.verdict.pass b{color:#1e8449}"
             "img{max-width:100%}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>matrix {esc(result.experiment)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>")


def _row_class(row: Sequence[str]) -> str:
    """`fail` (red) for a row that shows a failure nobody expected, `expected` (neutral) for one that shows the
    failure its variant was declared to show."""
    if any(c.startswith(("FAIL", "OOM")) and c.split(" (")[0].endswith(AS_EXPECTED) for c in row):
        return " class='expected'"
    return " class='fail'" if any(c.startswith(("FAIL", "OOM", "NO")) for c in row) else ""


def write_matrix_report(result: MatrixResult, directory: str | Path, *, charts: bool = True) -> MatrixFiles:
    """Write `matrix.md`, `matrix.html`, `matrix.json` and the bar charts into `directory` (created)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    drawn = draw_charts(result, out) if charts else []
    names = [p.name for p in drawn]
    md = out / "matrix.md"
    md.write_text(markdown(result, charts=names), encoding="utf-8")
    page = out / "matrix.html"
    page.write_text(html_page(result, charts=names), encoding="utf-8")
    doc = out / "matrix.json"
    doc.write_text(json.dumps(result.to_json(), indent=2, allow_nan=False), encoding="utf-8")
    return MatrixFiles(out, md, page, doc, tuple(drawn))


def draw_charts(result: MatrixResult, directory: Path) -> list[Path]:
    """One PNG per group and side that has rows: ms/iter OFF → ON per switch (above) and the per-rank peak memory
    by config (below), as seed 004's two figures. One figure for both: a figure's fixed cost (layout, text, PNG
    encoding) is most of a small chart's."""
    from matplotlib.figure import Figure

    drawn: list[Path] = []
    for group, side, rows in _sections(result):
        tag = f"{group}_{side}" if len(result.groups) > 1 or group != "default" else side
        label = result.side_labels.get(side, side) + (f" ({group})" if group != "default" else "")
        timed = [r for r in rows if r.perf_off is not None and r.perf_on is not None]
        configs = [c for c in result.configs if c.group == group and side in c.sides
                   and not c.sides[side].memory.empty]
        if not timed and not configs:
            continue
        fig = Figure(figsize=(max(7.0, 0.7 * max(len(timed), len(configs)) + 2.5), 7.0), dpi=80)
        left, right = fig.subplots(2, 1)  # ms/iter above, memory below
        fig.subplots_adjust(left=0.1, right=0.98, top=0.95, bottom=0.06, hspace=0.35)
        if timed:
            x = range(len(timed))
            left.bar([i - 0.2 for i in x], [r.perf_off.ms_per_iter or 0.0 for r in timed if r.perf_off], 0.4,
                     color=OFF_COLOR, label="OFF")
            left.bar([i + 0.2 for i in x], [r.perf_on.ms_per_iter or 0.0 for r in timed if r.perf_on], 0.4,
                     color=ON_COLOR, label="ON")
            left.set_xticks(list(x), [r.configs for r in timed], fontsize=8)  # the tables name each switch
            left.legend(fontsize=8)
        left.set_ylabel("ms/iter (mean after warm-up)")
        loaded = any(r.timing_unreliable for r in timed)
        left.set_title(f"{label}: ms/iter OFF → ON" + (" — unreliable: timed on a loaded host" if loaded else ""),
                       fontsize=10, color="#8a6d00" if loaded else "black")
        if configs:
            x = range(len(configs))
            right.bar([i - 0.2 for i in x], [c.sides[side].memory.max_rank_gib or 0.0 for c in configs], 0.4,
                      color=OFF_COLOR, label="max-rank")
            right.bar([i + 0.2 for i in x], [c.sides[side].memory.avg_rank_gib or 0.0 for c in configs], 0.4,
                      color=ON_COLOR, label="avg-rank")
            right.set_xticks(list(x), [short_name(c.name) if short_name(c.name) != c.name else c.name[:12]
                                       for c in configs], fontsize=8)
            right.legend(fontsize=8)
        right.set_ylabel("allocator peak (GiB)")
        right.set_title(f"{label}: per-rank peak memory by config", fontsize=10)
        path = directory / f"matrix_{tag}.png"
        fig.savefig(path)
        drawn.append(path)
    return drawn


def artifact_rows(summary: dict[str, object]) -> list[dict[str, str]]:
    """One table of the whole matrix from its stored summary (`MatrixResult.to_json`): a row per variant and
    changed side with the seed's columns, then the variant's verdict and status — the UI's matrix artifact."""
    sides = summary.get("sides") or {}
    assert isinstance(sides, dict)
    rows_doc = summary.get("rows") or []
    variants = summary.get("variants") or []
    assert isinstance(rows_doc, list)
    assert isinstance(variants, list)
    out: list[dict[str, str]] = []
    for v in variants:
        own = [r for r in rows_doc if r.get("variant") == v["name"] and r.get("group") == v["group"]]
        base = {"group": str(v["group"]), "variant": str(v["name"]), "switch": str(v["switch"]),
                "verdict": str(v["outcome"]).upper(), "expected": str(v["expect"]),
                "as expected": "yes" if v["as_expected"] else "NO", "status": str(v["status"])}
        if not own:
            out.append({**base, "side": "—", "configs": "—", "loss mean rel.": "—", "ms/iter off→on": "—",
                        "throughput change": "—", "max-rank GiB off→on": "—",
                        "why": clip("; ".join(v["reasons"]), 200)})
        for r in own:
            perf_off, perf_on, mem = r.get("perf_off") or {}, r.get("perf_on") or {}, r.get("memory_gib") or {}
            out.append({**base, "side": str(sides.get(r["side"], r["side"])), "configs": str(r["configs"]),
                        "loss mean rel.": pct(r.get("loss_mean_rel")),
                        "ms/iter off→on": arrow(num(perf_off.get("ms_per_iter")), num(perf_on.get("ms_per_iter"))),
                        "throughput change": speed_change(r.get("throughput_change"),
                                                          bool(r.get("timing_unreliable"))),
                        "max-rank GiB off→on": arrow(num(mem.get("max_rank_off"), 6), num(mem.get("max_rank_on"), 6)),
                        "why": clip("; ".join(r.get("failed_criteria") or []), 200)})
    return out
