"""The reference side of the Qwen3-Omni media parity tests (tests/unit/test_qwen3_omni_media.py,
tests/e2e/test_omni_media.py): transformers' own ``Qwen3OmniMoeProcessor`` on an OpenAI chat turn,
with none of the project's processor, template or tokenizer code. Media bytes are decoded with
soundfile + soxr (audio, resampled to the feature extractor's 16 kHz) and Pillow (image)."""
from __future__ import annotations

import base64
import io

import numpy as np

# what the real Qwen3-Omni tokenizer_config.json names as its multimodal tokens (the tiny
# checkpoint's tokenizer files leave them out; the vocabulary has them)
MEDIA_TOKENS = {"image_token": "<|image_pad|>", "audio_token": "<|audio_pad|>", "video_token": "<|video_pad|>",
                "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
                "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>"}


def transformers_processor(path):
    """transformers' ``Qwen3OmniMoeProcessor`` on the checkpoint's files (``path`` must hold the
    processor files, ``omni_triton.checkpoints.qwen3_omni.write_processor_files``). Its video
    processor (``Qwen2VLVideoProcessor``) needs torchvision, which is not installed: the audio and
    image cases use none, so a stand-in holding only the ``merge_size`` / ``temporal_patch_size``
    that the placeholder expansion reads takes its place (``from_pretrained`` would fail on it)."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer, Qwen3OmniMoeProcessor, WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    class WithoutVideo(Qwen3OmniMoeProcessor):
        def check_argument_for_proper_class(self, name, arg):
            return None if name == "video_processor" else super().check_argument_for_proper_class(name, arg)

    image = Qwen2VLImageProcessorPil.from_pretrained(path)
    return WithoutVideo(
        image_processor=image, feature_extractor=WhisperFeatureExtractor.from_pretrained(path),
        video_processor=SimpleNamespace(merge_size=image.merge_size, temporal_patch_size=image.temporal_patch_size,
                                        model_input_names=["pixel_values_videos", "video_grid_thw"]),
        tokenizer=AutoTokenizer.from_pretrained(path, extra_special_tokens=MEDIA_TOKENS),
        chat_template=(path / "chat_template.jinja").read_text())


def _transformers_content(part, sampling_rate):
    """An OpenAI content part -> (transformers chat content item, processor keyword, media)."""
    import soundfile as sf
    import soxr
    from PIL import Image

    if part["type"] == "input_audio":
        wav, rate = sf.read(io.BytesIO(base64.b64decode(part["input_audio"]["data"])), dtype="float32")
        wav = soxr.resample(wav, rate, sampling_rate).astype(np.float32)
        return {"type": "audio", "audio": wav}, "audio", wav
    img = Image.open(io.BytesIO(base64.b64decode(part["image_url"]["url"].split(",", 1)[1]))).convert("RGB")
    return {"type": "image", "image": img}, "images", img


def transformers_inputs(proc, messages):
    """One user turn (OpenAI messages: text + mono ``input_audio`` / data-URL ``image_url`` parts)
    -> the processor's torch tensors (``input_ids`` int64 [1, L], ``input_features`` float32
    [A, 128, F], ``feature_attention_mask`` [A, F], ``pixel_values`` float32 [P, C*t*p*p],
    ``image_grid_thw`` [I, 3]; only the modalities present), with the generation prompt."""
    (turn,) = messages
    content, media = [], {}
    for part in turn["content"]:
        if part["type"] == "text":
            content.append(part)
        else:
            item, key, value = _transformers_content(part, proc.feature_extractor.sampling_rate)
            content.append(item)
            media.setdefault(key, []).append(value)
    text = proc.apply_chat_template([{"role": turn["role"], "content": content}], add_generation_prompt=True,
                                    tokenize=False)
    return proc(text=text, return_tensors="pt", **media)
