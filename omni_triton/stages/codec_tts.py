"""Codec-token TTS stage: CSM talker -> Mimi code2wav, with chunked streaming decode.

Architecture (transformers ``CsmForConditionalGeneration``, Sesame's CSM):
- the **backbone** (Llama-style decoder over text tokens and audio frames) predicts codebook 0 of
  the next codec frame;
- the **depth decoder** (small decoder, one position per codebook) predicts codebooks 1..K-1 of
  that frame from the backbone's last hidden state;
- the **codec** (transformers ``MimiModel``, Kyutai's Mimi) decodes a [K, T] code matrix into
  24 kHz mono PCM, ``samples_per_frame = sampling_rate / frame_rate`` samples per frame
  (1920 at Mimi's 12.5 Hz).

Data contract (what the Triton models in ``model_repository/tts_*`` carry, see
``docs/speech_contracts.md``):
- codec frames: ``np.int64`` arrays of shape ``[T, num_codebooks]`` (frame-major; Mimi itself wants
  ``[batch, num_codebooks, T]``, the transpose happens inside :class:`CodecDecoder`);
- audio: ``np.float32`` mono PCM in [-1, 1] at ``CodecDecoder.sampling_rate`` Hz.

No checkpoint can be downloaded here, so :func:`build_tiny_csm` makes a tiny random-weight CSM
(+ tiny Mimi + locally trained tokenizer) and saves it with ``save_pretrained``; everything else
loads it with ``from_pretrained`` exactly as it would load ``sesame/csm-1b``.

Chunked streaming follows vLLM-Omni's Qwen3-TTS code2wav scheme (25-frame chunks decoded with
25 frames of left context, a smaller first chunk for a low time-to-first-packet); see
:func:`chunk_schedule`.
"""
from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

MANIFEST = "manifest.json"
CODEC_SUBDIR = "codec"
BUILDER_VERSION = 1

# Small English text the tiny byte-level BPE tokenizer is trained on (any text works: byte-level
# BPE can encode every string; merges only make common words shorter).
_TRAIN_TEXT = """\
The quick brown fox jumps over the lazy dog. Hello, world! How are you today?
Omni Triton serves speech, text, images and video with NVIDIA Triton Inference Server.
This is a test of the text to speech system. The weather is nice and the sky is blue.
She sells sea shells by the sea shore. Peter Piper picked a peck of pickled peppers.
One, two, three, four, five, six, seven, eight, nine, ten. Good morning and good night.
A streaming talker generates codec frames; the codec decoder turns them into audio.
What time is it? It is half past nine. Please speak slowly and clearly, thank you.
"""

BOS, EOS, AUDIO, AUDIO_EOS = "<|begin_of_text|>", "<|end_of_text|>", "<|AUDIO|>", "<|audio_eos|>"

# Text-only version of sesame/csm-1b's chat template: each turn is "<bos>[speaker]text<eos>".
_CHAT_TEMPLATE = (
    "{%- for message in messages %}{%- for item in message['content'] %}"
    "{%- if item['type'] == 'text' %}"
    "{{- '<|begin_of_text|>[' + message['role'] + ']' + item['text'] + '<|end_of_text|>' }}"
    "{%- elif item['type'] == 'audio' %}{{- '<|AUDIO|><|audio_eos|>' }}{%- endif %}"
    "{%- endfor %}{%- endfor %}"
)


@dataclass(frozen=True)
class TinyCsmSpec:
    """Sizes of the tiny random CSM. Real csm-1b: 32 codebooks, vocab 2051 (2048 codes + 3 ids),
    backbone 2048x16, depth decoder 1024x4, Mimi hidden 512."""

    num_codebooks: int = 8
    codebook_size: int = 64  # Mimi codes per codebook; CSM vocab = codebook_size + 3 specials
    backbone_hidden: int = 64
    backbone_layers: int = 2
    depth_hidden: int = 32
    depth_layers: int = 1
    mimi_hidden: int = 32
    mimi_filters: int = 8
    mimi_layers: int = 1
    num_speakers: int = 4
    default_min_frames: int = 8
    default_max_frames: int = 100
    emit_frames: int = 1
    last_conv_scale: float = 0.05

    def config_hash(self, seed: int) -> str:
        blob = json.dumps({"spec": self.__dict__, "seed": seed, "v": BUILDER_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _train_tokenizer():
    """Byte-level BPE trained on ``_TRAIN_TEXT``; specials are single tokens; the post-processor
    wraps every encoded text as ``<|begin_of_text|> ... <|end_of_text|>`` like csm-1b's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=[BOS, EOS, AUDIO, AUDIO_EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_TRAIN_TEXT.splitlines(), trainer=trainer)
    bos_id, eos_id = tok.token_to_id(BOS), tok.token_to_id(EOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}", pair=f"{BOS} $A {EOS} {BOS} $B {EOS}",
        special_tokens=[(BOS, bos_id), (EOS, eos_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=AUDIO,
        model_max_length=2048,
    )


def kaiming_init_conv_(mod: torch.nn.Module, gen: torch.Generator) -> None:
    """Kaiming-normal init of one ``Conv1d``/``ConvTranspose1d`` (fan-in from its weight shape),
    bias zeroed. Random codec decoders with their default conv init give ~1e-8 amplitude."""
    fan_in = mod.weight[0].numel() if isinstance(mod, torch.nn.Conv1d) else mod.weight.shape[0] // max(mod.groups, 1) * mod.weight.shape[-1]
    mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen) * (2.0 / max(fan_in, 1)) ** 0.5)
    if mod.bias is not None:
        mod.bias.zero_()


def kaiming_init_convs_(module: torch.nn.Module, gen: torch.Generator, last_conv: torch.nn.Module,
                        last_conv_scale: float) -> None:
    """Kaiming-init every conv of a random codec decoder (module order), then scale ``last_conv``
    (the one producing the waveform) by ``last_conv_scale`` so the output is noise-like, neither
    silent (~1e-8) nor clipped."""
    for mod in module.modules():
        if isinstance(mod, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
            kaiming_init_conv_(mod, gen)
    last_conv.weight.mul_(last_conv_scale)


def _init_codec_(codec: torch.nn.Module, spec: TinyCsmSpec, gen: torch.Generator) -> None:
    """Make a random Mimi audible: random codebook centroids (Mimi inits them to zeros, so every
    code would decode to the same vector) and kaiming-initialised convs, last conv scaled down so
    the output is noise-like, neither silent (~1e-8) nor clipped."""
    from transformers.models.mimi.modeling_mimi import MimiEuclideanCodebook

    for mod in codec.modules():  # one pass in module order (the RNG order the csm-tiny hash implies)
        if isinstance(mod, MimiEuclideanCodebook):
            mod.embed_sum.copy_(torch.randn(mod.embed_sum.shape, generator=gen))
            mod.cluster_usage.fill_(1.0)
            mod._embed = None
        elif isinstance(mod, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
            kaiming_init_conv_(mod, gen)
    last = [m for n, m in codec.named_modules() if n.startswith("decoder.") and isinstance(m, torch.nn.Conv1d)][-1]
    last.weight.mul_(spec.last_conv_scale)


def build_tiny_csm(out_dir: Path, seed: int = 0, spec: TinyCsmSpec | None = None) -> Path:
    """Build and save a tiny random-weight CSM checkpoint into ``out_dir``; return ``out_dir``.

    Writes (all via ``save_pretrained``): ``config.json`` + ``model.safetensors`` +
    ``generation_config.json`` (greedy; codebook special ids >= ``codebook_size`` suppressed in the
    backbone and, through the ``depth_decoder_*`` keys CSM uses, in the depth decoder too),
    the CsmProcessor files (byte-level BPE tokenizer, Encodec feature extractor, chat template),
    ``codec/`` (the same Mimi weights as ``codec_model``, loadable alone with
    ``MimiModel.from_pretrained``) and ``manifest.json`` (seed, config hash, talker defaults).
    Idempotent: returns at once when the manifest exists with the same hash.
    """
    spec = spec or TinyCsmSpec()
    return build_once(Path(out_dir), spec.config_hash(seed), lambda d, h: _build(d, seed, spec, h))


def build_once(out_dir: Path, config_hash: str, build: Callable[[Path, str], None]) -> Path:
    """Run ``build(out_dir, config_hash)`` unless ``out_dir/manifest.json`` already records
    ``config_hash``; return ``out_dir``. ``build`` must write the manifest last (it marks the build
    complete). Several Triton models may start at once and all find the folder missing: one builds
    under a file lock, the others wait on it and then see the finished manifest."""
    import fcntl

    if _manifest_hash(out_dir) == config_hash:
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / f".{out_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _manifest_hash(out_dir) == config_hash:
            return out_dir
        (out_dir / MANIFEST).unlink(missing_ok=True)
        out_dir.mkdir(parents=True, exist_ok=True)
        build(out_dir, config_hash)
    return out_dir


def _manifest_hash(out_dir: Path) -> str | None:
    try:
        return json.loads((out_dir / MANIFEST).read_text()).get("config_hash")
    except (OSError, ValueError):
        return None


def _build(out_dir: Path, seed: int, spec: TinyCsmSpec, h: str) -> None:
    from transformers import (
        CsmConfig, CsmForConditionalGeneration, CsmProcessor, EncodecFeatureExtractor, MimiConfig,
    )

    man_path = out_dir / MANIFEST
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)

    tokenizer = _train_tokenizer()
    fe = EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0)
    processor = CsmProcessor(feature_extractor=fe, tokenizer=tokenizer, chat_template=_CHAT_TEMPLATE)

    vocab = spec.codebook_size + 3  # like csm-1b: 2048 codes + 3 specials, pad = vocab - 1
    codec_cfg = MimiConfig(
        hidden_size=spec.mimi_hidden, num_filters=spec.mimi_filters, num_hidden_layers=spec.mimi_layers,
        intermediate_size=2 * spec.mimi_hidden, num_attention_heads=2, num_key_value_heads=2,
        codebook_size=spec.codebook_size, codebook_dim=16, vector_quantization_hidden_dimension=16,
        num_quantizers=spec.num_codebooks, num_semantic_quantizers=1,
        upsample_groups=spec.mimi_hidden,  # Mimi needs upsample_groups == hidden_size
        sliding_window=250, max_position_embeddings=8000,
    )
    depth_cfg = dict(
        num_codebooks=spec.num_codebooks, backbone_hidden_size=spec.backbone_hidden, vocab_size=vocab,
        hidden_size=spec.depth_hidden, intermediate_size=2 * spec.depth_hidden,
        num_hidden_layers=spec.depth_layers, num_attention_heads=2, num_key_value_heads=1,
        max_position_embeddings=spec.num_codebooks + 1,
    )
    cfg = CsmConfig(
        num_codebooks=spec.num_codebooks, vocab_size=vocab, text_vocab_size=len(tokenizer),
        hidden_size=spec.backbone_hidden, intermediate_size=2 * spec.backbone_hidden,
        num_hidden_layers=spec.backbone_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.pad_token_id,
        audio_token_id=tokenizer.convert_tokens_to_ids(AUDIO),
        audio_eos_token_id=tokenizer.convert_tokens_to_ids(AUDIO_EOS),
        codebook_pad_token_id=vocab - 1, codebook_eos_token_id=0,
        depth_decoder_config=depth_cfg, codec_config=codec_cfg.to_dict(),
    )
    model = CsmForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        # Larger-than-default embeddings so greedy decoding of a random model moves around the
        # codebook instead of repeating one frame.
        for emb in (model.embed_text_tokens, model.backbone_model.embed_tokens.embed_audio_tokens):
            emb.weight.copy_(torch.randn(emb.weight.shape, generator=gen))
        # Default init (std 0.02) gives near-uniform attention: the output then depends only on the
        # last prompt token (always <|end_of_text|>), i.e. not on the text or the speaker.
        for name, mod in list(model.backbone_model.named_modules()) + list(model.depth_decoder.named_modules()):
            if isinstance(mod, torch.nn.Linear):
                std = 1.5 / mod.in_features ** 0.5
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen) * std)
        for head in (model.lm_head.weight, model.depth_decoder.codebooks_head.weight):
            head.copy_(torch.randn(head.shape, generator=gen) * 0.5)
        _init_codec_(model.codec_model, spec, gen)

    specials = list(range(spec.codebook_size, vocab))
    gc = model.generation_config
    gc.do_sample = False
    gc.suppress_tokens = specials
    gc.max_new_tokens = spec.default_max_frames
    gc.pad_token_id = cfg.codebook_pad_token_id
    gc.eos_token_id = None
    dgc = model.depth_decoder.generation_config
    dgc.do_sample = False
    dgc.suppress_tokens = specials
    dgc.min_new_tokens = dgc.max_new_tokens = spec.num_codebooks - 1

    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    model.codec_model.save_pretrained(out_dir / CODEC_SUBDIR)
    manifest = {
        "name": "csm-tiny", "seed": seed, "config_hash": h, "builder_version": BUILDER_VERSION,
        "spec": spec.__dict__, "num_codebooks": spec.num_codebooks,
        "sampling_rate": int(codec_cfg.sampling_rate), "frame_rate": float(codec_cfg.frame_rate),
        "num_speakers": spec.num_speakers,
    }
    man_path.write_text(json.dumps(manifest, indent=1))  # written last: marks the build complete


def checkpoint_dir(name: str) -> Path:
    """Folder of the CSM checkpoint ``name`` in the cache (``omni_triton.paths.model_dir``).

    ``csm-tiny`` is (re)built here if missing: idempotent (manifest hash) and a few seconds, the
    same files ``omni-triton prepare`` writes; any other name must already be there.
    """
    from omni_triton.paths import model_dir

    path = model_dir(name)
    if name == "csm-tiny":
        build_tiny_csm(path)
    return path


def read_manifest(model_dir: Path) -> dict:
    """The builder's ``manifest.json`` of ``model_dir`` ({} when absent, e.g. a real checkpoint)."""
    p = Path(model_dir) / MANIFEST
    return json.loads(p.read_text()) if p.is_file() else {}


# --------------------------------------------------------------------------------------- talker


class GenerationCancelled(Exception):
    """Raised inside ``generate`` (from the streamer) to stop a cancelled generation."""


class _MinFramesLogitsProcessor:
    """Suppress the codebook-0 EOS id until ``min_frames`` frames exist.

    Why not ``generate(min_new_tokens=...)``: transformers' MinNewTokensLengthLogitsProcessor
    counts ``input_ids.shape[-1]``, which for CSM's ``[batch, frames, num_codebooks]`` ids is the
    codebook count, not the frame count. Here frames = ``shape[1]`` once ids are 3-D, 0 before.
    """

    def __init__(self, min_frames: int, eos_id: int):
        self.min_frames, self.eos_id = int(min_frames), int(eos_id)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        frames = input_ids.shape[1] if input_ids.ndim == 3 else 0
        if frames < self.min_frames:
            scores = scores.clone()
            scores[:, self.eos_id] = -float("inf")
        return scores


class _FrameStreamer:
    """transformers streamer (``put``/``end``) that hands each generated frame to a queue.

    ``generate`` first ``put``s the prompt (skipped), then ``put``s one ``[batch, num_codebooks]``
    frame per step. ``put`` checks the cancellation hook after every frame (before queueing it) and
    raises :class:`GenerationCancelled`, which aborts ``generate`` before the next frame is computed:
    at most the one frame in flight when cancellation was requested is computed, and it is dropped.
    """

    def __init__(self, q: "queue.Queue", should_stop: Callable[[], bool]):
        self.q, self.should_stop, self._prompt_seen = q, should_stop, False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        if self.should_stop():  # frame computed after a cancel request: dropped
            raise GenerationCancelled()
        self.q.put(value[0].numpy().astype(np.int64, copy=True))

    def end(self) -> None:
        pass


def _restore_depth_decoder_generation_config(model, model_dir: Path) -> None:
    """Apply the ``depth_decoder_*`` keys of ``generation_config.json`` to the depth decoder.

    ``CsmForConditionalGeneration.save_pretrained`` stores the depth decoder's generation config as
    ``depth_decoder_*`` keys and its ``from_pretrained`` copies them back, but in transformers 5.19
    ``GenerationConfig.from_pretrained`` drops unknown keys, so they never arrive (the depth decoder
    then neither decodes greedily nor suppresses the codebook special ids, and Mimi indexes out of
    range). This re-reads them from the file, which stays the single source of truth.
    """
    p = Path(model_dir) / "generation_config.json"
    if not p.is_file():
        return
    raw = json.loads(p.read_text())
    attrs = {k[len("depth_decoder_"):]: v for k, v in raw.items() if k.startswith("depth_decoder_")}
    attrs.pop("_from_model_config", None)
    attrs.pop("transformers_version", None)
    model.depth_decoder.generation_config.update(**attrs)


class CodecTalker:
    """CSM backbone + depth decoder, streaming codec frames as they are generated.

    Uses transformers' own CSM generation path (``CsmForConditionalGeneration.generate`` with a
    ``streamer``); generation runs on a helper thread and :meth:`stream` yields from a queue.
    Cancellation goes through the streamer because CSM's ``generate`` drops every custom
    ``StoppingCriteria`` except max length (see ``CsmGenerationMixin._get_stopping_criteria``).
    """

    def __init__(self, model, processor, manifest: dict | None = None):
        self.model, self.processor = model, processor
        self.manifest = manifest or {}
        cfg = model.config
        self.num_codebooks = int(cfg.num_codebooks)
        self.codebook_eos_id = int(cfg.codebook_eos_token_id)
        spec = self.manifest.get("spec", {})
        self.default_min_frames = int(spec.get("default_min_frames", 0))
        self.default_max_frames = int(spec.get("default_max_frames", model.generation_config.max_new_tokens or 250))
        self.num_speakers = int(self.manifest.get("num_speakers", 1))
        self._lock = threading.Lock()  # one generate at a time per model object

    @classmethod
    def from_pretrained(cls, model_dir, device: str = "cpu") -> "CodecTalker":
        from transformers import CsmForConditionalGeneration, CsmProcessor

        model_dir = Path(model_dir)
        model = CsmForConditionalGeneration.from_pretrained(model_dir).to(device).eval()
        _restore_depth_decoder_generation_config(model, model_dir)
        processor = CsmProcessor.from_pretrained(model_dir)
        return cls(model, processor, read_manifest(model_dir))

    def prompt_ids(self, text: str, speaker: int = 0) -> dict:
        """csm-1b prompt: ``<|begin_of_text|>[speaker]text<|end_of_text|>`` -> input_ids/attention_mask
        (``torch.int64 [1, L]``)."""
        enc = self.processor(text=f"[{int(speaker)}]{text}", add_special_tokens=True, return_tensors="pt")
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    def stream(
        self,
        text: str,
        speaker: int = 0,
        min_frames: int | None = None,
        max_frames: int | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> Iterator[np.ndarray]:
        """Yield ``np.int64 [n_new, num_codebooks]`` frames (n_new >= 1) while generation runs.

        Greedy (deterministic). Stops at ``max_frames`` frames, at CSM's EOS frame (codebooks
        0..K-2 all ``codebook_eos_token_id``; suppressed before ``min_frames`` and never yielded)
        or when ``should_stop()`` returns True (checked after every frame; no frame generated after
        a True is yielded). Closing the generator early also stops generation.
        """
        min_frames = self.default_min_frames if min_frames is None else int(min_frames)
        max_frames = self.default_max_frames if max_frames is None else int(max_frames)
        if max_frames <= 0:
            return
        closed = threading.Event()  # consumer went away (generator closed)
        cancelled = threading.Event()
        user_stop = should_stop or (lambda: False)

        def stop() -> bool:  # called by the streamer on the generate thread, once per frame
            if closed.is_set() or user_stop():
                cancelled.set()
                return True
            return False

        q: queue.Queue = queue.Queue()
        done = object()
        err: list[BaseException] = []
        inputs = self.prompt_ids(text, speaker)

        def run():
            from transformers import LogitsProcessorList

            try:
                torch.set_num_threads(1)
                with self._lock, torch.inference_mode():
                    self.model.generate(
                        **inputs, max_new_tokens=max_frames, do_sample=False,
                        logits_processor=LogitsProcessorList(
                            [_MinFramesLogitsProcessor(min_frames, self.codebook_eos_id)]),
                        streamer=_FrameStreamer(q, stop),
                    )
            except GenerationCancelled:
                pass
            except BaseException as e:  # re-raised in the consumer
                err.append(e)
            finally:
                q.put(done)

        th = threading.Thread(target=run, name="csm-generate", daemon=True)
        th.start()
        try:
            finished = False
            while not finished:
                items = [q.get()]
                while True:  # drain what is already there
                    try:
                        items.append(q.get_nowait())
                    except queue.Empty:
                        break
                frames = []
                for it in items:
                    if it is done:
                        finished = True
                        break
                    if (it[:-1] == self.codebook_eos_id).all():  # CSM EOS frame: end, not audio
                        finished = True
                        break
                    frames.append(it)
                if cancelled.is_set():
                    break
                if frames:
                    yield np.stack(frames).astype(np.int64)
            if err:
                raise err[0]
        finally:
            closed.set()
            th.join()

    def generate(self, text: str, speaker: int = 0, min_frames=None, max_frames=None) -> np.ndarray:
        """All frames at once: ``np.int64 [T, num_codebooks]``."""
        chunks = list(self.stream(text, speaker, min_frames, max_frames))
        return np.concatenate(chunks) if chunks else np.zeros((0, self.num_codebooks), np.int64)


# ------------------------------------------------------------------------------------- code2wav


class CodecDecoder:
    """Mimi decoder (``MimiModel.decode``): codec frames -> 24 kHz float32 PCM.

    Batched decode right-pads to the longest request. Mimi's decoder is causal (causal convs and
    transposed convs trimmed on the right, causal sliding-window attention), so right padding leaves
    the earlier samples unchanged mathematically. Measured in float32 on CPU: batched vs one-by-one
    differ by <= 3e-7 (peak ~0.45); padding one item alone changes it by 7e-8 and batching
    equal-length items without padding by 1.6e-7, i.e. shape-dependent kernel rounding, so grouping
    by length would not be bit-exact either and padding is kept
    (``tests/unit/test_codec_tts.py::test_batched_padded_decode_equals_one_by_one``).
    """

    def __init__(self, codec):
        self.codec = codec.eval()
        cfg = codec.config
        self.sampling_rate = int(cfg.sampling_rate)
        self.frame_rate = float(cfg.frame_rate)
        self.samples_per_frame = int(round(self.sampling_rate / self.frame_rate))
        self.num_codebooks = int(cfg.num_quantizers)
        self.codebook_size = int(cfg.codebook_size)

    @classmethod
    def from_pretrained(cls, model_dir, device: str = "cpu") -> "CodecDecoder":
        """``model_dir`` is a Mimi checkpoint, or a CSM checkpoint (its ``codec/`` subfolder, else
        the ``codec_model`` inside the CSM weights)."""
        from transformers import AutoConfig, CsmForConditionalGeneration, MimiModel

        model_dir = Path(model_dir)
        if (model_dir / CODEC_SUBDIR / "config.json").is_file():
            model_dir = model_dir / CODEC_SUBDIR
        if AutoConfig.from_pretrained(model_dir).model_type == "mimi":
            codec = MimiModel.from_pretrained(model_dir)
        else:
            codec = CsmForConditionalGeneration.from_pretrained(model_dir).codec_model
        return cls(codec.to(device))

    def decode(self, codes_list: Sequence[np.ndarray], left_context_list: Sequence[int] | None = None) -> list[np.ndarray]:
        """Decode a batch in ONE Mimi forward pass.

        codes_list: ``[T_i, num_codebooks]`` int arrays (T_i may differ; 0 allowed).
        left_context_list: frames at the start of each item that are context only.
        Returns ``np.float32 [(T_i - left_i) * samples_per_frame]`` per item.
        """
        return decode_ragged(codes_list, left_context_list, self.num_codebooks, self.codebook_size,
                             self.samples_per_frame,
                             lambda codes: self.codec.decode(codes).audio_values[:, 0])


def decode_ragged(codes_list: Sequence[np.ndarray], left_context_list: Sequence[int] | None,
                  num_codebooks: int, codebook_size: int, samples_per_frame: int,
                  forward: Callable[[torch.Tensor], torch.Tensor], trailing_loss: int = 0) -> list[np.ndarray]:
    """Decode chunks of different lengths in ONE forward pass of a causal codec decoder.

    The items (``[T_i, num_codebooks]`` int arrays, T_i may be 0) are right-padded to the longest
    and stacked as int64 ``[n, num_codebooks, T_max]`` for ``forward``, which returns PCM
    ``[n, S]``; each item keeps the samples of its new frames (:func:`keep_new_samples`). Right
    padding cannot reach earlier samples of a causal decoder (the kept tail trimmed by
    ``trailing_loss`` samples included). Shared by Mimi (``CodecDecoder``) and Qwen3-Omni's
    code2wav (``qwen3_omni.OmniCode2Wav``).

    Returns: ``np.float32 [(T_i - left_i) * samples_per_frame]`` per item (empty for T_i = 0).
    Raises: ``ValueError`` for codes outside [0, codebook_size).
    """
    n = len(codes_list)
    left = [0] * n if left_context_list is None else [int(x) for x in left_context_list]
    lens = [int(np.asarray(c).shape[0]) for c in codes_list]
    out: list[np.ndarray] = [np.zeros(0, np.float32) for _ in range(n)]
    tmax = max(lens, default=0)
    if tmax == 0:
        return out
    batch = np.zeros((n, tmax, num_codebooks), np.int64)
    for i, c in enumerate(codes_list):
        c = np.asarray(c, dtype=np.int64).reshape(-1, num_codebooks)
        if c.size and (c.min() < 0 or c.max() >= codebook_size):
            raise ValueError(f"codes must lie in [0, {codebook_size}), got [{c.min()}, {c.max()}]")
        batch[i, : c.shape[0]] = c
    with torch.inference_mode():
        audio = forward(torch.from_numpy(batch).transpose(1, 2)).float().numpy()  # [n, S]
    for i in range(n):
        if lens[i]:
            out[i] = keep_new_samples(audio[i], lens[i], left[i], samples_per_frame, trailing_loss)
    return out


def keep_new_samples(audio: np.ndarray, n_frames: int, left_context: int, samples_per_frame: int,
                     trailing_loss: int = 0) -> np.ndarray:
    """The PCM of the new frames of one chunk decoded with left context.

    ``audio`` is the decoder output for ``n_frames`` frames (possibly longer: right padding of a
    batch), whose first ``left_context`` frames were context only. A causal decoder emits
    ``n_frames * samples_per_frame - trailing_loss`` valid samples: ``trailing_loss`` > 0 for
    decoders whose causal transposed convs trim the samples that still need the next frame
    (Qwen3-Omni code2wav); those samples come from the next chunk, whose left context covers them,
    so a chunk with context keeps ``[left*spf - trailing_loss, n*spf - trailing_loss)``: the
    concatenated chunks then tile exactly the samples one decode of all frames gives.
    Returns ``np.float32 [(n_frames - left_context) * spf]`` (minus ``trailing_loss`` for a chunk
    without context). Mimi (``trailing_loss=0``) keeps ``[left*spf, n*spf)``.
    """
    lo = left_context * samples_per_frame - (trailing_loss if left_context > 0 else 0)
    hi = n_frames * samples_per_frame - trailing_loss
    return np.ascontiguousarray(audio[max(lo, 0):max(hi, 0)], dtype=np.float32)


def validate_chunk(codes: np.ndarray, left_context, num_codebooks: int, codebook_size: int) -> tuple[np.ndarray, int]:
    """Check one code2wav request: ``codes`` [..., T, K] int -> int64 [T, K]; ``left_context`` (any
    array holding one int) in [0, T]; codes in [0, codebook_size). Raises ValueError (INVALID_ARG)."""
    c = np.asarray(codes)
    c = c.reshape(-1, c.shape[-1]).astype(np.int64, copy=False)
    left = int(np.asarray(left_context).reshape(-1)[0])
    if c.shape[1] != num_codebooks:
        raise ValueError(f"CODES has {c.shape[1]} codebooks, the codec expects {num_codebooks}")
    if c.size and (c.min() < 0 or c.max() >= codebook_size):
        raise ValueError(f"CODES must lie in [0, {codebook_size})")
    if not 0 <= left <= c.shape[0]:
        raise ValueError(f"LEFT_CONTEXT={left} outside [0, {c.shape[0]}]")
    return c, left


# ------------------------------------------------------------------------------ chunk schedule


@dataclass
class ChunkSchedule:
    """Decides code2wav chunks from a growing list of frames (pure python, no torch).

    vLLM-Omni's Qwen3-TTS talker -> code2wav connector streams 25-frame chunks, each decoded with
    25 frames of left context (connector ``extra``: ``codec_chunk_frames: 25``,
    ``codec_left_context_frames: 25``, and ``initial_codec_chunk_frames`` for a smaller first
    chunk, which lowers time-to-first-packet).

    Usage: call :meth:`push` with the total number of frames seen so far; it returns the ready
    chunks as ``(start, end, left_context)`` frame indices: decode ``frames[start:end]`` and keep
    the audio after the first ``left_context`` frames (``start = first_new - left_context``).
    At the end call :meth:`flush` for the tail. Every frame is emitted exactly once, in order.
    """

    first_chunk_frames: int = 5
    chunk_frames: int = 25
    left_context_frames: int = 25
    emitted: int = 0  # frames whose audio has been scheduled

    def __post_init__(self):
        if self.first_chunk_frames < 1 or self.chunk_frames < 1 or self.left_context_frames < 0:
            raise ValueError("first_chunk_frames, chunk_frames must be >= 1, left_context_frames >= 0")

    def _next_size(self) -> int:
        return self.first_chunk_frames if self.emitted == 0 else self.chunk_frames

    def _chunk(self, end: int) -> tuple[int, int, int]:
        new_start = self.emitted
        start = max(0, new_start - self.left_context_frames)
        self.emitted = end
        return (start, end, new_start - start)

    def push(self, total_frames: int) -> list[tuple[int, int, int]]:
        out = []
        while total_frames - self.emitted >= self._next_size():
            out.append(self._chunk(self.emitted + self._next_size()))
        return out

    def flush(self, total_frames: int) -> list[tuple[int, int, int]]:
        out = self.push(total_frames)
        if total_frames > self.emitted:
            out.append(self._chunk(total_frames))
        return out


def chunk_slices(frames: np.ndarray, chunks: Sequence[tuple[int, int, int]]) -> list[tuple[np.ndarray, int]]:
    """``(codes_with_context [end-start, K], left_context)`` for each ``(start, end, left)``."""
    return [(frames[s:e], left) for s, e, left in chunks]


# ------------------------------------------------------------------------- request validation


class TtsInputError(ValueError):
    """The request cannot be synthesised as given (empty/oversize text, unknown voice, speed)."""


def parse_tts_request(text, voice, speed, voices: Sequence[str], default_voice: str,
                      max_input_chars: int) -> tuple[str, int]:
    """Validate a ``tts`` request; return ``(text, speaker_id)``.

    ``voice`` is a speaker id as a string ("0".."N", one of ``voices``; None/"" -> default);
    ``speed`` must be None or 1.0 (CSM has no speaking-rate control, ``supports_speed=false``).
    """
    text = text.decode("utf-8") if isinstance(text, bytes) else str(text or "")
    if not text.strip():
        raise TtsInputError("TEXT is empty")
    if len(text) > max_input_chars:
        raise TtsInputError(f"TEXT has {len(text)} characters, more than max_input_chars={max_input_chars}")
    if speed is not None and abs(float(speed) - 1.0) > 1e-6:
        raise TtsInputError(f"SPEED={float(speed):g} is not supported by this model (only 1.0)")
    voice = voice.decode("utf-8") if isinstance(voice, bytes) else voice
    voice = (voice or default_voice).strip()
    if voice not in voices:
        raise TtsInputError(f"unknown VOICE {voice!r}; available: {', '.join(voices)}")
    return text, int(voice)


class CancelFlags:
    """Cancellation flags for talker streams, shared by every process of one tritonserver.

    Why: Triton 2.51's BLS response iterator has no ``cancel()``, so the ``tts`` BLS model cannot
    cancel the ``tts_talker`` request it started. It passes a ``REQUEST_ID`` instead and, when its
    own client goes away, raises the flag for that id; the talker checks the flag after every
    frame. The talker runs several instances (separate stub processes) that execute one request
    each, so the flags live in files, one per cancelled id, in a folder named after the server's
    pid (the stubs' parent process): cheap to check (one ``stat`` per frame) and visible to all
    instances at once. A flag raised before its stream starts still stops it.

    Args:
        directory: the folder of flags; created if missing.
    """

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    @classmethod
    def for_server(cls, server_pid: int | None = None) -> "CancelFlags":
        """Flags of the tritonserver whose pid is ``server_pid`` (default: this stub's parent)."""
        from omni_triton.paths import server_run_dir

        pid = os.getppid() if server_pid is None else server_pid
        return cls(server_run_dir(pid) / "cancel")

    def _path(self, request_id: str) -> Path:
        return self.directory / hashlib.sha256(request_id.encode("utf-8")).hexdigest()[:32]

    def cancel(self, request_id: str) -> None:
        """Raise the flag of ``request_id``."""
        self._path(request_id).touch()

    def is_cancelled(self, request_id: str | None) -> bool:
        """Whether the flag of ``request_id`` is raised (``False`` for ``None``/empty)."""
        return bool(request_id) and self._path(request_id).exists()

    def discard(self, request_id: str | None) -> None:
        """Lower the flag (when its stream ended)."""
        if request_id:
            self._path(request_id).unlink(missing_ok=True)


# --------------------------------------------------------------------------- in-process pipeline


@dataclass
class SynthesisResult:
    """Output of :func:`synthesize_reference`.

    codes: ``np.int64 [T, K]``; audio: one-shot decode of all codes, ``np.float32 [T*spf]``;
    streamed_chunks: per-chunk PCM of the streamed in-process variant (concatenation has the same
    length as ``audio``); timings in seconds (``ttfp_s``: time to first streamed chunk)."""

    codes: np.ndarray
    audio: np.ndarray
    sampling_rate: int
    streamed_chunks: list[np.ndarray] = field(default_factory=list)
    timings: dict = field(default_factory=dict)

    @property
    def streamed_audio(self) -> np.ndarray:
        return np.concatenate(self.streamed_chunks) if self.streamed_chunks else np.zeros(0, np.float32)


def synthesize_reference(
    talker: CodecTalker,
    decoder: CodecDecoder,
    text: str,
    speaker: int = 0,
    min_frames: int | None = None,
    max_frames: int | None = None,
    first_chunk_frames: int = 5,
    chunk_frames: int = 25,
    left_context_frames: int = 25,
    stream: bool = True,
) -> SynthesisResult:
    """Whole pipeline in-process (no Triton): the parity reference and the no-Triton baseline.

    Runs the talker once; while frames arrive, the streamed variant decodes chunks with the
    :class:`ChunkSchedule` (exactly what the ``tts`` BLS model does); then decodes all codes in one
    shot (``audio``).
    """
    t0 = time.perf_counter()
    sched = ChunkSchedule(first_chunk_frames, chunk_frames, left_context_frames)
    frames: list[np.ndarray] = []
    chunks: list[np.ndarray] = []
    timings: dict = {"decode_chunk_s": []}
    all_codes = np.zeros((0, talker.num_codebooks), np.int64)

    def run_chunks(ready):
        for codes, left in chunk_slices(all_codes, ready):
            td = time.perf_counter()
            chunks.append(decoder.decode([codes], [left])[0])
            timings["decode_chunk_s"].append(time.perf_counter() - td)
            timings.setdefault("ttfp_s", time.perf_counter() - t0)

    for new in talker.stream(text, speaker, min_frames, max_frames):
        frames.append(new)
        all_codes = np.concatenate(frames)
        if stream:
            run_chunks(sched.push(len(all_codes)))
    t_talk = time.perf_counter() - t0
    if stream:
        run_chunks(sched.flush(len(all_codes)))
    timings["talker_s"] = t_talk
    timings["talker_frames_per_s"] = len(all_codes) / t_talk if t_talk > 0 else 0.0
    td = time.perf_counter()
    audio = decoder.decode([all_codes], [0])[0]
    timings["full_decode_s"] = time.perf_counter() - td
    timings["total_s"] = time.perf_counter() - t0
    return SynthesisResult(all_codes, audio, decoder.sampling_rate, chunks, timings)
