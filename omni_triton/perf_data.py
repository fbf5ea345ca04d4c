"""perf_analyzer input data for every served model, built from the contracts.

``perf_analyzer --input-data FILE`` reads ``{"data": [{NAME: {"content": [...], "shape": [...]}}]}``:
``content`` is the tensor flattened (strings for BYTES), ``shape`` its dims *without* the batch
dimension for dynamically batched models (perf_analyzer adds it from ``-b``) and the full shape for
the others. :func:`example_inputs` gives one valid request per model (client-facing inputs the
stages accept; inter-stage tensors such as embeddings, latents and codec frames zero-filled at the
sizes of the embedded tiny checkpoints, which the GPU checkpoints do not share: regenerate with
``--dims`` values of the real model for those). ``python -m omni_triton.perf_data write OUTDIR`` writes
``OUTDIR/<model>/input_data.json``; ``tests/unit/test_perf_data.py`` checks the committed files
against the contracts and this generator.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from omni_triton.contracts import CONTRACTS, asr, chat, qwen3_tts, speech, wan
from omni_triton.contracts import codec as cd
from omni_triton.contracts import omni_stages as om
from omni_triton.contracts import qwen_image as qi
from omni_triton.contracts import stable_audio as sa
from omni_triton.contracts import whisper as wh

#: Sizes of the embedded tiny checkpoints that inter-stage tensors must match.
TINY_DIMS = {
    "image_text_hidden": 32,   # qwen-image(-edit)-tiny text_encoder hidden_size = joint_attention_dim
    "image_packed_channels": 16,  # transformer in_channels (z_dim 4 x 2x2 patch)
    "image_z_dim": 4,          # vae z_dim
    "image_vae_scale": 8,      # vae spatial down-sampling
    "edit_condition_latent": 128,  # the edit VAE encoder resizes the condition image to ~1024x1024 px
    "omni_hidden": 64,         # qwen3-omni-tiny thinker text hidden_size = talker thinker_hidden_size
    "omni_code_groups": 4,     # talker num_code_groups = code2wav num_quantizers
    "csm_codebooks": 8,        # csm-tiny num_codebooks
    "video_text_dim": 32,      # wan2.2-t2v-tiny UMT5 d_model = transformer text_dim
    "video_z_dim": 16,         # wan vae z_dim = transformer in_channels
    "video_vae_scale": 8,      # wan vae scale_factor_spatial (temporal: 4)
    "audio_text_dim": 32,      # stable-audio-open-tiny T5 d_model
    "audio_text_len": 64,      # its tokenizer's model_max_length (the pipeline pads to it)
    "audio_latent_channels": 16,  # its transformer in_channels = Oobleck decoder_input_channels
    "audio_latent_len": 256,   # its transformer sample_size (the longest clip's latent frames)
    # qwen3-omni-tiny config.json token ids: the talker finds the chat turns in SEQUENCE by them
    "omni_im_start": 1, "omni_im_end": 2, "omni_user": 282, "omni_assistant": 278,
    "whisper_d_model": 64,     # whisper-tiny-random d_model (encoder states [1500, d_model])
}

_TEXT = "Measured with perf analyzer."
_SIZE = 32  # pixels: the smallest image the tiny pipelines serve quickly (multiple of 16)


def _u8(value: str) -> np.ndarray:
    return np.array([value.encode("utf-8")], dtype=np.object_)


def _i32(v: int) -> np.ndarray:
    return np.array([v], np.int32)


def _f32(v: float) -> np.ndarray:
    return np.array([v], np.float32)


def example_inputs(model: str, dims: dict[str, int] = TINY_DIMS) -> dict[str, np.ndarray]:
    """One request's inputs for ``model``: name -> array *without* a batch dimension.

    Args:
        model: a key of :data:`CONTRACTS`.
        dims: inter-stage sizes (:data:`TINY_DIMS` keys).

    Raises:
        KeyError: an unknown model.
    """
    messages = _u8(json.dumps([{"role": "user", "content": "Say hello."}]))
    sampling = _u8(json.dumps({"max_tokens": 8, "temperature": 0.0}))
    h = dims["image_text_hidden"]
    lat = _SIZE // dims["image_vae_scale"]
    image_in = {qi.PROMPT: _u8("a red square"), qi.NEGATIVE_PROMPT: _u8(""),
                qi.HEIGHT: _i32(_SIZE), qi.WIDTH: _i32(_SIZE), qi.NUM_INFERENCE_STEPS: _i32(2),
                qi.TRUE_CFG_SCALE: _f32(1.0), qi.GUIDANCE_SCALE: _f32(0.0),
                qi.SEED: np.array([0], np.int64)}
    rgb = np.full((_SIZE, _SIZE, 3), 128, np.uint8)
    embeds = {qi.PROMPT_EMBEDS: np.zeros((4, h), np.float32),
              qi.NEGATIVE_PROMPT_EMBEDS: np.zeros((0, h), np.float32)}
    denoise = {**embeds, **{k: image_in[k] for k in (qi.HEIGHT, qi.WIDTH, qi.NUM_INFERENCE_STEPS,
                                                     qi.TRUE_CFG_SCALE, qi.GUIDANCE_SCALE, qi.SEED)}}
    hid, groups, frames = dims["omni_hidden"], dims["omni_code_groups"], 4
    # <|im_start|>user 20 21 <|im_end|> <|im_start|>assistant | 30 31 32 (3 generated tokens)
    prompt = [dims["omni_im_start"], dims["omni_user"], 20, 21, dims["omni_im_end"], dims["omni_im_start"],
              dims["omni_assistant"]]
    sequence = np.array(prompt + [30, 31, 32], np.int64)
    talker_in = {om.SEQUENCE: sequence, om.PROMPT_LEN: _i32(len(prompt)),
                 om.THINKER_EMBEDS: np.zeros((len(sequence) - 1, hid), np.float32),
                 om.THINKER_HIDDEN: np.zeros((len(sequence) - 1, hid), np.float32),
                 om.TTS_EMBEDS: np.zeros((3, hid), np.float32)}
    table = {
        "llm": {chat.MESSAGES: messages, chat.SAMPLING_PARAMETERS: sampling},
        "llm_tts": {chat.MESSAGES: messages, chat.SAMPLING_PARAMETERS: sampling,
                    chat.MODALITIES: _u8(json.dumps(["text", "audio"]))},
        "qwen3_omni": {chat.MESSAGES: messages, chat.SAMPLING_PARAMETERS: sampling,
                 chat.MODALITIES: _u8(json.dumps(["text", "audio"])), chat.MAX_AUDIO_FRAMES: _i32(8)},
        "qwen3_omni_thinker": {chat.MESSAGES: messages, chat.SAMPLING_PARAMETERS: sampling,
                         om.TALKER_INPUTS: np.array([True])},
        "qwen3_omni_talker": {**talker_in, speech.MAX_FRAMES: _i32(8)},
        "qwen3_omni_code2wav": {cd.CODES: np.zeros((frames, groups), np.int64), cd.LEFT_CONTEXT: _i32(0)},
        "piper": {speech.TEXT: _u8(_TEXT)},
        "csm": {speech.TEXT: _u8(_TEXT), speech.MAX_FRAMES: _i32(8)},
        "csm_talker": {speech.TEXT: _u8(_TEXT), speech.MAX_FRAMES: _i32(8)},
        "csm_code2wav": {cd.CODES: np.zeros((frames, dims["csm_codebooks"]), np.int64),
                         cd.LEFT_CONTEXT: _i32(0)},
        "qwen_image": image_in,
        "qwen_image_edit": {**image_in, qi.INPUT_IMAGE: rgb},
        "qwen_image_text_encoder": {qi.PROMPT: image_in[qi.PROMPT], qi.NEGATIVE_PROMPT: _u8("")},
        "qwen_image_edit_text_encoder": {qi.PROMPT: image_in[qi.PROMPT], qi.IMAGE: rgb},
        "qwen_image_edit_vae_encoder": {qi.IMAGE: rgb},
        "qwen_image_denoiser": denoise,
        "qwen_image_edit_denoiser": {**denoise, qi.IMAGE: rgb,
                                     qi.IMAGE_LATENTS: np.zeros(
                                         (dims["image_z_dim"], 1, dims["edit_condition_latent"],
                                          dims["edit_condition_latent"]), np.float32)},
        "qwen_image_vae_decoder": {qi.LATENTS: np.zeros(((lat // 2) ** 2, dims["image_packed_channels"]),
                                                           np.float32),
                                   qi.HEIGHT: _i32(_SIZE), qi.WIDTH: _i32(_SIZE)},
    }
    table["qwen_image_edit_vae_decoder"] = table["qwen_image_vae_decoder"]
    # inpaint: a grey 32x32 image, its top half to repaint (MASK 255, diffusers' convention)
    mask = np.zeros((_SIZE, _SIZE), np.uint8)
    mask[: _SIZE // 2] = 255
    strength = np.array([0.6], np.float64)
    table["qwen_image_inpaint"] = {**image_in, qi.INPUT_IMAGE: rgb, qi.MASK: mask, qi.STRENGTH: strength}
    table["qwen_image_inpaint_vae_encoder"] = {qi.IMAGE: rgb, qi.MASK: mask, qi.HEIGHT: _i32(_SIZE),
                                               qi.WIDTH: _i32(_SIZE), qi.PROMPT: image_in[qi.PROMPT]}
    table["qwen_image_inpaint_denoiser"] = {**denoise, qi.IMAGE: rgb, qi.MASK: mask, qi.STRENGTH: strength,
                                            qi.IMAGE_MOMENTS: np.zeros((2 * dims["image_z_dim"], 1, lat, lat),
                                                                       np.float32)}
    # Qwen-Image-Edit-Plus: one condition image, packed (contracts.image.pack_images)
    pixels, sizes = qi.pack_images([rgb])
    plus_images = {qi.IMAGES: pixels, qi.IMAGE_SIZES: sizes}
    cond = dims["edit_condition_latent"] // 2  # 2x2 patches of the ~1024x1024 px condition latents
    table.update({
        "qwen_image_edit_plus": {**image_in, qi.INPUT_IMAGES: pixels, qi.INPUT_IMAGE_SIZES: sizes},
        "qwen_image_edit_plus_vae_encoder": plus_images,
        "qwen_image_edit_plus_text_encoder": {qi.PROMPT: image_in[qi.PROMPT], **plus_images},
        "qwen_image_edit_plus_denoiser": {**denoise, **plus_images, qi.IMAGE_LATENTS: np.zeros(
            (cond * cond, dims["image_packed_channels"]), np.float32)},
        "qwen_image_edit_plus_vae_decoder": table["qwen_image_vae_decoder"],
    })
    # Qwen2.5-Omni: the omni tensors (qwen2.5-omni-tiny has qwen3-omni-tiny's ChatML ids and H = 64)
    omni = ("qwen3_omni", "qwen3_omni_thinker", "qwen3_omni_talker")
    table.update({f"qwen2_5_{k[len('qwen3_'):]}": table[k] for k in omni})
    table["qwen2_5_omni_token2wav"] = {cd.CODES: np.zeros(8, np.int64), chat.VOICE: _u8("Chelsie"),
                                      qi.SEED: np.array([0], np.int64)}
    # video: 32x32 px, 5 frames (4k+1), 2 steps, CFG off (no negative embeddings needed)
    video_req = {wan.HEIGHT: _i32(_SIZE), wan.WIDTH: _i32(_SIZE), wan.NUM_FRAMES: _i32(5),
                 wan.NUM_INFERENCE_STEPS: _i32(2), wan.GUIDANCE_SCALE: _f32(1.0),
                 wan.SEED: np.array([0], np.int64)}
    vs = _SIZE // dims["video_vae_scale"]
    table["wan_t2v"] = {wan.PROMPT: _u8("a red square"), **video_req}
    table["wan_t2v_text_encoder"] = {wan.PROMPT: _u8("a red square"), wan.NEGATIVE_PROMPT: _u8("")}
    table["wan_t2v_denoiser"] = {wan.PROMPT_EMBEDS: np.zeros((4, dims["video_text_dim"]), np.float32), **video_req}
    table["wan_t2v_vae_decoder"] = {wan.LATENTS: np.zeros((dims["video_z_dim"], 2, vs, vs), np.float32)}
    # image-to-video: a grey 32x32 reference frame; its condition latents [z, 2, 4, 4] for 5 frames
    reference = np.full((_SIZE, _SIZE, 3), 128, np.uint8)
    table["wan_i2v"] = {**table["wan_t2v"], wan.INPUT_IMAGE: reference}
    table["wan_i2v_vae_encoder"] = {wan.INPUT_IMAGE: reference, wan.NUM_FRAMES: _i32(5)}
    table["wan_i2v_denoiser"] = {**table["wan_t2v_denoiser"],
                                 wan.CONDITION_LATENTS: np.zeros((dims["video_z_dim"], 2, vs, vs), np.float32)}
    # qwen3-tts-tiny: 4 code groups; a 1 s clip at 16 kHz for the clone prompt
    table["qwen3_tts"] = {speech.TEXT: _u8(_TEXT), qwen3_tts.VOICE: _u8("vivian"), speech.MAX_FRAMES: _i32(8)}
    table["qwen3_tts_talker"] = {**table["qwen3_tts"], qwen3_tts.TASK: _u8("custom_voice")}
    table["qwen3_tts_code2wav"] = {cd.CODES: np.zeros((frames, 4), np.int64), cd.LEFT_CONTEXT: _i32(0)}
    table["qwen3_tts_voice_prompt"] = {
        qwen3_tts.REF_AUDIO: (np.sin(np.arange(16000) * 0.08) * 0.3).astype(np.float32),
        qwen3_tts.REF_SAMPLE_RATE: _i32(16000), qwen3_tts.X_VECTOR_ONLY: np.array([True])}
    # ASR: 1 s of a 440 Hz tone at 16 kHz; the decoder gets zero encoder states of the tiny Whisper
    tone = (np.sin(np.arange(asr.SAMPLE_RATE) * 2 * np.pi * 440 / asr.SAMPLE_RATE) * 0.3).astype(np.float32)
    table["whisper"] = {speech.AUDIO: tone, asr.LANGUAGE: _u8("en")}
    table["pocketsphinx"] = {speech.AUDIO: tone, asr.LANGUAGE: _u8("en")}
    table["whisper_encoder"] = {speech.AUDIO: tone}
    table["whisper_decoder"] = {wh.ENCODER_HIDDEN: np.zeros((1500, dims["whisper_d_model"]), np.float32),
                                asr.LANGUAGE: _u8("en"), wh.MAX_NEW_TOKENS: _i32(8)}
    # Stable Audio Open: a 1 s clip, 4 steps, CFG with a blank negative prompt (unconditional
    # embeddings and masks zero-filled at the tiny checkpoint's sizes)
    span = {sa.AUDIO_START_S: np.array([0.0]), sa.AUDIO_END_S: np.array([1.0])}
    audio_req = {**span, sa.NUM_INFERENCE_STEPS: _i32(4), sa.GUIDANCE_SCALE: _f32(7.0),
                 sa.SEED: np.array([0], np.int64)}
    text_len, text_dim = dims["audio_text_len"], dims["audio_text_dim"]
    embeds = np.zeros((text_len, text_dim), np.float32)
    mask = np.ones(text_len, np.int64)
    table["stable_audio"] = {sa.PROMPT: _u8("rain on a tin roof"), **audio_req}
    table["stable_audio_text_encoder"] = {sa.PROMPT: _u8("rain on a tin roof"), sa.NEGATIVE_PROMPT: _u8("")}
    table["stable_audio_denoiser"] = {sa.PROMPT_EMBEDS: embeds, sa.ATTENTION_MASK: mask,
                                      sa.NEGATIVE_PROMPT_EMBEDS: embeds, sa.NEGATIVE_ATTENTION_MASK: mask,
                                      **audio_req}
    table["stable_audio_vae_decoder"] = {
        sa.LATENTS: np.zeros((dims["audio_latent_channels"], dims["audio_latent_len"]), np.float32), **span}
    return table[model]


def perf_json(inputs: dict[str, np.ndarray]) -> dict:
    """perf_analyzer's ``--input-data`` document for one request.

    Args:
        inputs: name -> array with the contract's dims (batch dimension excluded; for the
            non-batched models the contract's dims are the full shape).
    """
    entry = {}
    for name, array in inputs.items():
        if array.dtype == np.object_:
            content = [v.decode("utf-8") for v in array.reshape(-1)]
        elif array.dtype == np.bool_:
            content = [bool(v) for v in array.reshape(-1)]
        else:
            content = array.reshape(-1).tolist()
        entry[name] = {"content": content, "shape": list(array.shape)}
    return {"data": [entry]}


def write_all(outdir: Path, models: list[str] | None = None) -> list[Path]:
    """Write ``outdir/<model>/input_data.json`` for ``models`` (default: all); returns the paths."""
    paths = []
    for model in models or sorted(CONTRACTS):
        path = outdir / model / "input_data.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = perf_json(example_inputs(model))
        path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
        paths.append(path)
    return paths


def perf_command(model: str, data_file: Path, url: str = "localhost:8001", *,
                 perf_analyzer: str = "perf_analyzer", extra: list[str] = (),
                 admin_key: str | None = None) -> list[str]:
    """The perf_analyzer argv for ``model`` over gRPC: ``--streaming`` for decoupled models
    (perf_analyzer needs it for them and measures until the final response), batch size 1.

    Args:
        model: a key of :data:`CONTRACTS`.
        data_file: its ``input_data.json``.
        url: Triton's gRPC ``host:port``.
        perf_analyzer: the executable (``scripts/perf_runner.sh``'s ``bin/perf_analyzer`` here).
        extra: more perf_analyzer options, appended (later ones win).
        admin_key: the key of Triton's restricted APIs (perf_analyzer reads the model config
            first), sent with ``-H``. Note: perf_analyzer takes headers on its command line only.
    """
    argv = [perf_analyzer, "-m", model, "-i", "grpc", "-u", url, "--input-data", str(data_file), "-b", "1"]
    if admin_key:
        from omni_triton import triton_admin

        argv += ["-H", f"{triton_admin.GRPC_HEADER}:{admin_key}"]
    if CONTRACTS[model].decoupled:
        argv.append("--streaming")
    return argv + list(extra)


#: Options for a short, bounded measurement that ends on a busy (shared) machine: a few windows of a
#: few requests each, and any stability accepted (a timing taken on a shared machine is no result).
QUICK_OPTIONS = ("--measurement-mode", "count_windows", "--measurement-request-count", "5",
                 "--stability-percentage", "1000", "--max-trials", "3")


def read_csv(path: Path) -> list[dict[str, float]]:
    """Rows of perf_analyzer's ``-f`` CSV export, one per concurrency level, as numbers.

    Columns used: ``Concurrency``, ``Inferences/Second`` (throughput, requests/s at batch 1) and
    ``p50 latency`` ... ``p99 latency`` (microseconds; for a streaming model, time to the first
    response).

    Raises:
        ValueError: the file has no data row or a non-numeric cell.
    """
    import csv

    with open(path, newline="") as f:
        rows = [{k: float(v) for k, v in row.items() if k} for row in csv.DictReader(f)]
    if not rows:
        raise ValueError(f"{path}: no measurement row")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    gen = sub.add_parser("write", help="write OUTDIR/<model>/input_data.json")
    gen.add_argument("outdir", type=Path)
    gen.add_argument("--models", default="", help="comma-separated (default: all)")
    cmd = sub.add_parser("command", help="print the perf_analyzer argv for MODEL, one per line")
    cmd.add_argument("model", choices=sorted(CONTRACTS))
    cmd.add_argument("--data", type=Path, required=True)
    cmd.add_argument("--url", default="localhost:8001")
    cmd.add_argument("--perf-analyzer", default="perf_analyzer")
    args = parser.parse_args(argv)
    if args.cmd == "command":
        from omni_triton import triton_admin

        print("\n".join(perf_command(args.model, args.data, args.url, perf_analyzer=args.perf_analyzer,
                                     admin_key=triton_admin.key_from_env())))
        return 0
    for path in write_all(args.outdir, [m for m in args.models.split(",") if m] or None):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
