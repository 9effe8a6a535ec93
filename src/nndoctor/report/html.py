"""The HTML reporter: one self-contained file (inline CSS, JS and SVG; nothing fetched).

The findings are rendered here, in Python, so they read without JavaScript; the plots of
what the doctor saw over the steps (``Report.history``) are drawn by the inline script from
the JSON embedded in the page: the loss with each finding marked at the step it first
appeared, per-layer gradient norms (heatmap), update/weight ratios, input statistics,
activation dead/saturated fractions and the step time split into data wait and the rest.
"""

from __future__ import annotations

import html
import json
import math
import os
from importlib import resources
from typing import Any

from nndoctor.core._version import __version__
from nndoctor.core.findings import Finding, Report, Severity, _jsonable
from nndoctor.util.atomic import atomic_write_text

_PLOTS = (
    ("plot-loss", "Loss", "The value passed to backward() at each step; dashed lines mark the step "
                          "at which each finding first appeared."),
    ("plot-grads", "Gradient norms per layer", "L2 norm of each layer's gradients on sampled steps; "
                                               "red cells hold NaN/Inf."),
    ("plot-updates", "Update / weight ratio", "‖Δw‖/‖w‖ per optimizer step on sampled steps; the shaded "
                                              "band is 1e-4…1e-2 around the usual ~1e-3."),
    ("plot-inputs", "Model input per batch", "min, max, mean and std of the model's first input on "
                                             "sampled steps."),
    ("plot-activations", "Activations", "Fraction of ReLU outputs at zero and of sigmoid/tanh outputs "
                                        "within 1% of a limit, on sampled steps."),
    ("plot-steptime", "Step time", "Wall time between optimizer steps, split into waiting for the "
                                   "DataLoader and the rest."),
)


def _asset(name: str) -> str:
    return resources.files("nndoctor.report").joinpath("assets").joinpath(name).read_text(encoding="utf-8")


def _value(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.4g}"
    text = json.dumps(_jsonable(value), ensure_ascii=False) if not isinstance(value, str) else value
    return text if len(text) <= 400 else text[:399] + "…"


def _finding_html(finding: Finding, display_location: Any, reason: str | None = None) -> str:
    esc = html.escape
    where = display_location(finding.location) if finding.location else ""
    when = []
    if finding.count > 1:
        when.append(f"×{finding.count}")
    if finding.first_step is not None:
        when.append(f"first at step {finding.first_step}")
    evidence = "".join(
        f"<tr><td>{esc(str(k))}</td><td class=mono>{esc(_value(v))}</td></tr>"
        for k, v in finding.evidence.items() if not str(k).startswith("_")
    )
    parts = [
        f'<div class="finding {finding.severity.label}" data-code="{esc(finding.code)}">',
        '<div class="head">',
        f'<span class="sev">{finding.severity.label}</span>',
        f'<span class="code mono">{esc(finding.code)}</span><span class="name">{esc(finding.name)}</span>',
        f'<span class="where mono">{esc(where)}</span>' if where else "",
        f'<span class="when">{esc(", ".join(when))}</span>' if when else "",
        "</div>",
        f'<p class="msg">{esc(finding.message)}</p>',
        f'<table class="evidence">{evidence}</table>' if evidence else "",
        f'<p class="fix"><b>Fix:</b> {esc(finding.fix)}</p>',
        f'<p class="when">suppressed: {esc(reason)}</p>' if reason else "",
        "</div>",
    ]
    return "".join(parts)


def _summary(report: Report) -> str:
    counts = {s: sum(1 for f in report.findings if f.severity == s) for s in Severity}
    pills = [f'<span class="pill {s.label}">{n} {s.label}{"s" if n != 1 else ""}</span>'
             for s, n in sorted(counts.items(), reverse=True) if n]
    if not report.findings:
        pills.append('<span class="pill clean">no problems found</span>')
    if report.suppressed:
        pills.append(f'<span class="pill">{len(report.suppressed)} suppressed</span>')
    if report.internal_errors:
        pills.append(f'<span class="pill">{len(report.internal_errors)} internal error(s)</span>')
    return '<div class="summary">' + "".join(pills) + "</div>"


def _perf_breakdown_html(report: Report) -> str:
    """``nndoctor perf``'s step-time breakdown as a table of bars (no script needed)."""
    perf = report.extra.get("perf") if isinstance(report.extra, dict) else None
    breakdown = (perf or {}).get("breakdown") or {}
    steps = breakdown.get("steps")
    if not steps:
        return ""
    try:
        from nndoctor.commands.perf.timeline import PHASE_LABELS
    except Exception:  # noqa: BLE001 - labels are a nicety
        PHASE_LABELS = {}
    rows = []
    for name, seconds in (breakdown.get("phases_s") or {}).items():
        fraction = float((breakdown.get("fractions") or {}).get(name) or 0.0)
        label = html.escape(PHASE_LABELS.get(name, name))
        rows.append(
            f"<tr><td>{label}</td><td class=mono>{1000 * seconds / steps:.2f} ms</td>"
            f"<td class=mono>{fraction:.1%}</td><td style=\"width:50%\"><div class=bar "
            f"style=\"width:{100 * max(0.0, min(1.0, fraction)):.1f}%\"></div></td></tr>")
    median = breakdown.get("median_step_s")
    head = f"median step {1000 * median:.1f} ms over {steps} measured steps" if median else f"{steps} measured steps"
    return (f'<h2>Where the step time goes</h2><p class="note">{html.escape(head)}</p>'
            f'<table class="evidence perf" id="perf-breakdown">{"".join(rows)}</table>' + _perf_trials_html(perf))


def _perf_trials_html(perf: Any) -> str:
    """The --try results as the terminal shows them: measured lines say "measured", predicted
    gains of changes not measured say "a prediction, not a measurement"."""
    trials = (perf or {}).get("trials") or {}
    if not trials:
        return ""
    try:
        from nndoctor.commands.perf.render import trial_lines

        lines = trial_lines(trials)
    except Exception:  # noqa: BLE001 - the breakdown above still stands
        return ""
    return (f'<h3>What --try measured (and predicted)</h3><pre class="mono" id="perf-trials">'
            f'{html.escape(chr(10).join(lines))}</pre>') if lines else ""


def render_html(report: Report, *, title: str | None = None, display_location: Any = str,
                fragment: bool = False) -> str:
    """The report as one HTML page (``fragment``: a block without <html>/<head>, for notebooks).

    ``display_location`` turns a Location into the text shown (notebooks show "cell 3, line 4").
    """
    esc = html.escape
    command = " ".join(report.command) or "nndoctor"
    status = report.status + (f" after {report.steps} optimizer step{'s' if report.steps != 1 else ''}"
                              if report.steps else "")
    history = report.history.to_json() if report.history is not None else None
    data = {
        "findings": [f.to_json() for f in report.sorted_findings()],
        "history": history,
    }
    # "</script>" inside the data must not end the script element.
    data_json = json.dumps(data, ensure_ascii=False).replace("<", "\\u003c")
    findings = "".join(_finding_html(f, display_location) for f in report.sorted_findings())
    suppressed = "".join(_finding_html(s.finding, display_location, s.reason) for s in report.suppressed)
    body = [
        "<main>",
        "<header>",
        f"<h1>nndoctor · {esc(title or command)}</h1>",
        f'<div class="meta">{esc(command)} · {esc(status)} · nndoctor {esc(__version__)}</div>',
        "</header>",
        _summary(report),
        "<h2>Findings</h2>",
        findings or '<p class="empty">No problems found.</p>',
    ]
    if suppressed:
        body.append(f"<details><summary>{len(report.suppressed)} suppressed finding(s)</summary>{suppressed}</details>")
    if report.traceback and report.status == "crashed":
        body.append(f'<h2>The script raised</h2><pre class="tb">{esc(report.traceback)}</pre>')
    perf_section = _perf_breakdown_html(report)
    if perf_section:
        body.append(perf_section)
    if history is not None:
        body.append("<h2>What the doctor saw, step by step</h2><div class=\"grid\">")
        for plot_id, heading, note in _PLOTS:
            body.append(f'<section class="plot" id="{plot_id}"><h3>{esc(heading)}</h3>'
                        f'<p class="note">{esc(note)}</p></section>')
        body.append("</div>")
    if report.internal_errors:
        errors = "".join(f"<li><b>{esc(e.where)}</b>: {esc(e.error)}</li>" for e in report.internal_errors)
        body.append(f"<details><summary>internal errors in nndoctor</summary><ul>{errors}</ul></details>")
    body.append('<footer>Generated by nndoctor; `nndoctor checks CODE` explains each code.</footer></main>')
    body.append(f'<script type="application/json" id="nndoctor-data">{data_json}</script>')
    body.append(f"<script>{_asset('report.js')}</script>")
    content = "\n".join(body)
    style = f"<style>{_asset('report.css')}</style>"
    if fragment:
        return f'<div class="nndoctor-report">{style}{content}</div>'
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>nndoctor · {esc(title or command)}</title>{style}</head>\n<body>\n{content}\n</body></html>\n"
    )


def write_html(report: Report, path: str | os.PathLike[str], **options: Any) -> None:
    atomic_write_text(path, render_html(report, **options))
