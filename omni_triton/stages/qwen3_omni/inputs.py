"""Multimodal inputs of the Qwen3-Omni thinker: decoded media -> the processor's tensors
(:class:`MultimodalInputs`), and the prompt expansion of the audio/image/video placeholders.

The processor is transformers' ``Qwen3OmniMoeProcessor`` in parts, without torchvision (which
this CPU stack cannot install): its ``WhisperFeatureExtractor`` (numpy) for audio,
``Qwen2VLImageProcessorPil`` (Pillow/numpy, the "slow" image processor) for images, and for
video (``Qwen2VLVideoProcessor`` needs torchvision) a stated workaround: every sampled frame
goes through the same PIL image processor at the size ``smart_resize`` picks for the first
frame, then the frames are cut into ``temporal_patch_size`` x ``patch_size``^2 patches with the
exact reshape/transpose of ``Qwen2VLVideoProcessor.patchify`` (:func:`patchify_video`). The
placeholder expansion is the reference's own ``replace_multimodal_special_tokens``.

Tensors (made in ``qwen3_omni_thinker`` from the data parts of MESSAGES; its last response hands the
talker ``MultimodalInputs.talker_arrays``, names in ``omni_triton.contracts.qwen3_omni``):
``input_features`` float32 [A, M, F] (log-mel, M mel bins, F frames at 100/s),
``feature_attention_mask`` int32 [A, F]; ``pixel_values`` float32 [P, C*t*p*p] (all images'
patches), ``image_grid_thw`` int64 [I, 3]; ``pixel_values_videos`` float32 [Pv, C*t*p*p],
``video_grid_thw`` int64 [V, 3], ``video_second_per_grid`` float32 [V] (seconds per temporal
patch). A, I, V: audio clips, images, videos in message order.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from omni_triton.contracts import qwen3_omni as q3_contract
from omni_triton.contracts.chat import ChatInputError
from omni_triton.media.inputs import MediaLimits

AUDIO_TOKEN, IMAGE_TOKEN, VIDEO_TOKEN = "<|audio_pad|>", "<|image_pad|>", "<|video_pad|>"


@dataclass
class MultimodalInputs:
    """The processor's tensors for one request (numpy; shapes in the module docstring). Fields of
    a modality that is absent are None."""

    input_features: np.ndarray | None = None
    feature_attention_mask: np.ndarray | None = None
    pixel_values: np.ndarray | None = None
    image_grid_thw: np.ndarray | None = None
    pixel_values_videos: np.ndarray | None = None
    video_grid_thw: np.ndarray | None = None
    video_second_per_grid: np.ndarray | None = None

    @property
    def counts(self) -> dict[str, int]:
        """Number of audio clips, images and videos."""
        n = lambda a: 0 if a is None else int(a.shape[0])  # noqa: E731
        return {"audio": n(self.input_features), "image": n(self.image_grid_thw), "video": n(self.video_grid_thw)}

    @property
    def empty(self) -> bool:
        return not any(self.counts.values())

    def thinker_kwargs(self) -> dict:
        """torch tensors for ``thinker.generate`` / the reference ``generate`` (only those given)."""
        import torch

        out = {}
        for name, value in self.__dict__.items():
            if value is not None:
                t = torch.from_numpy(np.ascontiguousarray(value))
                out[name] = t.long() if name in ("feature_attention_mask", "image_grid_thw", "video_grid_thw") else t
        return out

    def talker_arrays(self) -> dict[str, np.ndarray]:
        """What the reference ``generate`` also passes to ``talker.generate`` (its 3D rope
        positions of the media tokens), numpy: ``audio_feature_lengths`` int64 [A] (the feature
        mask's sums), ``image_grid_thw`` / ``video_grid_thw`` int64 [n, 3],
        ``video_second_per_grid`` float32 [V]; only those present."""
        out = {k: getattr(self, k) for k in ("image_grid_thw", "video_grid_thw", "video_second_per_grid")
               if getattr(self, k) is not None}
        if self.feature_attention_mask is not None:
            out["audio_feature_lengths"] = self.feature_attention_mask.sum(axis=1).astype(np.int64)
        return out


def talker_media_kwargs(arrays: dict | None) -> dict:
    """:meth:`MultimodalInputs.talker_arrays` as the torch keyword arguments of ``talker.generate``
    (int64 grids / lengths, float32 seconds per grid); {} for text-only requests."""
    import torch

    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in (arrays or {}).items()}


@dataclass
class MediaItem:
    """One decoded media part: ``kind`` audio (``data`` float32 PCM [S] at the feature
    extractor's rate), image (RGB ``PIL.Image``) or video (``data`` list of uint8 [H, W, 3]
    frames, ``fps`` the sampling rate)."""

    kind: str
    data: object
    fps: float = 0.0


@dataclass
class OmniProcessor:
    """The processor parts of a Qwen3-Omni checkpoint (see the module docstring)."""

    feature_extractor: object
    image_processor: object
    n_window: int = 50
    position_id_per_seconds: float = 13.0
    seconds_per_chunk: float = 2.0
    limits: MediaLimits = field(default_factory=MediaLimits)

    @classmethod
    def from_pretrained(cls, model_dir, limits: MediaLimits | None = None) -> OmniProcessor:
        """Loads ``preprocessor_config.json`` (one file holds the feature extractor's and the image
        processor's fields, as in Qwen/Qwen3-Omni-30B-A3B-Instruct) and ``config.json``."""
        from transformers import WhisperFeatureExtractor
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        n_window = int(cfg["thinker_config"]["audio_config"].get("n_window", 50))
        return cls(WhisperFeatureExtractor.from_pretrained(model_dir),
                   Qwen2VLImageProcessorPil.from_pretrained(model_dir),
                   n_window=n_window, limits=limits or MediaLimits())

    @property
    def sampling_rate(self) -> int:
        """Hz of the PCM the feature extractor takes (16000)."""
        return int(self.feature_extractor.sampling_rate)

    def __call__(self, items: Iterable[MediaItem]) -> MultimodalInputs:
        """Run the processor parts on the media of one request (message order kept per modality).

        Raises:
            ChatInputError: an image or frame the image processor cannot take (e.g. smaller than
                one patch after resizing is impossible: the processor upsizes, so this is rare).
        """
        items = list(items)
        out = MultimodalInputs()
        audio = [i.data for i in items if i.kind == "audio"]
        if audio:
            feats = self.feature_extractor(audio, sampling_rate=self.sampling_rate, padding=True, truncation=False,
                                           return_attention_mask=True, return_tensors="np")
            out.input_features = feats["input_features"].astype(np.float32)
            out.feature_attention_mask = feats["attention_mask"].astype(np.int32)
        images = [i.data for i in items if i.kind == "image"]
        try:
            if images:
                px = self.image_processor(images=images, return_tensors="np")
                out.pixel_values = np.asarray(px["pixel_values"], np.float32)
                out.image_grid_thw = np.asarray(px["image_grid_thw"], np.int64)
            videos = [i for i in items if i.kind == "video"]
            if videos:
                pv, grids, spg = [], [], []
                for v in videos:
                    patches, grid = self.video_patches(v.data)
                    pv.append(patches)
                    grids.append(grid)
                    spg.append(self.image_processor.temporal_patch_size / v.fps)
                out.pixel_values_videos = np.concatenate(pv).astype(np.float32)
                out.video_grid_thw = np.asarray(grids, np.int64)
                out.video_second_per_grid = np.asarray(spg, np.float32)
        except ValueError as exc:
            raise ChatInputError(f"image processor: {exc}") from None
        return out

    def video_patches(self, frames: list[np.ndarray]) -> tuple[np.ndarray, tuple[int, int, int]]:
        """Frames uint8 [H, W, 3] -> (patches float32 [t*h*w, C*T*p*p], (t, h, w)): each frame
        resized/rescaled/normalised by the PIL image processor to one ``smart_resize`` size, then
        :func:`patchify_video` (the torchvision-free stand-in for ``Qwen2VLVideoProcessor``)."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        ip = self.image_processor
        h, w = frames[0].shape[:2]
        factor = ip.patch_size * ip.merge_size
        rh, rw = smart_resize(h, w, factor=factor, min_pixels=ip.size["shortest_edge"],
                              max_pixels=ip.size["longest_edge"])
        from PIL import Image

        per_frame = []
        for f in frames:
            img = Image.fromarray(np.ascontiguousarray(f)).resize((rw, rh), resample=Image.Resampling.BICUBIC)
            px = ip(images=[img], do_resize=False, return_tensors="np")["pixel_values"]
            # px: the image's patches with the frame repeated over the temporal axis; undo that to
            # get the normalised frame back in [C, H, W] (exact: a broadcast, no arithmetic)
            per_frame.append(unpatchify_image(np.asarray(px, np.float32), rh, rw, ip.patch_size, ip.merge_size,
                                              ip.temporal_patch_size))
        return patchify_video(np.stack(per_frame), ip.patch_size, ip.merge_size, ip.temporal_patch_size)

    def expand_prompt(self, text: str, mm: MultimodalInputs) -> str:
        """The chat-templated ``text`` with each ``<|audio_pad|>`` / ``<|image_pad|>`` /
        ``<|video_pad|>`` repeated as many times as its encoder outputs tokens (the reference
        processor's ``replace_multimodal_special_tokens``).

        Raises:
            ChatInputError: the placeholders in ``text`` do not match the media counts.
        """
        from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import (
            Qwen3OmniMoeProcessor,
            _get_feat_extract_output_lengths,
        )

        counts = mm.counts
        found = {"audio": text.count(AUDIO_TOKEN), "image": text.count(IMAGE_TOKEN), "video": text.count(VIDEO_TOKEN)}
        if found != counts:
            raise ChatInputError(f"the prompt has {found} media placeholders but the request carries {counts}")
        audio_lengths = [] if mm.feature_attention_mask is None else list(
            _get_feat_extract_output_lengths(mm.feature_attention_mask.sum(-1), self.n_window))
        merge = SimpleNamespace(merge_size=self.image_processor.merge_size)
        this = SimpleNamespace(
            image_processor=merge, video_processor=merge, audio_token=AUDIO_TOKEN, image_token=IMAGE_TOKEN,
            video_token=VIDEO_TOKEN, vision_bos_token="<|vision_start|>", vision_eos_token="<|vision_end|>",
            audio_bos_token="<|audio_start|>", audio_eos_token="<|audio_end|>")
        grids = lambda a: iter([] if a is None else list(a))  # noqa: E731
        return Qwen3OmniMoeProcessor.replace_multimodal_special_tokens(
            this, [text], iter(audio_lengths), grids(mm.image_grid_thw), grids(mm.video_grid_thw),
            video_second_per_grid=grids(mm.video_second_per_grid), use_audio_in_video=False,
            position_id_per_seconds=self.position_id_per_seconds, seconds_per_chunk=self.seconds_per_chunk)[0]


def unpatchify_image(patches: np.ndarray, height: int, width: int, patch: int, merge: int, temporal: int) -> np.ndarray:
    """Inverse of ``Qwen2VLImageProcessorPil.patchify`` for one image: [gh*gw, C*T*p*p] -> [C, H, W]
    (the first of the T identical temporal copies)."""
    gh, gw = height // patch, width // patch
    c = patches.shape[1] // (temporal * patch * patch)
    x = patches.reshape(gh // merge, gw // merge, merge, merge, c, temporal, patch, patch)[:, :, :, :, :, 0]
    # (gh/m, gw/m, mh, mw, C, ph, pw) -> (C, gh/m, mh, ph, gw/m, mw, pw)
    return np.ascontiguousarray(x.transpose(4, 0, 2, 5, 1, 3, 6)).reshape(c, height, width)


def patchify_video(frames: np.ndarray, patch: int, merge: int,
                   temporal: int) -> tuple[np.ndarray, tuple[int, int, int]]:
    """``Qwen2VLVideoProcessor.patchify`` in numpy for one video: frames float32 [N, C, H, W] ->
    (patches [t*gh*gw, C*T*p*p], (t, gh, gw)), the last frame repeated up to a multiple of T."""
    n, c, h, w = frames.shape
    if pad := -n % temporal:
        frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
        n += pad
    t, gh, gw = n // temporal, h // patch, w // patch
    x = frames.reshape(t, temporal, c, gh // merge, merge, patch, gw // merge, merge, patch)
    # torch: view(B, t, T, C, gh/m, m, p, gw/m, m, p).permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9), no batch here
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x).reshape(t * gh * gw, c * temporal * patch * patch), (t, gh, gw)


#: modalities ``qwen3_omni`` takes in content parts (``parse_messages(accept=...)``; the contract's)
MEDIA_ACCEPT = q3_contract.MEDIA_ACCEPT


def decode_parts(parts: list[dict], processor: OmniProcessor) -> list[MediaItem]:
    """Decode media content parts (``input_audio``, ``image_url``/``video_url`` data URLs) into
    :class:`MediaItem` s under ``processor.limits``.

    Raises:
        MediaInputError: bad base64 / data URL, undecodable, over a limit; an http(s) URL (the
            frontend fetches those, when enabled, and sends data URLs).
    """
    from omni_triton.media import inputs as mi

    lim = processor.limits
    if len(parts) > lim.max_parts:
        raise mi.MediaInputError(f"{len(parts)} media parts; at most {lim.max_parts} per request")
    items = []
    for k, p in enumerate(parts):
        kind = p["type"]
        what = f"media part {k} ({kind})"
        if kind == "input_audio":
            data = mi.b64decode(p[kind]["data"], what, lim.max_part_bytes)
            audio = mi.decode_audio(data, what, processor.sampling_rate, lim.max_audio_seconds)
            items.append(MediaItem("audio", audio))
            continue
        url = p[kind]["url"]
        if not url.lower().startswith("data:"):
            raise mi.MediaInputError(f"{what}: only data URLs reach the model (http(s) URLs are fetched by the "
                                     "frontend when it allows them)")
        mime, data = mi.parse_data_url(url, what, lim.max_part_bytes)
        if kind == "image_url":
            items.append(MediaItem("image", mi.decode_image(data, what, lim.max_image_pixels)))
        else:
            frames, fps = mi.sample_video_frames(data, what, lim)
            items.append(MediaItem("video", frames, fps))
    return items


def prepare_media(messages: list[dict], processor: OmniProcessor, given: MultimodalInputs | None
                  ) -> tuple[list[dict], MultimodalInputs | None]:
    """Parsed messages (``parse_messages(accept=MEDIA_ACCEPT)``) -> (messages with placeholders,
    their tensors or None for text only). Media data parts are decoded and processed here;
    placeholder parts take ``given`` (tensors a caller already made; in Triton the ``qwen3_omni``
    BLS sends data parts, so ``qwen3_omni_thinker`` processes them here).

    Raises:
        ChatInputError / MediaInputError: data and placeholder parts mixed, tensors without
            placeholders (or the reverse), what :func:`decode_parts` rejects.
    """
    from omni_triton.contracts.chat import media_parts, placeholder_messages

    parts = media_parts(messages)
    given = None if given is None or given.empty else given
    data = [p for p in parts if p["type"] not in ("audio", "image", "video")]
    if not parts:
        if given is not None:
            raise ChatInputError("media tensors were sent but MESSAGES has no media parts")
        return messages, None
    if data and len(data) != len(parts):
        raise ChatInputError("MESSAGES mixes media data parts and placeholders")
    if data:
        if given is not None:
            raise ChatInputError("media tensors were sent with media data parts: send one or the other")
        given = processor(decode_parts(data, processor))
    elif given is None:
        raise ChatInputError("MESSAGES has media placeholders but no media tensors were sent")
    return placeholder_messages(messages), given
