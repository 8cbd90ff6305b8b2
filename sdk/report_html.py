"""The evaluation report as one self-contained HTML page (DESIGN §8).

Everything is inline: CSS, a few lines of JavaScript (to open a trajectory), and the
charts as SVG drawn here. The page loads nothing from the network, so it can be mailed,
attached to a CI run or opened from disk years later.
"""

from __future__ import annotations

import datetime
import html
import json
from collections.abc import Sequence
from typing import Any

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4d7c0f", "#be185d")
MAX_CURVES = 8

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#111;
background:#f7f7f8}
main{max-width:1200px;margin:0 auto;padding:16px 24px 64px}
h1{font-size:22px;margin:8px 0 4px}
h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
 h3{font-size:14px;margin:14px 0 6px}
.sub{color:#555;margin-bottom:12px}
.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{background:#fff;border:1px solid #e3e3e6;border-radius:8px;padding:10px 14px;min-width:120px}
.card b{display:block;font-size:20px} .card span{color:#666;font-size:12px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(360px,1fr));gap:16px}
.stack{display:grid;grid-template-columns:1fr;gap:16px}
.panel{background:#fff;border:1px solid #e3e3e6;border-radius:8px;padding:10px 14px;overflow:auto}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eee;vertical-align:top}
th{background:#fafafa;position:sticky;top:0}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
tr.attempt-row{cursor:pointer} tr.attempt-row:hover{background:#eef4ff}
tr.attempt-row.selected{background:#dbe8ff}
.status-ok{color:#166534} .status-error{color:#b45309} .status-void{color:#6b21a8}
.kv td:first-child{color:#555;white-space:nowrap;width:1%}
code,pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace}
pre{white-space:pre-wrap;word-break:break-word;background:#f4f4f6;padding:6px 8px;border-radius:6px;
margin:4px 0;max-height:320px;overflow:auto}
.trajectory{background:#fff;border:2px solid #2563eb;border-radius:8px;padding:10px 14px;
margin-top:12px}
.step{border-left:3px solid #cbd5e1;padding:4px 10px;margin:8px 0}
.step.refused{border-color:#f59e0b} .step.final{border-color:#16a34a}
.legend span{display:inline-block;margin-right:12px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
svg text{font:11px system-ui,sans-serif;fill:#333}
.hint{color:#666;font-size:12px}
"""

JS = """
function showTrajectory(i){
  document.querySelectorAll('section.trajectory').forEach(function(s){s.hidden=true;});
  document.querySelectorAll('tr.attempt-row').forEach(function(r){r.classList.remove('selected');});
  var t=document.getElementById('traj-'+i); if(!t){return;}
  t.hidden=false;
  var row=document.querySelector('tr.attempt-row[data-idx="'+i+'"]');
  if(row){row.classList.add('selected');}
  t.scrollIntoView({block:'start'});
}
document.querySelectorAll('tr.attempt-row').forEach(function(r){
  r.addEventListener('click',function(){showTrajectory(r.dataset.idx);});
});
document.querySelectorAll('button.close-trajectory').forEach(function(b){
  b.addEventListener('click',function(){b.closest('section').hidden=true;});
});
var filter=document.getElementById('attempt-filter');
if(filter){filter.addEventListener('input',function(){
  var q=filter.value.toLowerCase();
  document.querySelectorAll('tr.attempt-row').forEach(function(r){
    r.hidden=q!=='' && r.textContent.toLowerCase().indexOf(q)<0;});
});}
if(location.hash.indexOf('#traj-')===0){showTrajectory(location.hash.slice(6));}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _f(value: Any, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if isinstance(value, int | float) else _e(value)


# -- SVG charts ---------------------------------------------------------------------------------


def bar_chart(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    title: str,
    width: int = 420,
    height: int = 200,
    y_max: float | None = None,
    fmt: str = "{:.0f}",
    color: str = PALETTE[0],
) -> str:
    """Vertical bars with their value above each."""
    if not values:
        return f'<p class="hint">{_e(title)}: no data</p>'
    top = y_max if y_max is not None else max(max(values), 1e-9)
    left, bottom, pad = 36, 36, 16
    plot_w, plot_h = width - left - pad, height - bottom - pad
    step = plot_w / len(values)
    parts = [_svg_open(width, height, title)]
    parts.append(_axis(left, pad, plot_w, plot_h, top, fmt))
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        h = 0.0 if top <= 0 else plot_h * min(value, top) / top
        x = left + i * step + step * 0.12
        y = pad + plot_h - h
        parts.append(
            f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{step * 0.76:.1f}" '
            f'height="{max(h, 0.5):.1f}" fill="{color}"><title>{_e(label)}: '
            f"{_e(fmt.format(value))}</title></rect>"
        )
        if value:
            parts.append(
                f'<text x="{x + step * 0.38:.1f}" y="{y - 3:.1f}" text-anchor="middle">'
                f"{_e(fmt.format(value))}</text>"
            )
        if len(values) <= 24 or i % max(1, len(values) // 12) == 0:
            parts.append(
                f'<text x="{x + step * 0.38:.1f}" y="{pad + plot_h + 14}" '
                f'text-anchor="middle">{_e(label[:14])}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


def hbar_chart(
    rows: Sequence[tuple[str, float, float]], *, title: str, width: int = 560, x_max: float = 1.0
) -> str:
    """Horizontal bars (mean) with stderr whiskers, one row per group."""
    if not rows:
        return f'<p class="hint">{_e(title)}: no data</p>'
    label_w, pad, row_h = 170, 14, 20
    plot_w = width - label_w - pad - 96
    height = pad * 2 + row_h * len(rows) + 16
    parts = [_svg_open(width, height, title)]
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        x = label_w + plot_w * tick
        parts.append(
            f'<line x1="{x:.1f}" y1="{pad}" x2="{x:.1f}" y2="{height - pad - 12}" '
            'stroke="#e5e7eb"/>'
            f'<text x="{x:.1f}" y="{height - pad}" text-anchor="middle">{tick * x_max:g}</text>'
        )
    for i, (label, mean, err) in enumerate(rows):
        y = pad + i * row_h
        w = plot_w * max(0.0, min(mean, x_max)) / x_max
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{_e(label[:26])}</text>'
            f'<rect class="bar" x="{label_w}" y="{y + 3}" width="{max(w, 0.5):.1f}" '
            f'height="{row_h - 6}" fill="{PALETTE[0]}"><title>{_e(label)}: {mean:.3f} ± '
            f"{err:.3f}</title></rect>"
        )
        if err > 0:
            lo = label_w + plot_w * max(0.0, mean - err) / x_max
            hi = label_w + plot_w * min(x_max, mean + err) / x_max
            mid = y + row_h / 2
            parts.append(
                f'<line class="whisker" x1="{lo:.1f}" y1="{mid:.1f}" x2="{hi:.1f}" '
                f'y2="{mid:.1f}" stroke="#111" stroke-width="1.5"/>'
            )
        parts.append(f'<text x="{label_w + plot_w + 6}" y="{y + 13}">{mean:.3f} ± {err:.3f}</text>')
    parts.append("</svg>")
    return "".join(parts)


def line_chart(
    series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    *,
    title: str,
    width: int = 460,
    height: int = 240,
    x_label: str = "k",
) -> str:
    """Lines with a point at each value; y in [0, 1]."""
    series = [(name, pts) for name, pts in series if pts]
    if not series:
        return f'<p class="hint">{_e(title)}: no data</p>'
    xs = [x for _, pts in series for x, _ in pts]
    x_lo, x_hi = min(xs), max(xs)
    span = (x_hi - x_lo) or 1.0
    left, bottom, pad = 40, 34, 16
    plot_w, plot_h = width - left - pad, height - bottom - pad
    parts = [_svg_open(width, height, title), _axis(left, pad, plot_w, plot_h, 1.0, "{:.2f}")]

    def px(x: float) -> float:
        return left + (plot_w * (x - x_lo) / span if x_hi > x_lo else plot_w / 2)

    def py(y: float) -> float:
        return pad + plot_h - plot_h * max(0.0, min(1.0, y))

    for x in sorted(set(xs)):
        parts.append(
            f'<text x="{px(x):.1f}" y="{pad + plot_h + 14}" text-anchor="middle">{x:g}</text>'
        )
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 4}" text-anchor="middle">'
        f"{_e(x_label)}</text>"
    )
    for i, (name, pts) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        parts.append(
            f'<polyline class="curve" points="{path}" fill="none" stroke="{color}" '
            'stroke-width="2"/>'
        )
        for x, y in pts:
            parts.append(
                f'<circle class="point" cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" '
                f'fill="{color}"><title>{_e(name)} pass@{x:g} = {y:.3f}</title></circle>'
            )
    parts.append("</svg>")
    legend = "".join(
        f'<span><i style="background:{PALETTE[i % len(PALETTE)]}"></i>{_e(name)}</span>'
        for i, (name, _) in enumerate(series)
    )
    return "".join(parts) + f'<div class="legend">{legend}</div>'


def _svg_open(width: int, height: int, title: str) -> str:
    return (
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'style="width:100%;max-width:{width}px;height:auto" '
        f'aria-label="{_e(title)}"><title>{_e(title)}</title>'
    )


def _axis(left: int, top: int, plot_w: float, plot_h: float, y_max: float, fmt: str) -> str:
    parts = [
        f'<line x1="{left}" y1="{top + plot_h:.1f}" x2="{left + plot_w:.1f}" '
        f'y2="{top + plot_h:.1f}" stroke="#999"/>'
    ]
    for frac in (0.0, 0.5, 1.0):
        y = top + plot_h - plot_h * frac
        parts.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w:.1f}" y2="{y:.1f}" '
            'stroke="#eee"/>'
            f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">'
            f"{_e(fmt.format(y_max * frac))}</text>"
        )
    return "".join(parts)


# -- the page -----------------------------------------------------------------------------------


def _cards(items: Sequence[tuple[str, str]]) -> str:
    body = "".join(f'<div class="card"><b>{_e(v)}</b><span>{_e(k)}</span></div>' for k, v in items)
    return f'<div class="cards">{body}</div>'


def _kv(rows: Sequence[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><td>{_e(k)}</td><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def _header(report: dict[str, Any]) -> str:
    h = report["header"]
    when = datetime.datetime.fromtimestamp(float(h.get("generated_at", 0)), datetime.UTC)
    digests = h.get("task_digests") or {}
    digest_rows = "".join(
        f"<tr><td><code>{_e(t)}</code></td><td><code>{_e(d)}</code></td></tr>"
        for t, d in sorted(digests.items())
    )
    grading = h.get("grading") or {}
    rows: list[tuple[str, Any]] = [
        ("pack", f"<code>{_e(h.get('pack'))}@{_e(h.get('version'))}</code>"),
        ("pack digest", f"<code>{_e(h.get('pack_digest'))}</code>"),
        ("tasks digest", f"<code>{_e(h.get('tasks_digest'))}</code> ({len(digests)} tasks)"),
        ("split", _e(h.get("split"))),
        *([("held-out draw", _e(h["heldout_draw"]))] if h.get("heldout_draw") is not None else []),
        ("policy", f"<code>{_e(h.get('policy'))}</code>"),
        ("sampling", f"<code>{_e(json.dumps(h.get('sampling', {})))}</code>"),
        ("seeds", _e(h.get("seeds"))),
        ("k", _e(h.get("k"))),
        ("limits", f"<code>{_e(json.dumps(h.get('limits', {})))}</code>"),
        ("server", f"{_e(h.get('server'))} (palaestra {_e(h.get('server_version', '?'))})"),
        ("run", f"<code>{_e(h.get('run_id', '-'))}</code>"),
        ("grading", _e(grading.get("note", "from the verdicts recorded during the run"))),
        ("generated", _e(when.strftime("%Y-%m-%d %H:%M:%S UTC"))),
    ]
    return (
        _kv(rows) + f"<details><summary>task digests</summary><table>{digest_rows}</table>"
        "</details>"
    )


def _breakdown(report: dict[str, Any], key: str, k: int) -> str:
    groups = report["by"][key]
    chart = hbar_chart(
        [(name, s["mean_reward"], s["stderr"]) for name, s in groups.items()],
        title=f"mean reward by {key}",
    )
    head = (
        f"<tr><th>{_e(key)}</th><th class=num>tasks</th><th class=num>attempts</th>"
        "<th class=num>mean reward ± stderr</th><th class=num>pass@1</th>"
        + (f"<th class=num>pass@{k}</th>" if k > 1 else "")
        + "<th class=num>void</th><th class=num>errors</th></tr>"
    )
    body = "".join(
        f"<tr><td>{_e(name)}</td><td class=num>{s['tasks']}</td><td class=num>{s['attempts']}</td>"
        f"<td class=num>{s['mean_reward']:.3f} ± {s['stderr']:.3f}</td>"
        f"<td class=num>{_f(s['pass_at_k'].get('1', '-'))}</td>"
        + (f"<td class=num>{_f(s['pass_at_k'].get(str(k), '-'))}</td>" if k > 1 else "")
        + f"<td class=num>{s['void']}</td><td class=num>{s['errors']}</td></tr>"
        for name, s in groups.items()
    )
    return (
        f'<div class="panel" id="by-{_e(key)}"><h3>by {_e(key)}</h3>{chart}'
        f"<table>{head}{body}</table></div>"
    )


def _pass_curves(report: dict[str, Any], k: int) -> str:
    series: list[tuple[str, list[tuple[float, float]]]] = [
        ("all", [(float(j), v) for j, v in report["summary"]["pass_at_k"].items()])
    ]
    domains = sorted(report["by"]["domain"].items(), key=lambda kv: -kv[1]["attempts"])
    for name, s in domains[: MAX_CURVES - 1]:
        if len(domains) > 1:
            series.append((name, [(float(j), v) for j, v in s["pass_at_k"].items()]))
    note = (
        f'<p class="hint">{len(domains) - MAX_CURVES + 1} more domains in the tables</p>'
        if len(domains) > MAX_CURVES - 1
        else ""
    )
    return line_chart(series, title=f"unbiased pass@k, k = 1..{k}") + note


def _process(report: dict[str, Any]) -> str:
    p = report["process"]
    steps = p["steps_histogram"]
    phases = p["phases"]
    failures = p["failure_classes"]
    cards = _cards(
        [
            ("mean steps", f"{p['steps']['mean']:.2f}"),
            ("tool calls", str(p["tool_calls"])),
            ("tool-call success", f"{p['tool_call_success']:.1%}"),
            ("mean tokens", f"{p['tokens']['total']['mean']:.0f}"),
            ("mean attempt time", f"{p['duration_s']['mean']:.2f} s"),
            ("void", str(p["void"])),
        ]
    )
    charts = [
        bar_chart(list(steps), list(steps.values()), title="steps per attempt"),
        bar_chart(
            [name.removesuffix("_s") for name in phases],
            [v["mean"] for v in phases.values()],
            title="mean time per phase (s)",
            fmt="{:.3f}",
            color=PALETTE[2],
        ),
        bar_chart(
            list(failures) or ["none"],
            list(failures.values()) or [0],
            title="failure classes",
            color=PALETTE[1],
        ),
    ]
    server = p.get("server") or {}
    extra = (
        "<h3>server-side process metrics</h3>"
        + _kv([(k, _f(v, 3 if "rate" in k else 0)) for k, v in sorted(server.items())])
        if server
        else ""
    )
    voids = p.get("void_reasons") or {}
    void_table = (
        "<h3>void reasons</h3>" + _kv([(r, str(n)) for r, n in voids.items()]) if voids else ""
    )
    token_rows = [
        (name, f"mean {s['mean']:.0f} · p90 {s['p90']:.0f} · total {s['total']:.0f}")
        for name, s in p["tokens"].items()
    ]
    phase_rows = [
        (name, f"mean {s['mean']:.3f} s · p90 {s['p90']:.3f} s · total {s['total']:.2f} s")
        for name, s in phases.items()
    ]
    return (
        cards
        + '<div class="grid">'
        + "".join(f'<div class="panel">{c}</div>' for c in charts)
        + f'<div class="panel"><h3>tokens</h3>{_kv(token_rows)}<h3>phases</h3>{_kv(phase_rows)}'
        f"<h3>stop reasons</h3>{_kv([(r, str(n)) for r, n in p['stop_reasons'].items()])}"
        f"{void_table}{extra}</div></div>"
    )


def _hacks(report: dict[str, Any]) -> str:
    """The reward-hack monitor's table: per domain, attempts flagged and by which rule."""
    h = report.get("hacks") or {}
    rules = list(h.get("descriptions") or {})
    rows = [*(h.get("domains") or {}).items(), ("all", h)] if h else []
    head = (
        "<tr><th>domain</th><th class=num>attempts</th><th class=num>flagged</th>"
        "<th class=num>flagged share</th>"
        + "".join(f"<th class=num>{_e(r)}</th>" for r in rules)
        + "</tr>"
    )
    body = "".join(
        f"<tr><td>{_e(name)}</td><td class=num>{c['episodes']}</td>"
        f"<td class=num>{c['flagged']}</td><td class=num>{c['flagged_share']:.1%}</td>"
        + "".join(f"<td class=num>{c['rules'].get(r, 0)}</td>" for r in rules)
        + "</tr>"
        for name, c in rows
    )
    legend = _kv([(r, _e(d)) for r, d in (h.get("descriptions") or {}).items()])
    return (
        '<div class="panel" id="hack-monitor"><p class="hint">Attempts whose actions touch '
        "verifier-sensitive ground; a flag is a signal, not a verdict (rewards are "
        f"unchanged).</p><table>{head}{body}</table>"
        f"<details><summary>rules</summary>{legend}</details></div>"
    )


def _attempt_rows(attempts: Sequence[dict[str, Any]]) -> str:
    rows = []
    for i, a in enumerate(attempts):
        rows.append(
            f'<tr class="attempt-row" data-idx="{i}" title="open its trajectory">'
            f"<td><code>{_e(a['task'])}</code></td><td class=num>{a['attempt']}</td>"
            f"<td class=num>{a['seed']}</td>"
            f'<td class="status-{_e(a["status"])}">{_e(a["status"])}</td>'
            f"<td class=num>{a['reward']:.3f}</td><td>{'✓' if a['passed'] else ''}</td>"
            f"<td class=num>{a['steps']}</td><td class=num>{a['tool_calls']}</td>"
            f"<td class=num>{a.get('tokens_prompt', 0) + a.get('tokens_completion', 0)}</td>"
            f"<td class=num>{a['duration_s']:.2f}</td><td>{_e(a.get('stop', ''))}</td>"
            f"<td>{_e(a.get('failure', ''))}</td>"
            f"<td>{_e(' '.join(sorted({f['rule'] for f in a.get('hack_flags') or []})))}</td></tr>"
        )
    return "".join(rows)


def _rounded(values: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in values.items()}


def _trajectory(i: int, a: dict[str, Any]) -> str:
    facts: list[tuple[str, Any]] = [
        ("task", f"<code>{_e(a['task'])}</code> (attempt {a['attempt']}, seed {a['seed']})"),
        ("episode", f"<code>{_e(a.get('episode_id', ''))}</code>"),
        ("task digest", f"<code>{_e(a.get('task_digest', ''))}</code>"),
        ("status", f'<span class="status-{_e(a["status"])}">{_e(a["status"])}</span>'),
        ("reward", f"{a['reward']:.3f} ({'passed' if a['passed'] else 'not passed'})"),
        ("components", f"<code>{_e(json.dumps(a.get('components', {})))}</code>"),
        ("verifier", f"<code>{_e(json.dumps(a.get('verifier', {})))}</code>"),
        ("stop", _e(a.get("stop", ""))),
        ("phases", f"<code>{_e(json.dumps(_rounded(a.get('phases', {}))))}</code>"),
    ]
    if a.get("error_class"):
        facts.append(("error", f"<b>{_e(a['error_class'])}</b>: {_e(a.get('error', ''))}"))
    if a.get("regraded"):
        facts.append(("regraded", f"<code>{_e(json.dumps(a['regraded']))}</code>"))
    if a.get("process"):
        facts.append(("server metrics", f"<code>{_e(json.dumps(a['process']))}</code>"))
    if a.get("feedback"):
        facts.append(("feedback", f"<pre>{_e(a['feedback'])}</pre>"))
    if a.get("hack_flags"):
        lines = "\n".join(
            f"step {f['index']}: {f['rule']}: {f['note']}\n    {f['excerpt']}"
            for f in a["hack_flags"]
        )
        facts.append(("hack flags", f"<pre>{_e(lines)}</pre>"))
    steps = []
    trajectory = a.get("trajectory") or []
    for s in trajectory:
        kind = (
            "refused"
            if s.get("error")
            else "final"
            if s.get("terminated") or s.get("truncated")
            else ""
        )
        obs = s.get("observation") or {}
        body = (
            f"<div><b>step {s.get('index', '?')}</b> · policy {s.get('policy_s', 0):.3f} s"
            f" · env {s.get('env_s', 0):.3f} s · tokens so far {s.get('tokens', 0)}</div>"
            f"<div>action</div><pre>{_e(json.dumps(s.get('action'), indent=1))}</pre>"
        )
        if s.get("error"):
            body += f"<div>refused</div><pre>{_e(s['error'])}</pre>"
        if obs:
            images = f" (+{obs.get('images')} image(s))" if obs.get("images") else ""
            body += f"<div>observation{images}</div><pre>{_e(obs.get('text', ''))}</pre>"
        if s.get("terminated") or s.get("truncated"):
            body += (
                f"<div>{'terminated' if s.get('terminated') else 'truncated'}, reward "
                f"{s.get('reward', 0):.3f}</div>"
            )
        steps.append(f'<div class="step {kind}">{body}</div>')
    if not steps:
        steps.append('<p class="hint">no steps were taken</p>')
    return (
        f'<section class="trajectory" id="traj-{i}" hidden>'
        f"<h3>trajectory: {_e(a['task'])} #{a['attempt']} "
        f'<button class="close-trajectory" type="button">close</button></h3>'
        f'{_kv(facts)}<div class="steps">{"".join(steps)}</div></section>'
    )


def render_html(report: dict[str, Any]) -> str:
    h, s = report["header"], report["summary"]
    k = int(h.get("k", 1))
    hist = report["reward_histogram"]
    edges = hist["edges"]
    labels = [f"{edges[i]:.1f}" for i in range(len(edges) - 1)]
    attempts = report["attempts"]
    title = f"{h.get('policy')} on {h.get('pack')}@{h.get('version')} ({h.get('split')})"
    summary = _cards(
        [
            ("mean reward ± stderr", f"{s['mean_reward']:.3f} ± {s['stderr']:.3f}"),
            ("pass@1", _f(s["pass_at_k"].get("1", 0.0))),
            *([(f"pass@{k}", _f(s["pass_at_k"].get(str(k), 0.0)))] if k > 1 else []),
            ("tasks", str(s["tasks"])),
            ("attempts", str(s["attempts"])),
            ("void", str(s["void"])),
            ("policy errors", str(s["errors"])),
        ]
    )
    head = (
        "<tr><th>task</th><th class=num>#</th><th class=num>seed</th><th>status</th>"
        "<th class=num>reward</th><th>pass</th><th class=num>steps</th><th class=num>calls</th>"
        "<th class=num>tokens</th><th class=num>time (s)</th><th>stop</th><th>failure</th>"
        "<th>hack flags</th></tr>"
    )
    trajectories = "".join(_trajectory(i, a) for i, a in enumerate(attempts))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)} · palaestra eval</title><style>{CSS}</style></head>
<body><main>
<h1>{_e(title)}</h1>
<div class="sub">palaestra evaluation report · {s["tasks"]} tasks × k={k}</div>
{summary}
<h2 id="header">Header</h2><div class="panel">{_header(report)}</div>
<h2 id="rewards">Rewards</h2>
<div class="grid">
<div class="panel" id="reward-distribution">{
        bar_chart(labels, hist["counts"], title="reward distribution (non-void attempts)")
    }<p class="hint">bins of 0.1 by their lower edge; the last holds 0.9–1.0</p></div>
<div class="panel" id="pass-at-k">{_pass_curves(report, k)}</div>
</div>
<h2 id="breakdowns">Breakdowns (mean ± stderr)</h2>
<div class="stack">{
        "".join(_breakdown(report, key, k) for key in ("family", "domain", "difficulty"))
    }
</div>
<h2 id="process">Process</h2>
{_process(report)}
<h2 id="hacks">Reward-hack monitor</h2>
{_hacks(report)}
<h2 id="attempts">Attempts</h2>
<p class="hint">Click an attempt to open its trajectory.
<input id="attempt-filter" placeholder="filter (task, status, failure…)"></p>
<div class="panel" style="max-height:520px"><table id="attempt-table">{head}{
        _attempt_rows(attempts)
    }</table></div>
<div id="trajectories">{trajectories}</div>
</main><script>{JS}</script></body></html>
"""
