// The Speech tab: pick a speech model and a voice (the model's own and the stored custom voices),
// type text, hear it while it streams.
//
// Play is one `POST /v1/audio/speech` with `stream: true, response_format: "wav"`: the server
// sends a WAV header (placeholder sizes) and then 16-bit PCM as the stages make it. The header
// gives the format (`wavFormat`), the PCM after it is played as it arrives (`PcmPlayer`), and all
// bytes are kept for a "Download WAV" link (the header's sizes filled in). Stop aborts the fetch
// (the server then cancels the Triton stream) and silences the player.
//
// `SpeechRun` (the player card: Play/Stop, figures, status, download) is exported for the Voices
// tab's "Speak".

import { ApiError, apiFetch, apiJson, el, errorBox, fillModelSelect, fmtSeconds, showError } from "../api.js";
import { exposePlayback, PcmPlayer, wavFormat } from "../audio.js";

const ENDPOINT = "/v1/audio/speech";

/** GET /v1/audio/voices: {byModel: Map(model -> its entry), uploaded: Map(id -> audio.voice)}. */
export async function loadVoices() {
  const body = await apiJson("/v1/audio/voices");
  const byModel = new Map((body.data || []).map((entry) => [entry.model, entry]));
  const uploaded = new Map((body.uploaded_voices || []).map((v) => [v.id, v]));
  return { byModel, uploaded, storeError: body.voice_store_error || null };
}

/**
 * Fill `select` with the voices `model` takes: its own voices, then the stored custom voices
 * usable on it (`custom_voices`; the option's value is the voice id). Keeps the current choice
 * when still listed; `prefer` (a value) is chosen when given and listed.
 */
export function fillVoiceSelect(select, voices, model, { builtIn = true, prefer = null } = {}) {
  const entry = voices.byModel.get(model);
  const keep = prefer || select.value;
  const groups = [];
  if (entry && builtIn && entry.voices && entry.voices.length) {
    const own = entry.voices.map((v) => el("option", { value: v }, v === entry.default_voice ? `${v} (default)` : v));
    groups.push(el("optgroup", { label: "Model voices" }, own));
  }
  const custom = ((entry && entry.custom_voices) || []).map((id) => {
    const v = voices.uploaded.get(id);
    const label = v ? `${v.name} (${v.type === "prompt" ? "designed" : "cloned"})` : id;
    return el("option", { value: id }, label);
  });
  if (custom.length) groups.push(el("optgroup", { label: "Custom voices" }, custom));
  select.replaceChildren(...groups);
  if (!groups.length) select.append(el("option", { value: "", disabled: true }, "(no voice for this model)"));
  const values = [...select.querySelectorAll("option:not([disabled])")].map((o) => o.value);
  if (values.includes(keep)) select.value = keep;
  else if (entry && builtIn && values.includes(entry.default_voice)) select.value = entry.default_voice;
}

/** The bytes of a complete WAV file from a streamed one: `header` (up to the PCM) with its sizes set. */
function wavFile(header, dataOffset, pcmChunks, pcmBytes, frameBytes) {
  const usable = pcmBytes - (pcmBytes % frameBytes); // an aborted stream may end mid-frame
  const head = header.slice(0, dataOffset);
  const view = new DataView(head.buffer, head.byteOffset, head.length);
  view.setUint32(4, dataOffset - 8 + usable, true); // RIFF size
  view.setUint32(dataOffset - 4, usable, true); // data size
  const parts = [head];
  let left = usable;
  for (const chunk of pcmChunks) {
    if (left <= 0) break;
    parts.push(chunk.length <= left ? chunk : chunk.subarray(0, left));
    left -= chunk.length;
  }
  return new Blob(parts, { type: "audio/wav" });
}

/**
 * A speech player card: status line, figures (TTFP, first byte, audio seconds, RTF), Stop and a
 * Download WAV link. `play(body)` streams one request; `stop()` aborts it. `prefix` prefixes the
 * data-testids (`<prefix>-status`, `-ttfp`, `-ttfb`, `-audio-seconds`, `-rtf`, `-download`, `-error`).
 *
 * The status element carries the state for tests and people: data-state (idle, requesting,
 * streaming, playing = stream complete and still sounding, done = played out, stopped, error), data-stream-done ("true" once the last byte arrived),
 * data-audio-time / data-first-sound-ms (exposePlayback), data-sample-rate, data-audio-seconds.
 */
export class SpeechRun {
  constructor(prefix) {
    this.prefix = prefix;
    const id = (name) => `${prefix}-${name}`;
    this.status = el("div", { class: "speech-status muted", "data-testid": id("status"), dataset: { state: "idle", streamDone: "false", audioTime: "0.000" } }, "Ready.");
    this.fig = {
      ttfp: el("b", { "data-testid": id("ttfp") }, "–"),
      ttfb: el("b", { "data-testid": id("ttfb") }, "–"),
      seconds: el("b", { "data-testid": id("audio-seconds") }, "–"),
      rtf: el("b", { "data-testid": id("rtf") }, "–"),
    };
    this.download = el("a", { class: "speech-download", "data-testid": id("download"), hidden: true }, "Download WAV");
    this.error = errorBox(id("error"));
    this.node = el(
      "div",
      { class: "speech-run" },
      this.status,
      el(
        "div",
        { class: "figures" },
        el("span", { title: "request start to first sound (time to first packet, as heard)" }, "TTFP ", this.fig.ttfp),
        el("span", { title: "request start to the first byte of audio" }, "first byte ", this.fig.ttfb),
        el("span", { title: "seconds of audio received" }, "audio ", this.fig.seconds),
        el("span", { title: "real-time factor: generation time / audio seconds (below 1: faster than real time)" }, "RTF ", this.fig.rtf),
      ),
      this.download,
      this.error,
    );
    this.controller = null;
    this.player = null;
    this.unexpose = null;
    this.ticker = null;
    this.url = null;
    this.onstate = () => {};
  }

  setState(state, text) {
    this.status.dataset.state = state;
    if (text !== undefined) this.status.textContent = text;
    this.onstate(state);
  }

  /** Silence and release the previous run's player. */
  release() {
    if (this.controller) this.controller.abort();
    this.controller = null;
    if (this.ticker) clearInterval(this.ticker);
    this.ticker = null;
    if (this.unexpose) this.unexpose();
    this.unexpose = null;
    if (this.player) this.player.close().catch(() => {});
    this.player = null;
  }

  /** Abort the stream and silence the audio (what arrived stays downloadable). */
  stop() {
    const running = this.controller !== null;
    if (this.controller) this.controller.abort();
    if (this.player) this.player.stop();
    // data-audio-time now (exposePlayback goes on: it shows the player's clock, silent from here)
    if (this.player) this.status.dataset.audioTime = this.player.playedSeconds.toFixed(3);
    if (running) this.setState("stopped", `Stopped after ${fmtSeconds(this.player ? this.player.playedSeconds : 0)} of audio.`);
  }

  get busy() {
    return this.controller !== null;
  }

  /** Stream `body` (a speech request; stream/response_format are set here) and play it. */
  async play(body) {
    this.release();
    showError(this.error, null);
    for (const f of Object.values(this.fig)) f.textContent = "–";
    this.download.hidden = true;
    if (this.url) URL.revokeObjectURL(this.url);
    this.url = null;
    Object.assign(this.status.dataset, { streamDone: "false", audioTime: "0.000", audioSeconds: "0" });
    delete this.status.dataset.firstSoundMs;
    delete this.status.dataset.sampleRate;
    this.setState("requesting", "Requesting…");

    const controller = new AbortController();
    this.controller = controller;
    this.last = controller;
    const mine = () => this.last === controller; // false once a newer run started
    let player = null;
    const t0 = performance.now();
    let firstByteMs = null;
    let format = null;
    let head = new Uint8Array(0); // bytes until the header is complete
    const pcmChunks = [];
    let pcmBytes = 0;
    const rateOf = () => (format ? format.sampleRate * format.channels * 2 : 1);

    const tick = () => {
      if (!mine()) return;
      const p = player;
      if (p && p.firstSoundMs !== null) this.fig.ttfp.textContent = fmtSeconds((p.firstSoundMs - t0) / 1000);
      if (format) {
        const seconds = pcmBytes / rateOf();
        this.fig.seconds.textContent = fmtSeconds(seconds);
        this.status.dataset.audioSeconds = seconds.toFixed(3);
      }
      if (p && this.status.dataset.state === "playing" && p.bufferedSeconds === 0) {
        // played out: the last figures, then nothing more to watch
        clearInterval(this.ticker);
        this.ticker = null;
        if (this.unexpose) this.unexpose();
        this.unexpose = null;
        this.setState("done", `Done: ${fmtSeconds(pcmBytes / rateOf())} of audio played.`);
      }
    };
    this.ticker = setInterval(tick, 100);

    try {
      const response = await apiFetch(ENDPOINT, {
        json: { ...body, stream: true, response_format: "wav" },
        signal: controller.signal,
      });
      const reader = response.body.getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        if (!value || !value.length) continue;
        if (firstByteMs === null) {
          firstByteMs = performance.now();
          this.fig.ttfb.textContent = fmtSeconds((firstByteMs - t0) / 1000);
        }
        let pcm = value;
        if (!format) {
          const joined = new Uint8Array(head.length + value.length);
          joined.set(head, 0);
          joined.set(value, head.length);
          head = joined;
          format = wavFormat(head);
          if (!format) continue; // the header is not complete yet
          if (format.bitsPerSample !== 16) throw new Error(`unexpected WAV stream: ${format.bitsPerSample}-bit samples`);
          this.status.dataset.sampleRate = String(format.sampleRate);
          player = new PcmPlayer({ sampleRate: format.sampleRate, channels: format.channels });
          this.player = player;
          await player.start();
          if (controller.signal.aborted) throw new DOMException("stopped", "AbortError");
          this.unexpose = exposePlayback(this.status, player);
          this.setState("streaming", `Streaming ${format.sampleRate} Hz audio…`);
          pcm = head.subarray(format.dataOffset);
        }
        if (!pcm.length) continue;
        const copy = pcm.slice(); // own buffer: the player and the download both keep it
        pcmChunks.push(copy);
        pcmBytes += copy.length;
        player.pushPcm16(copy);
      }
      const doneMs = performance.now();
      if (!format) throw new Error("the stream ended before its WAV header");
      const seconds = pcmBytes / rateOf();
      this.status.dataset.streamDone = "true";
      this.fig.rtf.textContent = seconds > 0 ? ((doneMs - t0) / 1000 / seconds).toFixed(3) : "–";
      this.setState("playing", `Stream complete (${fmtSeconds((doneMs - t0) / 1000)}); playing…`);
    } catch (err) {
      if (!mine()) return; // a newer run took over
      if (controller.signal.aborted) {
        this.status.dataset.streamDone = "true";
      } else {
        if (player) player.stop();
        this.setState("error", "Failed.");
        // a WAV stream has no way to carry the server's error once it started: say what happened
        const cut = firstByteMs !== null && !(err instanceof ApiError);
        showError(this.error, cut ? new ApiError(0, `The stream was cut off after ${fmtSeconds(pcmBytes / rateOf())} of ` +
          `audio (${err.message}): the server ended it, e.g. a stage died (its log says which). Retry the request.`,
          { code: "stream_cut_off" }) : err);
      }
    } finally {
      if (mine()) {
        this.controller = null;
        this.finish(tick, format, head, pcmChunks, pcmBytes);
      }
    }
  }

  /** The last figures and the download link (what arrived, as a complete WAV file). */
  finish(tick, format, head, pcmChunks, pcmBytes) {
    tick();
    if (format && pcmBytes > 0) {
      this.url = URL.createObjectURL(wavFile(head, format.dataOffset, pcmChunks, pcmBytes, 2 * format.channels));
      this.download.href = this.url;
      this.download.download = `speech-${Date.now()}.wav`;
      this.download.hidden = false;
    }
    this.onstate(this.status.dataset.state);
  }
}

let ui = null;
let voices = null;

async function refreshVoices() {
  try {
    voices = await loadVoices();
    fillVoiceSelect(ui.voice, voices, ui.model.value);
    ui.storeNote.hidden = !voices.storeError;
    ui.storeNote.textContent = voices.storeError ? `Custom voices unavailable: ${voices.storeError}` : "";
  } catch (err) {
    showError(ui.run.error, err);
  }
}

export async function init(panel) {
  const model = el("select", { "data-testid": "speech-model" });
  const voice = el("select", { "data-testid": "speech-voice" });
  const text = el("textarea", { "data-testid": "speech-text", rows: 4 }, "The capital of France is Paris. It sits on the Seine, in the north of the country.");
  const pacing = el("input", { type: "checkbox", "data-testid": "speech-pacing" });
  const speed = el("input", { type: "number", step: "0.05", placeholder: "1.0", "data-testid": "speech-speed", class: "speech-speed" });
  const instructions = el("input", { type: "text", placeholder: "(optional) style, e.g. cheerful", "data-testid": "speech-instructions" });
  const play = el("button", { type: "submit", "data-testid": "speech-play" }, "Play");
  const stop = el("button", { type: "button", class: "secondary", "data-testid": "speech-stop", disabled: true }, "Stop");
  const storeNote = el("p", { class: "muted", hidden: true });
  const run = new SpeechRun("speech");
  run.onstate = () => {
    stop.disabled = !run.busy;
  };
  ui = { model, voice, run, storeNote };

  const form = el(
    "form",
    { class: "card", autocomplete: "off" },
    el("h2", {}, "Speech"),
    el("p", { class: "muted" }, "POST /v1/audio/speech, streamed as WAV and played while it arrives."),
    el(
      "div",
      { class: "row" },
      el("label", {}, "Model", model),
      el("label", {}, "Voice", voice),
      el("label", {}, "Speed", speed),
      el("label", { class: "grow" }, "Instructions", instructions),
    ),
    el("label", {}, "Text", text),
    el(
      "div",
      { class: "row" },
      play,
      stop,
      el("label", { class: "inline", title: "stream_pacing: \"realtime\": the server computes audio just ahead of playback (docs/scheduling.md)" }, pacing, "pace to real time"),
    ),
    storeNote,
    run.node,
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const body = { model: model.value, input: text.value };
    if (voice.value) body.voice = voice.value;
    if (speed.value !== "") body.speed = Number(speed.value);
    if (instructions.value !== "") body.instructions = instructions.value;
    if (pacing.checked) body.stream_pacing = "realtime";
    const started = run.play(body);
    stop.disabled = false;
    return started;
  });
  stop.addEventListener("click", () => run.stop());
  model.addEventListener("change", () => voices && fillVoiceSelect(voice, voices, model.value));
  panel.append(form);

  await fillModelSelect(model, ENDPOINT, { preferred: ["piper_tts"] });
  await refreshVoices();
}

/** Shown again: the voices may have changed in the Voices tab. */
export function show() {
  if (ui) refreshVoices();
}

export async function refresh() {
  if (!ui) return;
  await fillModelSelect(ui.model, ENDPOINT, { preferred: ["piper_tts"] });
  await refreshVoices();
}
