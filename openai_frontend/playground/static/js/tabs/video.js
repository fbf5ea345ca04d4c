// The Video tab: create a job (POST /v1/videos, multipart), follow it (GET /v1/videos/{id}
// polled: the progress bar is the job's own `progress`), play the MP4 when it is completed
// (GET /v1/videos/{id}/content fetched with the key -> blob: URL -> <video>), cancel a running
// job (DELETE /v1/videos/{id}: the server stops its denoiser at the next step and removes the
// job), and the job list (GET /v1/videos) with each job's state.

import { apiFetch, apiJson, el, errorBox, fillModelSelect, fmtSeconds, listModels, showError } from "../api.js";

const POLL_MS = 250;
const ACTIVE = ["queued", "in_progress"];

let ui = null;
let current = null; // {id, started (performance.now() at create), timer}
let videoUrl = null;
let listTimer = null;

function num(input) {
  const v = input.value.trim();
  return v === "" ? undefined : v;
}

export async function init(panel) {
  const model = el("select", { "data-testid": "video-model" });
  const prompt = el("textarea", { "data-testid": "video-prompt" });
  prompt.value = "a red fox runs through the snow";
  const size = el("input", { type: "text", value: "32x32", size: 9, "data-testid": "video-size" });
  const seconds = el("input", { type: "number", step: "any", placeholder: "", "data-testid": "video-seconds", class: "w6" });
  const frames = el("input", { type: "number", placeholder: "model's", "data-testid": "video-frames", class: "w6" });
  const fps = el("input", { type: "number", value: 8, "data-testid": "video-fps", class: "w5" });
  const steps = el("input", { type: "number", placeholder: "model's", "data-testid": "video-steps", class: "w6" });
  const seed = el("input", { type: "number", placeholder: "random", "data-testid": "video-seed", class: "w8" });
  const reference = el("input", { type: "file", accept: "image/*", "data-testid": "video-reference" });
  const create = el("button", { type: "submit", "data-testid": "video-create" }, "Create job");
  const error = errorBox("video-error");

  const status = el("span", { class: "pill", "data-testid": "video-status", "data-state": "" }, "no job");
  const jobId = el("code", { "data-testid": "video-id" });
  const progress = el("progress", { max: 100, value: 0, "data-testid": "video-progress", "data-value": "0" });
  const progressText = el("span", { class: "muted", "data-testid": "video-progress-text" }, "");
  const cancel = el("button", { type: "button", class: "danger", disabled: true, "data-testid": "video-cancel" }, "Cancel job");
  const ttfp = el("b", { "data-testid": "video-ttfp" }, "–");
  const player = el("video", { controls: true, loop: true, muted: true, playsinline: true, "data-testid": "video-player" });
  player.muted = true;

  const form = el("form", { class: "card", "data-testid": "video-form" },
    el("h2", {}, "Video"),
    el("div", { class: "row" }, el("label", {}, "Model", model)),
    el("label", {}, "Prompt", prompt),
    el("div", { class: "row" },
      el("label", {}, "Size", size), el("label", {}, "Seconds", seconds), el("label", {}, "Frames (4k+1)", frames),
      el("label", {}, "fps", fps), el("label", {}, "Steps", steps), el("label", {}, "Seed", seed)),
    el("div", { class: "row" }, el("label", {}, "First frame (image-to-video models)", reference)),
    el("div", { class: "row" }, create, cancel),
    error,
    el("div", { class: "row job" }, status, jobId, progressText),
    progress,
    el("div", { class: "figures" }, el("span", {}, "time to first picture ", ttfp)),
    player);

  const jobs = el("tbody", { "data-testid": "video-jobs" });
  const listError = errorBox("video-jobs-error");
  const refreshJobs = el("button", { type: "button", class: "secondary", "data-testid": "video-jobs-refresh" }, "Refresh");
  const list = el("div", { class: "card" },
    el("div", { class: "row" }, el("h2", {}, "Jobs"), refreshJobs),
    listError,
    el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "id"), el("th", {}, "model"), el("th", {}, "status"),
      el("th", {}, "progress"), el("th", {}, "size"), el("th", {}, "seconds"), el("th", {}, "prompt"), el("th", {}, ""))), jobs));

  panel.append(form, list);
  ui = { model, prompt, size, seconds, frames, fps, steps, seed, reference, create, error, status, jobId, progress,
    progressText, cancel, ttfp, player, jobs, listError };

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    createJob();
  });
  cancel.addEventListener("click", () => current && cancelJob(current.id));
  refreshJobs.addEventListener("click", () => loadJobs());
  player.addEventListener("playing", () => {
    if (current && current.started !== null && ui.player.dataset.jobId === current.id) {
      const s = (performance.now() - current.started) / 1000;
      ui.ttfp.textContent = fmtSeconds(s);
      ui.ttfp.dataset.seconds = String(s);
      current.started = null;
    }
  });
  for (const name of ["timeupdate", "loadeddata", "playing"]) {
    player.addEventListener(name, () => {
      player.dataset.currentTime = String(player.currentTime);
      player.dataset.readyState = String(player.readyState);
      player.dataset.duration = String(player.duration);
    });
  }

  try {
    await fillModelSelect(model, "/v1/videos", { preferred: ["wan_t2v"] });
  } catch (err) {
    showError(error, err);
  }
  await loadJobs();
}

export function show() {
  clearInterval(listTimer);
  listTimer = setInterval(loadJobs, 3000);
}

export function hide() {
  clearInterval(listTimer);
  listTimer = null;
}

export async function refresh() {
  if (!ui) return;
  await listModels(true).catch(() => null);
  await fillModelSelect(ui.model, "/v1/videos", { preferred: ["wan_t2v"] }).catch((err) => showError(ui.error, err));
  await loadJobs();
}

function setState(state, progress) {
  ui.status.textContent = state;
  ui.status.dataset.state = state;
  ui.status.className = `pill ${state === "completed" ? "ok" : ["failed", "cancelled", "expired"].includes(state) ? "bad" : ""}`;
  if (progress !== undefined && progress !== null) {
    ui.progress.value = progress;
    ui.progress.dataset.value = String(progress);
    ui.progressText.textContent = `${progress}%`;
  }
  ui.cancel.disabled = !ACTIVE.includes(state);
}

async function createJob() {
  showError(ui.error, null);
  if (current) clearTimeout(current.timer);
  const form = new FormData();
  const fields = {
    model: ui.model.value || undefined, prompt: ui.prompt.value, size: num(ui.size), seconds: num(ui.seconds),
    num_frames: num(ui.frames), fps: num(ui.fps), num_inference_steps: num(ui.steps), seed: num(ui.seed),
  };
  for (const [k, v] of Object.entries(fields)) if (v !== undefined) form.append(k, v);
  if (ui.reference.files[0]) form.append("input_reference", ui.reference.files[0], ui.reference.files[0].name);
  ui.create.disabled = true;
  const started = performance.now();
  try {
    const job = await apiJson("/v1/videos", { form });
    current = { id: job.id, started, timer: null };
    ui.jobId.textContent = job.id;
    ui.ttfp.textContent = "…";
    setState(job.status, job.progress);
    loadJobs();
    poll(job.id);
  } catch (err) {
    showError(ui.error, err);
  } finally {
    ui.create.disabled = false;
  }
}

async function poll(id) {
  if (!current || current.id !== id) return;
  let job;
  try {
    job = await apiJson(`/v1/videos/${encodeURIComponent(id)}`);
  } catch (err) {
    if (current && current.id === id && ui.status.dataset.state !== "cancelled") showError(ui.error, err);
    return;
  }
  if (!current || current.id !== id || ui.status.dataset.state === "cancelled") return;
  setState(job.status, job.progress);
  if (ACTIVE.includes(job.status)) {
    current.timer = setTimeout(() => poll(id), POLL_MS);
    return;
  }
  loadJobs();
  if (job.status === "completed") await play(id);
  else if (job.error) showError(ui.error, job.error.message || JSON.stringify(job.error));
}

/** Fetch the MP4 with the key and play it from memory. */
async function play(id) {
  try {
    const response = await apiFetch(`/v1/videos/${encodeURIComponent(id)}/content`);
    const blob = await response.blob();
    if (videoUrl) URL.revokeObjectURL(videoUrl);
    videoUrl = URL.createObjectURL(blob.type ? blob : new Blob([blob], { type: "video/mp4" }));
    ui.player.dataset.jobId = id;
    ui.player.dataset.bytes = String(blob.size);
    ui.player.src = videoUrl;
    await ui.player.play().catch(() => null); // autoplay may be refused: the controls remain
  } catch (err) {
    showError(ui.error, err);
  }
}

async function cancelJob(id) {
  try {
    await apiFetch(`/v1/videos/${encodeURIComponent(id)}`, { method: "DELETE" });
    if (current && current.id === id) {
      clearTimeout(current.timer);
      setState("cancelled");
    }
  } catch (err) {
    showError(ui.error, err);
  }
  loadJobs();
}

async function loadJobs() {
  if (!ui) return;
  let data;
  try {
    data = (await apiJson("/v1/videos?limit=20")).data || [];
    showError(ui.listError, null);
  } catch (err) {
    showError(ui.listError, err);
    return;
  }
  ui.jobs.replaceChildren(...data.map((job) => {
    const actions = [];
    if (job.status === "completed") {
      actions.push(el("button", { type: "button", class: "secondary", onclick: () => {
        current = { id: job.id, started: null, timer: null };
        ui.jobId.textContent = job.id;
        setState(job.status, job.progress);
        play(job.id);
      } }, "Play"));
    }
    actions.push(el("button", { type: "button", class: "danger", onclick: () => cancelJob(job.id) },
      ACTIVE.includes(job.status) ? "Cancel" : "Delete"));
    return el("tr", { "data-id": job.id, "data-state": job.status },
      el("td", {}, el("code", {}, job.id)), el("td", {}, job.model), el("td", { class: "state" }, job.status),
      el("td", {}, `${job.progress ?? 0}%`), el("td", {}, job.size || ""), el("td", {}, job.seconds ?? ""),
      el("td", { class: "prompt" }, job.prompt || ""), el("td", {}, ...actions));
  }));
  if (!data.length) ui.jobs.append(el("tr", {}, el("td", { colspan: 8, class: "muted" }, "no jobs")));
}
