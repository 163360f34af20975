"""The report as one self-contained HTML page: inline SVG plots and CSS, no script to run, and
the same content as JSON inside it (``<script type="application/json" id="report-data">``)."""

from __future__ import annotations

import datetime
import json
from html import escape
from typing import Any

from cliffguard.report import svg

OUTCOME_COLORS = {"open": "#f0a030", "resumed": "#2ca02c", "rolled_back": "#d62728", "halted": "#9467bd",
                  "abandoned": "#7f7f7f"}
CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:960px;color:#222}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:14px;margin:16px 0 4px}table{border-collapse:collapse;margin:6px 0}
td,th{padding:2px 10px 2px 0;text-align:left;vertical-align:top}th{color:#555;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums}.big{font-size:34px;font-weight:700}
.figs{display:flex;gap:28px;flex-wrap:wrap;align-items:flex-end}.figs div{font-size:18px}
.figs div span{display:block;color:#666;font-size:12px}.figs div span.big{color:#222;font-size:34px}
.muted{color:#777}.plot{max-width:100%;height:auto}"""


def _t(ts: float | None) -> str:
    if ts is None:
        return "—"
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _s(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:,.1f} s" if x < 600 else f"{x / 60:,.1f} min" if x < 36000 else f"{x / 3600:,.2f} h"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def _table(head: list[str], rows: list[list[Any]], numeric: set[int] = frozenset()) -> str:  # type: ignore[assignment]
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f'<td class="n">{escape(str(c))}</td>' if i in numeric else
                                    f"<td>{escape(str(c))}</td>" for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def render(data: dict[str, Any]) -> str:
    run, g = data["run"], data.get("goodput")
    labels = {b["name"]: (b["label"], b["color"]) for b in data["buckets"]}
    parts = [f"<h1>Run <code>{escape(run['id'])}</code></h1>",
             f'<p class="muted">{escape(run["status"])} · recovery {escape(run["recovery_state"])} · step '
             f'{run["last_step"]} · report of {_t(data["generated_at"])}</p>']
    parts.append(_summary(g, data))
    parts.append(_goodput(g, labels))
    parts.append(_loss(data))
    parts.append(_incidents(data, labels))
    parts.append(_restarts(data, labels))
    parts.append(_mfu(data))
    parts.append(_checkpoints(data, g))
    blob = json.dumps(data, default=str, allow_nan=False).replace("</", "<\\/")
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>cliffguard report · {escape(run['id'])}</title><style>{CSS}</style></head><body>"
            + "".join(parts) + f'<script type="application/json" id="report-data">{blob}</script></body></html>')


def _summary(g: dict[str, Any] | None, data: dict[str, Any]) -> str:
    if g is None:
        return "<p><b>No goodput ledger yet</b>: the controller has booked no event of this run.</p>"
    figs = [("ETTR", f'<span class="big" id="ettr">{_pct(g["ettr"])}</span>'),
            ("ETTR in GPU-seconds", _pct(g["ettr_gpu"])), ("wall time", _s(g["wall_s"])),
            ("steps lost", str(g["steps_lost"])), ("rollbacks", str(g.get("rollbacks", 0))),
            ("restarts", str(g.get("restarts", 0))), ("incidents", str(len(data["incidents"])))]
    cells = "".join(f"<div><span>{escape(k)}</span>{v}</div>" for k, v in figs)
    note = "" if g.get("saw_start", True) else "<p class='muted'>The run's start was never seen: the ledger " \
                                                 "opens at its first event.</p>"
    return f'<div class="figs">{cells}</div>{note}'


def _goodput(g: dict[str, Any] | None, labels: dict[str, tuple[str, str]]) -> str:
    if g is None:
        return ""
    wall = g["wall_s"] or 1.0
    items = [(labels[b][0], s, labels[b][1]) for b, s in g["seconds"].items() if s > 0]
    rows = [[labels[b][0], f"{s:,.2f}", f"{100 * s / wall:.2f} %", f"{g['gpu_seconds'][b]:,.1f}"]
            for b, s in g["seconds"].items() if s > 0]
    tl = g.get("timeline") or {}
    pts, names = tl.get("points") or [], tl.get("buckets") or []
    area = svg.stacked_area([p[0] for p in pts], [(labels[n][0], labels[n][1], [p[i + 1] for p in pts])
                                                   for i, n in enumerate(names)])
    unknown = g["seconds"].get("unknown", 0.0)
    return ("<h2>Where the time went</h2>" + svg.share_bar(items)
            + _table(["bucket", "seconds", "share of wall", "GPU-seconds"], rows, {1, 2, 3})
            + (f"<p class='muted'>{unknown:.1f} s no event explains (unknown).</p>" if unknown else "")
            + "<h3>Over time (cumulative, stacked)</h3>" + area)


def _loss(data: dict[str, Any]) -> str:
    bands = []
    for inc in data["incidents"]:
        steps = [t["step"] for t in inc["timeline"] if t["step"] is not None]
        start = inc["onset_step"] if inc["onset_step"] is not None else inc["spike_step"]
        bands.append((start, max([inc["spike_step"], *steps]) + 1, OUTCOME_COLORS.get(inc["outcome"], "#f0a030"),
                      f"{inc['rule']} → {inc['outcome']}"))
    pts = [(p["step"], p["loss"]) for p in data["loss"]]
    return ("<h2>Loss, with incidents marked</h2>" + svg.line_chart(pts, xlabel="step", ylabel="loss", bands=bands,
                                                                    log_y=True))


def _incidents(data: dict[str, Any], labels: dict[str, tuple[str, str]]) -> str:
    out = [f"<h2>Incidents ({len(data['incidents'])})</h2>"]
    for inc in data["incidents"]:
        cost = inc["cost"] or {}
        out.append(f"<h3>{escape(inc['id'][:8])} · {escape(inc['rule'])} ({escape(inc['level'])}) at step "
                   f"{inc['spike_step']} → {escape(inc['outcome'].replace('_', ' '))}</h3>")
        out.append(f"<p>class <b>{escape(str(inc['cause'] or inc['rule']))}</b> · remedy <b>"
                   f"{escape(inc['remedy'].replace('_', ' '))}</b>"
                   + (f" (rollback to {inc['rollback_to']}, LR × {inc['lr_scale']:g})" if inc["rollback_to"] is not None
                      and inc["lr_scale"] is not None else "")
                   + f" · cost <b>{_s(cost.get('seconds'))}</b>, {cost.get('gpu_seconds', 0):,.1f} GPU-s, "
                   f"{cost.get('steps_lost', 0)} steps lost</p>")
        if cost.get("buckets"):
            out.append(_table(["bucket", "seconds", "GPU-seconds"],
                              [[labels[b][0], f"{v['seconds']:.2f}", f"{v['gpu_seconds']:.1f}"]
                               for b, v in cost["buckets"].items()], {1, 2}))
        out.append(_table(["when", "step", "from", "to", "why"],
                          [[_t(t["ts"]), t["step"], t["from"], t["to"], t["reason"][:140]] for t in inc["timeline"]]))
    return "".join(out)


def _restarts(data: dict[str, Any], labels: dict[str, tuple[str, str]]) -> str:
    rows = [[r["kind"], _t(r["ts"]), _s(r["cost"]["seconds"]), r["cost"]["steps_lost"],
             ", ".join(f"{labels[b][0]} {v['seconds']:.1f} s" for b, v in r["cost"]["buckets"].items())]
            for r in data["restarts"]]
    rem = [[r["remedy"], r["count"], _s(r["seconds"]), f"{r['gpu_seconds']:,.1f}", r["steps_lost"]]
           for r in data["remedies"]]
    out = "<h2>Restarts and scale changes</h2>" + (_table(["kind", "when", "cost", "steps lost", "by bucket"], rows)
                                                 if rows else "<p class='muted'>none</p>")
    out += "<h2>Cost by remedy</h2>" + _table(["remedy", "count", "time", "GPU-seconds", "steps lost"], rem, {1, 3, 4})
    guard = ((data.get("goodput") or {}).get("guard")) or {}
    if guard.get("skip_episodes"):
        saved = guard["estimated_saved_s"]
        out += (f"<p>The guard skipped updates in {guard['skip_episodes']} runs of steps ({_s(guard['skipped_s'])}); "
                f"{guard['absorbed']} of them the run went on from without a rollback. Estimated saving: "
                + (f"<b>{_s(saved)}</b> ({escape(guard['basis'])}, less the skipped steps' time)" if saved is not None
                   else escape(guard["basis"])) + ".</p>")
    return out


def _mfu(data: dict[str, Any]) -> str:
    m = data["mfu"]
    named = "".join(f"<li>{_t(b['ts'])}: {escape(b['title'])}</li>" for b in m["bottleneck"])
    return ("<h2>MFU</h2>" + f"<p>mean {_pct(m['mean'])}" + (" · the MFU rule named:</p><ul>" + named + "</ul>"
                                                             if named else " · the MFU rule named no bottleneck</p>")
            + svg.line_chart([(p["step"], p["mfu"]) for p in m["series"]], xlabel="step", ylabel="MFU",
                             color="#9467bd"))


def _checkpoints(data: dict[str, Any], g: dict[str, Any] | None) -> str:
    rows = [[c["step"], c["kind"], "yes" if c["verified"] else "NO", "yes" if c["stable"] else "",
             f"{c['bytes']:,}", f"{c['seconds']:.3f}", c["detail"] or ""] for c in data["checkpoints"][-40:]]
    out = "<h2>Checkpoints</h2>" + _table(["step", "kind", "verified", "stable", "bytes", "seconds", "detail"], rows,
                                          {0, 4, 5})
    ck = (g or {}).get("checkpoints") or {}
    cf = ck.get("counterfactual")
    if not cf:
        return out + "<p class='muted'>No counterfactual: it needs disk checkpoints at a regular interval and " \
                     "measured snapshot stalls.</p>"
    out += (f"<h3>The checkpoint interval</h3><p>every {cf['interval_steps']} steps of {cf['step_s']:.3f} s, "
            f"{cf['stall_s']:.3f} s stall per checkpoint, {_s(cf['restore_s'])} restore per failure, MTBF "
            f"{_s(cf['mtbf_s'])} ({escape(cf['mtbf_source'])}). Young's optimum: every {cf['young_interval_steps']} "
            f"steps ({_s(cf['young_interval_s'])}); Daly's: {cf['daly_interval_steps']} steps.</p>")
    return out + _table(["interval (steps)", "loss per failure", "stall per hour", "expected waste per hour", ""],
                        [[r["interval_steps"], _s(r["loss_per_failure_s"]), _s(r["stall_per_hour_s"]),
                          _s(r["waste_per_hour_s"]), "now" if r["current"] else "optimum" if r["optimum"] else ""]
                         for r in cf["rows"]], {0})
