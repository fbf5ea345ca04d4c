// The Server tab: GET /health (status, each model's Triton state), GET /v1/models (state,
// endpoints), and a few live figures from the frontend's GET /metrics (Prometheus text,
// docs/metrics.md "Frontend metrics") drawn as small canvas charts, scraped every few seconds
// while the tab is shown.

import { apiFetch, authHeaders, el, errorBox, listModels, showError } from "../api.js";

const REFRESH_MS = 3000;
const POINTS = 60; // samples kept per chart (3 minutes)

/** The frontend's request counters (docs/metrics.md): their sum is "requests". */
const REQUEST_COUNTERS = [
  "omni_frontend_speech_requests_total", "omni_frontend_generation_requests_total",
  "omni_frontend_image_requests_total", "omni_frontend_video_requests_total",
  "omni_frontend_transcription_requests_total",
];

/**
 * The charts: `value(now, before)` -> a number or null from two parsed scrapes (`before` may be
 * null at the first scrape). Rates are per second over the scrape interval; a histogram's mean is
 * its sum's increase over its count's increase (the requests of that interval).
 */
const CHARTS = [
  { id: "requests", title: "requests (total)", unit: "", value: (m) => sum(m, REQUEST_COUNTERS) },
  { id: "request-rate", title: "requests / s", unit: "/s", value: (m, b, dt) => (b ? Math.max(0, sum(m, REQUEST_COUNTERS) - sum(b, REQUEST_COUNTERS)) / dt : null) },
  { id: "inflight", title: "in flight", unit: "", value: (m) => sum(m, ["omni_frontend_inflight_requests"]) },
  { id: "images", title: "images made (total)", unit: "", value: (m) => sum(m, ["omni_frontend_images_total"]) },
  { id: "ttfa", title: "time to first audio, mean (s)", unit: " s", value: (m, b) => histMean(m, b, "omni_frontend_time_to_first_audio_seconds") },
  { id: "ttft", title: "time to first token, mean (s)", unit: " s", value: (m, b) => histMean(m, b, "omni_frontend_time_to_first_token_seconds") },
];

let ui = null;
let timer = null;
let previous = null; // {metrics, at}
const series = new Map(CHARTS.map((c) => [c.id, []]));

/** Prometheus text exposition -> Map(name -> [{labels, value}]). */
export function parsePrometheus(text) {
  const out = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[3]) for (const l of m[3].matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    const value = Number(m[4]);
    if (!out.has(m[1])) out.set(m[1], []);
    out.get(m[1]).push({ labels, value });
  }
  return out;
}

function sum(metrics, names) {
  let total = 0;
  for (const name of names) for (const s of metrics.get(name) || []) if (Number.isFinite(s.value)) total += s.value;
  return total;
}

/** Mean of the histogram `name`'s observations since `before` (all time at the first scrape); null: none. */
function histMean(metrics, before, name) {
  const count = sum(metrics, [`${name}_count`]) - (before ? sum(before, [`${name}_count`]) : 0);
  const total = sum(metrics, [`${name}_sum`]) - (before ? sum(before, [`${name}_sum`]) : 0);
  return count > 0 ? total / count : null;
}

export async function init(panel) {
  const health = el("span", { class: "pill", "data-testid": "server-health", "data-state": "" }, "…");
  const healthMessage = el("span", { class: "muted", "data-testid": "server-health-message" });
  const healthModels = el("tbody", { "data-testid": "server-health-models" });
  const models = el("tbody", { "data-testid": "server-models" });
  const error = errorBox("server-error");
  const refreshButton = el("button", { type: "button", class: "secondary", "data-testid": "server-refresh" }, "Refresh");
  const updated = el("span", { class: "muted", "data-testid": "server-updated" });

  const charts = el("div", { class: "charts" }, ...CHARTS.map((c) => el("figure", { class: "chart" },
    el("figcaption", {}, c.title, " ", el("b", { "data-testid": `server-value-${c.id}` }, "–")),
    el("canvas", { class: "spark", width: 320, height: 60, "data-testid": `server-chart-${c.id}`, "data-points": "0" }))));

  panel.append(
    el("div", { class: "card" },
      el("div", { class: "row" }, el("h2", {}, "Server"), refreshButton, updated),
      error,
      el("div", { class: "row" }, el("span", {}, "health "), health, healthMessage),
      el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "Triton model"), el("th", {}, "state"))), healthModels)),
    el("div", { class: "card" }, el("h2", {}, "Models (/v1/models)"),
      el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "id"), el("th", {}, "state"), el("th", {}, "modality"),
        el("th", {}, "endpoints"))), models)),
    el("div", { class: "card" }, el("h2", {}, "Live figures (/metrics)"),
      el("p", { class: "muted" }, `The frontend's Prometheus metrics, scraped every ${REFRESH_MS / 1000} s while this tab is shown.`),
      charts));
  ui = { health, healthMessage, healthModels, models, error, updated };
  refreshButton.addEventListener("click", () => tick(true));
  await tick(true);
}

export function show() {
  clearInterval(timer);
  timer = setInterval(() => tick(false), REFRESH_MS);
}

export function hide() {
  clearInterval(timer);
  timer = null;
}

export function refresh() {
  return tick(true);
}

async function tick(all) {
  if (!ui) return;
  const errors = [];
  await Promise.all([
    loadHealth().catch((e) => errors.push(e)),
    (all || !ui.models.childElementCount ? loadModels() : Promise.resolve()).catch((e) => errors.push(e)),
    scrape().catch((e) => errors.push(e)),
  ]);
  showError(ui.error, errors[0] || null);
  ui.updated.textContent = `updated ${new Date().toLocaleTimeString()}`;
}

async function loadHealth() {
  // /health answers 503 with the same body when a model is not ready: read it either way (as
  // main.js's pill does; the key, when the tab has one, shows the detail)
  const response = await fetch("/health", { headers: authHeaders() });
  const body = await response.json().catch(() => ({ status: `HTTP ${response.status}` }));
  ui.health.textContent = body.status || "?";
  ui.health.dataset.state = body.status || "";
  ui.health.className = `pill ${body.status === "ok" ? "ok" : "bad"}`;
  ui.healthMessage.textContent = body.message || (body.models ? "" : "(detail shown to this machine or with the API key)");
  const entries = Object.entries(body.models || {});
  ui.healthModels.replaceChildren(...entries.map(([name, state]) =>
    el("tr", { "data-model": name, "data-state": state }, el("td", {}, name), el("td", {}, state))));
}

async function loadModels() {
  const cards = await listModels(true);
  ui.models.replaceChildren(...cards.map((m) => el("tr", { "data-model": m.id, "data-state": m.state || "" },
    el("td", {}, m.id), el("td", {}, m.state || ""), el("td", {}, m.modality || (m.modalities || []).join(", ")),
    el("td", { class: "endpoints" }, (m.endpoints || []).join(" ")))));
}

async function scrape() {
  const text = await (await apiFetch("/metrics")).text();
  const metrics = parsePrometheus(text);
  const at = performance.now();
  const dt = previous ? Math.max((at - previous.at) / 1000, 0.001) : 0;
  for (const chart of CHARTS) {
    const v = chart.value(metrics, previous ? previous.metrics : null, dt);
    const points = series.get(chart.id);
    points.push(v);
    if (points.length > POINTS) points.shift();
    const label = document.querySelector(`#tab-server [data-testid="server-value-${chart.id}"]`);
    const last = v === null ? "–" : `${Number.isInteger(v) ? v : v.toFixed(3)}${chart.unit}`;
    if (label) label.textContent = last;
    const canvas = document.querySelector(`#tab-server [data-testid="server-chart-${chart.id}"]`);
    if (canvas) draw(canvas, points, v);
  }
  previous = { metrics, at };
}

/** A sparkline of `points` (nulls are gaps) on `canvas`; its data-* say what was drawn. */
function draw(canvas, points, last) {
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 320;
  const h = canvas.clientHeight || 60;
  if (canvas.width !== Math.round(w * ratio)) canvas.width = Math.round(w * ratio);
  if (canvas.height !== Math.round(h * ratio)) canvas.height = Math.round(h * ratio);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const values = points.filter((v) => v !== null && Number.isFinite(v));
  canvas.dataset.points = String(values.length);
  canvas.dataset.last = last === null ? "" : String(last);
  if (!values.length) return;
  const max = Math.max(...values);
  const min = Math.min(0, ...values);
  const span = max - min || 1;
  const x = (i) => 4 + ((w - 8) * i) / Math.max(POINTS - 1, 1);
  const y = (v) => h - 4 - ((h - 8) * (v - min)) / span;
  const offset = POINTS - points.length;
  ctx.strokeStyle = "#2f6fdb";
  ctx.fillStyle = "#2f6fdb";
  ctx.lineWidth = 2;
  ctx.beginPath();
  let open = false;
  points.forEach((v, i) => {
    if (v === null || !Number.isFinite(v)) {
      open = false;
      return;
    }
    if (open) ctx.lineTo(x(i + offset), y(v));
    else ctx.moveTo(x(i + offset), y(v));
    open = true;
  });
  ctx.stroke();
  points.forEach((v, i) => {
    if (v !== null && Number.isFinite(v)) ctx.fillRect(x(i + offset) - 1.5, y(v) - 1.5, 3, 3);
  });
  ctx.fillStyle = "#5b6670";
  ctx.font = "10px system-ui, sans-serif";
  ctx.fillText(`max ${Number.isInteger(max) ? max : max.toFixed(3)}`, 6, 12);
}
