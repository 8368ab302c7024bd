"""The monitor page at ``/``: pictures first (each segment key's two buffers as fill bars,
IDs/s per generator as a sparkline, the lease's time left as a bar, the processes and
their restarts, in cluster mode the members, the owner of each strict key and the hand-offs
in progress), then the numbers as Leaf's ``/cache`` shows them, and the segment table
(``/db``). One HTML document: inline CSS, JavaScript and SVG, no external assets. It
reads ``/api/v1/status`` every two seconds; every value is inserted as text (keys come
from the database), never as markup.

Honest first: a lost or expired lease is a red bar with what to do (never a green bar
counting down the deadline of a lease that is gone), a process that is not ready says so
on its own chip, and the page's title says "NOT READY". HTTP requests per endpoint (rate,
p50/p99 latency estimated from the server's histograms, as Prometheus'
``histogram_quantile`` does) cover the last minute the page has watched, or the time since
the server started until the page has watched 10 s."""

from __future__ import annotations

import json

from flakekit_server.metrics import LATENCY_BUCKETS_S

__all__ = ["PAGE"]

_PAGE = b"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>flakekit server</title>
<style>
  * { box-sizing: border-box; }
  body { font: 14px/1.4 system-ui, sans-serif; margin: 0; padding: 1em 1.2em 2em; color: #1f2328;
         background: #f4f5f7; }
  h1 { font-size: 1.35em; margin: 0 0 .2em; display: flex; flex-wrap: wrap; gap: .5em; align-items: center; }
  h2 { font-size: 1.05em; margin: 1.6em 0 .5em; }
  a { color: #0b5cad; }
  .muted { color: #6a737d; } .small { font-size: .85em; }
  .badge { display: inline-block; padding: .1em .7em; border-radius: .8em; color: #fff; font-weight: 600;
           font-size: .8em; }
  .ok { background: #2a7d2a; } .bad { background: #b22; }
  #problems { margin: .4em 0; padding-left: 1.2em; } #problems li { color: #b22; }
  .cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(300px, 1fr)); gap: .8em; }
  .card { background: #fff; border: 1px solid #d8dce1; border-radius: 8px; padding: .7em .9em;
          min-width: 0; }
  .card h3 { margin: 0 0 .4em; font-size: 1em; display: flex; flex-wrap: wrap;
             justify-content: space-between; align-items: baseline; gap: 0 .6em; }
  .card h3 .key, .card h3 .name { overflow-wrap: anywhere; min-width: 0; }
  .card h3 .muted { font-weight: normal; font-size: .85em; margin-left: auto; }
  .row { display: grid; grid-template-columns: 5.5em 1fr; gap: .5em; align-items: center; margin: .35em 0; }
  .bar { position: relative; height: 1.25em; background: #e7e9ec; border-radius: 4px; overflow: hidden; }
  .fill { position: absolute; inset: 0 auto 0 0; background: #9cc8ee; border-radius: 4px 0 0 4px; }
  .fill.lease { background: #9fd49f; } .fill.low { background: #f2c46d; } .fill.gone { background: #ef9a9a; }
  .card.bad { border-color: #b22; box-shadow: 0 0 0 1px #b22 inset; }
  .bar.gone-bar .label { color: #7a1010; font-weight: 600; }
  .todo { margin-top: .4em; padding: .35em .5em; background: #fdecec; border-radius: 4px; color: #7a1010;
          font-size: .85em; }
  .bar .label { position: absolute; inset: 0; padding: 0 .4em; font-size: .8em; line-height: 1.55em;
                white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
  .bar.pending { background: repeating-linear-gradient(135deg, #eceef1 0 6px, #e2e5e9 6px 12px); }
  .bar.pending .label { color: #6a737d; }
  svg.spark { display: block; width: 100%; height: 44px; background: #f7f9fb; border-radius: 4px; }
  .spark path.line { fill: none; stroke: #3b82c4; stroke-width: 1.5; }
  .spark path.area { fill: #3b82c4; opacity: .15; stroke: none; }
  .procs { display: flex; flex-wrap: wrap; gap: .5em; }
  .proc { background: #fff; border: 1px solid #d8dce1; border-radius: 8px; padding: .4em .7em; }
  .proc .dot { display: inline-block; width: .7em; height: .7em; border-radius: 50%; margin-right: .3em; }
  .proc.not-ready { border-color: #b22; }
  .scroll { overflow-x: auto; max-width: 100%; }
  table { border-collapse: collapse; background: #fff; font-size: .9em; }
  th, td { border: 1px solid #d8dce1; padding: .2em .55em; text-align: right; white-space: nowrap; }
  th { background: #eef0f3; } td.l, th.l { text-align: left; } th[colspan] { text-align: center; }
  .yes { color: #2a7d2a; font-weight: 600; } .no { color: #b22; font-weight: 600; }
  td.pending { color: #6a737d; font-weight: normal; }
  details { margin-top: .6em; } summary { cursor: pointer; }
  @media (max-width: 480px) {
    body { padding: .7em .6em 2em; font-size: 13px; }
    .cards { grid-template-columns: 1fr; }
    .row { grid-template-columns: 4.6em 1fr; }
  }
</style>
</head>
<body>
<h1>flakekit server <span id="ready" class="badge">...</span></h1>
<div id="summary" class="muted small">loading...</div>
<ul id="problems"></ul>

<h2>Processes</h2>
<div id="processes" class="procs"></div>

<h2>HTTP <span id="http-window" class="muted small"></span></h2>
<div class="scroll"><table id="http"><thead><tr><th class="l">endpoint</th><th>requests/s</th>
  <th>requests</th><th>errors (5xx)</th><th>p50</th><th>p99</th><th>mean</th>
</tr></thead><tbody></tbody></table></div>

<section id="cluster-panel" hidden>
<h2>Cluster <span id="cluster-summary" class="muted small"></span></h2>
<div class="scroll"><table id="cluster-members"><thead><tr><th class="l">node</th>
  <th class="l">advertise</th><th>weight</th><th class="l">state</th><th>strict keys owned</th>
</tr></thead><tbody></tbody></table></div>
<div class="scroll"><table id="cluster-keys"><thead><tr><th class="l">strict key</th>
  <th class="l">owner</th><th>claim epoch here</th><th class="l">here</th>
</tr></thead><tbody></tbody></table></div>
<p id="cluster-moving" class="small"></p>
</section>

<h2>Snowflake generators: IDs/s (up to the last 5 minutes) and lease time left</h2>
<div id="generator-cards" class="cards"></div>

<h2>Segment keys: the two buffers (IDs left in each)</h2>
<div id="segment-cards" class="cards"></div>

<h2>Segment table</h2>
<div class="scroll"><table id="db"><thead><tr><th class="l">tag</th><th>max</th><th>step</th>
  <th class="l">update</th><th class="l">generator</th></tr></thead><tbody></tbody></table></div>
<p class="muted small">As Leaf's <a href="/db">/db</a> page shows it (re-read every 10 s).</p>

<details>
<summary>Numbers (as Leaf's /cache)</summary>
<h2>Snowflake generators and leases</h2>
<div class="scroll"><table id="leases"><thead><tr>
  <th class="l">generator</th><th>process</th><th class="l">layout</th><th>worker id</th><th>epoch</th>
  <th>lease left (s)</th><th>renewals</th><th>renew failures</th><th>IDs issued</th><th class="l">state</th>
</tr></thead><tbody></tbody></table></div>
<h2>Segment keys</h2>
<div class="scroll"><table id="segments"><thead><tr>
  <th class="l" rowspan="2">key</th><th class="l" rowspan="2">generator</th><th rowspan="2">process</th>
  <th rowspan="2">step</th><th rowspan="2">IDs issued</th>
  <th colspan="4">current buffer</th><th colspan="4">next buffer</th>
  <th rowspan="2">fetches</th><th rowspan="2">fetch ms</th><th class="l" rowspan="2">state</th>
</tr><tr>
  <th>pos</th><th>end</th><th>step</th><th>ready</th><th>pos</th><th>end</th><th>step</th><th>ready</th>
</tr></thead><tbody></tbody></table></div>
</details>
<p class="muted small">Refreshes every 2 s. JSON: <a href="/api/v1/status">/api/v1/status</a>,
metrics: <a href="/metrics">/metrics</a>, readiness: <a href="/ready">/ready</a>.</p>
<script>
"use strict";
const SVG = "http://www.w3.org/2000/svg";
const leaseFull = {};   // the longest lease time seen per generator: the bar's full length
const BOUNDS = __LATENCY_BOUNDS_S__;   // the server's request latency histogram bounds, s
const WINDOW_S = 60;                   // HTTP rate and latency: over the last minute seen,
const MIN_WINDOW_S = 10;               // once the page has watched that long (else since start)
const httpSeen = [];                   // [{t, routes}] the status answers of that minute
function dur(s) {
  // a duration as a person reads it: 850 ms, 12.3 s, 4 min 05 s, 3 h 12 min, 2 d 4 h
  s = Math.abs(s);
  if (s < 1) return Math.round(s * 1000) + " ms";
  if (s < 60) return s.toFixed(1) + " s";
  const pad = n => String(Math.floor(n)).padStart(2, "0");
  if (s < 3600) return Math.floor(s / 60) + " min " + pad(s % 60) + " s";
  if (s < 86400) return Math.floor(s / 3600) + " h " + pad(s % 3600 / 60) + " min";
  return Math.floor(s / 86400) + " d " + Math.floor(s % 86400 / 3600) + " h";
}
function latency(q) {
  if (q === null) return "-";
  if (q.over !== undefined) return "> " + dur(q.over);
  const s = q.s;
  if (s < 0.001) return Math.round(s * 1e6) + " \\u00b5s";
  if (s < 1) return (s * 1000).toFixed(s < 0.01 ? 2 : 1) + " ms";
  return s.toFixed(2) + " s";
}
function quantile(q, h) {
  // h: bucket counts (one per bound, then +Inf), sum_ns, count; linear inside a bucket
  const counts = h.slice(0, -2), total = counts.reduce((a, b) => a + b, 0);
  if (!total) return null;
  const rank = q * total;
  let seen = 0;
  for (let i = 0; i < counts.length; i++) {
    if (counts[i] > 0 && seen + counts[i] >= rank) {
      if (i >= BOUNDS.length) return {over: BOUNDS[BOUNDS.length - 1]};
      const lo = i ? BOUNDS[i - 1] : 0, hi = BOUNDS[i];
      return {s: lo + (hi - lo) * ((rank - seen) / counts[i])};
    }
    seen += counts[i];
  }
  return null;
}
function httpTotals(procs) {
  // every process's requests and latency histograms, summed per endpoint (route)
  const out = {};
  const entry = r => out[r] = out[r] || {n: 0, errors: 0, h: null};
  for (const p of procs) {
    const http = p.http || {};
    for (const [route, status, n] of (http.requests || [])) {
      const e = entry(route); e.n += n; if (status >= 500) e.errors += n;
    }
    for (const [route, h] of Object.entries(http.latency || {})) {
      const e = entry(route); e.h = e.h ? e.h.map((v, i) => v + h[i]) : h.slice();
    }
  }
  return out;
}
function renderHttp(s, uptime) {
  const now = s.server.time, routes = httpTotals(s.processes);
  httpSeen.push({t: now, routes: routes});
  while (httpSeen.length > 2 && now - httpSeen[1].t >= WINDOW_S) httpSeen.shift();
  let base = now - httpSeen[0].t >= MIN_WINDOW_S ? httpSeen[0] : null;
  // a restarted process starts its counters again: then since start, not a negative rate
  if (base && Object.entries(base.routes).some(([r, b]) => !routes[r] || routes[r].n < b.n)) base = null;
  const span = base ? now - base.t : uptime;
  document.getElementById("http-window").textContent = base
    ? "(last " + dur(span) + ")" : "(since start, " + dur(span) + ")";
  const body = document.querySelector("#http tbody");
  body.replaceChildren();
  const rows = Object.entries(routes).map(([route, e]) => {
    const b = base && base.routes[route];
    const n = e.n - (b ? b.n : 0), errors = e.errors - (b ? b.errors : 0);
    const h = e.h && b && b.h ? e.h.map((v, i) => v - b.h[i]) : e.h;
    return {route, n, errors, h};
  }).sort((a, b) => b.n - a.n || (a.route < b.route ? -1 : 1));
  for (const r of rows) {
    const tr = el("tr", "http-route");
    cell(tr, r.route, "l route");
    cell(tr, span > 0 ? (r.n / span).toFixed(r.n / span < 10 ? 2 : 0) : "-", "rate");
    cell(tr, fmt(r.n), "count");
    cell(tr, fmt(r.errors), r.errors ? "no" : "");
    if (!r.n) r.h = null;   // none in the window: no latency to show
    cell(tr, r.h ? latency(quantile(0.5, r.h)) : "-", "p50");
    cell(tr, r.h ? latency(quantile(0.99, r.h)) : "-", "p99");
    const count = r.h ? r.h[r.h.length - 1] : 0;
    cell(tr, count ? latency({s: r.h[r.h.length - 2] / count / 1e9}) : "-", "mean");
    body.appendChild(tr);
  }
  if (!body.children.length) { const tr = el("tr"); cell(tr, "(no requests yet)", "l muted"); body.appendChild(tr); }
}
function leaseTrouble(g) {
  // a lease that is lost, lapsed or missing: [the bar's label, what the operator does]
  const w = g.worker_id === null || g.worker_id === undefined ? "-" : g.worker_id;
  const left = g.lease_remaining_s;
  if (g.lost) {
    return ["LOST \\u00b7 worker " + w,
            "This generator issues no IDs: another process took worker " + w + ". Check who " +
            "holds it (flakekit workers list), then restart this server: it leases a free worker id."];
  }
  if (left !== null && left !== undefined && left <= 0) {
    return ["EXPIRED " + dur(-left) + " ago \\u00b7 worker " + w + " \\u00b7 " + g.renew_failures + " renewals failed",
            "No IDs until a renewal succeeds: check that this host reaches the lease backend " +
            "(database, ZooKeeper or etcd); IDs resume by themselves when it answers."];
  }
  if (g.worker_id === null || g.worker_id === undefined) {
    return ["NO LEASE",
            "No worker id could be leased (all taken, or the backend is down): see the problems above."];
  }
  return [g.problem || "not ready", "See the problems above."];
}
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = String(text);
  return e;
}
function cell(row, value, cls) {
  row.appendChild(el("td", cls, (value === null || value === undefined) ? "-" : value));
}
function fmt(n) { return (n === null || n === undefined) ? "-" : Number(n).toLocaleString("en-US"); }
function bar(fraction, label, fillClass, barClass) {
  const b = el("div", "bar" + (barClass ? " " + barClass : ""));
  if (fraction !== null) {
    const f = el("div", "fill" + (fillClass ? " " + fillClass : ""));
    f.style.width = (Math.max(0, Math.min(1, fraction)) * 100).toFixed(1) + "%";
    b.appendChild(f);
  }
  b.appendChild(el("span", "label", label));
  return b;
}
function row(name, content) {
  const r = el("div", "row");
  r.appendChild(el("span", "muted small", name));
  r.appendChild(content);
  return r;
}
function sparkline(rates) {
  const w = 300, h = 44;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", "0 0 " + w + " " + h);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  const data = rates.slice(-300);
  const n = Math.max(60, data.length);   // the axis grows to five minutes as samples arrive
  const max = Math.max(1, ...data);
  const pts = data.map((v, i) => [w - (data.length - 1 - i) * (w / (n - 1)), h - 2 - (v / max) * (h - 6)]);
  const title = document.createElementNS(SVG, "title");
  title.textContent = data.length ? "max " + max + " IDs/s over " + data.length + " s" : "no samples yet";
  svg.appendChild(title);
  if (pts.length) {
    const d = pts.map((p, i) => (i ? "L" : "M") + p[0].toFixed(1) + " " + p[1].toFixed(1)).join(" ");
    const area = document.createElementNS(SVG, "path");
    area.setAttribute("class", "area");
    area.setAttribute("d", d + " L" + w + " " + h + " L" + pts[0][0].toFixed(1) + " " + h + " Z");
    const line = document.createElementNS(SVG, "path");
    line.setAttribute("class", "line");
    line.setAttribute("d", d);
    svg.appendChild(area); svg.appendChild(line);
  }
  return svg;
}
function rateText(rates) {
  const last = rates.slice(-10);
  const now = last.length ? last.reduce((a, b) => a + b, 0) / last.length : 0;
  return fmt(Math.round(now)) + " IDs/s now (10 s mean) \\u00b7 peak " + fmt(Math.max(0, ...rates)) +
    " \\u00b7 last " + Math.max(60, Math.min(300, rates.length)) + " s";
}
function generatorCard(proc, g) {
  const card = el("div", "card generator-card");
  const h = el("h3"); h.appendChild(el("span", "name", g.name));
  h.appendChild(el("span", "muted", g.layout + " \\u00b7 worker " + (g.worker_id === null ? "-" : g.worker_id) +
                   " \\u00b7 process " + proc.process));
  card.appendChild(h);
  const rates = g.rate_per_s || [];
  card.appendChild(sparkline(rates));
  card.appendChild(el("div", "muted small rate", rateText(rates)));
  const left = g.lease_remaining_s;
  let b, todo = null;
  if (!g.ready) {
    // never a green bar for a lease that is gone, whatever its old deadline says
    const [label, what] = leaseTrouble(g);
    b = bar(1, label, "gone", "gone-bar");
    todo = what;
    card.classList.add("bad");
  } else if (left === null || left === undefined) {
    b = bar(1, g.worker_id === null ? "no lease" : "never expires", "lease");
  } else {
    const key = proc.process + "/" + g.name;
    leaseFull[key] = Math.max(leaseFull[key] || 0, left);
    const frac = leaseFull[key] > 0 ? left / leaseFull[key] : 0;
    b = bar(frac, dur(left) + " left \\u00b7 " + g.renewals + " renewals" +
            (g.renew_failures ? ", " + g.renew_failures + " failed" : ""),
            left <= 0 ? "gone" : (frac < 0.34 ? "low" : "lease"));
  }
  b.classList.add("lease-bar");
  card.appendChild(row("lease", b));
  card.appendChild(row("issued", el("span", "issued", fmt(g.issued))));
  if (!g.ready) card.appendChild(el("div", "no small problem", g.problem));
  if (todo) card.appendChild(el("div", "todo", "What to do: " + todo));
  return card;
}
function bufferBar(b) {
  if (!b || !b.ready || b.end === null || b.end === undefined) {
    // the normal state between fetches: grey, not an error
    const out = bar(null, b && b.slot === "current" ? "empty" : "not loaded yet (normal)", "", "pending");
    out.classList.add("buffer", "pending-buffer");
    return out;
  }
  const size = Math.max(1, b.end - b.start), left = Math.max(0, b.end - b.position);
  const out = bar(left / size, fmt(left) + " of " + fmt(size) + " left \\u00b7 " + fmt(b.start) + "\\u2013" + fmt(b.end));
  out.classList.add("buffer", "ready-buffer");
  out.dataset.fill = (left / size).toFixed(3);
  return out;
}
function segmentCard(proc, g, k) {
  const card = el("div", "card segment-card");
  const h = el("h3"); h.appendChild(el("span", "key", k.key));
  h.appendChild(el("span", "muted", g.name + " \\u00b7 step " + fmt(k.step) + " \\u00b7 process " + proc.process));
  card.appendChild(h);
  for (const slot of ["current", "next"]) {
    const b = (k.buffers || []).find(x => x.slot === slot);
    card.appendChild(row(slot, bufferBar(b ? b : {slot: slot, ready: false})));
  }
  card.appendChild(el("div", "muted small", fmt(k.fetches) + " fetches" +
    (k.fetch_ms_last === null || k.fetch_ms_last === undefined ? "" : ", last " + k.fetch_ms_last.toFixed(1) + " ms") +
    (k.fetch_failures ? ", " + k.fetch_failures + " failed" : "")));
  if (k.last_error) card.appendChild(el("div", "no small", k.last_error));
  return card;
}
function renderProcesses(sup, snaps) {
  const box = document.getElementById("processes");
  box.replaceChildren();
  for (const p of sup.processes) {
    const snap = snaps.find(x => x.process === p.process);
    const ready = p.running && snap && snap.ready;
    const d = el("div", "proc " + (p.running ? "running" : "stopped") + (ready ? " ready" : " not-ready"));
    const dot = el("span", "dot " + (ready ? "ok" : "bad"));
    d.appendChild(dot);
    d.appendChild(el("b", "", "process " + p.process));
    d.appendChild(el("span", ready ? "muted" : "no", " " + (ready ? "ready" : p.running ? "not ready" : "not running")));
    d.appendChild(el("span", "muted", " \\u00b7 pid " + (p.pid === null || p.pid === undefined ? "-" : p.pid) +
                     " \\u00b7 " + p.restarts + " restart" + (p.restarts === 1 ? "" : "s") +
                     (snap && snap.started ? " \\u00b7 up " + dur(snap.time - snap.started) : "")));
    if (p.last_error) d.appendChild(el("div", "no small", p.last_error));
    box.appendChild(d);
  }
}
function renderCluster(procs) {
  // the cluster as this node sees it: members with their state, the owner of each strict
  // key, and the keys being handed over (claiming or releasing here)
  const panel = document.getElementById("cluster-panel");
  const c = (procs.find(p => p.cluster) || {}).cluster;
  if (!c || !c.status) { panel.hidden = true; return; }
  panel.hidden = false;
  const st = c.status, owners = st.owners || {}, claims = st.claims || {};
  const lease = (st.lease || {}).remaining_s;
  document.getElementById("cluster-summary").textContent =
    "cluster " + st.cluster + " \\u00b7 this node " + st.node + " \\u00b7 view epoch " + st.epoch +
    " \\u00b7 " + st.hash + " \\u00b7 membership lease " +
    (lease === null || lease === undefined ? "-" : lease.toFixed(1) + " s") +
    " \\u00b7 " + c.handoffs + " hand-off(s) taken \\u00b7 forwards " + (c.forwards.ok || 0) +
    " ok, " + (c.forwards.failed || 0) + " failed \\u00b7 421s " + c.misdirected;
  const members = document.querySelector("#cluster-members tbody");
  members.replaceChildren();
  for (const m of (st.members || [])) {
    const tr = el("tr", "member");
    cell(tr, m.node + (m.node === st.node ? " (this node)" : ""), "l node");
    cell(tr, m.advertise, "l"); cell(tr, m.weight);
    cell(tr, m.state, "l state " + (m.state === "alive" ? "yes" : "no"));
    cell(tr, Object.values(owners).filter(o => o === m.node).length, "owned");
    members.appendChild(tr);
  }
  if (!members.children.length) { const tr = el("tr"); cell(tr, "(no view yet)", "l muted"); members.appendChild(tr); }
  const keys = document.querySelector("#cluster-keys tbody");
  keys.replaceChildren();
  const moving = [];
  for (const k of Object.keys(owners).sort()) {
    const claim = claims[k] || {};
    const tr = el("tr", "strict-key");
    cell(tr, k, "l key"); cell(tr, owners[k], "l owner"); cell(tr, claim.epoch);
    const state = claim.state || "-";
    cell(tr, state, "l " + (state === "owned" ? "yes" : (state === "idle" || state === "-") ? "" : "no"));
    if (state === "claiming" || state === "releasing") moving.push(k + " (" + state + ")");
    keys.appendChild(tr);
  }
  if (!keys.children.length) { const tr = el("tr"); cell(tr, "(no strict keys)", "l muted"); keys.appendChild(tr); }
  const mv = document.getElementById("cluster-moving");
  mv.textContent = moving.length ? "hand-offs in progress: " + moving.join(", ") : "no hand-off in progress";
  mv.className = "small " + (moving.length ? "no" : "muted");
}
function render(s) {
  const ready = document.getElementById("ready");
  ready.textContent = s.ready ? "ready" : "not ready";
  ready.className = "badge " + (s.ready ? "ok" : "bad");
  document.title = (s.ready ? "" : "NOT READY \\u00b7 ") + "flakekit server";
  const srv = s.server;
  const starts = s.processes.map(p => p.started).filter(t => typeof t === "number");
  const uptime = starts.length ? srv.time - Math.min(...starts) : 0;
  document.getElementById("summary").textContent =
    "version " + srv.version + " \\u00b7 up " + dur(uptime) + " \\u00b7 " + s.supervision.running + " of " + s.supervision.expected +
    " process(es) running, " + s.supervision.restarts + " restart(s) \\u00b7 " + srv.stack +
    " \\u00b7 " + srv.host + ":" + srv.port + " \\u00b7 config " + (srv.config || "(embedded default)") +
    " \\u00b7 updated " + new Date(srv.time * 1000).toLocaleTimeString();
  const problems = document.getElementById("problems");
  problems.replaceChildren();
  for (const p of s.problems) problems.appendChild(el("li", "", p));
  renderProcesses(s.supervision, s.processes);
  renderHttp(s, uptime);
  renderCluster(s.processes);
  const gcards = document.getElementById("generator-cards");
  const scards = document.getElementById("segment-cards");
  const leases = document.querySelector("#leases tbody");
  const segments = document.querySelector("#segments tbody");
  gcards.replaceChildren(); scards.replaceChildren(); leases.replaceChildren(); segments.replaceChildren();
  for (const proc of s.processes) {
    for (const g of proc.generators) {
      if (g.kind === "time-ordered") {
        gcards.appendChild(generatorCard(proc, g));
        const tr = el("tr", "generator");
        cell(tr, g.name, "l name"); cell(tr, proc.process); cell(tr, g.layout, "l");
        cell(tr, g.worker_id, "worker"); cell(tr, g.epoch);
        cell(tr, g.lost ? "lost" : g.lease_remaining_s === null || g.lease_remaining_s === undefined ? "never expires" : g.lease_remaining_s.toFixed(1));
        cell(tr, g.renewals); cell(tr, g.renew_failures); cell(tr, g.issued, "issued");
        cell(tr, g.ready ? "ok" : g.problem, "l " + (g.ready ? "yes" : "no"));
        leases.appendChild(tr);
        continue;
      }
      for (const k of (g.keys || [])) {
        scards.appendChild(segmentCard(proc, g, k));
        const tr = el("tr", "segment");
        cell(tr, k.key, "l key"); cell(tr, g.name, "l"); cell(tr, proc.process); cell(tr, k.step);
        cell(tr, g.issued, "issued");
        for (const slot of ["current", "next"]) {
          const b = (k.buffers || []).find(x => x.slot === slot) || {};
          cell(tr, b.position, slot + "-pos"); cell(tr, b.end, slot + "-end"); cell(tr, b.step, slot + "-step");
          cell(tr, b.ready ? "yes" : "no", b.ready ? "yes" : (slot === "next" ? "pending" : "no"));
        }
        cell(tr, k.fetches); cell(tr, k.fetch_ms_last === null || k.fetch_ms_last === undefined ? null : k.fetch_ms_last.toFixed(2));
        cell(tr, g.ready ? "ok" : g.problem, "l " + (g.ready ? "yes" : "no"));
        segments.appendChild(tr);
      }
    }
  }
  if (!gcards.children.length) gcards.appendChild(el("p", "muted", "(no snowflake generators)"));
  if (!scards.children.length) scards.appendChild(el("p", "muted", "(no segment generators)"));
  if (!leases.children.length) { const tr = el("tr"); cell(tr, "(no snowflake generators)", "l muted"); leases.appendChild(tr); }
  if (!segments.children.length) { const tr = el("tr"); cell(tr, "(no segment generators)", "l muted"); segments.appendChild(tr); }
}
async function refresh() {
  try {
    const r = await fetch("/api/v1/status", {cache: "no-store"});
    render(await r.json());
  } catch (e) {
    const ready = document.getElementById("ready");
    ready.textContent = "unreachable"; ready.className = "badge bad";
  }
}
async function refreshDb() {
  // /db is server-rendered with every value escaped; its cells are copied here as text
  const body = document.querySelector("#db tbody");
  try {
    const r = await fetch("/db", {cache: "no-store"});
    const doc = new DOMParser().parseFromString(await r.text(), "text/html");
    body.replaceChildren();
    for (const tr of doc.querySelectorAll("table tr")) {
      const tds = tr.querySelectorAll("td");
      if (!tds.length) continue;
      const out = el("tr", "db-row");
      tds.forEach((td, i) => cell(out, td.textContent, (i === 0 || i >= 3) ? "l" : ""));
      body.appendChild(out);
    }
    if (!body.children.length) { const tr = el("tr"); cell(tr, "(no segment table)", "l muted"); body.appendChild(tr); }
  } catch (e) {
    body.replaceChildren();
    const tr = el("tr"); cell(tr, "(the segment table did not answer)", "l muted"); body.appendChild(tr);
  }
}
refresh();
refreshDb();
setInterval(refresh, 2000);
setInterval(refreshDb, 10000);
</script>
</body>
</html>
"""
#: the page, with the server's latency histogram bounds (seconds) for the p50/p99 estimates
PAGE = _PAGE.replace(b"__LATENCY_BOUNDS_S__", json.dumps(list(LATENCY_BUCKETS_S)).encode())
