// The Voices tab: consents, cloned and designed voices, and speaking with them.
//
//   consent  POST /v1/audio/voice_consents   (multipart: name, language, recording)
//   clone    POST /v1/audio/voices           (multipart: name, audio_sample, consent, ref_text?)
//   design   POST /v1/audio/voices           (JSON: name, type "prompt", prompt)
//   list     GET  /v1/audio/voices           (uploaded_voices) and GET /v1/audio/voice_consents
//   delete   DELETE /v1/audio/voices/{id}, DELETE /v1/audio/voice_consents/{id}
//   speak    POST /v1/audio/speech           (streamed WAV, the Speech tab's SpeechRun)
//
// A recording comes from the microphone (MediaRecorder: Chromium records WebM/Opus, which the
// server decodes like any upload: omni_triton.media.audio.decode_audio, PyAV for WebM) or from a
// file. Every limit (clip length, size, name, consent required) is the server's: its error shows.

import { apiFetch, apiJson, el, errorBox, fillModelSelect, showError } from "../api.js";
import { fillVoiceSelect, loadVoices, SpeechRun } from "./speech.js";

const EXTENSIONS = { "audio/webm": "webm", "audio/ogg": "ogg", "audio/mp4": "m4a", "audio/wav": "wav", "audio/mpeg": "mp3" };

/**
 * An audio source: a file input and a Record/Stop button (microphone), with a preview.
 * `get()` -> {blob, name} of the last one chosen (file or recording), or null.
 */
function audioSource(prefix) {
  let chosen = null;
  let recorder = null;
  let previewUrl = null;
  const file = el("input", { type: "file", accept: "audio/*", "data-testid": `${prefix}-file` });
  const record = el("button", { type: "button", class: "secondary", "data-testid": `${prefix}-record` }, "● Record");
  const preview = el("audio", { controls: true, hidden: true, "data-testid": `${prefix}-preview` });
  const note = el("span", { class: "muted", "data-testid": `${prefix}-source` }, "no audio chosen");
  const error = errorBox(`${prefix}-record-error`);

  function choose(blob, name, text) {
    chosen = { blob, name };
    if (previewUrl) URL.revokeObjectURL(previewUrl);
    previewUrl = URL.createObjectURL(blob);
    preview.src = previewUrl;
    preview.hidden = false;
    note.textContent = text;
    note.dataset.ready = "true";
  }

  file.addEventListener("change", () => {
    const f = file.files && file.files[0];
    if (f) choose(f, f.name, `file ${f.name} (${Math.round(f.size / 1024)} KiB)`);
  });

  record.addEventListener("click", async () => {
    showError(error, null);
    if (recorder) {
      recorder.stop();
      return;
    }
    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    } catch (err) {
      showError(error, new Error(`No microphone: ${err.message}`));
      return;
    }
    const chunks = [];
    const started = performance.now();
    recorder = new MediaRecorder(stream);
    recorder.addEventListener("dataavailable", (event) => event.data.size && chunks.push(event.data));
    recorder.addEventListener("stop", () => {
      stream.getTracks().forEach((t) => t.stop());
      const type = (recorder.mimeType || "audio/webm").split(";")[0];
      const blob = new Blob(chunks, { type });
      const seconds = ((performance.now() - started) / 1000).toFixed(1);
      choose(blob, `${prefix}.${EXTENSIONS[type] || "webm"}`, `recorded ${seconds} s (${recorder.mimeType || type})`);
      recorder = null;
      record.textContent = "● Record";
      record.dataset.recording = "false";
    });
    recorder.start();
    record.textContent = "■ Stop recording";
    record.dataset.recording = "true";
    note.textContent = "recording…";
    delete note.dataset.ready;
  });

  const node = el("div", { class: "audio-source" }, el("div", { class: "row" }, record, el("span", { class: "muted" }, "or"), file), note, preview, error);
  return {
    node,
    get: () => chosen,
    reset() {
      chosen = null;
      file.value = "";
      preview.hidden = true;
      preview.removeAttribute("src");
      note.textContent = "no audio chosen";
      delete note.dataset.ready;
    },
  };
}

/** Every consent (the cursor pages of GET /v1/audio/voice_consents). */
async function listConsents() {
  const all = [];
  let after = null;
  for (let page = 0; page < 50; page++) {
    const query = new URLSearchParams({ limit: "100" });
    if (after) query.set("after", after);
    const body = await apiJson(`/v1/audio/voice_consents?${query}`);
    all.push(...(body.data || []));
    if (!body.has_more || !body.last_id) break;
    after = body.last_id;
  }
  return all;
}

function when(seconds) {
  return seconds ? new Date(seconds * 1000).toLocaleString() : "";
}

let ui = null;

async function refreshLists({ selectVoice = null, selectConsent = null } = {}) {
  const [voices, consents] = await Promise.all([loadVoices(), listConsents().catch((err) => err)]);
  ui.voices = voices;

  // consents
  if (consents instanceof Error) {
    showError(ui.consentError, consents);
  } else {
    const keep = selectConsent || ui.consent.value;
    ui.consent.replaceChildren(
      el("option", { value: "" }, consents.length ? "(choose a consent)" : "(no consent yet: record one above)"),
      ...consents.map((c) => el("option", { value: c.id }, `${c.name} (${c.language}, ${c.id})`)),
    );
    if (consents.some((c) => c.id === keep)) ui.consent.value = keep;
    else if (consents.length === 1) ui.consent.value = consents[0].id;
    ui.consentRows.replaceChildren(
      ...consents.map((c) =>
        el(
          "tr",
          { "data-testid": "consent-row", dataset: { id: c.id } },
          el("td", {}, c.name),
          el("td", {}, c.language),
          el("td", { class: "mono" }, c.id),
          el("td", {}, when(c.created_at)),
          el("td", {}, el("button", { type: "button", class: "danger", "data-testid": "consent-delete", onclick: () => deleteConsent(c.id) }, "Delete")),
        ),
      ),
    );
    ui.consentTable.hidden = !consents.length;
  }

  // stored voices
  const stored = [...voices.uploaded.values()];
  ui.voiceRows.replaceChildren(
    ...stored.map((v) =>
      el(
        "tr",
        { "data-testid": "voice-row", dataset: { id: v.id, name: v.name } },
        el("td", {}, v.name),
        el("td", {}, v.type === "prompt" ? "designed" : "cloned"),
        el("td", {}, v.type === "prompt" ? v.prompt || "" : `${v.seconds ?? "?"} s${v.ref_text ? `, "${v.ref_text}"` : ""}`),
        el("td", { class: "mono" }, v.id),
        el("td", {}, when(v.created_at)),
        el("td", { class: "bad" }, v.error || ""),
        el(
          "td",
          { class: "actions" },
          el("button", { type: "button", class: "secondary", "data-testid": "voice-speak", onclick: () => speakWith(v.id) }, "Speak"),
          el("button", { type: "button", class: "danger", "data-testid": "voice-delete", onclick: () => deleteVoice(v.id) }, "Delete"),
        ),
      ),
    ),
  );
  ui.voiceTable.hidden = !stored.length;
  ui.noVoices.hidden = stored.length > 0;
  ui.noVoices.textContent = voices.storeError ? `The voice store is unavailable: ${voices.storeError}` : "No stored voice yet.";
  fillVoiceSelect(ui.speakVoice, voices, ui.speakModel.value, { prefer: selectVoice });
}

/** Run `action` with `button` disabled; its error goes to `box`. */
async function busy(button, box, action) {
  showError(box, null);
  button.disabled = true;
  try {
    return await action();
  } catch (err) {
    showError(box, err);
    return null;
  } finally {
    button.disabled = false;
  }
}

function value(input) {
  return input.value.trim();
}

async function createConsent() {
  await busy(ui.consentButton, ui.consentError, async () => {
    const form = new FormData();
    form.append("name", value(ui.consentName));
    form.append("language", value(ui.consentLanguage));
    const audio = ui.consentAudio.get();
    if (audio) form.append("recording", audio.blob, audio.name);
    const consent = await apiJson("/v1/audio/voice_consents", { form });
    ui.consentResult.textContent = `Consent ${consent.id} stored.`;
    ui.consentAudio.reset();
    await refreshLists({ selectConsent: consent.id });
  });
}

async function deleteConsent(id) {
  showError(ui.consentError, null);
  try {
    await apiFetch(`/v1/audio/voice_consents/${encodeURIComponent(id)}`, { method: "DELETE" });
    await refreshLists();
  } catch (err) {
    showError(ui.consentError, err);
  }
}

async function cloneVoice() {
  await busy(ui.cloneButton, ui.cloneError, async () => {
    const form = new FormData();
    form.append("name", value(ui.cloneName));
    const audio = ui.cloneAudio.get();
    if (audio) form.append("audio_sample", audio.blob, audio.name);
    if (ui.consent.value) form.append("consent", ui.consent.value);
    if (value(ui.refText)) form.append("ref_text", value(ui.refText));
    const voice = await apiJson("/v1/audio/voices", { form });
    ui.cloneResult.textContent = `Voice ${voice.name} (${voice.id}, ${voice.seconds} s) cloned.`;
    ui.cloneAudio.reset();
    await refreshLists({ selectVoice: voice.id });
  });
}

async function designVoice() {
  await busy(ui.designButton, ui.designError, async () => {
    const voice = await apiJson("/v1/audio/voices", { json: { name: value(ui.designName), type: "prompt", prompt: ui.prompt.value } });
    ui.designResult.textContent = `Voice ${voice.name} (${voice.id}) designed.`;
    await refreshLists({ selectVoice: voice.id });
  });
}

async function deleteVoice(id) {
  showError(ui.listError, null);
  try {
    await apiFetch(`/v1/audio/voices/${encodeURIComponent(id)}`, { method: "DELETE" });
    await refreshLists();
  } catch (err) {
    showError(ui.listError, err);
  }
}

/** "Speak" on a row: that voice in the Speak card, then play. */
function speakWith(id) {
  const usable = (model) => ((ui.voices.byModel.get(model) || {}).custom_voices || []).includes(id);
  if (!usable(ui.speakModel.value)) {
    const other = [...ui.speakModel.options].find((o) => !o.disabled && usable(o.value));
    if (other) ui.speakModel.value = other.value;
  }
  fillVoiceSelect(ui.speakVoice, ui.voices, ui.speakModel.value, { prefer: id });
  ui.speakVoice.value = id;
  ui.speakCard.scrollIntoView({ block: "nearest" });
  speak();
}

function speak() {
  const body = { model: ui.speakModel.value, input: ui.speakText.value };
  if (ui.speakVoice.value) body.voice = ui.speakVoice.value;
  ui.speakStop.disabled = false;
  return ui.run.play(body);
}

export async function init(panel) {
  const consentAudio = audioSource("consent");
  const cloneAudio = audioSource("sample");
  const run = new SpeechRun("voices");
  ui = {
    consentAudio,
    cloneAudio,
    run,
    consentName: el("input", { type: "text", "data-testid": "consent-name", placeholder: "who consents" }),
    consentLanguage: el("input", { type: "text", value: "en-US", "data-testid": "consent-language", size: 8 }),
    consentButton: el("button", { type: "button", "data-testid": "consent-create" }, "Store consent"),
    consentError: errorBox("consent-error"),
    consentResult: el("p", { class: "muted", "data-testid": "consent-result" }),
    consentRows: el("tbody"),
    consent: el("select", { "data-testid": "clone-consent" }),
    cloneName: el("input", { type: "text", "data-testid": "clone-name", placeholder: "my-voice" }),
    refText: el("input", { type: "text", "data-testid": "clone-ref-text", placeholder: "(optional) the words spoken in the sample" }),
    cloneButton: el("button", { type: "button", "data-testid": "clone-create" }, "Clone voice"),
    cloneError: errorBox("clone-error"),
    cloneResult: el("p", { class: "muted", "data-testid": "clone-result" }),
    designName: el("input", { type: "text", "data-testid": "design-name", placeholder: "narrator" }),
    prompt: el("textarea", { rows: 2, "data-testid": "design-prompt", placeholder: "A calm, low narrator voice" }),
    designButton: el("button", { type: "button", "data-testid": "design-create" }, "Design voice"),
    designError: errorBox("design-error"),
    designResult: el("p", { class: "muted", "data-testid": "design-result" }),
    voiceRows: el("tbody"),
    noVoices: el("p", { class: "muted", "data-testid": "voices-empty" }, "No stored voice yet."),
    listError: errorBox("voices-list-error"),
    speakModel: el("select", { "data-testid": "speak-model" }),
    speakVoice: el("select", { "data-testid": "speak-voice" }),
    speakText: el("textarea", { rows: 2, "data-testid": "speak-text" }, "Hello, this is my new voice speaking."),
    speakButton: el("button", { type: "button", "data-testid": "speak-play" }, "Speak"),
    speakStop: el("button", { type: "button", class: "secondary", "data-testid": "speak-stop", disabled: true }, "Stop"),
  };
  ui.consentTable = el("table", { hidden: true, "data-testid": "consent-table" }, el("thead", {}, el("tr", {}, ...["Name", "Language", "Id", "Created", ""].map((h) => el("th", {}, h)))), ui.consentRows);
  ui.voiceTable = el("table", { hidden: true, "data-testid": "voice-table" }, el("thead", {}, el("tr", {}, ...["Name", "Type", "Sample / prompt", "Id", "Created", "Error", ""].map((h) => el("th", {}, h)))), ui.voiceRows);
  run.onstate = () => {
    ui.speakStop.disabled = !run.busy;
  };

  ui.consentButton.addEventListener("click", createConsent);
  ui.cloneButton.addEventListener("click", cloneVoice);
  ui.designButton.addEventListener("click", designVoice);
  ui.speakButton.addEventListener("click", speak);
  ui.speakStop.addEventListener("click", () => run.stop());
  ui.speakModel.addEventListener("change", () => fillVoiceSelect(ui.speakVoice, ui.voices, ui.speakModel.value));

  ui.speakCard = el(
    "div",
    { class: "card" },
    el("h2", {}, "Speak"),
    el("p", { class: "muted" }, "POST /v1/audio/speech with a voice (stored voices are listed for the models that can use them: Qwen3-TTS)."),
    el("div", { class: "row" }, el("label", {}, "Model", ui.speakModel), el("label", {}, "Voice", ui.speakVoice)),
    el("label", {}, "Text", ui.speakText),
    el("div", { class: "row" }, ui.speakButton, ui.speakStop),
    run.node,
  );

  panel.append(
    el(
      "div",
      { class: "card" },
      el("h2", {}, "1. Consent"),
      el("p", { class: "muted" }, "A recording of the speaker agreeing to be cloned (POST /v1/audio/voice_consents); cloning names one."),
      el("div", { class: "row" }, el("label", {}, "Name", ui.consentName), el("label", {}, "Language (BCP 47)", ui.consentLanguage)),
      consentAudio.node,
      el("div", { class: "row" }, ui.consentButton),
      ui.consentResult,
      ui.consentError,
      ui.consentTable,
    ),
    el(
      "div",
      { class: "card" },
      el("h2", {}, "2. Clone a voice"),
      el("p", { class: "muted" }, "A sample of the voice (POST /v1/audio/voices; the server's limits on its length apply)."),
      el("div", { class: "row" }, el("label", {}, "Name", ui.cloneName), el("label", {}, "Consent", ui.consent), el("label", { class: "grow" }, "Reference text", ui.refText)),
      cloneAudio.node,
      el("div", { class: "row" }, ui.cloneButton),
      ui.cloneResult,
      ui.cloneError,
    ),
    el(
      "div",
      { class: "card" },
      el("h2", {}, "Or design a voice"),
      el("p", { class: "muted" }, "A voice from a description (Qwen3-TTS voice design; POST /v1/audio/voices with type \"prompt\")."),
      el("div", { class: "row" }, el("label", {}, "Name", ui.designName)),
      el("label", {}, "Description", ui.prompt),
      el("div", { class: "row" }, ui.designButton),
      ui.designResult,
      ui.designError,
    ),
    el("div", { class: "card" }, el("h2", {}, "Stored voices"), ui.noVoices, ui.voiceTable, ui.listError),
    ui.speakCard,
  );

  await fillModelSelect(ui.speakModel, "/v1/audio/speech", { preferred: ["qwen3_tts"] });
  await refreshLists();
}

export function show() {
  if (ui) refreshLists().catch((err) => showError(ui.listError, err));
}

export async function refresh() {
  if (!ui) return;
  await fillModelSelect(ui.speakModel, "/v1/audio/speech", { preferred: ["qwen3_tts"] });
  await refreshLists();
}
