// The playground's shell: tabs (one module per tab under tabs/, loaded on first view), the API
// key field (shown when the server answers 401, or when the tab already holds a key), and the
// server pill. Each tab module exports `init(panel)`; `show(panel)` / `hide(panel)` if it wants.

import { apiFetch, apiKey, ApiError, authHeaders, onUnauthorized, setApiKey, showError } from "./api.js";

const TABS = ["speech", "chat", "voices", "images", "video", "realtime", "server"];
const loaded = new Map(); // tab -> module (or a Promise of it)
let current = null;

const keyForm = document.getElementById("key-form");
const keyInput = document.getElementById("api-key");
const globalError = document.getElementById("global-error");
const pill = document.getElementById("server-state");

function showKeyForm(message) {
  keyForm.hidden = false;
  if (message) showError(globalError, message);
  keyInput.focus();
}

keyForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  setApiKey(keyInput.value.trim());
  keyInput.value = "";
  delete keyForm.dataset.state;
  try {
    await apiFetch("/v1/models"); // the key works: say so and let the tabs ask again
    keyForm.dataset.state = "ok";
    showError(globalError, null);
    refreshServer();
    for (const name of loaded.keys()) reloadTab(name);
    // the shown tab's init failed on the 401 (so it is not among the loaded ones): again, now
    if (current && !loaded.has(current)) selectTab(current);
  } catch (err) {
    keyForm.dataset.state = "refused";
    showError(globalError, err);
  }
});
document.getElementById("key-forget").addEventListener("click", () => {
  setApiKey("");
  keyInput.value = "";
});
onUnauthorized((error) => showKeyForm(error));

// An on-demand model loading on its first request (api.js watchLoad): say so while it loads, then
// let the open tabs list its new state.
const notice = document.getElementById("global-notice");
const loading = new Set();
window.addEventListener("model-load", (event) => {
  const { model, state } = event.detail;
  if (state === "loading") loading.add(model);
  else loading.delete(model);
  notice.hidden = loading.size === 0;
  notice.textContent = loading.size
    ? `Loading ${[...loading].join(", ")}: an on-demand model loads on its first request (seconds to a minute here); the request goes on when it is ready.`
    : "";
  notice.dataset.models = [...loading].join(",");
  if (state === "loaded" || state === "failed") for (const name of loaded.keys()) reloadTab(name);
});

async function loadTab(name) {
  if (!loaded.has(name)) {
    const panel = document.getElementById(`tab-${name}`);
    const promise = import(`./tabs/${name}.js`).then(async (mod) => {
      panel.replaceChildren(); // a failed init (a 401 before the key was given) left a half tab
      await mod.init(panel);
      return mod;
    });
    loaded.set(name, promise);
    promise.catch((err) => {
      loaded.delete(name);
      if (!(err instanceof ApiError && err.status === 401)) showError(globalError, err);
    });
  }
  return loaded.get(name);
}

async function reloadTab(name) {
  const panel = document.getElementById(`tab-${name}`);
  const mod = await loaded.get(name)?.catch(() => null);
  if (mod && mod.refresh) mod.refresh(panel);
  else if (!mod) loadTab(name);
}

/** Show tab `name` (also from the URL's #fragment: #images opens Images). */
export async function selectTab(name) {
  if (!TABS.includes(name)) name = TABS[0];
  for (const tab of TABS) {
    const panel = document.getElementById(`tab-${tab}`);
    const selected = tab === name;
    panel.hidden = !selected;
    document.querySelector(`nav button[data-tab="${tab}"]`).setAttribute("aria-selected", String(selected));
  }
  const previous = current;
  current = name;
  if (previous && previous !== name) {
    const mod = await loaded.get(previous)?.catch(() => null);
    if (mod && mod.hide) mod.hide(document.getElementById(`tab-${previous}`));
  }
  if (location.hash !== `#${name}`) history.replaceState(null, "", `#${name}`);
  const mod = await loadTab(name).catch(() => null);
  if (mod && mod.show && current === name) mod.show(document.getElementById(`tab-${name}`));
}

document.getElementById("tabs").addEventListener("click", (event) => {
  const button = event.target.closest("button[data-tab]");
  if (button) selectTab(button.dataset.tab);
});
window.addEventListener("hashchange", () => selectTab(location.hash.slice(1)));

/** The pill in the header: /health's status (200: ok; 503: degraded; unreachable). */
async function refreshServer() {
  try {
    const response = await fetch("/health", { headers: authHeaders() });
    const body = await response.json().catch(() => ({}));
    pill.textContent = `server: ${body.status || response.status}`;
    pill.className = `pill ${response.ok ? "ok" : "bad"}`;
  } catch (_) {
    pill.textContent = "server: unreachable";
    pill.className = "pill bad";
  }
}

async function checkKeyNeeded() {
  if (apiKey()) keyForm.hidden = false;
  try {
    await apiFetch("/v1/models");
    if (apiKey()) keyForm.dataset.state = "ok";
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 401)) showError(globalError, err);
  }
}

refreshServer();
setInterval(refreshServer, 10000);
checkKeyNeeded().then(() => selectTab(location.hash.slice(1)));
