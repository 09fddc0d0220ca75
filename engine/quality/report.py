"""The evaluation as one self-contained HTML page: summary, plots, table, players; and
as words (`format_summary`: the CLI's and the API's summary).

Plots are inline SVG drawn here (no JavaScript, no network): speaker
similarity per checkpoint (both encoders, the zero-shot clone and the
ceiling as dashed lines), word error rate per checkpoint, speaking rate
against the speaker's own. Audio players point at the renders beside the page.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from engine.core.kinds import VoiceKind
from engine.layout.run import REPORT_FILE
from engine.layout.voice import display_path
from engine.prepare.styles import styles_obeyed

COLORS = ("#2463eb", "#d9480f", "#2b8a3e", "#862e9c")
ZERO_SHOT_COLOR = "#c2255c"  # apart from every series colour
_STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse;font-size:.92em}
td,th{padding:4px 8px;border-bottom:1px solid #ddd;text-align:right}
td:first-child,th:first-child{text-align:left}
tr.best td{background:#eef6ee;font-weight:600}
.warn{color:#a61e4d}.muted{color:#777}
.plots{display:flex;flex-wrap:wrap;gap:18px}
audio{width:210px;height:32px}
"""


def _esc(x: Any) -> str:
    return html.escape(str(x))


def _fmt(x: Any, spec: str) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return format(x, spec)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering lo..hi."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, count - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    start = math.floor(lo / step + 1e-9) * step
    ticks = []
    v = start
    while v < hi + step * 0.999:
        ticks.append(round(v, 10))
        v += step
    return ticks


def _tick_text(v: float, ticks: list[float]) -> str:
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else 1.0
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) if step < 1 else 0
    text = f"{v:.{decimals}f}"
    return text.lstrip("-") if float(text) == 0 else text


def line_plot(title: str, series: list[dict[str, Any]], hlines: list[dict[str, Any]],
              x_label: str = "step", y_label: str = "", width: int = 380,
              height: int = 230) -> str:
    """An SVG line chart. `series`: {"name", "points": [(x, y)...]};
    `hlines`: {"name", "y"} drawn dashed across the plot. Round tick values; the legend
    sits below the plot (names on the plot overlapped each other and the lines)."""
    pts = [(x, y) for s in series for x, y in s["points"]
           if y is not None and math.isfinite(y)]
    lines = [h for h in hlines if h.get("y") is not None and math.isfinite(h["y"])]
    ys = [y for _, y in pts] + [h["y"] for h in lines]
    xs = [x for x, _ in pts]
    items = [(s["name"], s.get("color", COLORS[i % len(COLORS)]), False)
             for i, s in enumerate(series)] + \
        [(h["name"], h.get("color", "#888"), True) for h in lines]
    per_row = 2
    legend_rows = max(1, math.ceil(len(items) / per_row))
    left, right, top, bottom = 48, 12, 26, 40
    pw, ph = width - left - right, height - top - bottom
    total = height + 16 * legend_rows + 4
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{total}" '
           f'role="img" aria-label="{_esc(title)}">',
           f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13" '
           f'font-weight="600">{_esc(title)}</text>']
    if not ys:
        out.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" '
                   'font-size="12" fill="#777">no data</text></svg>')
        return "".join(out)
    lo, hi = min(ys), max(ys)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.05, hi + 0.05
    ticks = nice_ticks(lo, hi)
    y0, y1 = ticks[0], ticks[-1]
    x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if x1 - x0 < 1e-9:
        x0, x1 = x0 - 1, x1 + 1
    xpad = 0.04 * (x1 - x0)
    x0, x1 = x0 - xpad, x1 + xpad

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * ph

    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" '
               'stroke="#bbb"/>')
    for yv in ticks:
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{sy(yv):.1f}" y2="{sy(yv):.1f}" '
                   'stroke="#eee"/>')
        out.append(f'<text x="{left - 4}" y="{sy(yv) + 4:.1f}" text-anchor="end" '
                   f'font-size="10">{_tick_text(yv, ticks)}</text>')
    steps = sorted(set(xs))
    stride = max(1, math.ceil(len(steps) / 8))  # at most ~8 labels under the axis
    for x in steps[::stride]:
        out.append(f'<text x="{sx(x):.1f}" y="{top + ph + 14}" text-anchor="middle" '
                   f'font-size="10">{x:g}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle" '
               f'font-size="11">{_esc(x_label)}</text>')
    if y_label:
        out.append(f'<text x="12" y="{top + ph / 2}" font-size="11" text-anchor="middle" '
                   f'transform="rotate(-90 12 {top + ph / 2})">{_esc(y_label)}</text>')
    for h in lines:
        color = h.get("color", "#888")
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{sy(h["y"]):.1f}" '
                   f'y2="{sy(h["y"]):.1f}" stroke="{color}" stroke-dasharray="5,4">'
                   f'<title>{_esc(h["name"])}: {h["y"]:.3f}</title></line>')
    for i, s in enumerate(series):
        color = s.get("color", COLORS[i % len(COLORS)])
        good = [(x, y) for x, y in s["points"] if y is not None and math.isfinite(y)]
        if len(good) > 1:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in good)
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" '
                       'stroke-width="2"/>')
        for x, y in good:
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="{color}">'
                       f'<title>{_esc(s["name"])} {x:g}: {y:.3f}</title></circle>')
    # the legend, below the chart: a sample of each line (dashed for reference lines)
    col_w = (width - 16) / per_row
    for k, (name, color, dashed) in enumerate(items):
        lx = 16 + col_w * (k % per_row)
        ly = height + 10 + 16 * (k // per_row)
        dash = ' stroke-dasharray="5,4"' if dashed else ""
        out.append(f'<line x1="{lx:.1f}" x2="{lx + 18:.1f}" y1="{ly - 4}" y2="{ly - 4}" '
                   f'stroke="{color}" stroke-width="2"{dash}/>')
        out.append(f'<text class="legend" x="{lx + 22:.1f}" y="{ly}" font-size="10" '
                   f'fill="{color}">{_esc(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def _plots(result: dict[str, Any]) -> list[str]:
    entries = result["entries"]
    ckpts = [e for e in entries if e["kind"] == VoiceKind.CHECKPOINT and e.get("step") is not None]
    zero = next((e for e in entries if e["kind"] == VoiceKind.ZERO_SHOT), None)
    export = next((e for e in entries if e["kind"] == VoiceKind.CUSTOM_VOICE), None)

    def pts(key: str) -> list[tuple[float, float | None]]:
        return [(float(e["step"]), e["mean"].get(key)) for e in ckpts]

    def h(entry: dict[str, Any] | None, key: str, name: str, color: str
          ) -> list[dict[str, Any]]:
        if entry is None or entry["mean"].get(key) is None:
            return []
        return [{"name": name, "y": entry["mean"][key], "color": color}]

    ceiling = result["reference"]["self_similarity"].get("resemblyzer")
    sim_series = [{"name": "resemblyzer (independent)", "points": pts("similarity")}]
    if any(y is not None for _, y in pts("similarity_model")):
        sim_series.append({"name": "model's own encoder", "points": pts("similarity_model")})
    sim = line_plot("Speaker similarity per checkpoint", sim_series,
                    h(zero, "similarity", "zero-shot", ZERO_SHOT_COLOR)
                    + h(export, "similarity", "export", "#2b8a3e")
                    + ([{"name": "real clips", "y": ceiling, "color": "#555"}]
                       if ceiling is not None else []),
                    y_label="cosine")
    wer = line_plot("Word error rate per checkpoint", [{"name": "WER", "points": pts("wer")}],
                    h(zero, "wer", "zero-shot", ZERO_SHOT_COLOR), y_label="WER")
    rate = line_plot("Speaking rate vs the speaker's own",
                     [{"name": "rate ratio", "points": pts("rate_ratio")}],
                     [{"name": "speaker", "y": 1.0, "color": "#555"},
                      *h(zero, "rate_ratio", "zero-shot", ZERO_SHOT_COLOR)], y_label="x speaker")
    return [sim, wer, rate]


def _styles_table(entries: list[dict[str, Any]]) -> list[str]:
    """Per checkpoint and trained style: obeyed or not, each measure's move, and what the
    style cost in similarity and word errors against the plain renders (none: no styles)."""
    styled = [e for e in entries if e.get("styles")]
    if not styled:
        return []
    head = ("<tr><th>checkpoint</th><th>style</th><th>obeyed</th><th>checks right</th>"
            "<th>moves (styled − plain)</th><th>similarity</th><th>Δ similarity</th>"
            "<th>WER</th><th>Δ WER</th></tr>")
    rows = []
    for e in styled:
        plain = e["styles"].get("plain") or {}
        rows.append(f"<tr><td>{_esc(e['label'])}</td><td class=\"muted\">plain</td><td></td>"
                    f"<td></td><td></td><td>{_fmt(plain.get('similarity'), '.3f')}</td><td></td>"
                    f"<td>{_fmt(plain.get('wer'), '.2f')}</td><td></td></tr>")
        for style, s in e["styles"]["per_style"].items():
            verdict = {True: "yes", False: "no", None: "not measurable"}[s.get("followed")]
            moves = ", ".join(f"{w} {v:+.2f}" for w, v in (s.get("moves") or {}).items())
            cost = " class=\"warn\"" if s.get("costs_similarity") else ""
            rows.append(
                f"<tr><td></td><td>{_esc(style)}</td><td>{verdict}</td>"
                f"<td>{s['obeyed']} of {s['checked']}</td><td>{_esc(moves or '–')}</td>"
                f"<td>{_fmt(s.get('similarity'), '.3f')}</td>"
                f"<td{cost}>{_fmt(s.get('similarity_change'), '+.3f')}"
                f"{' (costs similarity)' if cost else ''}</td>"
                f"<td>{_fmt(s.get('wer'), '.2f')}</td>"
                f"<td>{_fmt(s.get('wer_change'), '+.2f')}</td></tr>")
    n = styled[0]["styles"].get("sentences")
    return [f"<h2>Styles per checkpoint</h2><p class=\"muted\">Each trained style on {n} "
            "held-out sentence(s), one seed, against the plain render of the same sentence: a "
            "style is obeyed when more than half of the checks of its measurable words "
            "(slowly, loudly, whisper, ...) went the right way.</p><table>" + head
            + "".join(rows) + "</table>"]


def render_html(result: dict[str, Any]) -> str:
    entries = result["entries"]
    best = (result.get("best") or {}).get("label")
    ref = result["reference"]
    parts = ["<!doctype html>\n<html><head><meta charset=\"utf-8\">",
             f"<title>Voxshard evaluation: {_esc(result['speaker'])} / {_esc(result['run'])}"
             f"</title><style>{_STYLE}</style></head><body>",
             f"<h1>Is the clone any good? {_esc(result['speaker'])}, run {_esc(result['run'])}"
             "</h1>"]
    base = result.get("baseline")
    facts = [f"{len(result['sentences'])} held-out sentences, seed {result['seed']}",
             f"speech recognition: {_esc(result['asr']['backend'])} "
             f"({_esc(result['asr']['model'])})",
             f"base model: {_esc(result['base_model'])}",
             f"similarity to {len(ref['clips'])} "
             f"{'held-out' if ref['held_out'] else ''} clips of the speaker"]
    if base:
        facts.append("zero-shot baseline: " + ("in-context cloning (reference clip and its "
                     "transcript)" if base["mode"] == "in_context"
                     else "speaker vector (x-vector) of the reference clip"))
    if ref.get("words_per_s"):
        facts.append(f"speaker's own rate: {ref['words_per_s']:.2f} words/s")
    ceil = ref["self_similarity"].get("resemblyzer")
    if ceil is not None:
        facts.append(f"real clips of the speaker score {ceil:.3f} (the ceiling)")
    parts.append("<p class=\"muted\">" + " · ".join(facts) + f" · {_esc(result['created'])}"
                 "</p>")
    if best:
        weight = result.get("style_weight") or 0
        rule = (f"highest independent similarity plus {weight:g} × the share of style checks "
                "obeyed" if weight else "highest independent similarity")
        parts.append(f"<p><b>Best checkpoint: {_esc(best)}</b> ({rule} among checkpoints "
                     "that still say the words).</p>")
    if result["warnings"]:
        parts.append("<ul>" + "".join(f"<li class=\"warn\">{_esc(w['message'])}</li>"
                                      for w in result["warnings"]) + "</ul>")
    count = result.get("count") or {}
    if count.get("written"):
        parts.append(f"<p>{count.get('measured', 0)} of {count['written']} checkpoints "
                     "measured.</p>")
    gone = [n for n in result.get("skipped") or [] if n.get("step") is not None]
    if gone:
        parts.append("<p class=\"muted\">Not measured:</p><ul>" + "".join(
            f"<li class=\"muted\">step {n['step']}: {_esc(str(n.get('reason') or ''))}</li>"
            for n in gone) + "</ul>")
    parts.append("<h2>Per checkpoint</h2><div class=\"plots\">" + "".join(_plots(result))
                 + "</div>")
    head = ("<tr><th>voice</th><th>similarity</th><th>similarity (model's encoder)</th>"
            "<th>WER</th><th>words/s</th><th>rate × speaker</th><th>loudness LUFS</th>"
            "<th>peak dBFS</th><th>clipped %</th><th>unended</th><th>ran away</th>"
            "<th>render s</th></tr>")
    rows = []
    for e in entries:
        m = e["mean"]
        label = e["label"] + (f" ({e['mode'].replace('_', '-')})" if e.get("mode") else "")
        clipped = None if m.get("clipped_fraction") is None else 100 * m["clipped_fraction"]
        rows.append(
            f"<tr class=\"{'best' if e['label'] == best else ''}\"><td>{_esc(label)}</td>"
            f"<td>{_fmt(m.get('similarity'), '.3f')}</td>"
            f"<td>{_fmt(m.get('similarity_model'), '.3f')}</td>"
            f"<td>{_fmt(m.get('wer'), '.2f')}</td><td>{_fmt(m.get('words_per_s'), '.2f')}</td>"
            f"<td>{_fmt(m.get('rate_ratio'), '.2f')}</td>"
            f"<td>{_fmt(m.get('loudness_lufs'), '.1f')}</td>"
            f"<td>{_fmt(m.get('peak_dbfs'), '.1f')}</td><td>{_fmt(clipped, '.2f')}</td>"
            f"<td>{m.get('capped', 0)}</td><td>{m.get('runaway', 0)}</td>"
            f"<td>{_fmt(e.get('render_s'), '.1f')}</td></tr>")
    parts.append("<h2>Figures (means over the sentences)</h2><table>" + head + "".join(rows)
                 + "</table>")
    parts += _styles_table(entries)
    # players: one row per sentence, one column per voice
    cols = "".join(f"<th>{_esc(e['label'])}</th>" for e in entries)
    rows = []
    for i, text in enumerate(result["sentences"]):
        cells = []
        for e in entries:
            r = next((x for x in e["renders"] if x["sentence"] == i), None)
            if r is None:
                cells.append("<td></td>")
                continue
            tip = (f"heard: {r.get('heard', '')} | similarity {_fmt(r.get('similarity'), '.3f')}"
                   f" | WER {_fmt(r.get('wer'), '.2f')}")
            cells.append(f"<td title=\"{_esc(tip)}\"><audio controls preload=\"none\" "
                         f"src=\"{_esc(r['path'])}\"></audio><br><span class=\"muted\">"
                         f"sim {_fmt(r.get('similarity'), '.2f')} · WER "
                         f"{_fmt(r.get('wer'), '.2f')}</span></td>")
        rows.append(f"<tr><td>{_esc(text)}</td>{''.join(cells)}</tr>")
    parts.append("<h2>Listen</h2><table><tr><th>sentence</th>" + cols + "</tr>"
                 + "".join(rows) + "</table>")
    refs = "".join(f"<tr><td>{_esc(c['id'])}</td><td>{_esc(c.get('text', ''))}</td><td>"
                   f"<audio controls preload=\"none\" src=\"{_esc(c['path'])}\"></audio>"
                   "</td></tr>" for c in ref["clips"])
    parts.append("<h2>The speaker (reference clips)</h2><table><tr><th>clip</th><th>text</th>"
                 f"<th></th></tr>{refs}</table>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def format_summary(result: dict[str, Any], out: Path) -> str:
    """The evaluation in words: a table of each voice's means, the best, the warnings."""
    def f(x: Any, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    fresh = len(result.get("evaluated") or result["entries"])
    count = result.get("count") or {}
    of = (f" {count.get('measured', 0)} of {count['written']} checkpoints measured."
          if count.get("written") else "")
    lines = [f"Evaluated {fresh} voice(s) of run {result['run']} ({len(result['entries'])} "
             f"in the report) on {len(result['sentences'])} held-out sentence(s) "
             f"(seed {result['seed']}, ASR {result['asr']['backend']}).{of}",
             f"  {'voice':<14}{'similarity':>11}{'(model)':>9}{'WER':>7}{'rate':>7}"
             f"{'LUFS':>8}{'clip %':>8}"]
    for e in result["entries"]:
        m = e["mean"]
        mark = " *" if result.get("best") and e["label"] == result["best"]["label"] else ""
        lines.append(f"  {e['label'][:14]:<14}{f(m.get('similarity'), '.3f'):>11}"
                     f"{f(m.get('similarity_model'), '.3f'):>9}{f(m.get('wer'), '.2f'):>7}"
                     f"{f(m.get('rate_ratio'), '.2f'):>7}{f(m.get('loudness_lufs'), '.1f'):>8}"
                     f"{f(100 * m['clipped_fraction'] if m.get('clipped_fraction') is not None else None, '.2f'):>8}{mark}")  # noqa: E501
    ceiling = result["reference"]["self_similarity"].get("resemblyzer")
    if ceiling is not None:
        lines.append(f"  real clips of the speaker score {ceiling:.3f} (the ceiling).")
    if result.get("baseline"):
        lines.append(f"  zero-shot baseline: {result['baseline']['mode'].replace('_', '-')} "
                     "cloning.")
    for e in result["entries"]:
        if e.get("styles"):
            lines.append(f"  {e['label']}: {styles_obeyed(e['styles'])}.")
    if result.get("best"):
        lines.append(f"  best checkpoint: {result['best']['label']} (*).")
    for w in result["warnings"]:
        lines.append(f"  warning: {w['message']}")
    gone = [n for n in result.get("skipped") or [] if n.get("step") is not None]
    if gone:
        lines.append(f"  not measured: step {', '.join(str(n['step']) for n in gone)}.")
        reasons = dict.fromkeys(str(n.get("reason") or "") for n in gone)
        lines += [f"    ({reason})" for reason in reasons if reason]
    lines.append(f"Report: {display_path(out / REPORT_FILE)}")
    return "\n".join(lines)
