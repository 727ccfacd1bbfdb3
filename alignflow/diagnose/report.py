"""The diagnosis as an HTML section (for the run report) and as a standalone page.

One table, the modules in the GPU side's execution order: per row the input and output activations, and the
module's own parameters after load, their gradients and their updates (cosine, max abs, relative L2 of the worst
tensor). The first divergent row is highlighted and linked from the verdict; the mapping used follows.
"""

from __future__ import annotations

from html import escape

from alignflow.diagnose.compare import CAUSE_TEXT, Diagnosis, ModuleRow
from alignflow.diagnose.metrics import TensorDiff

_CSS = """
.af-diag table{border-collapse:collapse;font:12px monospace}
.af-diag td,.af-diag th{border:1px solid #ccc;padding:2px 5px;text-align:right}
.af-diag td.m{text-align:left;white-space:nowrap}
.af-diag tr.first{background:#ffd7d7;font-weight:bold}
.af-diag .diverged{color:#b00000}.af-diag .warning{color:#a06000}.af-diag .match{color:#006000}
.af-diag .absent,.af-diag .shape{color:#888}
"""


def _cell(d: TensorDiff | None) -> str:
    if d is None:
        return "<td></td>"
    if not d.compared:
        return f'<td class="{d.status}" title="{escape(d.note)}">{escape(d.status)}</td>'
    cos = f"{d.cosine:.6f}" if d.cosine is not None else "–"
    mx = f"{d.max_abs:.2e}" if d.max_abs is not None else "–"
    rel = f"{d.rel_l2:.2e}" if d.rel_l2 is not None else "–"
    title = escape(f"cosine {cos}, max abs {mx}, relative L2 {rel}, msprobe {d.msprobe or '-'} {d.note}")
    return f'<td class="{d.status}" title="{title}">{cos}<br>{mx}<br>{rel}</td>'


def _row(r: ModuleRow, first: int | None) -> str:
    cls = ' class="first" id="af-first-divergence"' if r.order == first else ""
    npu = escape(r.npu_module or "—")
    return (f"<tr{cls}><td>{r.order}</td><td class=m>{escape(r.label)}<br><small>{escape(r.gpu_type)} | NPU: {npu}"
            f"</small></td>{_cell(r.input)}{_cell(r.output)}{_cell(r.stage('loaded'))}{_cell(r.stage('grad'))}"
            f"{_cell(r.stage('update'))}</tr>")


def html_section(d: Diagnosis) -> str:
    """The `<section>` the run report embeds."""
    first = d.cause.row if d.cause else None
    if d.cause is None:
        verdict = (f"<p><b>PASS</b>: step {d.step} agrees module by module (loaded weights, activations, gradients, "
                   "updates) within the tolerance.</p>")
    else:
        details = "".join(f"<li>{escape(x)}</li>" for x in d.cause.details)
        verdict = (f'<p><b>DIVERGED</b> at <a href="#af-first-divergence">{escape(d.cause.module)}</a> — '
                   f"<b>{escape(d.cause.kind)}</b>: {escape(CAUSE_TEXT[d.cause.kind])}.</p>"
                   f"<p>{escape(d.cause.summary)}</p><ul>{details}</ul>")
    tol = d.tolerance
    notes = "".join(f"<li>{escape(n)}</li>" for n in d.notes)
    scalars = "".join(f"<tr><td class=m>{escape(k)}</td><td>{v['npu']}</td><td>{v['gpu']}</td></tr>"
                      for k, v in d.scalars.items())
    opt = "".join(f"<tr><td class=m>{escape(k)}</td><td>{escape(str(v['npu']))}</td><td>{escape(str(v['gpu']))}</td>"
                  "</tr>" for k, v in d.optimizer.items())
    rows = "".join(_row(r, first) for r in d.rows)
    renames = "".join(f"<li>{escape(a)} → {escape(b)}</li>" for a, b in d.mapping.renames) or "<li>none</li>"
    params = "".join(f"<tr><td class=m>{escape(', '.join(m.sources))}</td><td class=m>{escape(m.ops_text)}</td>"
                     f"<td class=m>{escape(', '.join(m.targets))}</td><td class=m>{escape(m.rule)}</td></tr>"
                     for m in d.mapping.params)
    unmatched = "".join(f"<li>{escape(k)}: {len(v)}{': ' + escape(', '.join(v[:6])) if v else ''}"
                        f"{' …' if len(v) > 6 else ''}</li>" for k, v in d.unmatched.items())
    return f"""<section class="af-diag"><style>{_CSS}</style>
<h2>Tensor-level diagnosis (step {d.step})</h2>
{verdict}
<p>Each cell: cosine, max abs error, relative L2 error (NPU vs GPU, GPU the reference). Tolerance: msprobe's
cosine &gt; {tol.cosine:g} and max abs &lt; {tol.max_abs:g}; diverged also above a relative error of
{tol.rel_floor:g} that the inputs do not explain ({tol.amplification:g}x theirs).</p>
<ul>{notes}</ul>
<table><tr><th>scalar</th><th>NPU</th><th>GPU</th></tr>{scalars}</table>
<table><tr><th>optimizer</th><th>NPU</th><th>GPU</th></tr>{opt}</table>
<table><tr><th>#</th><th>module (GPU execution order)</th><th>input</th><th>output</th><th>loaded</th><th>grad</th>
<th>update</th></tr>{rows}</table>
<h3>Mapping used (conversion spec {escape(d.mapping.spec)})</h3>
<p>Module renames:</p><ul>{renames}</ul>
<p>Unmatched:</p><ul>{unmatched}</ul>
<table><tr><th>NPU parameter(s)</th><th>ops</th><th>GPU parameter(s)</th><th>rule</th></tr>{params}</table>
</section>"""


def html_page(d: Diagnosis) -> str:
    return (f"<!doctype html><html><head><meta charset=utf-8><title>diagnosis step {d.step}</title></head><body>"
            f"{html_section(d)}</body></html>")
