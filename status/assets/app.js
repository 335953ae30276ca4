// The status page: renders a snapshot (the one the page arrived with, then every one the
// server pushes) into plain DOM and inline SVG. Names come from the state DB: they are set as
// text, never as markup.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
// Same-origin requests carry the page's cookie (set at sign-in): nothing to add to URLs.
const query = "";

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) e.append(c);
  return e;
}

function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  for (const c of children) e.append(c);
  return e;
}

const pct = (r) => (r == null ? "–" : Math.round(r * 100) + "%");
const gib = (kib) => (kib == null ? "–" : (kib / 1048576).toFixed(2) + " GiB");
const mib = (kib) => (kib == null ? "–" : Math.round(kib / 1024) + " MiB");
const clock = (ms) => new Date(ms).toLocaleTimeString([], { hour12: false });

// Green (idle) through yellow to red (Active memory close to MemTotal).
function heat(r) {
  const x = Math.max(0, Math.min(1, r));
  return `hsl(${130 - 130 * x}, ${65 + 15 * x}%, ${50 + 8 * x}%)`;
}

function sparkline(history) {
  const w = 180, h = 34;
  const s = svg("svg", { class: "spark", viewBox: `0 0 ${w} ${h}`, preserveAspectRatio: "none" });
  if (history.length < 2) {
    s.append(svg("text", { x: 2, y: h - 4, "font-size": 10, fill: "rgba(0,0,0,.55)" }, "collecting samples…"));
    return s;
  }
  const t0 = history[0][0], t1 = history[history.length - 1][0];
  const x = (t) => ((t - t0) / Math.max(1, t1 - t0)) * (w - 2) + 1;
  const y = (r) => h - 2 - Math.max(0, Math.min(1, r)) * (h - 4);
  const pts = history.map(([t, r]) => `${x(t).toFixed(1)},${y(r).toFixed(1)}`).join(" ");
  s.append(svg("polygon", { points: `1,${h} ${pts} ${w - 1},${h}`, fill: "rgba(0,0,0,.18)" }));
  s.append(svg("polyline", { points: pts, fill: "none", stroke: "rgba(0,0,0,.75)", "stroke-width": 1.6 }));
  const [lt, lr] = history[history.length - 1];
  s.append(svg("circle", { cx: x(lt), cy: y(lr), r: 2.6, fill: "#0b0f18" }));
  return s;
}

function renderSummary(d) {
  const inFlight = d.migrations.filter((m) => m.state !== "done" && m.state !== "rolled_back").length;
  const cards = [
    [d.nodes.length, "nodes"],
    [d.vms.length, "VMs"],
    [d.jobs.length, "jobs"],
    [d.migrations.filter((m) => m.state === "done").length, "migrations done"],
    [inFlight, "in flight"],
    [(d.pools.defunct || []).length, "defunct nodes"],
  ];
  document.getElementById("summary").replaceChildren(
    ...cards.map(([n, l]) => el("div", { class: "card" }, el("div", { class: "n", textContent: n }), el("div", { class: "l", textContent: l })))
  );
}

function renderNodes(d) {
  const cells = d.nodes.map((n) => {
    const cell = el("div", {
      class: "node " + n.pool + (n.ratio == null ? " nodata" : ""),
      "data-node": n.name,
      "data-pool": n.pool,
      "data-ratio": n.ratio == null ? "" : n.ratio.toFixed(3),
      title: `${n.name}: Active ${gib(n.active_kib)} of ${gib(n.total_kib)}`,
    });
    if (n.ratio != null) cell.style.background = heat(n.ratio);
    cell.append(
      el("div", { class: "top" }, el("span", { class: "name", textContent: n.name }), el("span", { class: "pool", textContent: n.pool })),
      el("div", { class: "ratio", textContent: pct(n.ratio) }),
      el("div", { class: "detail", textContent: `Active ${gib(n.active_kib)} / ${gib(n.total_kib)}` + (n.cpu == null ? "" : ` · CPU ${pct(n.cpu)}`) }),
      el("div", { class: "chips" }, ...(n.vms.length ? n.vms.map((v) => el("span", { class: "chip vm", textContent: v })) : [el("span", { class: "chip", textContent: "no VMs" })])),
      sparkline(n.history)
    );
    return cell;
  });
  document.getElementById("heatmap").replaceChildren(...(cells.length ? cells : [el("p", { class: "empty", textContent: "No nodes in the state database yet." })]));
}

function renderTimeline(d) {
  const box = document.getElementById("timeline");
  const ms = d.migrations.slice().reverse();
  const names = d.nodes.map((n) => n.name);
  const longest = Math.max(4, ...names.map((n) => n.length));
  const w = 720, rowH = 28, top = 14, left = 16 + longest * 7, right = 16;
  const h = top + Math.max(1, names.length) * rowH + 22;
  const s = svg("svg", { viewBox: `0 0 ${w} ${h}`, role: "img" });
  const colors = { done: "#3ccf8e", rolled_back: "#ff5d6c", active: "#5aa9ff" };
  s.append(svg("defs", {}, ...Object.entries(colors).map(([k, c]) =>
    svg("marker", { id: "arrow-" + k, viewBox: "0 0 10 10", refX: 8, refY: 5, markerWidth: 5, markerHeight: 5, orient: "auto-start-reverse" },
      svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: c })))));
  const y = (name) => top + Math.max(0, names.indexOf(name)) * rowH + rowH / 2;
  names.forEach((name) => {
    s.append(svg("line", { x1: left, x2: w - right, y1: y(name), y2: y(name), stroke: "#263149" }));
    s.append(svg("text", { x: left - 8, y: y(name) + 4, "text-anchor": "end", fill: "#8b97ad", "font-size": 12 }, name));
  });
  const now = d.generated_ms;
  const t0 = ms.length ? Math.min(ms[0].created_ms, now - 60000) : now - 60000;
  const x = (t) => left + ((t - t0) / Math.max(1, now - t0)) * (w - left - right);
  s.append(svg("text", { x: left, y: h - 6, fill: "#8b97ad", "font-size": 11 }, clock(t0)));
  s.append(svg("text", { x: w - right, y: h - 6, fill: "#8b97ad", "font-size": 11, "text-anchor": "end" }, clock(now) + " (now)"));
  for (const m of ms) {
    for (const mv of m.moves) {
      const kind = m.state === "done" || m.state === "rolled_back" ? m.state : "active";
      const color = colors[kind];
      const x1 = x(m.created_ms), x2 = Math.max(x(m.updated_ms), x1 + 14);
      const path = svg("path", { d: `M ${x1} ${y(m.source)} C ${x1 + 30} ${y(m.source)}, ${x2 - 30} ${y(mv.dest)}, ${x2} ${y(mv.dest)}`, fill: "none", stroke: color, "stroke-width": 2.4, "marker-end": `url(#arrow-${kind})` });
      path.append(svg("title", {}, `#${m.id} ${mv.vm}: ${m.source} → ${mv.dest} (${m.state})`));
      s.append(path, svg("circle", { cx: x1, cy: y(m.source), r: 4, fill: color }));
    }
  }
  box.replaceChildren(s);
  const list = d.migrations.map((m) => {
    const dests = [...new Set(m.moves.map((mv) => mv.dest))].join(", ");
    const took = ((m.updated_ms - m.created_ms) / 1000).toFixed(1);
    return el("li", { class: "migration " + m.state, "data-id": String(m.id), "data-source": m.source, "data-dest": dests, "data-state": m.state },
      el("span", { class: "id", textContent: "#" + m.id }),
      el("div", {},
        el("div", { class: "route" }, el("span", { textContent: m.source }), el("span", { class: "arrow", textContent: "→" }), el("span", { textContent: dests })),
        el("div", { class: "why", textContent: `${m.moves.map((mv) => mv.vm).join(", ")} · ${m.rule} · ${clock(m.created_ms)} · ${took} s` + (m.reason ? ` · ${m.reason}` : "") })),
      el("span", { class: "state " + m.state, textContent: m.state.replace("_", " ") }));
  });
  document.getElementById("migrations").replaceChildren(...(list.length ? list : [el("li", { class: "empty", textContent: "No migrations yet." })]));
}

function renderPools(d) {
  const cols = ["allocated", "free", "defunct"].map((p) => {
    const members = d.pools[p] || [];
    return el("div", { class: "pool-col " + p, "data-pool": p },
      el("h3", {}, p, el("span", { class: "count", textContent: String(members.length) })),
      el("div", { class: "members" }, ...(members.length ? members.map((n) => el("span", { textContent: n })) : [el("em", { class: "empty", textContent: "none" })])));
  });
  document.getElementById("pools").replaceChildren(...cols);
}

function renderVms(d) {
  const head = el("tr", {}, ...["VM", "job", "node", "max", "host RSS", "guest Active"].map((t) => el("th", { textContent: t })));
  const rows = d.vms.map((v) => {
    const frac = v.guest_active_kib != null && v.guest_total_kib ? v.guest_active_kib / v.guest_total_kib : 0;
    return el("tr", { "data-vm": v.vm },
      el("td", { textContent: v.vm }), el("td", { textContent: v.job }), el("td", { textContent: v.node }),
      el("td", { textContent: mib(v.mem_max_kib) }), el("td", { textContent: mib(v.host_rss_kib) }),
      el("td", {}, el("div", { class: "bar", title: mib(v.guest_active_kib) }, Object.assign(document.createElement("i"), { style: `width:${(frac * 100).toFixed(0)}%` })), mib(v.guest_active_kib)));
  });
  document.getElementById("vms").replaceChildren(head, ...rows);
}

function render(d) {
  if (!d) return;
  renderSummary(d);
  renderNodes(d);
  renderTimeline(d);
  renderPools(d);
  renderVms(d);
  const err = document.getElementById("error");
  err.hidden = !d.error;
  err.textContent = d.error ? "Reading the state database failed: " + d.error : "";
  document.getElementById("meta").textContent = `${d.db} · updated ${clock(d.generated_ms)}`;
  document.body.dataset.generated = String(d.generated_ms);
}

function live(on, text) {
  const l = document.getElementById("live");
  l.className = "live " + (on ? "on" : "off");
  document.getElementById("live-text").textContent = text;
}

// Server-sent events, and polling when the browser or a proxy cannot keep them open.
function follow() {
  let polling = null;
  const poll = () => fetch("api/status" + query).then((r) => r.json()).then((d) => { render(d); live(true, "live (polling)"); }).catch(() => live(false, "disconnected"));
  if (!window.EventSource) {
    polling = setInterval(poll, 2000);
    return;
  }
  const es = new EventSource("api/events" + query);
  es.addEventListener("status", (e) => { render(JSON.parse(e.data)); live(true, "live"); });
  es.onerror = () => {
    if (es.readyState === EventSource.CLOSED && !polling) polling = setInterval(poll, 2000);
    live(false, "reconnecting");
  };
}

render(window.VSE_SNAPSHOT);
follow();
