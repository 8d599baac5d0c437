"""The dashboard page: one self-contained HTML document (inline CSS and JS, canvas charts).

It loads nothing from any other host, so it works on closed networks. Kept in a Python module
rather than a data file so that every kind of install ships it.
"""

from __future__ import annotations

PAGE = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>LEAP — live rankings</title>
<style>
:root { --bg:#0f1420; --panel:#171e2d; --line:#263048; --text:#e6ebf5; --muted:#8b96ad;
        --blue:#4f9dff; --green:#3fcf8e; --amber:#f5b942; --red:#ff6b6b; --violet:#b18cff; }
* { box-sizing:border-box; }
body { margin:0; background:var(--bg); color:var(--text);
       font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif; }
header { display:flex; align-items:center; gap:16px; padding:14px 22px; border-bottom:1px solid var(--line); }
header h1 { font-size:18px; margin:0; font-weight:600; letter-spacing:.2px; }
header .sub { color:var(--muted); font-size:13px; }
#status { margin-left:auto; display:flex; align-items:center; gap:8px; color:var(--muted); font-size:13px; }
#dot { width:10px; height:10px; border-radius:50%; background:var(--amber); }
#dot.ok { background:var(--green); } #dot.bad { background:var(--red); }
main { padding:16px 22px 28px; display:grid; gap:14px; }
.kpis { display:grid; grid-template-columns:repeat(auto-fit,minmax(150px,1fr)); gap:12px; }
.kpi, .panel { background:var(--panel); border:1px solid var(--line); border-radius:10px; }
.kpi { padding:12px 14px; }
.kpi .label { color:var(--muted); font-size:12px; text-transform:uppercase; letter-spacing:.6px; }
.kpi .value { font-size:26px; font-weight:650; margin-top:4px; font-variant-numeric:tabular-nums; }
.kpi .note { color:var(--muted); font-size:12px; margin-top:2px; min-height:1.4em; }
.charts { display:grid; grid-template-columns:1.2fr 1fr 1.2fr; gap:12px; }
@media (max-width:1100px) { .charts { grid-template-columns:1fr; } }
.panel { padding:12px 14px; min-width:0; }
.panel h2 { margin:0 0 8px; font-size:13px; font-weight:600; color:var(--muted); white-space:nowrap;
            text-transform:uppercase; letter-spacing:.6px; display:flex; gap:10px; align-items:center; }
.legend { margin-left:auto; display:flex; gap:10px; text-transform:none; letter-spacing:0; font-weight:400;
          font-size:12px; }
.legend i { display:inline-block; width:10px; height:3px; margin-right:4px; vertical-align:middle; }
canvas { width:100%; height:220px; display:block; }
table { width:100%; border-collapse:collapse; font-variant-numeric:tabular-nums; }
th, td { text-align:left; padding:6px 8px; border-bottom:1px solid var(--line); white-space:nowrap; }
th { color:var(--muted); font-weight:500; font-size:12px; text-transform:uppercase; letter-spacing:.5px; }
td.top { white-space:normal; }
.chip { display:inline-block; padding:1px 7px; margin:1px 4px 1px 0; border-radius:9px; background:#22304a;
        font-size:12px; }
.chip.r1 { background:#1d3b2f; color:#8ff0c2; }
.chip b { font-weight:600; }
.chip .basis { color:var(--muted); font-size:11px; }
.fb { color:var(--amber); font-size:12px; }
.muted { color:var(--muted); }
.row2 { display:grid; grid-template-columns:2.4fr 1fr; gap:12px; }
@media (max-width:1100px) { .row2 { grid-template-columns:1fr; } }
.kv { display:grid; grid-template-columns:1fr auto; gap:4px 12px; font-size:13px; }
.kv div:nth-child(odd) { color:var(--muted); }
#feedwrap { max-height:430px; overflow:auto; }
</style>
</head>
<body>
<header>
  <h1>LEAP · live rankings</h1>
  <span class="sub" id="models">model: —</span>
  <div id="status"><span id="dot"></span><span id="statustext">connecting…</span></div>
</header>
<main>
  <section class="kpis">
    <div class="kpi"><div class="label">Rankings / s</div><div class="value" id="k-rate">—</div>
      <div class="note" id="k-rate-n"></div></div>
    <div class="kpi"><div class="label">Rankings seen</div><div class="value" id="k-total">—</div>
      <div class="note" id="k-total-n"></div></div>
    <div class="kpi"><div class="label">Coverage</div><div class="value" id="k-cov">—</div>
      <div class="note">rankings with a rank-1 pick</div></div>
    <div class="kpi"><div class="label">Fallback rate</div><div class="value" id="k-fb">—</div>
      <div class="note" id="k-fb-n"></div></div>
    <div class="kpi"><div class="label">acc@10 / acc@20</div><div class="value" id="k-acc">—</div>
      <div class="note" id="k-acc-n"></div></div>
    <div class="kpi"><div class="label">Predicted savings</div><div class="value" id="k-sav">—</div>
      <div class="note" id="k-sav-n"></div></div>
    <div class="kpi"><div class="label">Latency p50 / p99 ms</div><div class="value" id="k-lat">—</div>
      <div class="note">submission in → ranking out</div></div>
  </section>
  <section class="charts">
    <div class="panel"><h2>Events / s
      <span class="legend"><span><i style="background:var(--blue)"></i>rankings</span>
      <span><i style="background:var(--violet)"></i>submissions</span>
      <span><i style="background:var(--green)"></i>finishes</span></span></h2>
      <canvas id="c-rate"></canvas></div>
    <div class="panel"><h2>Rank-1 hardware share</h2><canvas id="c-hw"></canvas></div>
    <div class="panel"><h2>Rolling accuracy
      <span class="legend"><span><i style="background:var(--green)"></i>acc@10</span>
      <span><i style="background:var(--amber)"></i>acc@20</span></span></h2>
      <canvas id="c-acc"></canvas></div>
  </section>
  <section class="row2">
    <div class="panel"><h2>Latest rankings <span class="legend muted" id="feedn"></span></h2>
      <div id="feedwrap"><table>
        <thead><tr><th>received</th><th>job</th><th>top choices (samples per $)</th><th>fallback</th>
        <th>ms</th></tr></thead>
        <tbody id="feed"><tr><td colspan="5" class="muted">waiting for rankings…</td></tr></tbody>
      </table></div></div>
    <div class="panel"><h2>Details</h2><div class="kv" id="details"></div></div>
  </section>
</main>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();
const pct = (x, d = 1) => (x === null || x === undefined) ? "—" : (100 * x).toFixed(d) + "%";
const num = (x) => (x === null || x === undefined) ? "—" : Math.round(x).toLocaleString("en-US");
const short = (x) => {
  if (x === null || x === undefined) return "—";
  const a = Math.abs(x);
  if (a >= 1e9) return (x / 1e9).toFixed(1) + "G";
  if (a >= 1e6) return (x / 1e6).toFixed(1) + "M";
  if (a >= 1e3) return (x / 1e3).toFixed(1) + "k";
  return a >= 10 || Number.isInteger(x) ? x.toFixed(0) : x.toFixed(1);
};
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (ch) =>
  ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[ch]));

function setup(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  ctx.font = "11px system-ui, sans-serif";
  return [ctx, w, h];
}

// Line chart: series = [{values, color}], x = seconds ago (oldest first); yMax fixed or auto.
function lineChart(canvas, series, opts) {
  const [ctx, w, h] = setup(canvas);
  const L = 44, R = 10, T = 10, B = 22, pw = w - L - R, ph = h - T - B;
  let ymax = opts.yMax;
  if (ymax === undefined) {
    ymax = 0;
    for (const s of series) for (const v of s.values) if (v !== null && v > ymax) ymax = v;
    ymax = niceMax(ymax || 1);
  }
  ctx.strokeStyle = css("--line"); ctx.fillStyle = css("--muted"); ctx.lineWidth = 1;
  ctx.textAlign = "right"; ctx.textBaseline = "middle";
  for (let i = 0; i <= 4; i++) {
    const y = T + ph - (ph * i) / 4;
    ctx.beginPath(); ctx.moveTo(L, y); ctx.lineTo(L + pw, y); ctx.stroke();
    ctx.fillText(opts.fmt(ymax * i / 4), L - 6, y);
  }
  const n = Math.max(...series.map((s) => s.values.length), 2);
  ctx.textAlign = "center"; ctx.textBaseline = "top";
  for (const ago of [opts.span, opts.span * 3 / 4, opts.span / 2, opts.span / 4, 0]) {
    const x = L + pw * (1 - ago / opts.span);
    ctx.fillText(ago === 0 ? "now" : "-" + Math.round(ago) + "s", x, T + ph + 6);
  }
  for (const s of series) {
    ctx.strokeStyle = s.color; ctx.lineWidth = 2; ctx.beginPath();
    let pen = false;
    s.values.forEach((v, i) => {
      const x = L + pw * (s.offset === undefined ? i / (n - 1) : (s.offset[i]));
      if (v === null || v === undefined) { pen = false; return; }
      const y = T + ph - ph * Math.min(v, ymax) / ymax;
      if (pen) ctx.lineTo(x, y); else ctx.moveTo(x, y);
      pen = true;
    });
    ctx.stroke();
  }
  if (opts.empty) {
    ctx.fillStyle = css("--muted"); ctx.textAlign = "center"; ctx.textBaseline = "middle";
    ctx.fillText(opts.empty, L + pw / 2, T + ph / 2);
  }
}

function niceMax(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

const PALETTE = ["#4f9dff", "#3fcf8e", "#f5b942", "#b18cff", "#ff6b6b", "#38c6d9", "#f08ad5", "#9ccc65",
                 "#ff9f55", "#7f8cff"];

function barChart(canvas, rows) {
  const [ctx, w, h] = setup(canvas);
  if (!rows.length) {
    ctx.fillStyle = css("--muted"); ctx.textAlign = "center"; ctx.textBaseline = "middle";
    ctx.fillText("no ranked submissions yet", w / 2, h / 2); return;
  }
  const top = rows.slice(0, 8);
  const rest = rows.slice(8).reduce((a, r) => a + r.share, 0);
  if (rest > 0) top.push({hardware: "others", share: rest});
  const L = 92, R = 48, gap = 4, bh = Math.min(22, (h - gap * top.length) / top.length);
  const maxShare = Math.max(...top.map((r) => r.share));
  ctx.textBaseline = "middle";
  top.forEach((r, i) => {
    const y = i * (bh + gap) + 2;
    const bw = (w - L - R) * r.share / maxShare;
    ctx.fillStyle = r.hardware === "others" ? "#4a556d" : PALETTE[i % PALETTE.length];
    ctx.fillRect(L, y, Math.max(bw, 1), bh);
    ctx.fillStyle = css("--text"); ctx.textAlign = "right";
    ctx.fillText(r.hardware.length > 13 ? r.hardware.slice(0, 12) + "…" : r.hardware, L - 8, y + bh / 2);
    ctx.textAlign = "left"; ctx.fillStyle = css("--muted");
    ctx.fillText(pct(r.share), L + bw + 6, y + bh / 2);
  });
}

// A candidate's basis in the feed: the estimate served, the evidence, and the ratio to the job's prior.
function basisText(b) {
  if (!b) return "";
  const ev = {ran_here: "ran here", ran_elsewhere: "ran elsewhere", none: "no history"}[b.evidence] || b.evidence;
  const prior = b.prior_hardware && b.ratio != null ? ` · \u00d7${b.ratio} ${b.prior_hardware}` : "";
  return ` <span class="basis">${esc(b.estimate)} · ${esc(ev)}${esc(prior)}</span>`;
}

function render(s) {
  const t = s.totals, a = s.accuracy, sv = s.savings;
  $("k-rate").textContent = short(s.rates.rankings_per_s_10s);
  $("k-rate-n").textContent = "10 s mean · 60 s: " + short(s.rates.rankings_per_s_60s);
  $("k-total").textContent = num(t.rankings);
  $("k-total-n").textContent = num(t.submissions) + " submissions · " + num(t.finishes) + " finishes";
  $("k-cov").textContent = pct(s.coverage);
  $("k-fb").textContent = pct(s.fallback_rate);
  const reasons = Object.entries(s.fallback_reasons);
  $("k-fb-n").textContent = reasons.length ? reasons.slice(0, 2).map(([k, v]) => k).join(", ") : "none";
  $("k-acc").textContent = a.n ? pct(a["acc@10"], 0) + " / " + pct(a["acc@20"], 0) : "—";
  $("k-acc-n").textContent = a.n ? "last " + num(a.n) + " finished attempts" : "no finished ranked attempts yet";
  const rec = sv.recent;
  $("k-sav").textContent = rec.n ? pct(rec.savings) : "—";
  $("k-sav-n").textContent = rec.n ? "rank 1 vs requested hardware · last " + num(rec.n) : "needs requested hardware";
  const lat = s.latency_ms;
  $("k-lat").textContent = lat.n ? short(lat.p50) + " / " + short(lat.p99) : "—";
  const versions = Object.keys(s.models);
  $("models").textContent = "model: " + (versions.length ? versions.slice(0, 3).join(", ") : "—");

  const src = s.source || {};
  const ok = src.state === "following" || src.state === "detached";
  $("dot").className = ok ? "ok" : (src.state === "error" ? "bad" : "");
  $("statustext").textContent = ok ? "live · " + (src.bootstrap || "") : (src.error || src.state || "?");

  const ser = s.series, span = ser.seconds;
  lineChart($("c-rate"), [
    {values: ser.submissions, color: css("--violet")},
    {values: ser.finishes, color: css("--green")},
    {values: ser.rankings, color: css("--blue")},
  ], {span, fmt: short});
  const acc = ser.accuracy, start = ser.end - span;
  const offs = acc.map((p) => (p.t - start) / span);
  lineChart($("c-acc"), [
    {values: acc.map((p) => p["acc@20"]), color: css("--amber"), offset: offs},
    {values: acc.map((p) => p["acc@10"]), color: css("--green"), offset: offs},
  ], {span, yMax: 1, fmt: (v) => Math.round(v * 100) + "%",
      empty: a.n ? null : "waiting for finishes of ranked attempts"});
  barChart($("c-hw"), s.best_hardware_share);

  $("feedn").textContent = "newest first · " + s.feed.length + " shown";
  $("feed").innerHTML = s.feed.length ? s.feed.map((r) => {
    const when = new Date(r.received * 1000).toLocaleTimeString("en-GB");
    const top = r.top.length ? r.top.map((c) =>
      `<span class="chip${c.rank === 1 ? " r1" : ""}"><b>${esc(c.hardware)}</b> ` +
      `${short(c.throughput_per_dollar)}${basisText(c.basis)}</span>`
    ).join("") : '<span class="muted">nothing ranked</span>';
    const fb = r.fallback ? `<span class="fb">${esc(r.fallback)}</span>` : '<span class="muted">—</span>';
    return `<tr><td class="muted">${when}</td><td>${esc(r.job_key)}</td><td class="top">${top}` +
      ` <span class="muted">of ${r.candidates}</span></td><td>${fb}</td><td>${short(r.latency_ms)}</td></tr>`;
  }).join("") : '<tr><td colspan="5" class="muted">waiting for rankings…</td></tr>';

  const d = [
    ["finished attempts joined", num(a.joined_total)],
    ["MAPE (rolling)", pct(a.mape)],
    ["finishes without ranking", num(a.finishes_without_ranking)],
    ["finishes without throughput", num(a.finishes_unmeasured)],
    ["rankings awaiting finish", num(a.pending)],
    ["savings since start", pct(sv.total.savings) + " (" + num(sv.total.n) + ")"],
    ["$ saved / requested hour", sv.recent.n ? "$" + sv.recent.usd_saved_per_requested_hour.toFixed(2) : "—"],
    ["rank 1 ≠ requested", pct(sv.recent.rank1_differs_share)],
    ["duplicates dropped", num(t.duplicates)],
    ["malformed skipped", num(Object.values(t.malformed).reduce(
      (acc, m) => acc + Object.values(m).reduce((x, y) => x + y, 0), 0))],
  ];
  for (const [k, v] of Object.entries(s.fallback_reasons).slice(0, 4)) d.push(["fallback: " + k, num(v)]);
  $("details").innerHTML = d.map(([k, v]) => `<div>${esc(k)}</div><div>${esc(v)}</div>`).join("");
  window.__leap = {updates: (window.__leap?.updates || 0) + 1, summary: s};
}

let last = null;
function connect() {
  const es = new EventSource("events");
  es.addEventListener("summary", (ev) => { last = JSON.parse(ev.data); render(last); });
  es.onerror = () => { $("dot").className = "bad"; $("statustext").textContent = "reconnecting…"; };
}
window.addEventListener("resize", () => { if (last) render(last); });
connect();
</script>
</body>
</html>
"""
