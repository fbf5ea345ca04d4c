// The Realtime tab: a spoken conversation over WS /v1/realtime?model=... (docs/realtime.md, the
// GA naming: a browser cannot send the OpenAI-Beta header). The key goes in the
// `openai-insecure-api-key.<key>` subprotocol (wsProtocols), never in the URL.
//
// The microphone is captured by an AudioWorklet (realtime-capture.js) on an AudioContext at the
// session's input rate (24 kHz PCM16 mono) and sent as `input_audio_buffer.append` every 100 ms.
// Turns: server VAD (the server commits and answers when the speaker pauses) or push-to-talk
// (turn_detection null; "Send turn" commits and asks for a response). Answers
// (`response.output_audio.delta`, 24 kHz PCM16) play as they arrive with PcmPlayer; their
// transcript streams beside them.
//
// Barge-in: when the user speaks while an answer plays (`input_audio_buffer.speech_started`, or
// pressing Talk / sending text), playback stops at once (player.stop()), the answer's remaining
// deltas are dropped, the response is cancelled (server VAD cancels it itself, reason
// turn_detected; otherwise `response.cancel`), and once it is done the assistant item is cut to
// what was heard (`conversation.item.truncate` with audio_end_ms), as docs/realtime.md says.
//
// Hooks for tests on [data-testid=rt-status]: data-state (closed, connecting, listening, speaking,
// answering), data-audio-time (exposePlayback), data-speech-started, data-responses,
// data-audio-deltas, data-sent-ms (audio appended), data-barge-ins, data-cut-seconds (queued
// audio dropped by the last barge-in), data-played-at-barge-in, data-ttfp-ms (speech stopped or
// text sent -> first answer sound), data-last-status (the last response.done status).

import { ApiError, el, errorBox, fillModelSelect, fmtSeconds, showError, wsProtocols, wsUrl, apiJson } from "../api.js";
import { exposePlayback, PcmPlayer } from "../audio.js";

const RATE = 24000; // docs/realtime.md: PCM16 mono 24 kHz both ways

let ui = null;
let session = null; // the open conversation (see connect())

export async function init(panel) {
  ui = {
    model: el("select", { "data-testid": "rt-model", onchange: () => fillVoices() }),
    voice: el("select", { "data-testid": "rt-voice" }),
    mode: el("select", { "data-testid": "rt-mode" },
      el("option", { value: "vad" }, "server VAD (hands free)"),
      el("option", { value: "ptt" }, "push to talk")),
    audioOut: el("input", { type: "checkbox", checked: true, "data-testid": "rt-audio-out" }),
    maxTokens: el("input", { type: "number", min: "1", max: "4096", placeholder: "inf", class: "max-tokens", "data-testid": "rt-max-tokens" }),
    instructions: el("input", { type: "text", placeholder: "instructions (optional)", class: "instructions", "data-testid": "rt-instructions" }),
    connect: el("button", { type: "button", "data-testid": "rt-connect", onclick: () => (session ? disconnect() : connect()) }, "Start"),
    talk: el("button", { type: "button", class: "secondary", disabled: true, "data-testid": "rt-talk", onclick: () => toggleTalk() }, "Talk"),
    text: el("input", { type: "text", placeholder: "or type a message", class: "text-in", "data-testid": "rt-text" }),
    textSend: el("button", { type: "submit", class: "secondary", disabled: true, "data-testid": "rt-text-send" }, "Send text"),
    log: el("div", { class: "chat-log", "data-testid": "rt-log" }),
    status: el("div", { class: "figures", "data-testid": "rt-status", "data-state": "closed" }),
    stateText: el("b", { "data-testid": "rt-state" }, "closed"),
    ttfp: el("b", { "data-testid": "rt-ttfp" }, "–"),
    played: el("b", {}, "–"),
    bargeIns: el("b", {}, "0"),
    meter: el("meter", { min: "0", max: "1", value: "0", class: "level", "data-testid": "rt-level" }),
    error: errorBox("rt-error"),
  };
  ui.status.append(
    el("span", {}, "State ", ui.stateText),
    el("span", {}, "Mic ", ui.meter),
    el("span", {}, "TTFP (turn end → sound) ", ui.ttfp),
    el("span", {}, "Answer audio played ", ui.played),
    el("span", {}, "Barge-ins ", ui.bargeIns),
  );
  const textForm = el("form", { class: "row", onsubmit: (e) => { e.preventDefault(); sendText(); } }, ui.text, ui.textSend);
  panel.append(el("div", { class: "card" },
    el("h2", {}, "Realtime"),
    el("p", { class: "muted" }, "WS /v1/realtime: talk from the microphone and hear the answer as it streams. Speak while it answers to interrupt it (barge-in)."),
    el("div", { class: "row" }, el("label", {}, "Model", ui.model), el("label", {}, "Voice", ui.voice),
      el("label", {}, "Turns", ui.mode), el("label", { class: "inline" }, ui.audioOut, "Spoken answers"),
      el("label", {}, "Max output tokens", ui.maxTokens)),
    el("div", { class: "row" }, ui.instructions),
    el("div", { class: "row" }, ui.connect, ui.talk),
    textForm,
    ui.log,
    ui.status,
    ui.error,
  ));
  await refresh();
}

export async function refresh() {
  try {
    await fillModelSelect(ui.model, "/v1/realtime", { preferred: ["omni", "llm_tts"] });
    showError(ui.error, null);
  } catch (err) {
    showError(ui.error, err);
  }
  await fillVoices();
}

export function hide() {
  disconnect();
}

async function fillVoices() {
  const id = ui.model.value;
  if (!id) return;
  try {
    const body = await apiJson(`/v1/audio/voices?model=${encodeURIComponent(id)}`);
    const info = (body.data || []).find((d) => d.model === id) || (body.data || [])[0];
    const voices = info ? [...(info.voices || []), ...(info.custom_voices || [])] : [];
    ui.voice.replaceChildren(...voices.map((v) => el("option", { value: v }, v)));
    if (info && info.default_voice) ui.voice.value = info.default_voice;
  } catch (err) {
    showError(ui.error, err);
  }
}

function setState(name) {
  ui.status.dataset.state = name;
  ui.stateText.textContent = name;
}

function bump(key, by = 1) {
  ui.status.dataset[key] = String((parseInt(ui.status.dataset[key] || "0", 10) || 0) + by);
}

function b64encode(bytes) {
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

function b64decode(b64) {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

function line(role, text = "") {
  const body = el("div", { class: "text" }, text);
  const node = el("div", { class: `msg ${role}`, "data-role": role }, body);
  ui.log.append(node);
  ui.log.scrollTop = ui.log.scrollHeight;
  return { node, body };
}

/** The session.update of the form's settings (GA naming). */
function sessionUpdate() {
  const ptt = ui.mode.value === "ptt";
  const session = {
    type: "realtime",
    output_modalities: ui.audioOut.checked ? ["audio"] : ["text"],
    audio: {
      input: {
        format: { type: "audio/pcm", rate: RATE },
        turn_detection: ptt ? null : { type: "server_vad", create_response: true, interrupt_response: true },
      },
      output: { format: { type: "audio/pcm", rate: RATE } },
    },
  };
  if (ui.voice.value) session.audio.output.voice = ui.voice.value;
  if (ui.instructions.value.trim()) session.instructions = ui.instructions.value.trim();
  const max = parseInt(ui.maxTokens.value, 10);
  if (Number.isFinite(max)) session.max_output_tokens = max;
  return { type: "session.update", session };
}

async function connect() {
  const model = ui.model.value;
  if (!model) return;
  showError(ui.error, null);
  for (const key of Object.keys(ui.status.dataset)) if (key !== "testid") delete ui.status.dataset[key];
  ui.bargeIns.textContent = "0";
  ui.ttfp.textContent = "–";
  ui.log.replaceChildren(); // a new session is a new conversation
  setState("connecting");
  ui.connect.textContent = "Stop";
  const s = {
    ws: null,
    ptt: ui.mode.value === "ptt",
    talking: false, // push-to-talk: appending now
    player: new PcmPlayer({ sampleRate: RATE }),
    unexpose: null,
    mic: null, // {ctx, stream, node}
    responseId: null, // the running response
    dropped: new Set(), // responses whose audio is no longer played (barge-in)
    items: new Map(), // assistant item id -> {body, base (player seconds where its audio starts), audioMs}
    users: new Map(), // user item id -> bubble
    pendingTruncate: null, // {item_id, audio_end_ms} sent after its response is done
    turnEndAt: null, // performance.now() of speech_stopped / commit / text sent
    waitingSound: false,
    sentMs: 0,
    timer: null,
  };
  session = s;
  try {
    await s.player.start(); // inside the click: the browser lets it sound
    s.unexpose = exposePlayback(ui.status, s.player);
    s.timer = setInterval(() => { ui.played.textContent = fmtSeconds(s.player.playedSeconds); }, 200);
    s.ws = new WebSocket(wsUrl(`/v1/realtime?model=${encodeURIComponent(model)}`), wsProtocols("realtime"));
    s.ws.onmessage = (msg) => onEvent(s, JSON.parse(msg.data));
    s.ws.onclose = (ev) => {
      if (session === s) {
        if (ev.code !== 1000 && ev.code !== 1005 && ui.error.hidden) {
          showError(ui.error, new ApiError(0, `The realtime session closed (${ev.code}${ev.reason ? `: ${ev.reason}` : ""})`));
        }
        disconnect();
      }
    };
    await new Promise((resolve, reject) => {
      s.ws.onopen = resolve;
      s.ws.onerror = () => reject(new ApiError(0, "The realtime WebSocket could not be opened"));
    });
    s.ws.onerror = null;
    await startMic(s);
    ui.talk.disabled = !s.ptt;
    ui.textSend.disabled = false;
  } catch (err) {
    showError(ui.error, err);
    if (session === s) disconnect();
  }
}

async function startMic(s) {
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: false, autoGainControl: false },
  });
  const ctx = new AudioContext({ sampleRate: RATE });
  await ctx.audioWorklet.addModule(new URL("./realtime-capture.js", import.meta.url));
  const source = ctx.createMediaStreamSource(stream);
  const node = new AudioWorkletNode(ctx, "pcm16-capture", { processorOptions: { blockFrames: RATE / 10 } });
  node.port.onmessage = (msg) => onMicBlock(s, new Int16Array(msg.data));
  source.connect(node);
  node.connect(ctx.destination); // pulls the graph; the worklet outputs silence
  if (ctx.state === "suspended") await ctx.resume();
  s.mic = { ctx, stream, node };
}

function onMicBlock(s, samples) {
  let peak = 0;
  for (let i = 0; i < samples.length; i += 8) peak = Math.max(peak, Math.abs(samples[i]));
  ui.meter.value = peak / 32768;
  if (session !== s || !s.ws || s.ws.readyState !== WebSocket.OPEN) return;
  if (s.ptt && !s.talking) return;
  s.ws.send(JSON.stringify({ type: "input_audio_buffer.append", audio: b64encode(new Uint8Array(samples.buffer)) }));
  s.sentMs += (samples.length / RATE) * 1000;
  ui.status.dataset.sentMs = s.sentMs.toFixed(0);
}

function send(s, event) {
  if (s.ws && s.ws.readyState === WebSocket.OPEN) s.ws.send(JSON.stringify(event));
}

/** Stop what plays now (barge-in): silence, drop the answer's remaining audio, cancel it if it runs. */
function bargeIn(s, { cancel }) {
  const queued = s.player.bufferedSeconds;
  if (queued <= 0 && !s.responseId) return false;
  const played = s.player.playedSeconds;
  s.player.stop();
  bump("bargeIns");
  ui.bargeIns.textContent = ui.status.dataset.bargeIns;
  ui.status.dataset.cutSeconds = queued.toFixed(3);
  ui.status.dataset.playedAtBargeIn = played.toFixed(3);
  // cut the answer being heard to what was heard
  for (const [id, item] of s.items) {
    if (item.heardDone) continue;
    item.heardDone = true;
    const heardMs = Math.max(0, Math.round((played - item.base) * 1000));
    if (item.audioMs > heardMs) {
      item.node.classList.add("interrupted");
      s.pendingTruncate = { type: "conversation.item.truncate", item_id: id, content_index: 0, audio_end_ms: heardMs };
    }
  }
  if (s.responseId) {
    s.dropped.add(s.responseId);
    if (cancel) send(s, { type: "response.cancel" });
  } else if (s.pendingTruncate) {
    send(s, s.pendingTruncate);
    s.pendingTruncate = null;
  }
  return true;
}

function toggleTalk() {
  const s = session;
  if (!s || !s.ptt) return;
  if (!s.talking) {
    bargeIn(s, { cancel: true });
    send(s, { type: "input_audio_buffer.clear" });
    s.talking = true;
    ui.talk.textContent = "Send turn";
    setState("speaking");
  } else {
    s.talking = false;
    ui.talk.textContent = "Talk";
    send(s, { type: "input_audio_buffer.commit" });
    send(s, { type: "response.create" });
    s.turnEndAt = performance.now();
    s.waitingSound = true;
    setState("listening");
  }
}

function sendText() {
  const s = session;
  const text = ui.text.value.trim();
  if (!s || !text) return;
  ui.text.value = "";
  bargeIn(s, { cancel: true });
  send(s, { type: "conversation.item.create", item: { type: "message", role: "user", content: [{ type: "input_text", text }] } });
  send(s, { type: "response.create" });
  s.turnEndAt = performance.now();
  s.waitingSound = true;
}

function assistantItem(s, id) {
  if (!s.items.has(id)) {
    const { node, body } = line("assistant");
    body.dataset.testid = "rt-answer";
    s.items.set(id, { node, body, base: null, audioMs: 0, heardDone: false });
  }
  return s.items.get(id);
}

function onEvent(s, ev) {
  if (session !== s) return;
  switch (ev.type) {
    case "session.created":
      send(s, sessionUpdate());
      setState(s.ptt ? "ready" : "listening");
      break;
    case "input_audio_buffer.speech_started":
      bump("speechStarted");
      setState("speaking");
      // server VAD cancels the running response itself (interrupt_response): no response.cancel
      bargeIn(s, { cancel: false });
      break;
    case "input_audio_buffer.speech_stopped":
      s.turnEndAt = performance.now();
      s.waitingSound = true;
      setState("listening");
      break;
    case "conversation.item.created":
    case "conversation.item.added": {
      const item = ev.item || {};
      if (item.role === "user" && !s.users.has(item.id)) {
        const parts = item.content || [];
        const text = parts.map((p) => p.text || p.transcript || "").join(" ").trim();
        const audio = parts.some((p) => p.type === "input_audio");
        const bubble = line("user", text || (audio ? "(you spoke)" : ""));
        s.users.set(item.id, bubble);
      }
      break;
    }
    case "conversation.item.input_audio_transcription.completed": {
      const bubble = s.users.get(ev.item_id);
      if (bubble) bubble.body.textContent = `(you said) ${ev.transcript || "(no words)"}`;
      break;
    }
    case "conversation.item.input_audio_transcription.failed": {
      const bubble = s.users.get(ev.item_id);
      const e = ev.error || {};
      if (bubble) bubble.body.textContent = `(you spoke; transcription failed: ${e.code || e.message || "error"})`;
      break;
    }
    case "response.created":
      s.responseId = ev.response.id;
      bump("responses");
      setState("answering");
      break;
    case "response.output_audio.delta":
    case "response.audio.delta": {
      if (s.dropped.has(ev.response_id)) break;
      const item = assistantItem(s, ev.item_id);
      const bytes = b64decode(ev.delta);
      if (item.base === null) item.base = s.player.playedSeconds + s.player.bufferedSeconds;
      item.audioMs += (bytes.length / 2 / RATE) * 1000;
      s.player.pushPcm16(bytes);
      bump("audioDeltas");
      if (s.waitingSound && s.turnEndAt !== null && s.player.firstSoundMs !== null) {
        // the sound of this answer starts when its first chunk is scheduled
        const startsAt = performance.now() + Math.max(0, item.base - s.player.playedSeconds) * 1000;
        const ms = Math.max(0, startsAt - s.turnEndAt);
        ui.status.dataset.ttfpMs = ms.toFixed(1);
        ui.ttfp.textContent = fmtSeconds(ms / 1000);
        s.waitingSound = false;
      }
      break;
    }
    case "response.output_audio_transcript.delta":
    case "response.audio_transcript.delta":
    case "response.output_text.delta":
    case "response.text.delta": {
      if (s.dropped.has(ev.response_id)) break;
      const item = assistantItem(s, ev.item_id);
      item.body.textContent += ev.delta;
      ui.log.scrollTop = ui.log.scrollHeight;
      break;
    }
    case "response.done": {
      const r = ev.response || {};
      ui.status.dataset.lastStatus = r.status;
      if (s.responseId === r.id) s.responseId = null;
      const outputs = r.output || [];
      for (const o of outputs) {
        const item = s.items.get(o.id);
        if (item && r.status === "cancelled") item.node.classList.add("interrupted");
      }
      if (r.status === "failed" && r.status_details && r.status_details.error) {
        const e = r.status_details.error;
        showError(ui.error, new ApiError(0, e.message || "the response failed", e));
      }
      if (s.pendingTruncate) {
        send(s, s.pendingTruncate);
        s.pendingTruncate = null;
      }
      if (ui.status.dataset.state === "answering") setState(s.ptt ? "ready" : "listening");
      break;
    }
    case "error": {
      const e = ev.error || {};
      showError(ui.error, new ApiError(0, e.message || "error", e));
      break;
    }
    default:
      break;
  }
}

function disconnect() {
  const s = session;
  session = null;
  ui.connect.textContent = "Start";
  ui.talk.disabled = true;
  ui.talk.textContent = "Talk";
  ui.textSend.disabled = true;
  ui.meter.value = 0;
  if (!s) return;
  setState("closed");
  if (s.ws && s.ws.readyState <= WebSocket.OPEN) s.ws.close(1000);
  if (s.mic) {
    s.mic.stream.getTracks().forEach((t) => t.stop());
    s.mic.ctx.close();
  }
  if (s.timer) clearInterval(s.timer);
  if (s.unexpose) s.unexpose();
  s.player.close();
}
