// The Chat tab: a conversation with any chat model (POST /v1/chat/completions, stream: true).
// Text appears as the server-sent events arrive; with a model that speaks (its card's
// `modalities` include "audio": llm_tts, omni) the spoken answer is asked for as `pcm16` deltas
// (int16 LE mono at the model's rate, from GET /v1/audio/voices?model=) and played as it streams
// by PcmPlayer. An image or audio file can be attached (`image_url` / `input_audio` data URL
// parts); a model that does not take them refuses, and its error is shown as is.
//
// Hooks for tests: #chat-status (data-testid chat-status) carries data-stream-done,
// data-audio-time / data-first-sound-ms (exposePlayback), data-audio-at-done (seconds played when
// the stream ended: > 0 only if playback started while streaming), data-ttft-ms, data-ttfp-ms,
// data-done-ms, data-audio-bytes, data-text-chunks, data-prompt-tokens (usage: an attachment
// that reached the model raises it).

import { apiFetch, apiJson, el, errorBox, fillModelSelect, fmtSeconds, listModels, showError, sseEvents } from "../api.js";
import { exposePlayback, PcmPlayer } from "../audio.js";

const state = {
  messages: [], // the conversation sent with each request (OpenAI chat messages)
  attachments: [], // {kind: "image"|"audio", name, part}
  abort: null,
  player: null,
  unexpose: null,
  voiceInfo: new Map(), // model id -> {voices, default_voice, sample_rate} (GET /v1/audio/voices)
};

let ui = null;

export async function init(panel) {
  ui = {
    model: el("select", { "data-testid": "chat-model", onchange: () => onModelChange() }),
    speak: el("input", { type: "checkbox", checked: true, "data-testid": "chat-speak" }),
    voice: el("select", { "data-testid": "chat-voice" }),
    maxTokens: el("input", { type: "number", min: "1", placeholder: "model default", "data-testid": "chat-max-tokens", class: "max-tokens" }),
    log: el("div", { class: "chat-log", "data-testid": "chat-log" }),
    input: el("textarea", { placeholder: "Say something…", "data-testid": "chat-input" }),
    file: el("input", { type: "file", accept: "image/*,audio/*", "data-testid": "chat-attach", onchange: (e) => attach(e.target) }),
    chips: el("div", { class: "chips", "data-testid": "chat-attachments" }),
    send: el("button", { type: "submit", "data-testid": "chat-send" }, "Send"),
    stop: el("button", { type: "button", class: "secondary", disabled: true, "data-testid": "chat-stop", onclick: () => stop() }, "Stop"),
    clear: el("button", { type: "button", class: "secondary", "data-testid": "chat-clear", onclick: () => clearConversation() }, "New conversation"),
    status: el("div", { class: "figures", "data-testid": "chat-status" }),
    ttft: el("b", { "data-testid": "chat-ttft" }, "–"),
    ttfp: el("b", { "data-testid": "chat-ttfp" }, "–"),
    played: el("b", { "data-testid": "chat-played" }, "–"),
    tokens: el("b", { "data-testid": "chat-tokens" }, "–"),
    error: errorBox("chat-error"),
  };
  ui.speakRow = el("span", { class: "speak-row" },
    el("label", { class: "inline" }, ui.speak, "Speak the answer"),
    el("label", {}, "Voice", ui.voice));
  ui.status.append(
    el("span", {}, "TTFT ", ui.ttft),
    el("span", {}, "TTFP (spoken) ", ui.ttfp),
    el("span", {}, "Audio played ", ui.played),
    el("span", {}, "Tokens ", ui.tokens),
  );
  const form = el("form", { class: "card", onsubmit: (e) => { e.preventDefault(); send(); } },
    el("h2", {}, "Chat"),
    el("p", { class: "muted" }, "POST /v1/chat/completions, streamed (SSE). Models that speak answer aloud as the text streams."),
    el("div", { class: "row" }, el("label", {}, "Model", ui.model), ui.speakRow, el("label", {}, "Max tokens", ui.maxTokens), ui.clear),
    ui.log,
    ui.input,
    el("div", { class: "row" }, el("label", {}, "Attach an image or audio file", ui.file), ui.chips),
    el("div", { class: "row" }, ui.send, ui.stop),
    ui.status,
    ui.error,
  );
  panel.append(form);
  ui.input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      send();
    }
  });
  await refresh();
}

export async function refresh() {
  try {
    await fillModelSelect(ui.model, "/v1/chat/completions", { preferred: ["llm_tts", "omni", "llm"] });
    showError(ui.error, null);
  } catch (err) {
    showError(ui.error, err);
  }
  await onModelChange();
}

export function hide() {
  stop();
}

async function cardOf(id) {
  const models = await listModels();
  return models.find((m) => m.id === id) || null;
}

/** Whether the model answers with speech (its card's output modalities). */
async function speaks(id) {
  const card = await cardOf(id);
  return Boolean(card && (card.modalities || []).includes("audio"));
}

/** The model's voices and sample rate (GET /v1/audio/voices?model=), cached. */
async function voiceInfo(id) {
  if (!state.voiceInfo.has(id)) {
    const body = await apiJson(`/v1/audio/voices?model=${encodeURIComponent(id)}`);
    const entry = (body.data || []).find((d) => d.model === id) || (body.data || [])[0];
    if (!entry) throw new Error(`GET /v1/audio/voices lists no voices for ${id}`);
    state.voiceInfo.set(id, entry);
  }
  return state.voiceInfo.get(id);
}

async function onModelChange() {
  const id = ui.model.value;
  const speaking = id ? await speaks(id).catch(() => false) : false;
  ui.speakRow.hidden = !speaking;
  if (!speaking) return;
  try {
    const info = await voiceInfo(id);
    const keep = ui.voice.value;
    const voices = [...(info.voices || []), ...(info.custom_voices || [])];
    ui.voice.replaceChildren(...voices.map((v) => el("option", { value: v }, v)));
    ui.voice.value = voices.includes(keep) ? keep : info.default_voice || voices[0] || "";
  } catch (err) {
    showError(ui.error, err);
  }
}

function readDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

/** An attached file -> a content part: images as `image_url`, audio as `input_audio` (base64 + format). */
async function attach(input) {
  const files = [...input.files];
  input.value = "";
  for (const file of files) {
    const url = await readDataUrl(file);
    let item;
    if (file.type.startsWith("audio/")) {
      const sub = file.type.split("/")[1] || "";
      const format = { mpeg: "mp3", "x-wav": "wav", wave: "wav", "vnd.wave": "wav" }[sub] || sub || file.name.split(".").pop();
      item = { kind: "audio", name: file.name, part: { type: "input_audio", input_audio: { data: url.slice(url.indexOf(",") + 1), format } } };
    } else {
      item = { kind: "image", name: file.name, part: { type: "image_url", image_url: { url } } };
    }
    state.attachments.push(item);
  }
  renderChips();
}

function renderChips() {
  ui.chips.replaceChildren(...state.attachments.map((a, i) =>
    el("span", { class: "chip", "data-kind": a.kind }, `${a.kind}: ${a.name}`,
      el("button", { type: "button", class: "secondary", title: "remove", onclick: () => { state.attachments.splice(i, 1); renderChips(); } }, "×"))));
}

function bubble(role, text = "") {
  const body = el("div", { class: "text" }, text);
  const node = el("div", { class: `msg ${role}`, "data-role": role }, body);
  ui.log.append(node);
  ui.log.scrollTop = ui.log.scrollHeight;
  return { node, body };
}

function clearConversation() {
  stop();
  state.messages = [];
  state.attachments = [];
  renderChips();
  ui.log.replaceChildren();
  showError(ui.error, null);
}

function stop() {
  if (state.abort) state.abort.abort();
  state.abort = null;
  if (state.player) state.player.stop();
}

function b64bytes(b64) {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

async function send() {
  const text = ui.input.value.trim();
  const model = ui.model.value;
  if (!model || (!text && !state.attachments.length) || state.abort) return;
  showError(ui.error, null);
  const speaking = !ui.speakRow.hidden && ui.speak.checked;

  // the player starts inside the click (a user gesture lets it sound)
  if (state.unexpose) state.unexpose();
  state.unexpose = null;
  if (state.player) state.player.close();
  state.player = null;
  let info = null;
  if (speaking) {
    try {
      info = await voiceInfo(model);
    } catch (err) {
      showError(ui.error, err);
      return;
    }
    state.player = new PcmPlayer({ sampleRate: info.sample_rate || 24000 });
    await state.player.start();
  }

  const content = state.attachments.length
    ? [...(text ? [{ type: "text", text }] : []), ...state.attachments.map((a) => a.part)]
    : text;
  const userMessage = { role: "user", content };
  const userBubble = bubble("user", text);
  for (const a of state.attachments) userBubble.node.append(el("div", { class: "muted" }, `${a.kind}: ${a.name}`));
  const answer = bubble("assistant");
  answer.body.dataset.testid = "chat-answer";
  const sentAttachments = state.attachments;
  state.attachments = [];
  renderChips();
  ui.input.value = "";

  const body = { model, messages: [...state.messages, userMessage], stream: true, stream_options: { include_usage: true } };
  if (speaking) {
    body.modalities = ["text", "audio"];
    body.audio = { voice: ui.voice.value || info.default_voice, format: "pcm16" };
  } else {
    body.modalities = ["text"];
  }
  const max = parseInt(ui.maxTokens.value, 10);
  if (Number.isFinite(max)) body.max_tokens = max;

  const status = ui.status;
  status.dataset.streamDone = "false";
  for (const key of ["ttftMs", "ttfpMs", "doneMs", "audioAtDone", "audioBytes", "textChunks", "promptTokens"]) delete status.dataset[key];
  ui.ttft.textContent = "–";
  ui.ttfp.textContent = speaking ? "…" : "–";
  ui.played.textContent = "–";
  ui.tokens.textContent = "–";
  if (state.player) state.unexpose = exposePlayback(status, state.player);
  const player = state.player;
  const playedTimer = player ? setInterval(() => { ui.played.textContent = fmtSeconds(player.playedSeconds); }, 200) : null;

  const abort = new AbortController();
  state.abort = abort;
  ui.send.disabled = true;
  ui.stop.disabled = false;
  const t0 = performance.now();
  let reply = "";
  let audioBytes = 0;
  let textChunks = 0;
  let ok = false;
  try {
    const response = await apiFetch("/v1/chat/completions", { json: body, signal: abort.signal });
    for await (const ev of sseEvents(response, abort.signal)) {
      if (ev.data === "[DONE]") break;
      const chunk = JSON.parse(ev.data);
      if (chunk.error) throw Object.assign(new Error(chunk.error.message), chunk.error);
      if (chunk.usage) {
        ui.tokens.textContent = `${chunk.usage.prompt_tokens} in, ${chunk.usage.completion_tokens} out`;
        status.dataset.promptTokens = String(chunk.usage.prompt_tokens);
      }
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (!delta) continue;
      if (delta.content) {
        if (!reply) {
          status.dataset.ttftMs = (performance.now() - t0).toFixed(1);
          ui.ttft.textContent = fmtSeconds((performance.now() - t0) / 1000);
        }
        reply += delta.content;
        textChunks += 1;
        answer.body.textContent = reply;
        ui.log.scrollTop = ui.log.scrollHeight;
      }
      if (delta.audio && delta.audio.data && player) {
        const bytes = b64bytes(delta.audio.data);
        audioBytes += bytes.length;
        player.pushPcm16(bytes);
        if (player.firstSoundMs !== null && !status.dataset.ttfpMs) {
          status.dataset.ttfpMs = (player.firstSoundMs - t0).toFixed(1);
          ui.ttfp.textContent = fmtSeconds((player.firstSoundMs - t0) / 1000);
        }
      }
      if (delta.audio && delta.audio.transcript && !reply) {
        reply = delta.audio.transcript;
        answer.body.textContent = reply;
      }
    }
    ok = true;
  } catch (err) {
    if (err.name !== "AbortError") showError(ui.error, err);
    else answer.node.append(el("div", { class: "muted" }, "(stopped)"));
  } finally {
    status.dataset.doneMs = (performance.now() - t0).toFixed(1);
    status.dataset.audioBytes = String(audioBytes);
    status.dataset.textChunks = String(textChunks);
    if (player) status.dataset.audioAtDone = player.playedSeconds.toFixed(3);
    status.dataset.streamDone = "true";
    if (state.abort === abort) state.abort = null;
    ui.send.disabled = false;
    ui.stop.disabled = true;
    if (playedTimer !== null) setTimeout(() => clearInterval(playedTimer), Math.max(0, player.bufferedSeconds * 1000) + 500);
  }
  if (ok) {
    state.messages.push(userMessage, { role: "assistant", content: reply });
  } else if (!reply) {
    answer.node.remove();
    state.attachments = sentAttachments; // keep them for another try
    renderChips();
    if (!ui.input.value) ui.input.value = text; // and the words (the trial lost them on a 413)
  }
}
