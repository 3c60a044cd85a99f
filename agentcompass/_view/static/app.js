// AgentCompass results viewer: one page, hash routes, data loaded as <script>
// files (so it also works opened from disk), all data rendered as text.
"use strict";

const COMPASS = (() => {
  const waiting = new Map();
  const cache = new Map();
  // Data that came before it was asked for: the files index.html loads with the page.
  const early = new Map();
  function put(id, data) {
    const w = waiting.get(id);
    if (w) { waiting.delete(id); w.resolve(data); } else early.set(id, data);
  }
  // Served pages read data with fetch() and JSON.parse (faster, and no script
  // source for the engine to keep); pages opened from disk, where browsers
  // forbid fetch(), run the data files as scripts.
  const served = location.protocol === "http:" || location.protocol === "https:";
  async function fetchData(id) {
    const response = await fetch("data/" + id.split("/").map(encodeURIComponent).join("/") + ".js", { cache: "no-store" });
    if (!response.ok) throw new Error("cannot load " + id);
    const text = await response.text();
    const head = "COMPASS.put(" + JSON.stringify(id) + ",";
    if (!text.startsWith(head)) throw new Error("no data in " + id);
    return JSON.parse(text.slice(head.length, text.lastIndexOf(");")));
  }
  function fetchScript(id, fresh) {
    if (served) return fetchData(id);
    return new Promise((resolve, reject) => {
      waiting.set(id, { resolve, reject });
      const s = document.createElement("script");
      s.src = "data/" + id.split("/").map(encodeURIComponent).join("/") + ".js" + (fresh ? "?t=" + Date.now() : "");
      s.onload = () => { s.remove(); if (waiting.has(id)) { waiting.delete(id); reject(new Error("no data in " + id)); } };
      s.onerror = () => { s.remove(); waiting.delete(id); reject(new Error("cannot load " + id)); };
      document.head.appendChild(s);
    });
  }
  // Loads of one id are serialized: put() resolves by id.
  const chains = new Map();
  // Loads begun before the page asked (see prefetch), each taken once.
  const ahead = new Map();
  function load(id, opts = {}) {
    if (early.has(id)) { const data = early.get(id); early.delete(id); return Promise.resolve(data); }
    if (ahead.has(id)) {
      const p = ahead.get(id);
      ahead.delete(id);
      if (opts.cache !== false && !opts.fresh) cache.set(id, p);
      return p;
    }
    if (!opts.fresh && opts.cache !== false && cache.has(id)) return cache.get(id);
    const prev = chains.get(id) || Promise.resolve();
    const p = prev.catch(() => null).then(() => fetchScript(id, !!opts.fresh));
    chains.set(id, p);
    // Forget a settled load (it would hold its data, a trajectory chunk say, for good).
    const forget = () => { if (chains.get(id) === p) chains.delete(id); };
    p.then(forget, forget);
    if (opts.cache !== false && !opts.fresh) {
      cache.set(id, p);
      p.catch(() => cache.delete(id));
    }
    return p;
  }
  // The data the first view will ask for, begun while the page's other
  // files still load (the view starts once they have).
  function prefetch(id) {
    const p = load(id, { cache: false });
    p.catch(() => null);  // the view that takes it reports a failure
    ahead.set(id, p);
  }
  // What the first view did not take is not kept (a run page's data is large).
  function dropAhead() { ahead.clear(); }
  return { put, load, prefetch, dropAhead, cache };
})();
window.COMPASS = COMPASS;

// ------------------------------------------------------------------ helpers

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k === "class") el.className = v;
      else el.setAttribute(k, v === true ? "" : String(v));
    }
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
const $main = () => document.getElementById("main");
function setMain(...nodes) { const m = $main(); m.replaceChildren(...nodes.flat().filter((n) => n !== null && n !== undefined && n !== false)); m.removeAttribute("data-ready"); return m; }
function ready(view) { const m = $main(); m.dataset.view = view; m.dataset.ready = "1"; window.compassReady = performance.now(); }
function crumbs(...items) {
  const c = document.getElementById("crumbs");
  c.replaceChildren(...items.map((it) => (typeof it === "string" ? h("span", null, "/ " + it) : h("span", null, "/ ", it))));
}
function fmt(v, digits = 4) {
  if (v === null || v === undefined) return "—";
  if (typeof v === "boolean") return v ? "true" : "false";
  if (typeof v === "number") return Number.isInteger(v) ? v.toLocaleString("en") : v.toFixed(digits).replace(/0+$/, "").replace(/\.$/, "");
  return String(v);
}
// A mean with its standard error (metrics.json's stderr), as Inspect shows one beside every score.
function pm(v, stderr) { return v === null || v === undefined || stderr === null || stderr === undefined ? fmt(v) : `${fmt(v)} ± ${fmt(stderr)}`; }
function secs(v) {
  if (v === null || v === undefined) return "—";
  if (v === 0) return "0 s";
  if (v < 1e-3) return (v * 1e6).toFixed(0) + " µs";
  if (v < 0.01) return (v * 1000).toFixed(2) + " ms";
  if (v < 1) return (v * 1000).toFixed(0) + " ms";
  if (v < 120) return v.toFixed(2) + " s";
  if (v < 7200) return (v / 60).toFixed(1) + " min";
  return (v / 3600).toFixed(1) + " h";
}
function when(t) { return t ? new Date(t * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC") : "—"; }
function statusClass(s) {
  if (["succeeded", "completed", "normal", "passed"].includes(s)) return "b-ok";
  if (["failed", "run_error", "eval_error", "run_error_or_eval_error", "fatal", "timed_out", "interrupted"].includes(s)) return "b-bad";
  if (["error", "warning", "partial_failure", "cancelled", "unfinished"].includes(s)) return "b-warn";
  if (s === "running") return "b-run";
  return "";
}
function badge(s, extra) { return h("span", { class: "badge " + statusClass(s) + (extra ? " " + extra : "") }, s); }
function card(k, v, s, id) { return h("div", { class: "card", id: id || null }, h("div", { class: "k" }, k), h("div", { class: "v" }, v), s ? h("div", { class: "s" }, s) : null); }
// A cost in USD; null is unknown (no pricing), never shown as 0.
function usd(v) { return v === null || v === undefined ? "unknown" : "$" + Number(v).toFixed(v >= 1 ? 2 : 6); }
function headlineCard(hl) {
  if (!hl || !hl.attempts) return null;
  const share = hl.score_share_errored === null || hl.score_share_errored === undefined ? "" : ` · ${Math.round(hl.score_share_errored * 100)}% of the ${hl.series} score on errored attempts`;
  return card("limits hit", `${fmt(hl.limited)}`, `of ${fmt(hl.attempts)} attempts · ${fmt(hl.invalidated)} invalidated · ${fmt(hl.errored)} errored${share}`, "headline");
}
function panel(title, ...body) { return h("section", { class: "panel" }, title ? h("h2", null, title) : null, ...body); }
function outcome(v) { return v === null || v === undefined ? "none" : v >= 1 ? "pass" : "fail"; }
const FOLD_CHARS = 1500, FOLD_LINES = 24;

// Long text shows its head and a button to unfold (and fold again).
function folded(text, cls) {
  text = text === null || text === undefined ? "" : String(text);
  const lines = text.split("\n");
  const long = text.length > FOLD_CHARS || lines.length > FOLD_LINES;
  const pre = h("pre", { class: cls || null });
  if (!long) { pre.textContent = text; return pre; }
  let head = lines.slice(0, FOLD_LINES).join("\n");
  if (head.length > FOLD_CHARS) head = head.slice(0, FOLD_CHARS);
  pre.textContent = head + "…";
  let open = false;
  const btn = h("button", { class: "fold", type: "button" }, `show all (${lines.length.toLocaleString("en")} lines, ${text.length.toLocaleString("en")} chars)`);
  btn.addEventListener("click", () => {
    open = !open;
    pre.textContent = open ? text : head + "…";
    btn.textContent = open ? "fold" : `show all (${lines.length.toLocaleString("en")} lines, ${text.length.toLocaleString("en")} chars)`;
  });
  return h("div", { class: "folded" }, pre, btn);
}
function jsonBlock(value) { return folded(JSON.stringify(value, null, 2)); }

// ------------------------------------------------------------------ virtual table
// Fixed-height rows; only the rows in view (plus a margin) are in the DOM, so
// 10,000 or 1,000,000 rows cost the same to scroll and to filter.

const ROW_H = 30;
function virtualTable(columns, opts = {}) {
  const template = columns.map((c) => c.width || "1fr").join(" ");
  const head = h("div", { class: "vt-head" });
  head.style.gridTemplateColumns = template;
  const windowEl = h("div", { class: "vt-window" });
  const spacer = h("div", { class: "vt-spacer" }, windowEl);
  const body = h("div", { class: "vt-body" }, spacer);
  const empty = h("div", { class: "vt-empty" }, opts.empty || "No rows match.");
  const root = h("div", { class: "vt", id: opts.id || null }, head, body);
  let rows = [], sortCol = opts.sort ?? null, sortDir = opts.sortDir || 1, lastStart = -1, lastEnd = -1;
  const cells = columns.map((c, i) => {
    const cell = h("div", { class: c.num ? "num" : null, title: "sort by " + c.label, role: "columnheader" }, c.label);
    cell.addEventListener("click", () => {
      if (sortCol === i) sortDir = -sortDir; else { sortCol = i; sortDir = 1; }
      api.setRows(rows);
    });
    head.appendChild(cell);
    return cell;
  });
  // The sorted column says so, with its direction.
  function marks() {
    cells.forEach((cell, i) => {
      const on = sortCol === i;
      cell.textContent = columns[i].label + (on ? (sortDir > 0 ? " ▲" : " ▼") : "");
      cell.classList.toggle("sorted", on);
      if (on) cell.setAttribute("aria-sort", sortDir > 0 ? "ascending" : "descending"); else cell.removeAttribute("aria-sort");
    });
  }
  function paint(force) {
    const top = body.scrollTop, height = body.clientHeight || 600;
    const start = Math.max(0, Math.floor(top / ROW_H) - 10);
    const end = Math.min(rows.length, Math.ceil((top + height) / ROW_H) + 10);
    if (!force && start === lastStart && end === lastEnd) return;
    lastStart = start; lastEnd = end;
    windowEl.style.transform = `translateY(${start * ROW_H}px)`;
    const frag = document.createDocumentFragment();
    for (let i = start; i < end; i++) {
      const row = rows[i];
      const el = h("div", { class: "vt-row", "data-row": i });
      el.style.gridTemplateColumns = template;
      for (const c of columns) {
        const v = c.render ? c.render(row) : row[c.key];
        el.appendChild(v instanceof Node ? h("div", { class: c.num ? "num" : null }, v) : h("div", { class: c.num ? "num" : null, title: String(v ?? "") }, v ?? ""));
      }
      frag.appendChild(el);
    }
    windowEl.replaceChildren(frag);
    if (!rows.length) windowEl.replaceChildren(empty);
  }
  let scheduled = false;
  body.addEventListener("scroll", () => {
    if (scheduled) return;
    scheduled = true;
    requestAnimationFrame(() => { scheduled = false; paint(false); });
  });
  const api = {
    root,
    setRows(newRows) {
      rows = newRows;
      if (sortCol !== null) {
        const c = columns[sortCol];
        const key = c.sortKey || ((r) => (c.render ? null : r[c.key]));
        rows = rows.slice().sort((a, b) => sortDir * compare(key(a), key(b)));
      }
      spacer.style.height = Math.max(rows.length * ROW_H, 40) + "px";
      marks();
      paint(true);
    },
    count: () => rows.length,
    repaint: () => paint(true),
  };
  return api;
}
function compare(a, b) {
  if (a === b) return 0;
  if (a === null || a === undefined) return 1;
  if (b === null || b === undefined) return -1;
  if (typeof a === "number" && typeof b === "number") return a - b;
  return String(a).localeCompare(String(b));
}

// ------------------------------------------------------------------ charts (SVG, no library)

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, text) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}
// Horizontal bars: one row per label, a value in [0, max]; `ref` is drawn
// lighter behind (the reference value when there is no official one).
function barChart(items, opts = {}) {
  const labelW = 160, barW = 360, rowH = 22, valueW = 70;
  const max = opts.max || Math.max(1, ...items.map((i) => Math.max(i.value ?? 0, i.ref ?? 0)));
  const chart = svg("svg", { class: "chart", width: labelW + barW + valueW, height: items.length * rowH + 6, role: "img", "aria-label": opts.title || "chart" });
  items.forEach((it, i) => {
    const y = i * rowH + 3;
    chart.appendChild(svg("text", { x: labelW - 6, y: y + 14, "text-anchor": "end" }, it.label.length > 24 ? it.label.slice(0, 23) + "…" : it.label));
    chart.appendChild(svg("rect", { class: "axis", x: labelW, y: y + 3, width: barW, height: 14, fill: "#eef1f5" }));
    if (it.ref !== null && it.ref !== undefined) chart.appendChild(svg("rect", { class: "ref", x: labelW, y: y + 3, width: Math.max(0, (it.ref / max) * barW), height: 14 }));
    if (it.value !== null && it.value !== undefined) chart.appendChild(svg("rect", { class: "bar", x: labelW, y: y + 3, width: Math.max(0, (it.value / max) * barW), height: 14 }));
    const shown = it.value ?? it.ref;
    chart.appendChild(svg("text", { x: labelW + barW + 6, y: y + 14 }, shown === null || shown === undefined ? "—" : fmt(shown, 3) + (it.value === null && it.ref !== null ? " (ref)" : "")));
  });
  return chart;
}
function phaseBars(timings) {
  const entries = Object.entries(timings || {}).filter(([, v]) => typeof v === "number");
  const max = Math.max(1e-9, ...entries.map(([, v]) => v));
  return h("div", { class: "bars" }, entries.map(([k, v]) => {
    const fill = h("div", { class: "fill" });
    fill.style.width = ((v / max) * 100).toFixed(1) + "%";
    return h("div", { class: "row" }, h("span", null, k), h("div", { class: "track" }, fill), h("span", { class: "num" }, secs(v)));
  }));
}

// ------------------------------------------------------------------ router

let config = { live: false };
let runs = [];
let stopCurrent = () => {};

async function start() {
  try {
    [config, runs] = await Promise.all([COMPASS.load("config"), COMPASS.load("runs")]);
  } catch (e) {
    setMain(h("p", null, "Cannot load the viewer's data: " + e.message));
    return;
  }
  window.addEventListener("hashchange", route);
  route();
  COMPASS.dropAhead();
}

function route() {
  stopCurrent();
  stopCurrent = () => {};
  document.getElementById("live").textContent = "";
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter((p) => p !== "").map(decodeURIComponent);
  const view = parts[0] === "run" && parts[2] === "task" ? showAttempt(+parts[1], parts[3], parts[4] === undefined ? null : +parts[4])
    : parts[0] === "run" ? showRun(+parts[1])
    : parts[0] === "compare" ? showCompare((parts[1] || "").split(",").filter((x) => x !== "").map(Number))
    : showIndex();
  Promise.resolve(view).catch((e) => setMain(h("p", { class: "bad" }, "Error: " + e.message)));
}
const runHref = (i) => `#/run/${i}`;
const attemptHref = (i, key, attempt) => `#/run/${i}/task/${encodeURIComponent(key)}` + (attempt === undefined || attempt === null ? "" : `/${attempt}`);
function runLabel(i) { const r = runs[i]; return r ? `${r.name} · ${r.run_id}` : `run ${i}`; }

// ------------------------------------------------------------------ index

function showIndex() {
  crumbs();
  if (runs.length === 1 && !location.hash) { location.replace(runHref(0)); return; }
  const picked = new Set();
  const cmp = h("button", { class: "fold", type: "button", id: "compare-btn", disabled: true }, "Compare selected");
  cmp.addEventListener("click", () => { location.hash = "#/compare/" + [...picked].sort((a, b) => a - b).join(","); });
  const table = h("table", { class: "t", id: "runs" },
    h("tr", null, h("th", null, ""), h("th", null, "request"), h("th", null, "run"), h("th", null, "status"), h("th", null, "benchmark"), h("th", null, "harness"), h("th", null, "model"), h("th", null, "started")),
    runs.map((r, i) => {
      const box = h("input", { type: "checkbox", "data-run": i });
      box.addEventListener("change", () => { box.checked ? picked.add(i) : picked.delete(i); cmp.disabled = picked.size < 2; });
      return h("tr", null, h("td", null, box), h("td", null, h("a", { href: runHref(i) }, r.name)), h("td", { class: "mono" }, r.run_id),
        h("td", null, badge(r.status)), h("td", null, r.benchmark || "—"), h("td", null, r.harness || "—"), h("td", null, r.model || "—"), h("td", null, when(r.started_at)));
    }));
  setMain(h("h1", null, "Runs"), panel(null, table, h("p", null, cmp, " ", h("span", { class: "muted" }, "pick two or more runs of the same benchmark"))));
  ready("index");
}

// ------------------------------------------------------------------ run page

const runState = new Map(); // run index -> filter values, kept across navigation

async function showRun(i) {
  crumbs(runLabel(i));
  setMain(h("p", { class: "muted" }, "Loading run…"));
  let data = await COMPASS.load(`${i}/run`, { cache: !!config.static });
  const state = runState.get(i) || { status: "", severity: "", category: "", code: "", outcome: "", text: "" };
  runState.set(i, state);
  const head = h("div"), below = h("div");
  const table = virtualTable(taskColumns(i, data), { id: "task-table", empty: "No task matches the filters." });
  const count = h("span", { class: "muted", id: "task-count" });
  let rows = [];
  function buildRows() {
    const c = data.columns.reduce((acc, name, k) => ((acc[name] = k), acc), {});
    rows = data.tasks.map((t) => ({
      task_id: t[c.task_id], key: t[c.key], category: t[c.category], severity: t[c.severity], statuses: t[c.statuses],
      value: t[c.value], codes: t[c.codes], retries: t[c.retries], attempts: t[c.attempts], seconds: t[c.seconds],
      hay: (t[c.task_id] + " " + (t[c.category] || "") + " " + t[c.codes].join(" ") + " " + t[c.statuses].join(" ")).toLowerCase(),
    }));
  }
  function applyFilters() {
    const text = state.text.trim().toLowerCase();
    const shown = rows.filter((r) =>
      (!state.status || r.statuses.includes(state.status)) &&
      (!state.severity || r.severity === state.severity) &&
      (!state.category || (r.category || "(none)") === state.category) &&
      (!state.code || r.codes.includes(state.code)) &&
      (!state.outcome || outcome(r.value) === state.outcome || (state.outcome === "running" && r.severity === "running")) &&
      (!text || r.hay.includes(text)));
    table.setRows(shown);
    count.textContent = `${shown.length.toLocaleString("en")} of ${rows.length.toLocaleString("en")} tasks`;
  }
  // The filter controls are built once: a refresh patches the data and a
  // select's options (only when they changed, and never while it has the
  // focus, i.e. while it may be open), never the control a person is using.
  const text = h("input", { type: "search", name: "text", placeholder: "filter tasks by text…", "aria-label": "text filter" });
  text.value = state.text;
  text.addEventListener("input", () => { state.text = text.value; applyFilters(); });
  const outcomes = h("select", { name: "outcome", "aria-label": "outcome" },
    [["", "outcome: any"], ["pass", "passed (≥ 1)"], ["fail", "failed (< 1)"], ["none", "no value"]].map(([v, l]) => h("option", { value: v }, l)));
  outcomes.value = state.outcome;
  outcomes.addEventListener("change", () => { state.outcome = outcomes.value; applyFilters(); });
  const selects = {};
  const uniq = (f) => [...new Set(rows.flatMap(f))].sort();
  const choices = { status: () => uniq((r) => r.statuses), severity: () => uniq((r) => [r.severity]),
    category: () => uniq((r) => [r.category || "(none)"]), code: () => uniq((r) => r.codes) };
  for (const [name, label] of [["status", "status"], ["severity", "severity"], ["category", "category"], ["code", "issue"]]) {
    const el = h("select", { name, "aria-label": label }, h("option", { value: "" }, label + ": any"));
    el.addEventListener("change", () => { state[name] = el.value; applyFilters(); });
    selects[name] = el;
  }
  function patchOptions(force) {
    for (const [name, el] of Object.entries(selects)) {
      if (!force && document.activeElement === el) continue;
      const values = choices[name]();
      if (state[name] && !values.includes(state[name])) values.push(state[name]);
      const have = [...el.options].slice(1).map((o) => o.value);
      if (have.length !== values.length || have.some((v, k) => v !== values[k])) {
        el.replaceChildren(el.options[0], ...values.map((v) => h("option", { value: v }, v)));
      }
      if (el.value !== state[name]) el.value = state[name];
    }
  }
  const filters = h("div", { class: "filters" }, text, outcomes, Object.values(selects), count);
  const pickCode = (code) => { state.code = code; patchOptions(true); applyFilters(); };
  function render() {
    const parts = runSummary(i, data, pickCode);
    head.replaceChildren(...parts.slice(0, -1));
    below.replaceChildren(parts[parts.length - 1]);
    buildRows();
    patchOptions(false);
    applyFilters();
  }
  setMain(head, panel("Tasks", filters, table.root), below);
  render();
  ready("run");
  // Refresh while the run is live, or while the server is still reading rows
  // (pending): a live page asks only for what changed since its version.
  const again = () => (config.live && isLive(data)) || data.pending > 0;
  const wasLive = config.live && isLive(data);
  const status = () => data.pending > 0 ? `reading ${data.pending.toLocaleString("en")} more task(s)…`
    : isLive(data) ? "live · refreshed " + new Date().toLocaleTimeString() : wasLive ? "run finished" : "";
  if (again()) {
    let timer = null, stopped = false;
    const liveEl = document.getElementById("live");
    const tick = async () => {
      try {
        const update = await COMPASS.load(data.version && !config.static ? `${i}/since/${data.version}` : `${i}/run`, { fresh: true });
        if (stopped) return;
        data = mergeRun(data, update);
        render();
        liveEl.textContent = status();
      } catch (e) { liveEl.textContent = "live · " + e.message; }
      if (!stopped && again()) timer = setTimeout(tick, data.pending > 0 ? 500 : 2000);
    };
    liveEl.textContent = data.pending > 0 ? status() : "live";
    timer = setTimeout(tick, data.pending > 0 ? 500 : 2000);
    stopCurrent = () => { stopped = true; clearTimeout(timer); };
  }
}
// A run page updated by what changed since the version it holds (rows by task id).
function mergeRun(old, update) {
  if (!update.delta) return update;
  const tasks = old.tasks.slice(), at = new Map(tasks.map((t, k) => [t[0], k]));
  for (const t of update.tasks) { const k = at.get(t[0]); if (k === undefined) tasks.push(t); else tasks[k] = t; }
  const removed = new Set(update.delta.removed);
  const merged = { ...update, tasks: removed.size ? tasks.filter((t) => !removed.has(t[0])) : tasks };
  delete merged.delta;
  return merged;
}
// A task's record: its own file when served, its bundle's in the static site.
async function loadTask(i, key) {
  if (!config.static) return COMPASS.load(`${i}/task/${key}`, { cache: false });
  const run = await COMPASS.load(`${i}/run`);
  const firsts = run.task_bundles || [];
  let lo = 0, hi = firsts.length - 1, b = 0;
  while (lo <= hi) { const mid = (lo + hi) >> 1; if (firsts[mid] <= key) { b = mid; lo = mid + 1; } else hi = mid - 1; }
  const task = (await COMPASS.load(`${i}/tasks/${b}`))[key];
  if (!task) throw new Error("no task " + key);
  return task;
}
function isLive(data) { return data.header.status === "running" || data.live.running; }

function taskColumns(i, data) {
  return [
    { label: "task", width: "minmax(180px, 2.2fr)", key: "task_id", sortKey: (r) => r.task_id,
      render: (r) => (r.key ? h("a", { href: attemptHref(i, r.key), class: "task-link" }, r.task_id) : h("span", null, r.task_id)) },
    { label: "category", width: "1fr", key: "category", sortKey: (r) => r.category, render: (r) => r.category || "" },
    { label: "severity", width: "90px", sortKey: (r) => r.severity, render: (r) => badge(r.severity) },
    { label: "attempts", width: "minmax(130px, 1.4fr)", sortKey: (r) => r.statuses.join(","), render: attemptBadges },
    { label: data.primary || "value", width: "80px", num: true, sortKey: (r) => r.value, render: (r) => fmt(r.value, 3) },
    { label: "issues", width: "minmax(140px, 2fr)", sortKey: (r) => r.codes.join(","), render: (r) => r.codes.join(", ") },
    { label: "retries", width: "60px", num: true, sortKey: (r) => r.retries, render: (r) => fmt(r.retries) },
    { label: "time", width: "80px", num: true, sortKey: (r) => r.seconds, render: (r) => secs(r.seconds) },
  ];
}

// One badge per attempt: its status in words for one or two, a numbered chip
// coloured by status (the status in its title) for more, so k = 5 or 10 fit.
function attemptBadges(r) {
  if (r.statuses.length <= 2) return h("span", { class: "attempts" }, r.statuses.map((s) => badge(s)));
  return h("span", { class: "attempts" }, r.statuses.map((s, n) => {
    const b = h("span", { class: "badge mini " + statusClass(s), title: `attempt ${n}: ${s}` }, String(n));
    return b;
  }));
}

function runSummary(i, data, pickCode) {
  const hd = data.header, m = data.metrics, p = data.progress || {};
  const primary = data.primary;
  let score;
  if (!m) score = h("p", { class: "score" }, "No score: the run has not finalized (", hd.status, ").");
  else if (m.evaluation_failed) {
    const ref = primary && m.series[primary] ? m.series[primary].reference_value : null;
    score = h("p", { class: "score" }, h("span", { class: "badge b-bad" }, "no official score"), " ",
      `${m.series[primary]?.invalidated ?? "some"} task(s) ended FATAL, so the result does not measure the agent. Reference ${primary}: ${pm(ref, m.series[primary]?.stderr)} (from non-invalidated tasks).`);
  } else {
    const s = m.series[primary] || {};
    score = h("p", { class: "score" }, `${primary}: `, h("strong", { id: "score" }, fmt(s.value)),
      s.stderr !== null && s.stderr !== undefined ? h("span", { id: "score-stderr" }, ` ± ${fmt(s.stderr)}`) : null, ` over ${fmt(s.evaluated)} evaluated of ${fmt(s.total)} tasks`);
  }
  const usage = (m && m.usage) || data.usage || {};
  const elapsed = p.elapsed ?? (hd.ended_at && hd.started_at ? hd.ended_at - hd.started_at : null);
  const fatal = data.tasks.filter((t) => t[3] === "fatal").length, error = data.tasks.filter((t) => t[3] === "error").length;
  const unfinished = data.tasks.filter((t) => t[3] === "running" || t[3] === "unfinished").length;
  const cards = h("div", { class: "cards" },
    card("status", badge(hd.status), `${hd.benchmark || "?"} · ${hd.harness || "?"} · ${hd.environment || "?"}`),
    card("tasks", fmt(p.total ?? data.tasks.length), `${fmt(p.completed ?? data.tasks.length - unfinished)} done · ${fmt(p.active ?? unfinished)} active · ${fmt(p.pending ?? 0)} pending`),
    card("severity", `${fatal} / ${error}`, "fatal / error tasks"),
    card("wall time", secs(elapsed), `started ${when(hd.started_at)}`),
    card("tokens", fmt((usage.prompt_tokens || 0) + (usage.completion_tokens || 0)), `${fmt(usage.prompt_tokens || 0)} prompt · ${fmt(usage.completion_tokens || 0)} completion · ${fmt(usage.calls || 0)} calls`),
    "calls" in usage ? card("cost", usd(usage.cost_usd), usage.cost_usd === null ? "no pricing for the model" : "USD, all attempts", "cost") : null,
    headlineCard(m && m.headline),
    card("retries", fmt(data.retries), "extra tries across all attempts"),
    hd.model ? card("model", hd.model, "") : null);
  const out = [h("h1", null, hd.name, " ", h("span", { class: "muted mono" }, hd.run_id)), score, cards];
  const left = [], right = [];
  if (m) {
    const cols = ["value", "reference_value", "evaluated", "unavailable", "invalidated", "error", "total"];
    left.push(panel("Metrics", h("table", { class: "t", id: "metrics" },
      h("tr", null, h("th", null, "series"), cols.map((c) => h("th", { class: "num" }, c.replace("_", " ")))),
      Object.entries(m.series).map(([name, s]) => h("tr", null, h("td", null, name), cols.map((c) => h("td", { class: "num" },
        c === "value" ? pm(s.value, s.stderr) : c === "reference_value" && (s.value === null || s.value === undefined) ? pm(s.reference_value, s.stderr) : fmt(s[c]))))))));
    const cats = Object.entries(m.categories || {});
    if (cats.length && primary) {
      const items = cats.map(([c, v]) => ({ label: c, value: v.series[primary]?.value ?? null, ref: v.series[primary]?.reference_value ?? null }));
      left.push(panel(`${primary} by category`, barChart(items, { title: primary + " by category" }),
        h("table", { class: "t" }, h("tr", null, h("th", null, "category"), Object.keys(m.series).map((s) => h("th", { class: "num" }, s)), h("th", { class: "num" }, "tasks")),
          cats.map(([c, v]) => h("tr", null, h("td", null, c), Object.keys(m.series).map((s) => h("td", { class: "num" }, pm(v.series[s]?.value ?? v.series[s]?.reference_value, v.series[s]?.stderr))), h("td", { class: "num" }, fmt(v.series[primary]?.total)))))));
    }
  }
  right.push(panel("Time by phase (sum over attempts)", phaseBars(data.timings)));
  const codes = Object.entries(data.issues_by_code);
  right.push(panel("Issues by code", codes.length
    ? h("table", { class: "t", id: "issue-codes" }, codes.map(([code, n]) => h("tr", null,
      h("td", null, h("a", { href: "#", onclick: (e) => { e.preventDefault(); pickCode(code); } }, code)), h("td", { class: "num" }, `${n} task(s)`))))
    : h("p", { class: "muted" }, "No issues.")));
  if (data.notes && data.notes.length) right.push(panel("Notes", h("ul", null, data.notes.map((n) => h("li", null, String(n))))));
  out.push(h("div", { class: "grid2" }, h("div", null, left), h("div", null, right)));
  return out;
}

// ------------------------------------------------------------------ attempt page

async function showAttempt(i, key, attemptIndex) {
  setMain(h("p", { class: "muted" }, "Loading task…"));
  const task = await loadTask(i, key);
  crumbs(h("a", { href: runHref(i) }, runLabel(i)), task.task_id);
  const attempts = task.attempts || [];
  const attempt = attempts.find((a) => a.attempt === attemptIndex) || attempts[0];
  const tabs = h("div", { class: "tabs" }, attempts.map((a) =>
    h("a", { href: attemptHref(i, key, a.attempt), class: a === attempt ? "on" : null }, `attempt ${a.attempt} · ${a.status}`)));
  const head = h("h1", null, task.task_id, " ", badge(task.checkpointed ? "running" : task.severity), task.category ? h("span", { class: "muted" }, " " + task.category) : null);
  const note = task.checkpointed ? h("p", { class: "muted", id: "checkpointed" }, "Not finished: these attempts are read from their checkpoints; the task's record is written when it ends.") : null;
  if (!attempt) { setMain(head, h("p", null, "This task has no attempts.")); ready("attempt"); return; }
  const rr = attempt.run_result || {};
  const artifacts = rr.artifacts || {};
  const usage = rr.usage || {};
  const cards = h("div", { class: "cards" },
    card("status", badge(attempt.status), `attempt ${attempt.attempt}`),
    Object.entries(attempt.values || {}).map(([k, v]) => card(k, fmt(v), "value")),
    card("retries", fmt(attempt.retries || 0), "extra tries"),
    card("time", secs(Object.values(attempt.timings || {}).reduce((a, b) => a + (typeof b === "number" ? b : 0), 0)), "sum of phases"),
    card("tokens", fmt((usage.prompt_tokens || 0) + (usage.completion_tokens || 0)), `${fmt(usage.prompt_tokens || 0)} prompt · ${fmt(usage.completion_tokens || 0)} completion · ${fmt(usage.calls || 0)} calls`),
    "calls" in usage ? card("cost", usd(usage.cost_usd), "USD, this attempt", "attempt-cost") : null,
    card("trajectory", fmt(rr.trajectory_steps || 0), `messages · ${fmt(rr.tool_calls || 0)} tool calls`));
  const issues = (attempt.issues || []).length
    ? h("table", { class: "t", id: "issues" }, h("tr", null, ["severity", "phase", "code", "message"].map((c) => h("th", null, c))),
      attempt.issues.map((it) => h("tr", null, h("td", null, badge(it.severity, it.severity === "fatal" ? "b-bad" : it.severity === "error" ? "b-warn" : "")), h("td", null, it.phase), h("td", { class: "mono" }, it.code), h("td", null, it.message))))
    : h("p", { class: "muted" }, "No issues.");
  const sections = [head, note, tabs, cards, taskPanel(attempt), panel("Issues", issues, artifacts.execution_diagnostics ? h("details", null, h("summary", null, "diagnostics"), jsonBlock(artifacts.execution_diagnostics)) : null)];
  const outputs = commandOutputs(artifacts);
  const grid = h("div", { class: "grid2" },
    h("div", null, outputs, logsPanel(i, key, attempt), panel("Timings", phaseBars(attempt.timings))),
    h("div", null,
      panel("Output", folded(rr.output === "" || rr.output === null || rr.output === undefined ? "(empty)" : typeof rr.output === "string" ? rr.output : JSON.stringify(rr.output, null, 2))),
      panel("Plan (redacted)", h("details", null, h("summary", null, "show plan"), jsonBlock(attempt.plan))),
      otherArtifacts(artifacts),
      attempt.analysis && Object.keys(attempt.analysis).length ? panel("Analysis", jsonBlock(attempt.analysis)) : null,
      discardedPanel(task.discarded.filter((d) => d.attempt === attempt.attempt))));
  sections.push(grid);
  const traj = h("div", { id: "trajectory" });
  sections.push(panel(`Trajectory (${fmt(rr.trajectory_steps || 0)} messages)`, traj));
  setMain(...sections);
  ready("attempt");
  stopCurrent = renderTrajectory(traj, { i, key, attempt: attempt.attempt, steps: rr.trajectory_steps || 0,
    chunks: rr.trajectory_chunks || 0, chunkSteps: rr.trajectory_chunk_steps || 500, inline: rr.trajectory_inline || null });
}

// What the task asked: the prepared task's input (what the agent got) and the
// benchmark's expected answer, both kept in the attempt record's "prepared".
function asText(v) { return typeof v === "string" ? v : JSON.stringify(v, null, 2); }
function taskPanel(attempt) {
  const p = attempt.prepared;
  if (!p) return panel("Task", h("p", { class: "muted", id: "task-input" }, "Not recorded: the attempt ended before its task was prepared."));
  const input = Object.entries(p.input || {});
  const hasExpected = p.expected !== null && p.expected !== undefined;
  return panel("Task",
    h("div", { id: "task-input" }, input.length
      ? input.flatMap(([k, v]) => [h("div", { class: "muted" }, `input · ${k}`), folded(asText(v), "input-" + k)])
      : h("p", { class: "muted" }, "No input recorded.")),
    h("div", { id: "task-expected" }, h("div", { class: "muted" }, "expected"),
      hasExpected ? folded(asText(p.expected)) : h("p", { class: "muted" }, "None recorded (the benchmark's own check decides).")));
}
// The kept logs (tasks/<key>/attempt-<n>/logs/ of the run directory): listed
// with the task, each file's text loaded when it is opened.
function logsPanel(i, key, attempt) {
  const logs = attempt.logs || [];
  if (!logs.length) return panel("Logs", h("p", { class: "muted", id: "logs" }, "No logs kept."));
  return panel(`Logs (${logs.length})`, h("div", { id: "logs" }, logs.map((f, n) => {
    const body = h("div", { class: "log-text" }, h("p", { class: "muted" }, "Loading…"));
    const d = h("details", { class: "log", "data-path": f.path }, h("summary", null, h("span", { class: "mono" }, f.path), ` · ${fmt(f.size)} bytes`), body);
    let loaded = false;
    d.addEventListener("toggle", async () => {
      if (!d.open || loaded) return;
      loaded = true;
      try {
        const log = await COMPASS.load(`${i}/log/${key}/${attempt.attempt}-${n}`, { cache: false });
        const note = h("p", { class: "muted" }, `The first ${fmt(log.skipped)} bytes are not shown.`);
        body.replaceChildren(...(log.skipped ? [note] : []), folded(log.text));
      } catch (e) {
        loaded = false;
        body.replaceChildren(h("p", { class: "bad" }, "Cannot load this log: " + e.message));
      }
      body.dataset.ready = "1";
    });
    return d;
  })));
}

const COMMAND_TITLES = { verifier: "Verifier", harness_command: "Harness command" };
function isCommandOutput(v) { return v && typeof v === "object" && !Array.isArray(v) && ("stdout" in v || "stderr" in v) && "exit_code" in v; }
function commandPanel(title, id, v) {
  return panel(title, h("div", { id, class: "command-output" },
    h("p", null, "exit code ", h("strong", { class: "exit-code" }, v.exit_code === null || v.exit_code === undefined ? "none" : String(v.exit_code)),
      v.timed_out ? h("span", { class: "badge b-warn" }, " timed out") : null),
    v.stdout !== undefined ? [h("div", { class: "muted" }, "stdout"), folded(v.stdout || "(empty)", "stdout")] : null,
    v.stderr !== undefined ? [h("div", { class: "muted" }, "stderr"), folded(v.stderr || "(empty)", "stderr")] : null));
}
function commandOutputs(artifacts) {
  const out = [];
  for (const [k, title] of Object.entries(COMMAND_TITLES)) if (isCommandOutput(artifacts[k])) out.push(commandPanel(title, k.replace("_", "-"), artifacts[k]));
  for (const [k, v] of Object.entries(artifacts)) if (!(k in COMMAND_TITLES) && isCommandOutput(v)) out.push(commandPanel(k, "artifact-" + k, v));
  if ("exit_code" in artifacts) {
    // A harness that records its command's result at the top level (oracle).
    out.push(commandPanel("Harness output", "command", { exit_code: artifacts.exit_code, stdout: artifacts.stdout, stderr: artifacts.stderr }));
  }
  return out;
}
function otherArtifacts(artifacts) {
  const rest = Object.fromEntries(Object.entries(artifacts).filter(([k, v]) =>
    !(k in COMMAND_TITLES) && !isCommandOutput(v) && !["exit_code", "stdout", "stderr", "execution_diagnostics"].includes(k)));
  return Object.keys(rest).length ? panel("Artifacts", jsonBlock(rest)) : null;
}
function discardedPanel(tries) {
  if (!tries.length) return panel("Discarded tries", h("p", { class: "muted" }, "None."));
  return panel(`Discarded tries (${tries.length})`, h("div", { id: "discarded" }, tries.map((t) => {
    const d = t.data || {};
    const delay = d.retry_delay_seconds ?? d.delay_seconds ?? d.delay;
    const summary = [`try ${t.try}`, d.stage && `stage ${d.stage}`, d.scope && `retried the ${d.scope}`,
      delay !== undefined ? `waited ${secs(delay)}` : null, d.matched_pattern ? `matched ${d.matched_pattern}` : null].filter(Boolean).join(" · ");
    return h("div", { class: "discarded" }, h("div", null, summary),
      h("ul", null, (d.issues || []).map((it) => h("li", null, badge(it.severity), " ", h("span", { class: "mono" }, it.code), " ", it.message))),
      d.timings ? phaseBars(d.timings) : null,
      h("details", null, h("summary", null, "diagnostics and plan"), jsonBlock(d)));
  })));
}

// ------------------------------------------------------------------ trajectory
// A short trajectory renders whole. A long one renders virtually: a scroll
// box whose scrollbar spans every message (UNIT px of scroll per message,
// whatever its height), a sticky window holding only the messages on screen
// (the one at the scroll position, offset by the fraction scrolled past it,
// and those below it until the box is full; at the end, the last ones
// bottom-aligned), and chunks of the file loaded as the window needs them,
// a few kept. Search asks the server which chunks may hold the text (the
// static site scans the chunks) and matches message by message.
const WHOLE_MAX = 300, MAX_SCROLL_PX = 15e6, KEEP_CHUNKS = 8;

function chunkStore(src) {
  const kept = new Map(), loading = new Map();
  if (src.inline) kept.set(0, src.inline);
  function get(c) { const m = kept.get(c); if (m && c !== 0) { kept.delete(c); kept.set(c, m); } return m; }
  function load(c) {
    if (kept.has(c)) return Promise.resolve(get(c));
    if (loading.has(c)) return loading.get(c);
    const p = COMPASS.load(`${src.i}/traj/${src.key}/${src.attempt}-${c}`, { cache: false }).then((msgs) => {
      loading.delete(c);
      kept.set(c, msgs);
      for (const k of kept.keys()) { if (kept.size <= KEEP_CHUNKS) break; if (!(src.inline && k === 0)) kept.delete(k); }
      return msgs;
    }, (e) => { loading.delete(c); throw e; });
    loading.set(c, p);
    return p;
  }
  const message = (n) => { const m = get(Math.floor(n / src.chunkSteps)); return m ? m[n % src.chunkSteps] : undefined; };
  return { load, message, chunkOf: (n) => Math.floor(n / src.chunkSteps) };
}

// Does message m hold q (lower case) in its text, its tool calls' names or
// arguments, or its tool name?
function matches(m, q) {
  if (!m || typeof m !== "object") return JSON.stringify(m ?? "").toLowerCase().includes(q);
  const text = typeof m.content === "string" ? m.content : m.content === null || m.content === undefined ? "" : JSON.stringify(m.content);
  if (text.toLowerCase().includes(q)) return true;
  if (typeof m.name === "string" && m.name.toLowerCase().includes(q)) return true;
  return (m.tool_calls || []).some((c) => String(c.name ?? "").toLowerCase().includes(q) || String(c.arguments ?? "").toLowerCase().includes(q));
}
function hex(text) { return [...new TextEncoder().encode(text)].map((b) => b.toString(16).padStart(2, "0")).join(""); }

function renderTrajectory(container, src) {
  const steps = src.steps;
  if (!steps) { container.replaceChildren(h("p", { class: "muted" }, "No trajectory recorded (a harness without a model, or none kept).")); return () => {}; }
  const store = chunkStore(src);
  const status = h("div", { class: "sentinel", id: "trajectory-more" });
  const query = h("input", { type: "search", name: "find", placeholder: "search text or tool…", "aria-label": "search the trajectory" });
  const prev = h("button", { class: "fold", type: "button", id: "find-prev", title: "previous match (Shift+Enter)" }, "↑ previous");
  const next = h("button", { class: "fold", type: "button", id: "find-next", title: "next match (Enter)" }, "↓ next");
  const found = h("span", { class: "muted", id: "find-status" });
  const target = h("input", { type: "number", name: "jump", min: 0, max: steps - 1, placeholder: "message #", "aria-label": "jump to message" });
  const go = h("button", { class: "fold", type: "button", id: "jump-go" }, "jump");
  const start = h("button", { class: "fold", type: "button", id: "jump-start" }, "first");
  const end = h("button", { class: "fold", type: "button", id: "jump-end" }, "last");
  const tools = h("div", { class: "filters" }, query, prev, next, found, h("span", { class: "gap" }), target, go, start, end);
  let stopped = false, current = -1, hitQuery = null, hitChunks = null, searching = 0;
  const view = steps <= WHOLE_MAX ? wholeView() : virtualView();
  container.replaceChildren(tools, view.root, status);

  function callOf(n, id) {
    // The assistant message whose tool call a result answers: just before it, as a rule.
    for (let k = n - 1; k >= Math.max(0, n - 200); k--) {
      const m = store.message(k);
      if (m === undefined) return null;
      for (const c of (m && m.tool_calls) || []) if (c.id === id) return { index: k, name: c.name };
    }
    return null;
  }
  function node(n) {
    const m = store.message(n);
    if (m === undefined) { const el = h("div", { class: "msg loading", "data-index": n }, h("div", { class: "meta" }, `#${n} · loading…`)); el.dataset.placeholder = "1"; return el; }
    if (!window.compassFirstMessages) window.compassFirstMessages = performance.now();
    const el = message(m, n, (id) => callOf(n, id), jump);
    el.dataset.index = n;
    if (n === current) el.classList.add("hit");
    return el;
  }

  function wholeView() {
    const list = h("div", { class: "messages" });
    store.load(0).then(() => {
      if (stopped) return;
      const frag = document.createDocumentFragment();
      for (let n = 0; n < steps; n++) frag.appendChild(node(n));
      list.replaceChildren(frag);
      container.dataset.first = 0; container.dataset.last = steps - 1; container.dataset.shown = steps;
      status.textContent = `all ${steps.toLocaleString("en")} messages`;
    }, (e) => { status.textContent = "could not load the trajectory: " + e.message; });
    return {
      root: list,
      top: () => Math.max(0, current),
      show(n) {
        const el = list.querySelector(`[data-index="${n}"]`);
        list.querySelectorAll(".hit").forEach((x) => x.classList.remove("hit"));
        if (el) { el.classList.add("hit"); el.scrollIntoView({ block: "center" }); }
        container.dataset.first = n;
      },
      stop() {},
    };
  }

  function virtualView() {
    const unit = Math.min(100, MAX_SCROLL_PX / steps);
    const list = h("div", { class: "messages" });
    const win = h("div", { class: "traj-window" }, list);
    const spacer = h("div", { class: "traj-spacer" }, win);
    const box = h("div", { class: "traj-box", id: "trajectory-box", tabindex: "0" }, spacer);
    let nodes = new Map(), queued = false;
    function size() {
      const vh = box.clientHeight || 600;
      win.style.height = vh + "px";
      spacer.style.height = ((steps - 1) * unit + vh) + "px";
    }
    function want(n) {
      const c = store.chunkOf(n);
      store.load(c).then(() => { if (!stopped) schedule(); }, (e) => { status.textContent = "could not load messages: " + e.message; });
    }
    function place(order) {
      const fresh = new Map();
      for (const n of order) {
        let el = nodes.get(n);
        if (!el || (el.dataset.placeholder && store.message(n) !== undefined)) el = node(n);
        if (el.dataset.placeholder) want(n);
        fresh.set(n, el);
      }
      nodes = fresh;
      list.replaceChildren(...order.map((n) => fresh.get(n)));
      return order.map((n) => fresh.get(n).offsetHeight + 8);  // 8: the margin between messages
    }
    function render() {
      const vh = box.clientHeight || 600;
      const pos = Math.min(steps - 1, box.scrollTop / unit);
      const first = Math.floor(pos), frac = pos - first;
      let order = [], heights = [], filled = 0, next = first;
      // Down from the message at the scroll position until the box is full.
      while (next < steps) {
        const batch = [];
        for (let k = 0; k < 8 && next < steps; k++) batch.push(next++);
        order = order.concat(batch);
        heights = place(order);
        filled = heights.reduce((a, b) => a + b, 0) - frac * heights[0];
        if (filled >= vh) break;
      }
      let offset = -frac * heights[0];
      if (filled < vh) {
        // The end: the last messages bottom-aligned, with earlier ones above them.
        let before = order[0];
        let total = heights.reduce((a, b) => a + b, 0);
        while (before > 0 && total < vh) {
          const batch = [];
          for (let k = 0; k < 8 && before > 0; k++) batch.unshift(--before);
          order = batch.concat(order);
          heights = place(order);
          total = heights.reduce((a, b) => a + b, 0);
        }
        offset = Math.min(0, vh - total);
      }
      list.style.transform = `translateY(${offset}px)`;
      // The first message on screen, and the last.
      let y = offset, top = order[0], last = order[0];
      for (let k = 0; k < order.length; k++) {
        if (y + heights[k] <= 0) top = order[k + 1] ?? order[k];
        if (y < vh) last = order[k];
        y += heights[k];
      }
      container.dataset.first = top;
      container.dataset.last = last;
      container.dataset.rendered = order.length;
      status.textContent = `messages ${top.toLocaleString("en")}–${last.toLocaleString("en")} of ${steps.toLocaleString("en")}`;
    }
    function schedule() {
      if (queued) return;
      queued = true;
      requestAnimationFrame(() => { queued = false; if (!stopped) render(); });
    }
    box.addEventListener("scroll", schedule, { passive: true });
    const onResize = () => { size(); schedule(); };
    window.addEventListener("resize", onResize);
    requestAnimationFrame(() => { size(); render(); });
    return {
      root: box,
      top: () => +container.dataset.first || 0,
      show(n) {
        box.scrollTop = Math.ceil(n * unit);
        for (const [k, el] of nodes) if (k === n || el.classList.contains("hit")) nodes.delete(k);  // re-drawn with or without the mark
        render();
        const r = box.getBoundingClientRect();
        if (r.top > innerHeight || r.bottom < 0) box.scrollIntoView({ block: "nearest" });  // the list itself in view
      },
      stop() { window.removeEventListener("resize", onResize); },
    };
  }

  function jump(n) {
    n = Math.max(0, Math.min(steps - 1, Math.floor(n)));
    current = n;
    container.dataset.match = n;
    view.show(n);
  }
  async function find(dir) {
    const q = query.value.trim().toLowerCase();
    if (!q) return;
    const mine = ++searching;
    const t0 = performance.now();
    const from = current >= 0 ? current : dir > 0 ? view.top() - 1 : view.top();
    const chunks = Math.ceil(steps / src.chunkSteps);
    let candidates;
    if (config.static) candidates = [...Array(chunks).keys()];
    else {
      if (hitQuery !== q) {
        found.textContent = "searching…";
        const r = await COMPASS.load(`${src.i}/find/${src.key}/${src.attempt}/${hex(q)}`, { cache: false });
        if (mine !== searching) return;
        hitQuery = q;
        hitChunks = r.chunks;
      }
      candidates = hitChunks;
    }
    // Ranges of messages to scan, in order: the rest of the current chunk, the
    // candidate chunks after it, wrapping round, then the current chunk's start.
    const sc = Math.floor(Math.max(0, Math.min(steps - 1, from + dir)) / src.chunkSteps);
    const ordered = dir > 0 ? [...candidates.filter((c) => c > sc), ...candidates.filter((c) => c < sc)]
      : [...candidates.filter((c) => c < sc).reverse(), ...candidates.filter((c) => c > sc).reverse()];
    const here = candidates.includes(sc) || config.static;
    const ranges = [];
    if (here) ranges.push(dir > 0 ? [from + 1, (sc + 1) * src.chunkSteps - 1] : [from - 1, sc * src.chunkSteps]);
    for (const c of ordered) ranges.push(dir > 0 ? [c * src.chunkSteps, (c + 1) * src.chunkSteps - 1] : [(c + 1) * src.chunkSteps - 1, c * src.chunkSteps]);
    if (here) ranges.push(dir > 0 ? [sc * src.chunkSteps, from] : [(sc + 1) * src.chunkSteps - 1, from]);
    let scanned = 0;
    for (const [a, b] of ranges) {
      const lo = Math.max(0, Math.min(a, b)), hi = Math.min(steps - 1, Math.max(a, b));
      if (lo > hi) continue;
      const msgs = await store.load(store.chunkOf(lo));
      if (mine !== searching || stopped) return;
      const base = store.chunkOf(lo) * src.chunkSteps;
      for (let n = dir > 0 ? lo : hi; dir > 0 ? n <= hi : n >= lo; n += dir) {
        if (matches(msgs[n - base], q)) {
          jump(n);
          window.compassFound = performance.now() - t0;
          found.textContent = `message #${n.toLocaleString("en")}`;
          return;
        }
      }
      if (++scanned % 4 === 0) found.textContent = `searching… ${Math.round(scanned / ranges.length * 100)}%`;
    }
    found.textContent = "no match";
    container.dataset.match = -1;
  }
  query.addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); find(e.shiftKey ? -1 : 1).catch((err) => { found.textContent = err.message; }); } });
  query.addEventListener("input", () => { current = -1; found.textContent = ""; });
  next.addEventListener("click", () => find(1).catch((err) => { found.textContent = err.message; }));
  prev.addEventListener("click", () => find(-1).catch((err) => { found.textContent = err.message; }));
  go.addEventListener("click", () => { if (target.value !== "") jump(+target.value); });
  target.addEventListener("keydown", (e) => { if (e.key === "Enter" && target.value !== "") jump(+target.value); });
  end.addEventListener("click", () => jump(steps - 1));
  start.addEventListener("click", () => jump(0));
  return () => { stopped = true; view.stop(); };
}

function message(m, index, callOf, jump) {
  if (!m || typeof m !== "object") return h("div", { class: "msg" }, folded(JSON.stringify(m)));
  const role = m.role || "?";
  let answers = null;
  if (role === "tool" && (m.tool_call_id || m.name)) {
    const call = m.tool_call_id ? callOf(m.tool_call_id) : null;
    const label = `answers ${call ? call.name : m.name || "call"}${m.tool_call_id ? " " + m.tool_call_id : ""}`;
    answers = call ? h("a", { href: "#", class: "answers", onclick: (e) => { e.preventDefault(); jump(call.index); } }, `${label} (#${call.index})`)
      : h("span", { class: "answers" }, label);
  }
  const exit = m.exit_code === null || m.exit_code === undefined ? null : m.exit_code;
  const meta = h("div", { class: "meta" }, h("span", { class: "role" }, role), h("span", { class: "index" }, `#${index}`),
    m.step !== undefined ? h("span", null, `step ${m.step}`) : null,
    m.name && role !== "tool" ? h("span", { class: "mono" }, m.name) : null,
    answers,
    m.usage ? h("span", { class: "usage" }, `${fmt(m.usage.prompt_tokens)} prompt · ${fmt(m.usage.completion_tokens)} completion tokens${typeof m.usage.cost_usd === "number" ? " · " + usd(m.usage.cost_usd) : ""}`) : null,
    m.duration_seconds !== undefined ? h("span", null, secs(m.duration_seconds)) : null,
    role === "tool" ? h("span", { class: "exit badge " + (exit === 0 ? "b-ok" : exit === null ? "" : "b-bad") }, "exit " + (exit === null ? "none" : exit)) : null,
    m.timed_out ? h("span", { class: "badge b-warn" }, "timed out") : null,
    m.truncated ? h("span", { class: "badge b-warn" }, "truncated") : null);
  const el = h("div", { class: "msg " + role, "data-role": role }, meta);
  if (m.content !== null && m.content !== undefined && m.content !== "") el.appendChild(folded(typeof m.content === "string" ? m.content : JSON.stringify(m.content, null, 2)));
  for (const call of m.tool_calls || []) {
    let args = call.arguments;
    try { args = JSON.stringify(JSON.parse(call.arguments), null, 2); } catch (e) { /* shown as given */ }
    el.appendChild(h("div", { class: "call tool-call" }, h("div", null, "→ ", h("span", { class: "name" }, call.name), " ", h("span", { class: "muted mono" }, call.id || "")), folded(args)));
  }
  return el;
}

// ------------------------------------------------------------------ compare

async function showCompare(indices) {
  crumbs("compare");
  indices = indices.filter((i) => i >= 0 && i < runs.length);
  if (indices.length < 2) { setMain(h("p", null, "Pick two or more runs on the ", h("a", { href: "#/" }, "runs page"), ".")); ready("compare"); return; }
  setMain(h("p", { class: "muted" }, "Loading runs…"));
  let loaded = await Promise.all(indices.map((i) => COMPASS.load(`${i}/run`, { cache: false })));
  // A comparison needs every row: wait while the server is still reading some.
  while (loaded.some((d) => d.pending > 0)) {
    const here = location.hash;
    setMain(h("p", { class: "muted" }, `Reading runs… ${loaded.reduce((n, d) => n + (d.pending || 0), 0).toLocaleString("en")} task(s) left`));
    await new Promise((resolve) => setTimeout(resolve, 500));
    if (location.hash !== here) return;
    loaded = await Promise.all(indices.map((i) => COMPASS.load(`${i}/run`, { fresh: true })));
  }
  // Oldest first: "better" and "worse" read as the change from the first run to the last.
  const order = loaded.map((d, k) => k).sort((a, b) => compare(loaded[a].header.started_at, loaded[b].header.started_at) || compare(loaded[a].header.run_id, loaded[b].header.run_id));
  const datas = order.map((k) => loaded[k]);
  indices = order.map((k) => indices[k]);
  const benchmarks = new Set(datas.map((d) => d.header.benchmark));
  const primary = datas[0].primary;
  const label = (k) => datas[k].header.run_id;
  const headRow = (first) => h("tr", null, h("th", null, first), datas.map((d, k) => h("th", { class: "num" }, h("a", { href: runHref(indices[k]) }, label(k)))));
  const series = [...new Set(datas.flatMap((d) => d.series))];
  const val = (s) => (s ? (s.value ?? s.reference_value) : null);
  const seriesTable = h("table", { class: "t", id: "compare-series" }, headRow("series"),
    series.map((s) => h("tr", null, h("td", null, s), datas.map((d, k) => {
      const v = val(d.metrics?.series?.[s]);
      const base = val(datas[0].metrics?.series?.[s]);
      const delta = k > 0 && v !== null && base !== null ? v - base : null;
      return h("td", { class: "num" }, fmt(v), d.metrics?.evaluation_failed ? " (ref)" : "",
        delta ? h("span", { class: delta > 0 ? "better" : "worse" }, ` ${delta > 0 ? "+" : ""}${fmt(delta, 3)}`) : null);
    }))));
  const cats = [...new Set(datas.flatMap((d) => Object.keys(d.metrics?.categories || {})))].sort();
  const catTable = cats.length ? h("table", { class: "t", id: "compare-categories" }, headRow(`category (${primary})`),
    cats.map((c) => h("tr", null, h("td", null, c), datas.map((d) => h("td", { class: "num" }, fmt(val(d.metrics?.categories?.[c]?.series?.[primary]))))))) : h("p", { class: "muted" }, "No categories.");
  // Per task: outcome of each run; "changed" when the outcomes differ.
  const byId = new Map();
  datas.forEach((d, k) => {
    const c = d.columns.reduce((acc, name, n) => ((acc[name] = n), acc), {});
    for (const t of d.tasks) {
      let row = byId.get(t[c.task_id]);
      if (!row) { row = { task_id: t[c.task_id], category: t[c.category], cells: datas.map(() => null) }; byId.set(row.task_id, row); }
      row.cells[k] = { key: t[c.key], value: t[c.value], severity: t[c.severity], statuses: t[c.statuses] };
    }
  });
  const rows = [...byId.values()];
  let improved = 0, regressed = 0;
  for (const r of rows) {
    const outs = r.cells.map((x) => (x ? outcome(x.value) : "missing"));
    r.changed = new Set(outs).size > 1;
    const first = r.cells[0] ? r.cells[0].value : null, last = r.cells[r.cells.length - 1] ? r.cells[r.cells.length - 1].value : null;
    r.trend = first !== null && last !== null ? Math.sign(last - first) : 0;
    if (r.changed && r.trend > 0) improved++;
    if (r.changed && r.trend < 0) regressed++;
    r.hay = (r.task_id + " " + (r.category || "")).toLowerCase();
  }
  const cols = [
    { label: "task", width: "minmax(180px, 2fr)", sortKey: (r) => r.task_id, render: (r) => r.task_id },
    { label: "category", width: "1fr", sortKey: (r) => r.category, render: (r) => r.category || "" },
    ...datas.map((d, k) => ({ label: label(k), width: "minmax(120px, 1fr)", sortKey: (r) => r.cells[k]?.value, render: (r) => {
      const x = r.cells[k];
      if (!x) return h("span", { class: "muted" }, "—");
      return x.key ? h("a", { href: attemptHref(indices[k], x.key), class: "cell" }, fmt(x.value, 3), " ", badge(x.severity)) : h("span", null, badge(x.severity));
    } })),
    { label: "change", width: "90px", sortKey: (r) => (r.changed ? r.trend : 2), render: (r) => (r.changed ? h("span", { class: r.trend > 0 ? "better" : r.trend < 0 ? "worse" : "changed" }, r.trend > 0 ? "better" : r.trend < 0 ? "worse" : "changed") : "") },
  ];
  const table = virtualTable(cols, { id: "compare-tasks", empty: "No task matches." });
  const changedOnly = h("input", { type: "checkbox", name: "changed", checked: true });
  const text = h("input", { type: "search", name: "text", placeholder: "filter tasks by text…" });
  const count = h("span", { class: "muted", id: "compare-count" });
  const apply = () => {
    const q = text.value.trim().toLowerCase();
    const shown = rows.filter((r) => (!changedOnly.checked || r.changed) && (!q || r.hay.includes(q)));
    table.setRows(shown);
    count.textContent = `${shown.length} of ${rows.length} tasks`;
  };
  changedOnly.addEventListener("change", apply);
  text.addEventListener("input", apply);
  setMain(h("h1", null, "Compare runs"),
    h("p", null, "Oldest first: ", datas.map((d, k) => h("span", null, k ? " → " : "", h("a", { href: runHref(indices[k]) }, `${d.header.name} · ${d.header.run_id}`), " ", badge(d.header.status)))),
    benchmarks.size > 1 ? h("p", { class: "badge b-warn" }, "These runs are of different benchmarks: " + [...benchmarks].join(", ")) : null,
    h("div", { class: "cards" }, card("tasks", fmt(rows.length), "in any run"), card("changed outcome", fmt(rows.filter((r) => r.changed).length), `${improved} better · ${regressed} worse`)),
    h("div", { class: "grid2" }, panel("Metrics", seriesTable), panel("By category", catTable)),
    panel("Tasks", h("div", { class: "filters" }, text, h("label", null, changedOnly, " changed outcome only"), count), table.root));
  apply();
  ready("compare");
}

{
  const m = /^#\/run\/(\d+)\/?$/.exec(location.hash);
  if (m) COMPASS.prefetch(`${m[1]}/run`);
}
document.addEventListener("DOMContentLoaded", start);
