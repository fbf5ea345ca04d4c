// The playground's one way to reach the API: the same routes, limits and key as any client.
//
// The API key lives in sessionStorage (this browser tab only, gone when it closes), is sent as
// "Authorization: Bearer <key>" (on a WebSocket: the "openai-insecure-api-key.<key>" subprotocol)
// and never goes into a URL. Every non-2xx answer becomes an ApiError carrying the API's own
// error object ({"error": {"message", "type", "param", "code"}}), shown as is.

const KEY_STORAGE = "omni-triton.api-key";

/** The key of this tab ("" when none). */
export function apiKey() {
  return sessionStorage.getItem(KEY_STORAGE) || "";
}

/** Keep `key` for this tab (an empty key forgets it). */
export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY_STORAGE, key);
  else sessionStorage.removeItem(KEY_STORAGE);
  listeners.forEach((fn) => fn(key));
}

const listeners = [];
/** Call `fn(key)` whenever the key changes. */
export function onApiKeyChange(fn) {
  listeners.push(fn);
}

/** An API error: `status` (HTTP), `message`, `code`, `param`, `type` from the API's error body. */
export class ApiError extends Error {
  constructor(status, message, { code = null, param = null, type = null } = {}) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
    this.param = param;
    this.type = type;
  }
}

/** The ApiError of a failed `response` (its OpenAI-shaped body, else its status text). */
export async function errorOf(response) {
  let text = "";
  try {
    text = await response.text();
    const body = JSON.parse(text);
    const e = body && body.error ? body.error : body;
    if (e && typeof e.message === "string") {
      return new ApiError(response.status, e.message, e);
    }
    if (body && body.detail) return new ApiError(response.status, JSON.stringify(body.detail));
  } catch (_) {
    /* not JSON */
  }
  return new ApiError(response.status, text.slice(0, 500) || `${response.status} ${response.statusText}`);
}

/** The tab's key as request headers ({} without one): for the plain fetch() calls that must read
 * a non-2xx body themselves (/health answers 503 with its detail). */
export function authHeaders() {
  const key = apiKey();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

/**
 * fetch() on this server with the tab's key. `json` (an object) or `form` (a FormData) or `body`
 * is sent; the Response is returned when it is 2xx, else its ApiError is thrown (a 401 also asks
 * for a key: see main.js).
 */
export async function apiFetch(path, { method, json, form, body, headers = {}, signal } = {}) {
  const init = { method: method || (json || form || body ? "POST" : "GET"), headers: { ...authHeaders(), ...headers }, signal };
  if (json !== undefined) {
    init.body = JSON.stringify(json);
    init.headers["Content-Type"] = "application/json";
  } else if (form !== undefined) {
    init.body = form;
  } else if (body !== undefined) {
    init.body = body;
  }
  const stopWatch = watchLoad(json && typeof json.model === "string" ? json.model
    : form instanceof FormData && typeof form.get("model") === "string" ? form.get("model") : null);
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    stopWatch();
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, `The server could not be reached (${err.message})`);
  }
  if (!response.ok) {
    stopWatch();
    const error = await errorOf(response);
    if (response.status === 401) unauthorizedHandlers.forEach((fn) => fn(error));
    throw error;
  }
  return response;
}

/** apiFetch + the JSON body. */
export async function apiJson(path, options) {
  const response = await apiFetch(path, options);
  return response.json();
}

const unauthorizedHandlers = [];
/** Call `fn(error)` on every 401 (main.js shows the key field). */
export function onUnauthorized(fn) {
  unauthorizedHandlers.push(fn);
}

/**
 * The server-sent events of a streamed `response`, as {event, data} objects (data: the joined
 * `data:` lines, a string), following the HTML event-stream format (LF, CR or CRLF line ends).
 */
export async function* sseEvents(response, signal) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let data = [];
  let event = "message";
  try {
    for (;;) {
      if (signal && signal.aborted) return;
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let match;
      while ((match = /\r\n|\r|\n/.exec(buffer)) !== null) {
        // a lone CR at the buffer's end may be half of a CRLF: wait for the next bytes
        if (match[0] === "\r" && match.index === buffer.length - 1) break;
        const line = buffer.slice(0, match.index);
        buffer = buffer.slice(match.index + match[0].length);
        if (line === "") {
          if (data.length) yield { event, data: data.join("\n") };
          data = [];
          event = "message";
        } else if (line.startsWith(":")) {
          continue; // comment (keep-alive)
        } else {
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let value = colon < 0 ? "" : line.slice(colon + 1);
          if (value.startsWith(" ")) value = value.slice(1);
          if (field === "data") data.push(value);
          else if (field === "event") event = value;
        }
      }
    }
    if (data.length) yield { event, data: data.join("\n") };
  } finally {
    reader.releaseLock();
  }
}

/** The WebSocket subprotocols carrying the tab's key (browsers cannot set headers on a WebSocket). */
export function wsProtocols(...others) {
  const key = apiKey();
  if (key && !WS_TOKEN.test(key)) {
    // the browser would refuse the subprotocol, quoting it (the key) in its error: say why instead
    throw new ApiError(0, "This API key holds characters a browser cannot send on a WebSocket " +
      "(a subprotocol is an RFC 7230 token: no / = , ; : spaces or quotes), so the browser cannot " +
      "authenticate here; serve with a key of letters, digits and - _ . ~ (docs/playground.md)", { code: "api_key_not_a_token" });
  }
  return key ? [...others, `openai-insecure-api-key.${key}`] : others;
}

/** RFC 7230 token characters: what a WebSocket subprotocol (RFC 6455) may hold. */
const WS_TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

/** ws(s):// URL of a path on this server. */
export function wsUrl(path) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}${path}`;
}

/**
 * While a request to an on-demand model that is not loaded yet is in flight, tell the page
 * (window event "model-load": detail {model, state: "loading" | "loaded" | "failed" | "gone"}):
 * its first request loads it (seconds to a minute). /v1/models is asked every 2 s until the
 * model is loaded or failed; the returned function ends the watch (the request failed).
 */
function watchLoad(model) {
  const card = model && cachedModels ? cachedModels.find((m) => m.id === model) : null;
  if (!card || !card.state || card.state === "loaded") return () => {};
  let done = false;
  let timer = null;
  const emit = (state) => window.dispatchEvent(new CustomEvent("model-load", { detail: { model, state } }));
  const finish = (state) => {
    if (done) return;
    done = true;
    clearTimeout(timer);
    emit(state);
  };
  const tick = async () => {
    if (done) return;
    emit("loading");
    try {
      const now = (await listModels(true)).find((m) => m.id === model);
      if (now && (now.state === "loaded" || now.state === "failed")) return finish(now.state);
    } catch (_) {
      /* keep watching */
    }
    if (!done) timer = setTimeout(tick, 2000);
  };
  timer = setTimeout(tick, 500);
  return () => finish("gone");
}

let cachedModels = null; // the last /v1/models answer (what watchLoad reads)
let modelsPromise = null;
/** GET /v1/models (cached; `refresh` asks again). Each card has `endpoints` (the routes that take it). */
export function listModels(refresh = false) {
  if (refresh || !modelsPromise) {
    modelsPromise = apiJson("/v1/models").then((body) => (cachedModels = body.data || []));
    modelsPromise.catch(() => {
      modelsPromise = null;
    });
  }
  return modelsPromise;
}

/** The served models that `endpoint` (e.g. "/v1/audio/speech") takes, optionally filtered by `accept(card)`. */
export async function modelsFor(endpoint, accept = () => true) {
  const models = await listModels();
  return models.filter((m) => (m.endpoints || []).includes(endpoint) && accept(m));
}

/**
 * Fill `select` with the models `endpoint` takes (state shown: an on-demand model loads on its
 * first request), keeping the current choice when still listed; `preferred` ids come first.
 */
export async function fillModelSelect(select, endpoint, { accept, preferred = [] } = {}) {
  const models = await modelsFor(endpoint, accept);
  const keep = select.value;
  models.sort((a, b) => rank(a.id, preferred) - rank(b.id, preferred) || a.id.localeCompare(b.id));
  select.replaceChildren(
    ...models.map((m) => el("option", { value: m.id }, m.state && m.state !== "loaded" ? `${m.id} (${m.state})` : m.id)),
  );
  if (models.some((m) => m.id === keep)) select.value = keep;
  if (!models.length) select.append(el("option", { value: "", disabled: true }, "(no model served for this API)"));
  return models;
}

function rank(id, preferred) {
  const i = preferred.indexOf(id);
  return i < 0 ? preferred.length : i;
}

/**
 * Show `err` in the `.error` element `box` (the API's message as is; null/undefined hides the box).
 * Returns the text shown.
 */
export function showError(box, err) {
  if (!err) {
    box.hidden = true;
    box.textContent = "";
    return "";
  }
  let text = err.message || String(err);
  if (err instanceof ApiError) {
    const extra = [err.status ? `HTTP ${err.status}` : "", err.code, err.param ? `param: ${err.param}` : ""].filter(Boolean);
    if (extra.length) text += `  (${extra.join(", ")})`;
  }
  box.textContent = text;
  box.hidden = false;
  return text;
}

/** document.createElement with attributes (`on*` functions become listeners) and children. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") node.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(node.dataset, value);
    else if (value === true) node.setAttribute(name, "");
    else node.setAttribute(name, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** A fresh hidden `.error` box (role=alert) for a card. */
export function errorBox(testid) {
  return el("div", { class: "error", role: "alert", hidden: true, "data-testid": testid });
}

/** Seconds with `digits` decimals, or "–". */
export function fmtSeconds(s, digits = 2) {
  return Number.isFinite(s) ? `${s.toFixed(digits)} s` : "–";
}
