// The Images tab: generate (POST /v1/images/generations, JSON) or edit uploaded image(s)
// (POST /v1/images/edits, multipart: image parts, an optional RGBA mask drawn with a brush or
// uploaded), with seed, steps, n, size and a registered LoRA (GET /v1/loras; an adapter can be
// uploaded with POST /v1/loras). Results (b64_json) are shown from blob: URLs in a grid; the time
// from the click to the first decoded picture is measured here with performance.now().
//
// Every limit is the API's: the fields are sent as typed and the API's error is shown as is.

import { apiFetch, apiJson, el, errorBox, fillModelSelect, fmtSeconds, listModels, showError } from "../api.js";

const GENERATE = "/v1/images/generations";
const EDIT = "/v1/images/edits";

let ui = null;
let urls = []; // blob: URLs of the grid, revoked when replaced

/** A number field's value, or undefined when empty (the API's default applies). */
function num(input) {
  const v = input.value.trim();
  return v === "" ? undefined : Number(v);
}

function text(input) {
  const v = input.value.trim();
  return v === "" ? undefined : v;
}

export async function init(panel) {
  const mode = el("select", { "data-testid": "images-mode" },
    el("option", { value: "generate" }, "Generate"), el("option", { value: "edit" }, "Edit uploaded image(s)"));
  const model = el("select", { "data-testid": "images-model" });
  const prompt = el("textarea", { "data-testid": "images-prompt", placeholder: "a red fox in the snow" });
  prompt.value = "a red fox in the snow";
  const size = el("input", { type: "text", value: "64x64", size: 9, "data-testid": "images-size", placeholder: "auto" });
  const n = el("input", { type: "number", value: 1, min: 1, "data-testid": "images-n", class: "w5" });
  const seed = el("input", { type: "number", placeholder: "random", "data-testid": "images-seed", class: "w8" });
  const steps = el("input", { type: "number", placeholder: "model's", "data-testid": "images-steps", class: "w6" });
  const negative = el("input", { type: "text", placeholder: "(none)", "data-testid": "images-negative" });
  const format = el("select", { "data-testid": "images-format" },
    el("option", { value: "png" }, "png"), el("option", { value: "webp" }, "webp"), el("option", { value: "jpeg" }, "jpeg"));
  const lora = el("select", { "data-testid": "images-lora" }, el("option", { value: "" }, "(none)"));
  const loraScale = el("input", { type: "number", value: 1, step: 0.1, "data-testid": "images-lora-scale", class: "w5" });

  // edit inputs
  const upload = el("input", { type: "file", accept: "image/*", multiple: true, "data-testid": "images-upload" });
  const editHint = el("span", { class: "muted", "data-testid": "images-edit-hint" });
  const maskUpload = el("input", { type: "file", accept: "image/png", "data-testid": "images-mask-upload" });
  const strength = el("input", { type: "number", step: 0.05, placeholder: "model's", "data-testid": "images-strength", class: "w6" });
  const brush = el("input", { type: "range", min: 2, max: 64, value: 12, "data-testid": "images-brush-size" });
  const clearMask = el("button", { type: "button", class: "secondary", "data-testid": "images-mask-clear" }, "Clear mask");
  const canvas = el("canvas", { class: "mask-canvas", "data-testid": "images-mask-canvas", "data-painted": "0" });
  const maskPreview = el("img", { alt: "mask sent", "data-testid": "images-mask-preview" });
  const maskBox = el("div", { class: "mask-box", hidden: true, "data-testid": "images-mask-box" },
    el("div", { class: "row" },
      el("label", {}, "Mask PNG (alpha 0 = repaint)", maskUpload),
      el("label", {}, "Brush", brush), clearMask,
      el("label", {}, "strength", strength)),
    el("p", { class: "muted" }, "Paint over the first image the area to repaint (or upload a mask, which wins)."),
    el("div", { class: "row" }, canvas,
      el("figure", { class: "mask-sent" }, maskPreview, el("figcaption", { class: "muted" }, "mask sent (transparent = repaint)"))));
  const editBox = el("div", { class: "edit-box", hidden: true, "data-testid": "images-edit-box" },
    el("div", { class: "row" }, el("label", {}, "Image(s) to edit", upload), editHint), maskBox);

  const run = el("button", { type: "submit", "data-testid": "images-run" }, "Generate");
  const error = errorBox("images-error");
  const ttfp = el("b", { "data-testid": "images-ttfp" }, "–");
  const total = el("b", { "data-testid": "images-total" }, "–");
  const usage = el("span", { class: "muted", "data-testid": "images-usage" });
  const grid = el("div", { class: "grid", "data-testid": "images-grid" });

  const form = el("form", { class: "card", "data-testid": "images-form" },
    el("h2", {}, "Images"),
    el("div", { class: "row" }, el("label", {}, "Mode", mode), el("label", {}, "Model", model)),
    el("label", {}, "Prompt", prompt),
    el("div", { class: "row" },
      el("label", {}, "Size", size), el("label", {}, "n", n), el("label", {}, "Seed", seed),
      el("label", {}, "Steps", steps), el("label", {}, "Format", format),
      el("label", {}, "Negative prompt", negative)),
    el("div", { class: "row" }, el("label", {}, "LoRA", lora), el("label", {}, "scale", loraScale)),
    editBox,
    el("div", { class: "row" }, run),
    error,
    el("div", { class: "figures" },
      el("span", {}, "time to first picture ", ttfp), el("span", {}, "total ", total), usage),
    grid);

  // LoRA adapters: upload and list
  const loraName = el("input", { type: "text", placeholder: "style", "data-testid": "images-lora-name" });
  const loraFile = el("input", { type: "file", accept: ".safetensors", "data-testid": "images-lora-file" });
  const loraError = errorBox("images-lora-error");
  const loraList = el("ul", { class: "lora-list", "data-testid": "images-lora-list" });
  const loraForm = el("form", { class: "card", "data-testid": "images-lora-form" },
    el("h2", {}, "LoRA adapters"),
    el("p", { class: "muted" }, "A diffusers or PEFT .safetensors adapter (docs/lora.md), registered with POST /v1/loras."),
    el("div", { class: "row" }, el("label", {}, "Name", loraName), el("label", {}, "File", loraFile),
      el("button", { type: "submit" }, "Upload")),
    loraError, loraList);

  panel.append(form, loraForm);
  ui = { mode, model, prompt, size, n, seed, steps, negative, format, lora, loraScale, upload, editHint, maskUpload,
    strength, brush, canvas, maskBox, maskPreview, editBox, run, error, ttfp, total, usage, grid, loraList, loraError };

  const painter = makePainter(canvas, brush);
  clearMask.addEventListener("click", () => painter.clear());
  upload.addEventListener("change", () => painter.load(upload.files[0] || null));

  mode.addEventListener("change", () => refreshModels());
  model.addEventListener("change", () => updateEditControls());
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    submit(painter);
  });
  loraForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    showError(loraError, null);
    const body = new FormData();
    body.append("name", loraName.value.trim());
    if (loraFile.files[0]) body.append("file", loraFile.files[0]);
    try {
      await apiFetch("/v1/loras", { form: body });
      loraName.value = "";
      loraFile.value = "";
      await refreshLoras();
    } catch (err) {
      showError(loraError, err);
    }
  });
  await refreshModels();
  await refreshLoras();
}

export async function refresh() {
  if (!ui) return;
  await listModels(true).catch(() => null);
  await refreshModels();
  await refreshLoras();
}

async function refreshModels() {
  const edit = ui.mode.value === "edit";
  ui.editBox.hidden = !edit;
  ui.run.textContent = edit ? "Edit" : "Generate";
  try {
    await fillModelSelect(ui.model, edit ? EDIT : GENERATE, { preferred: ["qwen_image", "qwen_image_edit"] });
  } catch (err) {
    showError(ui.error, err);
  }
  await updateEditControls();
}

/** The edit model's card says how many images it takes and whether it takes a mask. */
async function updateEditControls() {
  const models = await listModels().catch(() => []);
  const card = models.find((m) => m.id === ui.model.value);
  const edit = ui.mode.value === "edit";
  const mask = Boolean(edit && card && card.supports_mask);
  ui.maskBox.hidden = !mask;
  if (card && edit) {
    const most = card.max_input_images || 1;
    ui.editHint.textContent = `${card.id} takes ${most === 1 ? "one image" : `up to ${most} images`}` +
      (card.supports_mask ? " and a mask (required)" : "; no mask");
  } else {
    ui.editHint.textContent = "";
  }
}

async function refreshLoras() {
  let adapters = [];
  try {
    adapters = (await apiJson("/v1/loras")).data || [];
    showError(ui.loraError, null);
  } catch (err) {
    showError(ui.loraError, err); // e.g. 404 lora_disabled
  }
  const keep = ui.lora.value;
  ui.lora.replaceChildren(el("option", { value: "" }, "(none)"),
    ...adapters.map((a) => el("option", { value: a.name }, a.name)));
  if (adapters.some((a) => a.name === keep)) ui.lora.value = keep;
  ui.loraList.replaceChildren(...adapters.map((a) => el("li", { "data-name": a.name },
    `${a.name} (rank ${a.rank}, ${a.modules} modules, ${a.format}) `,
    el("button", { type: "button", class: "danger", onclick: async () => {
      try {
        await apiFetch(`/v1/loras/${encodeURIComponent(a.name)}`, { method: "DELETE" });
        await refreshLoras();
      } catch (err) {
        showError(ui.loraError, err);
      }
    } }, "Delete"))));
  if (!adapters.length) ui.loraList.append(el("li", { class: "muted" }, "no adapter registered"));
}

let maskUrl = null;
/** Show the mask PNG just sent (what the API got: alpha 0 where the brush painted). */
function showMask(blob) {
  if (maskUrl) URL.revokeObjectURL(maskUrl);
  maskUrl = URL.createObjectURL(blob);
  ui.maskPreview.src = maskUrl;
  ui.maskPreview.dataset.sent = String(Date.now());
}

function decodeB64(b64) {
  const bin = atob(b64);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return bytes;
}

async function submit(painter) {
  const edit = ui.mode.value === "edit";
  showError(ui.error, null);
  ui.run.disabled = true;
  ui.ttfp.textContent = "…";
  ui.total.textContent = "…";
  ui.usage.textContent = "";
  ui.grid.dataset.state = "running";
  const fields = {
    model: ui.model.value || undefined,
    prompt: ui.prompt.value,
    size: text(ui.size),
    n: num(ui.n),
    seed: num(ui.seed),
    num_inference_steps: num(ui.steps),
    negative_prompt: text(ui.negative),
    output_format: ui.format.value,
  };
  const loraName = ui.lora.value;
  const started = performance.now();
  try {
    let response;
    if (!edit) {
      const json = { ...fields };
      if (loraName) json.lora = { name: loraName, scale: num(ui.loraScale) ?? 1 };
      response = await apiFetch(GENERATE, { json });
    } else {
      const form = new FormData();
      for (const [k, v] of Object.entries(fields)) if (v !== undefined) form.append(k, String(v));
      if (loraName) {
        form.append("lora[name]", loraName);
        if (num(ui.loraScale) !== undefined) form.append("lora[scale]", String(num(ui.loraScale)));
      }
      for (const file of ui.upload.files) form.append("image", file, file.name);
      if (!ui.maskBox.hidden) {
        if (ui.maskUpload.files[0]) form.append("mask", ui.maskUpload.files[0], ui.maskUpload.files[0].name);
        else if (painter.painted()) {
          const mask = await painter.maskBlob();
          showMask(mask);
          form.append("mask", mask, "mask.png");
        }
        if (text(ui.strength) !== undefined) form.append("strength", text(ui.strength));
      }
      response = await apiFetch(EDIT, { form });
    }
    const body = await response.json();
    await show(body, started);
    const u = body.usage || {};
    ui.usage.textContent = `${body.size || ""} ${body.output_format || ""}, ${u.num_inference_steps ?? "?"} steps, ` +
      `denoise ${fmtSeconds(u.denoise_seconds)}`;
    ui.grid.dataset.state = "done";
  } catch (err) {
    showError(ui.error, err);
    ui.ttfp.textContent = "–";
    ui.total.textContent = "–";
    ui.grid.dataset.state = "error";
  } finally {
    ui.run.disabled = false;
  }
}

/** Show the response's images in the grid; resolves once every image is decoded. */
async function show(body, started) {
  urls.forEach((u) => URL.revokeObjectURL(u));
  urls = [];
  const type = `image/${body.output_format || "png"}`;
  let first = true;
  const loads = [];
  const figures = (body.data || []).map((item, i) => {
    const url = URL.createObjectURL(new Blob([decodeB64(item.b64_json)], { type }));
    urls.push(url);
    const img = el("img", { src: url, alt: `image ${i + 1}`, "data-testid": "images-result", "data-seed": item.seed });
    loads.push(img.decode().then(() => {
      if (first) {
        first = false;
        const s = (performance.now() - started) / 1000;
        ui.ttfp.textContent = fmtSeconds(s);
        ui.ttfp.dataset.seconds = String(s);
      }
      img.dataset.loaded = "1";
    }));
    const download = el("a", { href: url, download: `image-${item.seed ?? i}.${body.output_format || "png"}` }, "download");
    return el("figure", {}, img, el("figcaption", {}, `seed ${item.seed ?? "?"} · `, download));
  });
  ui.grid.replaceChildren(...figures);
  await Promise.all(loads);
  const s = (performance.now() - started) / 1000;
  ui.total.textContent = fmtSeconds(s);
  ui.total.dataset.seconds = String(s);
}

/**
 * The brush: `canvas` shows the first uploaded image with the painted area in red; the mask is an
 * image-sized PNG, opaque everywhere except where painted (alpha 0: OpenAI's "repaint here").
 */
function makePainter(canvas, brush) {
  let image = null; // ImageBitmap of the first upload
  let strokes = null; // canvas of the image's size, painted pixels opaque
  let painted = false;
  let drawing = false;

  function redraw() {
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    if (image) ctx.drawImage(image, 0, 0);
    if (strokes) {
      ctx.globalAlpha = 0.55;
      ctx.drawImage(strokes, 0, 0);
      ctx.globalAlpha = 1;
    }
  }

  function point(event) {
    const r = canvas.getBoundingClientRect();
    return [((event.clientX - r.left) * canvas.width) / r.width, ((event.clientY - r.top) * canvas.height) / r.height];
  }

  function paint(event) {
    if (!strokes) return;
    const [x, y] = point(event);
    const ctx = strokes.getContext("2d");
    // the brush size is in displayed pixels: scale it to the image's
    const radius = (Number(brush.value) / 2) * (canvas.width / Math.max(canvas.getBoundingClientRect().width, 1));
    ctx.fillStyle = "#e0245e";
    ctx.beginPath();
    ctx.arc(x, y, Math.max(radius, 0.5), 0, Math.PI * 2);
    ctx.fill();
    painted = true;
    canvas.dataset.painted = "1";
    redraw();
  }

  canvas.addEventListener("pointerdown", (event) => {
    drawing = true;
    canvas.setPointerCapture(event.pointerId);
    paint(event);
  });
  canvas.addEventListener("pointermove", (event) => drawing && paint(event));
  canvas.addEventListener("pointerup", () => {
    drawing = false;
  });

  return {
    async load(file) {
      image = file ? await createImageBitmap(file).catch(() => null) : null;
      canvas.width = image ? image.width : 0;
      canvas.height = image ? image.height : 0;
      strokes = image ? new OffscreenCanvas(image.width, image.height) : null;
      painted = false;
      canvas.dataset.painted = "0";
      redraw();
    },
    clear() {
      if (strokes) strokes.getContext("2d").clearRect(0, 0, strokes.width, strokes.height);
      painted = false;
      canvas.dataset.painted = "0";
      redraw();
    },
    painted: () => painted,
    /** The mask PNG (image-sized RGBA: alpha 0 where painted, 255 elsewhere). */
    maskBlob() {
      const mask = document.createElement("canvas");
      mask.width = strokes.width;
      mask.height = strokes.height;
      const ctx = mask.getContext("2d");
      ctx.fillStyle = "#000";
      ctx.fillRect(0, 0, mask.width, mask.height);
      ctx.globalCompositeOperation = "destination-out";
      ctx.drawImage(strokes, 0, 0);
      return new Promise((resolve) => mask.toBlob(resolve, "image/png"));
    },
  };
}
