"""The monitor page at ``/``: every generator and lease, and each segment key's two
buffers (position, end, step, ready) as Leaf's ``/cache`` shows them. Plain HTML and a
little JavaScript that reads ``/api/v1/status`` every two seconds; no external assets,
and every value is inserted as text (keys come from the database)."""

from __future__ import annotations

__all__ = ["PAGE"]

PAGE = b"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>flakekit server</title>
<style>
  body { font: 13px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; background: #fafafa; }
  h1 { font-size: 1.4em; margin: 0 0 .2em; }
  h2 { font-size: 1.1em; margin: 1.6em 0 .4em; }
  table { border-collapse: collapse; background: #fff; }
  th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: right; white-space: nowrap; }
  th { background: #eee; } td.l, th.l { text-align: left; } th[colspan] { text-align: center; }
  .badge { display: inline-block; padding: .1em .6em; border-radius: .8em; color: #fff; font-weight: 600; }
  .ok { background: #2a7d2a; } .bad { background: #b22; } .muted { color: #777; }
  .yes { color: #2a7d2a; font-weight: 600; } .no { color: #b22; font-weight: 600; }
  #problems li { color: #b22; }
</style>
</head>
<body>
<h1>flakekit server <span id="ready" class="badge">...</span></h1>
<div id="summary" class="muted">loading...</div>
<ul id="problems"></ul>
<h2>Snowflake generators and leases</h2>
<table id="leases"><thead><tr>
  <th class="l">generator</th><th>process</th><th class="l">layout</th><th>worker id</th><th>epoch</th>
  <th>lease left (s)</th><th>renewals</th><th>renew failures</th><th>IDs issued</th><th class="l">state</th>
</tr></thead><tbody></tbody></table>
<h2>Segment keys (two buffers each, as Leaf's /cache)</h2>
<table id="segments"><thead><tr>
  <th class="l" rowspan="2">key</th><th class="l" rowspan="2">generator</th><th rowspan="2">process</th>
  <th rowspan="2">step</th><th rowspan="2">IDs issued</th>
  <th colspan="4">current buffer</th><th colspan="4">next buffer</th>
  <th rowspan="2">fetches</th><th rowspan="2">fetch ms</th><th class="l" rowspan="2">state</th>
</tr><tr>
  <th>pos</th><th>end</th><th>step</th><th>ready</th><th>pos</th><th>end</th><th>step</th><th>ready</th>
</tr></thead><tbody></tbody></table>
<p class="muted">Refreshes every 2 s. JSON: <a href="/api/v1/status">/api/v1/status</a>,
metrics: <a href="/metrics">/metrics</a>, readiness: <a href="/ready">/ready</a>.</p>
<script>
"use strict";
function cell(row, value, cls) {
  const td = document.createElement("td");
  td.textContent = (value === null || value === undefined) ? "-" : String(value);
  if (cls) td.className = cls;
  row.appendChild(td);
}
function yesno(row, value) { cell(row, value ? "yes" : "no", value ? "yes" : "no"); }
function render(s) {
  const ready = document.getElementById("ready");
  ready.textContent = s.ready ? "ready" : "not ready";
  ready.className = "badge " + (s.ready ? "ok" : "bad");
  const srv = s.server;
  document.getElementById("summary").textContent =
    "version " + srv.version + " \\u00b7 " + srv.processes + " process(es) \\u00b7 " + srv.stack +
    " \\u00b7 " + srv.host + ":" + srv.port + " \\u00b7 config " + (srv.config || "(embedded default)") +
    " \\u00b7 updated " + new Date(srv.time * 1000).toLocaleTimeString();
  const problems = document.getElementById("problems");
  problems.replaceChildren();
  for (const p of s.problems) { const li = document.createElement("li"); li.textContent = p; problems.appendChild(li); }
  const leases = document.querySelector("#leases tbody");
  const segments = document.querySelector("#segments tbody");
  leases.replaceChildren(); segments.replaceChildren();
  for (const proc of s.processes) {
    for (const g of proc.generators) {
      if (g.strategy === "snowflake") {
        const tr = document.createElement("tr");
        tr.className = "generator";
        cell(tr, g.name, "l name"); cell(tr, proc.process); cell(tr, g.layout, "l");
        cell(tr, g.worker_id, "worker"); cell(tr, g.epoch);
        cell(tr, g.lease_remaining_s === null || g.lease_remaining_s === undefined ? "never expires" : g.lease_remaining_s.toFixed(1));
        cell(tr, g.renewals); cell(tr, g.renew_failures); cell(tr, g.issued, "issued");
        cell(tr, g.ready ? "ok" : g.problem, "l " + (g.ready ? "yes" : "no"));
        leases.appendChild(tr);
        continue;
      }
      for (const k of (g.keys || [])) {
        const tr = document.createElement("tr");
        tr.className = "segment";
        cell(tr, k.key, "l key"); cell(tr, g.name, "l"); cell(tr, proc.process); cell(tr, k.step);
        cell(tr, g.issued, "issued");
        for (const slot of ["current", "next"]) {
          const b = (k.buffers || []).find(x => x.slot === slot) || {};
          cell(tr, b.position, slot + "-pos"); cell(tr, b.end, slot + "-end"); cell(tr, b.step, slot + "-step");
          yesno(tr, b.ready);
        }
        cell(tr, k.fetches); cell(tr, k.fetch_ms_last === null || k.fetch_ms_last === undefined ? null : k.fetch_ms_last.toFixed(2));
        cell(tr, g.ready ? "ok" : g.problem, "l " + (g.ready ? "yes" : "no"));
        segments.appendChild(tr);
      }
    }
  }
  if (!leases.children.length) { const tr = document.createElement("tr"); cell(tr, "(no snowflake generators)", "l muted"); leases.appendChild(tr); }
  if (!segments.children.length) { const tr = document.createElement("tr"); cell(tr, "(no segment generators)", "l muted"); segments.appendChild(tr); }
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
refresh();
setInterval(refresh, 2000);
</script>
</body>
</html>
"""
