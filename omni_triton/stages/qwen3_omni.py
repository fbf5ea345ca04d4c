"""Qwen3-Omni pipeline (thinker -> talker -> code2wav) as separable stages, no Triton.

Architecture (transformers 5.19 ``Qwen3OmniMoeForConditionalGeneration``, model type
``qwen3_omni_moe``; Qwen3-Omni technical report, arXiv:2509.17765):

- **thinker** (``model.thinker``, a MoE decoder LM with audio/vision encoders) generates the text
  answer. The talker is conditioned on the thinker's *input embeddings* of every token
  (``hidden_states[0]`` of each generate step) and, for multimodal (audio/image/video) positions
  of the user turns only, on its hidden state at layer ``talker_config.accept_hidden_layer``;
- **talker** (``model.talker``, a MoE decoder over codec tokens) generates codebook 0 of each codec
  frame; its **code predictor** (a small decoder run once per frame) generates codebooks
  1..G-1 from the talker's last hidden state. One frame = G codes (``num_code_groups``);
- **code2wav** (``model.code2wav``) decodes ``[G, T]`` codes into 24 kHz mono PCM,
  ``total_upsample`` (1920) samples per frame, i.e. 12.5 frames/s.

The stages reproduce ``Qwen3OmniMoeForConditionalGeneration.generate(..., return_audio=True)``:
:class:`OmniThinker` runs ``model.thinker.generate`` (same arguments as the reference, plus a
streamer for text deltas) and returns the per-token embeddings / accept-layer hidden states the
reference concatenates; :func:`build_talker_inputs` rebuilds the talker's prompt exactly as the
reference's ``generate`` does (calling its own ``_get_talker_user_parts`` /
``_get_talker_assistant_parts``); :class:`OmniTalker` runs ``model.talker.generate`` with the
reference's talker arguments and streams each frame as the next forward pass completes it;
:class:`OmniCode2Wav` decodes chunks with left context (the :class:`ChunkSchedule` shared with the
codec TTS pipeline).

No checkpoint can be downloaded here, so :func:`build_tiny_qwen3_omni` makes a tiny random-weight
model (+ a locally trained ChatML tokenizer) and saves it with ``save_pretrained``; everything else
loads it with ``from_pretrained`` as it would load ``Qwen/Qwen3-Omni-30B-A3B-Instruct``.

Data contract between the stages (also the Triton tensors, see ``docs/omni_pipeline.md``):
- thinker -> talker (:class:`ThinkerOutput`): ``sequence`` int64 [L] (prompt + generated ids),
  ``prompt_len`` int, ``embeds`` float32 [L-1, H_thinker] (input embedding of every token fed to
  the thinker: all but the last generated one), ``hidden`` float32 [L-1, H_thinker] (layer
  ``accept_hidden_layer``), ``tts_embeds`` float32 [3, H_thinker] (thinker input embeddings of
  ``tts_bos``, ``tts_eos``, ``tts_pad``);
- talker -> code2wav: codec frames int64 [T, G] (frame-major);
- code2wav -> client: float32 mono PCM in [-1, 1] at 24 kHz.
"""
from __future__ import annotations

import hashlib
import json
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from omni_triton.stages.codec_tts import (
    MANIFEST, ChunkSchedule, build_once, chunk_slices, decode_ragged, kaiming_init_convs_, keep_new_samples, read_manifest,  # noqa: F401
)

BUILDER_VERSION = 2  # 2: MoE experts initialised (were uninitialised memory)

# ChatML special tokens (names as in Qwen3-Omni's tokenizer). Each is one token.
IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TTS_PAD, TTS_BOS, TTS_EOS = "<|tts_pad|>", "<|tts_bos|>", "<|tts_eos|>"
AUDIO_START, AUDIO_END, AUDIO_PAD = "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>"
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, TTS_PAD, TTS_BOS, TTS_EOS, AUDIO_START, AUDIO_END, AUDIO_PAD,
                  VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]
ROLE_WORDS = ("system", "user", "assistant")

# Qwen2/ChatML chat template (text parts only): "<|im_start|>{role}\n{content}<|im_end|>\n" per
# message, then "<|im_start|>assistant\n" when add_generation_prompt.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}{%- if part['type'] == 'text' %}{{- part['text'] }}"
    "{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_TRAIN_TEXT = """\
The capital of France is Paris. Hello, how can I help you today? I am a helpful assistant.
Omni models answer in text and in speech at the same time: a thinker writes, a talker speaks.
The quick brown fox jumps over the lazy dog. What is the weather like? It is sunny and warm.
Please tell me a short story about a cat, a dog and a bird who live in a small house.
One, two, three, four, five, six, seven, eight, nine, ten. Good morning and good night.
"""


@dataclass(frozen=True)
class TinyOmniSpec:
    """Sizes of the tiny random Qwen3-Omni. The real Qwen3-Omni-30B-A3B: thinker 2048 hidden x 48
    layers, 128 experts (8 active); talker 1024 x 20, code predictor 1024 x 5, 16 code groups of
    2048 codes; code2wav 1024 hidden, decoder_dim 1536."""

    text_vocab: int = 512
    thinker_hidden: int = 64
    thinker_layers: int = 2
    talker_hidden: int = 64  # == code predictor hidden (the talker feeds it its hidden state)
    talker_layers: int = 2
    predictor_layers: int = 1
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16  # mrope_section sums to head_dim / 2
    mrope_section: tuple = (2, 3, 3)
    num_experts: int = 4
    experts_per_tok: int = 2
    num_code_groups: int = 4
    codebook_size: int = 64
    code2wav_hidden: int = 32
    code2wav_layers: int = 1
    decoder_dim: int = 32
    last_conv_scale: float = 0.05
    residual_conv_scale: float = 0.1
    speakers: tuple = ("Ethan", "Chelsie", "Aiden")

    def config_hash(self, seed: int) -> str:
        blob = json.dumps({"spec": self.__dict__, "seed": seed, "v": BUILDER_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def train_chatml_tokenizer(vocab_size: int = 512):
    """Byte-level BPE (Qwen2 pre-tokenizer) trained on a few English lines; ChatML specials and the
    role words are single tokens. Returns a ``Qwen2TokenizerFast`` with the ChatML template.

    Specials get ids 0..12 (``SPECIAL_TOKENS`` order); role words are ordinary BPE tokens (trained
    until they merge), so the template's ``<|im_start|>user\\n`` is 3 tokens as in Qwen's vocabulary.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2TokenizerFast

    tok = Tokenizer(models.BPE())
    # Qwen2's pre-tokenizer: its split regex, then byte-level mapping (as in Qwen2TokenizerFast).
    qwen2_pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                     r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    from tokenizers import Regex
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(qwen2_pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    # ChatML puts role words right after <|im_start|> (no leading space): train them as such.
    tok.train_from_iterator(_TRAIN_TEXT.splitlines() + list(ROLE_WORDS) * 50, trainer=trainer)
    for word in ROLE_WORDS:
        assert tok.token_to_id(word) is not None, f"role word {word!r} is not a single token"
    return Qwen2TokenizerFast(
        tokenizer_object=tok, bos_token=None, eos_token=IM_END, pad_token=ENDOFTEXT, unk_token=None,
        additional_special_tokens=SPECIAL_TOKENS[1:], model_max_length=4096, chat_template=CHAT_TEMPLATE,
        errors="replace",
    )


def build_tiny_qwen3_omni(out_dir: Path, seed: int = 0, spec: TinyOmniSpec | None = None) -> Path:
    """Build and save a tiny random-weight ``Qwen3OmniMoeForConditionalGeneration`` into ``out_dir``.

    Writes (``save_pretrained``): ``config.json``, ``model.safetensors``, ``generation_config.json``
    (greedy thinker), the tokenizer files with the ChatML template, and ``manifest.json`` (seed,
    config hash, special ids). Idempotent: returns at once when the manifest has the same hash.
    """
    spec = spec or TinyOmniSpec()
    return build_once(Path(out_dir), spec.config_hash(seed), lambda d, h: _build(d, seed, spec, h))


def _build(out_dir: Path, seed: int, spec: TinyOmniSpec, h: str) -> None:
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    tok = train_chatml_tokenizer(spec.text_vocab)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS + list(ROLE_WORDS)}
    C = spec.codebook_size
    # Talker vocabulary: codes [0, C) then 1024 special ids, the layout the reference assumes when
    # it suppresses range(vocab - 1024, vocab) except codec_eos (Qwen3-Omni: 2048 codes + 1024).
    talker_vocab = C + 1024
    codec = dict(codec_pad_id=C + 0, codec_bos_id=C + 1, codec_eos_token_id=C + 2, codec_nothink_id=C + 3,
                 codec_think_bos_id=C + 4, codec_think_eos_id=C + 5)
    speaker_id = {name.lower(): C + 10 + i for i, name in enumerate(spec.speakers)}
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(spec.mrope_section)}
    mm = dict(audio_token_id=ids[AUDIO_PAD], image_token_id=ids[IMAGE_PAD], video_token_id=ids[VIDEO_PAD])
    text_cfg = dict(
        vocab_size=len(tok), hidden_size=spec.thinker_hidden, intermediate_size=2 * spec.thinker_hidden,
        num_hidden_layers=spec.thinker_layers, num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim, moe_intermediate_size=spec.thinker_hidden // 2, num_experts=spec.num_experts,
        num_experts_per_tok=spec.experts_per_tok, max_position_embeddings=4096, rope_parameters=rope,
        pad_token_id=ids[ENDOFTEXT], eos_token_id=ids[IM_END],
    )
    thinker_cfg = dict(
        text_config=text_cfg,
        audio_config=dict(num_mel_bins=32, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64,
                          d_model=32, output_dim=spec.thinker_hidden, downsample_hidden_size=16),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                           out_hidden_size=spec.thinker_hidden, deepstack_visual_indexes=[0],
                           num_position_embeddings=64),
        audio_start_token_id=ids[AUDIO_START], user_token_id=ids["user"], **mm,
        vision_start_token_id=ids[VISION_START],  # read by get_rope_index, not a declared field in 5.19
    )
    talker_cfg = dict(
        text_config=dict(
            vocab_size=talker_vocab, hidden_size=spec.talker_hidden, intermediate_size=2 * spec.talker_hidden,
            num_hidden_layers=spec.talker_layers, num_attention_heads=spec.heads,
            num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim, moe_intermediate_size=spec.talker_hidden // 2,
            num_experts=spec.num_experts, num_experts_per_tok=spec.experts_per_tok,
            max_position_embeddings=4096, rope_parameters=rope,
            # read by the talker's MoE block but not a declared field of the config class in 5.19
            shared_expert_intermediate_size=spec.talker_hidden,
        ),
        code_predictor_config=dict(
            vocab_size=C, hidden_size=spec.talker_hidden, intermediate_size=2 * spec.talker_hidden,
            num_hidden_layers=spec.predictor_layers, num_attention_heads=spec.heads,
            num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim, num_code_groups=spec.num_code_groups,
            max_position_embeddings=64,
        ),
        num_code_groups=spec.num_code_groups, thinker_hidden_size=spec.thinker_hidden,
        accept_hidden_layer=spec.thinker_layers // 2, speaker_id=speaker_id,
        audio_start_token_id=ids[AUDIO_START], vision_start_token_id=ids[VISION_START], **codec, **mm,
        spatial_merge_size=2,  # read by the talker but not a declared field of the config class in 5.19
    )
    code2wav_cfg = dict(
        codebook_size=C, hidden_size=spec.code2wav_hidden, num_attention_heads=2, num_key_value_heads=2,
        intermediate_size=2 * spec.code2wav_hidden, num_hidden_layers=spec.code2wav_layers,
        num_quantizers=spec.num_code_groups, decoder_dim=spec.decoder_dim, max_position_embeddings=8000,
    )
    cfg = Qwen3OmniMoeConfig(
        thinker_config=thinker_cfg, talker_config=talker_cfg, code2wav_config=code2wav_cfg,
        im_start_token_id=ids[IM_START], im_end_token_id=ids[IM_END], tts_pad_token_id=ids[TTS_PAD],
        tts_bos_token_id=ids[TTS_BOS], tts_eos_token_id=ids[TTS_EOS], system_token_id=ids["system"],
        user_token_id=ids["user"], assistant_token_id=ids["assistant"],
    )
    model = Qwen3OmniMoeForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        # Default init (std 0.02) makes a random LM's attention near-uniform, so its output hardly
        # depends on the prompt; larger embeddings and linears make text and codes prompt-dependent.
        for lm in (model.thinker.model, model.talker.model, model.talker.code_predictor):
            for mod in lm.modules():
                if isinstance(mod, torch.nn.Embedding):
                    mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen))
                elif isinstance(mod, torch.nn.Linear):
                    mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen) * (1.5 / mod.in_features ** 0.5))
                elif type(mod).__name__.endswith("Experts"):
                    # transformers 5 keeps MoE experts as fused 3D parameters ([experts, out, in]:
                    # gate_up_proj, down_proj) that its _init_weights leaves as torch.empty for the
                    # talker: uninitialised memory made the build irreproducible (and at times
                    # all-zero codes). Initialise them like the linears.
                    for param in mod.parameters(recurse=False):
                        param.copy_(torch.randn(param.shape, generator=gen) * (1.5 / param.shape[-1] ** 0.5))
        for head in [model.thinker.lm_head.weight, model.talker.codec_head.weight,
                     *[h.weight for h in model.talker.code_predictor.lm_head]]:
            head.copy_(torch.randn(head.shape, generator=gen) * 0.5)
        for proj in (model.talker.text_projection, model.talker.hidden_projection):
            for mod in proj.modules():
                if isinstance(mod, torch.nn.Linear):
                    mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen) * (1.0 / mod.in_features ** 0.5))
        # Random code2wav: ~1e-8 amplitude with default conv init; kaiming convs make it audible.
        model.code2wav.code_embedding.weight.copy_(torch.randn(model.code2wav.code_embedding.weight.shape, generator=gen))
        kaiming_init_convs_(model.code2wav, gen, last_conv=model.code2wav.decoder[-1].conv,
                            last_conv_scale=spec.last_conv_scale)
        # Each decoder block adds three residual units; with kaiming convs every unit grows the
        # signal (~8x per block, std 2e3 at the output). Scaling the units' last conv by 0.1 keeps
        # them near identity + small: output std ~0.06, peak ~0.35 (measured).
        for mod in model.code2wav.modules():
            if type(mod).__name__ == "Qwen3OmniMoeCode2WavDecoderResidualUnit":
                mod.conv2.conv.weight.mul_(spec.residual_conv_scale)

    gc = model.generation_config
    gc.do_sample = False
    gc.eos_token_id = ids[IM_END]
    gc.pad_token_id = ids[ENDOFTEXT]
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    manifest = {
        "name": "qwen3-omni-tiny", "seed": seed, "config_hash": h, "builder_version": BUILDER_VERSION,
        "spec": {k: list(v) if isinstance(v, tuple) else v for k, v in spec.__dict__.items()},
        "thinker_eos_token_id": ids[IM_END], "speakers": list(spec.speakers),
        "sampling_rate": 24000, "samples_per_frame": int(model.code2wav.total_upsample),
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1))  # written last: build complete


def checkpoint_dir(name: str) -> Path:
    """Folder of the Qwen3-Omni checkpoint ``name`` in the cache; ``qwen3-omni-tiny`` is (re)built
    here if missing (idempotent, ~seconds), any other name must already be there."""
    from omni_triton.paths import model_dir

    path = model_dir(name)
    if name == "qwen3-omni-tiny":
        build_tiny_qwen3_omni(path)
    return path


def read_speakers(model_dir: Path) -> list[str]:
    """Voice names of a checkpoint (``talker_config.speaker_id`` keys, as the manifest spells them)."""
    man = read_manifest(model_dir)
    if man.get("speakers"):
        return list(man["speakers"])
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return list(cfg["talker_config"]["speaker_id"])


# ------------------------------------------------------------------------------ request parsing


class OmniInputError(ValueError):
    """The request cannot be served as given (Triton INVALID_ARG, HTTP 400)."""


_ROLES = {"system", "user", "assistant"}
_SAMPLING_KEYS = {"temperature", "top_p", "top_k", "max_tokens", "min_tokens", "stop", "seed", "ignore_eos"}


@dataclass
class SamplingSettings:
    """Thinker sampling (vLLM ``SamplingParams`` names). ``temperature`` None or 0 means greedy
    (None: the checkpoint's ``generation_config``, greedy for the tiny model, like vLLM's
    ``generation_config="auto"``). ``top_k`` -1 or 0: disabled."""

    temperature: float | None = None
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 32
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return not self.temperature


def parse_sampling(raw: str | None, default_max_tokens: int) -> SamplingSettings:
    """``SAMPLING_PARAMETERS`` JSON -> :class:`SamplingSettings`; raises :class:`OmniInputError`."""
    s = SamplingSettings(max_tokens=default_max_tokens)
    if raw is None or not str(raw).strip():
        return s
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise OmniInputError(f"SAMPLING_PARAMETERS is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise OmniInputError("SAMPLING_PARAMETERS must be a JSON object")
    unknown = set(obj) - _SAMPLING_KEYS
    if unknown:
        raise OmniInputError(f"unsupported sampling parameters: {', '.join(sorted(unknown))}")

    def num(key, kind, lo=None, hi=None, lo_open=False):
        v = obj.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not float(v).is_integer()):
            raise OmniInputError(f"{key} must be {'an integer' if kind is int else 'a number'}, got {v!r}")
        v = kind(v)
        if (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
            raise OmniInputError(f"{key}={v} is out of range")
        return v

    t = num("temperature", float, 0.0, 2.0)
    s.temperature = t if t is not None else None
    s.top_p = num("top_p", float, 0.0, 1.0, lo_open=True) or s.top_p
    top_k = num("top_k", int, -1)
    s.top_k = -1 if top_k is None else top_k
    mt = num("max_tokens", int, 1)
    s.max_tokens = s.max_tokens if mt is None else mt
    s.min_tokens = num("min_tokens", int, 0) or 0
    if s.min_tokens > s.max_tokens:
        raise OmniInputError(f"min_tokens={s.min_tokens} is greater than max_tokens={s.max_tokens}")
    stop = obj.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(x, str) and x for x in stop)):
        raise OmniInputError("stop must be a list of non-empty strings")
    s.stop = list(stop or [])
    s.seed = num("seed", int, -(2**63), 2**63 - 1)  # torch.Generator.manual_seed: a 64-bit int
    ie = obj.get("ignore_eos", False)
    if not isinstance(ie, bool):
        raise OmniInputError("ignore_eos must be true or false")
    s.ignore_eos = ie
    return s


def parse_messages(raw: str) -> list[dict]:
    """``MESSAGES`` JSON (OpenAI chat messages) -> list of ``{"role", "content"}`` with text content;
    raises :class:`OmniInputError` for empty lists, unknown roles, non-text parts."""
    try:
        msgs = json.loads(raw)
    except ValueError as exc:
        raise OmniInputError(f"MESSAGES is not valid JSON: {exc}") from None
    if not isinstance(msgs, list) or not msgs:
        raise OmniInputError("messages must be a non-empty array")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            role = m.get("role") if isinstance(m, dict) else None
            raise OmniInputError(f"messages[{i}]: unknown role {role!r}; expected one of system, user, assistant")
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise OmniInputError(f"messages[{i}]: only text content parts are supported")
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise OmniInputError(f"messages[{i}]: content must be a string or a list of text parts")
        out.append({"role": m["role"], "content": content})
    return out


def parse_modalities(raw: str | None, default: Sequence[str] = ("text", "audio")) -> list[str]:
    """``MODALITIES`` JSON array (subset of text/audio; text is always produced) -> list."""
    if raw is None or not str(raw).strip():
        return list(default)
    try:
        mods = json.loads(raw)
    except ValueError:
        raise OmniInputError(f"MODALITIES is not a JSON array: {raw!r}") from None
    if not isinstance(mods, list) or not mods or not all(m in ("text", "audio") for m in mods):
        raise OmniInputError(f"MODALITIES must be a non-empty subset of [\"text\", \"audio\"], got {raw!r}")
    return list(dict.fromkeys(mods))


# ----------------------------------------------------------------------------------- thinker


@dataclass
class ThinkerOutput:
    """What the talker needs from the thinker (see the module docstring for shapes)."""

    sequence: np.ndarray  # int64 [L]
    prompt_len: int
    embeds: np.ndarray  # float32 [L-1, H]
    hidden: np.ndarray  # float32 [L-1, H]
    tts_embeds: np.ndarray  # float32 [3, H]: tts_bos, tts_eos, tts_pad


@dataclass
class ThinkerStep:
    """One streamed thinker event: ``text`` since the last step, cumulative ``completion_tokens``;
    the last step has ``finish_reason`` (stop/length/abort) and, when asked for, ``output``."""

    text: str
    completion_tokens: int
    finish_reason: str | None = None
    output: ThinkerOutput | None = None


class _QueueStreamer:
    """transformers streamer: skips the prompt, queues each new token id (int)."""

    def __init__(self, q: "queue.Queue"):
        self.q, self._prompt_seen = q, False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        for t in value.reshape(-1).tolist():
            self.q.put(int(t))

    def end(self) -> None:
        pass


def _stopping(should_stop: Callable[[torch.Tensor], bool]):
    """A transformers ``StoppingCriteria`` calling ``should_stop(input_ids)`` after every step."""
    from transformers import StoppingCriteria

    class _Stop(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), bool(should_stop(input_ids)), dtype=torch.bool)

    return _Stop()


def _threaded(run: Callable[[], object], q: "queue.Queue", done: object, closed: threading.Event) -> Iterator:
    """Run ``run()`` on a thread (one torch thread); yield the lists of items it queues (batched by
    what is already there) until it returns, then its return value; re-raise its exception.
    Closing the generator early sets ``closed`` (``run``'s stopping criterion must watch it) and
    joins the thread."""
    box: dict = {}

    def target():
        try:
            torch.set_num_threads(1)
            with torch.inference_mode():
                box["result"] = run()
        except BaseException as e:  # re-raised in the consumer
            box["error"] = e
        finally:
            q.put(done)

    th = threading.Thread(target=target, name="omni-generate", daemon=True)
    th.start()
    try:
        finished = False
        while not finished:
            items = [q.get()]
            while True:
                try:
                    items.append(q.get_nowait())
                except queue.Empty:
                    break
            if items[-1] is done:
                items.pop()
                finished = True
            yield items
    finally:
        closed.set()
        th.join()
    if "error" in box:
        raise box["error"]
    yield box.get("result")  # last item: generate's return value


def _cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` cut before the earliest stop string (excluded, as vLLM does) and whether one was found."""
    found = [text.find(s) for s in stops if s in text]
    return (text[: min(found)], True) if found else (text, False)


class ChatTokenizer:
    """The checkpoint's tokenizer and the ChatML ids the pipeline needs; no weights. Used by the
    thinker and by the ``omni`` BLS model (which validates requests before calling the stages)."""

    def __init__(self, tokenizer, im_start_token_id: int, assistant_token_id: int):
        self.tokenizer = tokenizer
        self.im_start_token_id, self.assistant_token_id = int(im_start_token_id), int(assistant_token_id)

    @classmethod
    def from_pretrained(cls, model_dir) -> "ChatTokenizer":
        from transformers import AutoTokenizer

        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        return cls(AutoTokenizer.from_pretrained(model_dir), cfg["im_start_token_id"], cfg["assistant_token_id"])

    def encode(self, prompt: str | None = None, messages: list[dict] | None = None) -> list[int]:
        """Token ids of a raw prompt, or of messages through the chat template (generation prompt)."""
        if (prompt is None) == (messages is None):
            raise OmniInputError("exactly one of PROMPT and MESSAGES must be given")
        if messages is not None:
            ids = self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            return [int(i) for i in ids]
        if not prompt:
            raise OmniInputError("PROMPT is empty")
        return [int(i) for i in self.tokenizer(prompt, add_special_tokens=False)["input_ids"]]

    def has_assistant_start(self, ids: Sequence[int]) -> bool:
        """Whether ``ids`` contain ``<|im_start|>assistant`` (the talker's prompt needs it)."""
        a, b = self.im_start_token_id, self.assistant_token_id
        return any(x == a and y == b for x, y in zip(ids, ids[1:]))


class OmniThinker:
    """The thinker of a Qwen3-Omni checkpoint (text-only inputs), streaming text as it generates.

    Runs ``model.thinker.generate`` with the arguments the reference
    ``Qwen3OmniMoeForConditionalGeneration.generate`` uses (``max_new_tokens``,
    ``eos_token_id=thinker_eos_token_id``, and with audio ``output_hidden_states=True``,
    ``return_dict_in_generate=True``), plus a streamer and a stopping criterion for cancellation.
    transformers with KV cache, one request at a time per object.
    """

    def __init__(self, model, tokenizer, manifest: dict | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.thinker = model.thinker
        self.config = model.config
        self.manifest = manifest or {}
        self.eos_token_id = int(self.manifest.get("thinker_eos_token_id", self.config.im_end_token_id))
        self.chat = ChatTokenizer(tokenizer, self.config.im_start_token_id, self.config.assistant_token_id)
        self._lock = threading.Lock()

    @classmethod
    def from_pretrained(cls, model_dir, device: str = "cpu") -> "OmniThinker":
        """Loads the thinker weights only (``enable_audio_output=False`` skips talker/code2wav)."""
        from transformers import AutoConfig, AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

        from transformers.utils import logging as hf_logging

        cfg = AutoConfig.from_pretrained(model_dir)
        cfg.enable_audio_output = False
        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # the skipped talker/code2wav weights are "UNEXPECTED" keys
        try:
            model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, config=cfg).to(device).eval()
        finally:
            hf_logging.set_verbosity(level)
        return cls(model, AutoTokenizer.from_pretrained(model_dir), read_manifest(model_dir))

    def encode(self, prompt: str | None = None, messages: list[dict] | None = None) -> list[int]:
        """See :meth:`ChatTokenizer.encode`."""
        return self.chat.encode(prompt, messages)

    def has_assistant_start(self, ids: Sequence[int]) -> bool:
        """See :meth:`ChatTokenizer.has_assistant_start`."""
        return self.chat.has_assistant_start(ids)

    def tts_embeds(self) -> np.ndarray:
        """float32 [3, H]: thinker input embeddings of tts_bos, tts_eos, tts_pad (the reference
        projects these with the talker's ``text_projection``)."""
        ids = torch.tensor([[self.config.tts_bos_token_id, self.config.tts_eos_token_id, self.config.tts_pad_token_id]])
        with torch.inference_mode():
            return self.thinker.get_input_embeddings()(ids)[0].float().numpy()

    def generate_kwargs(self, sampling: SamplingSettings) -> dict:
        """Arguments of ``thinker.generate`` for ``sampling`` (the reference passes
        ``max_new_tokens`` and ``eos_token_id``; greedy uses the checkpoint's greedy default)."""
        kw: dict = {"max_new_tokens": int(sampling.max_tokens),
                    "eos_token_id": None if sampling.ignore_eos else self.eos_token_id}
        if sampling.min_tokens:
            kw["min_new_tokens"] = int(sampling.min_tokens)
        if sampling.greedy:
            kw["do_sample"] = False
        else:
            kw.update(do_sample=True, temperature=float(sampling.temperature), top_p=float(sampling.top_p),
                      top_k=int(sampling.top_k) if sampling.top_k > 0 else None)
        return kw

    def stream(self, prompt_ids: Sequence[int], sampling: SamplingSettings, with_talker_inputs: bool = False,
               should_stop: Callable[[], bool] | None = None) -> Iterator[ThinkerStep]:
        """Generate; yield a :class:`ThinkerStep` per batch of new tokens, then a last one with
        ``finish_reason`` (and ``output`` when ``with_talker_inputs``; None when cancelled).

        Text deltas: the decode of all generated ids (special tokens skipped) minus what was sent,
        holding back a trailing U+FFFD (an incomplete UTF-8 sequence) and, with ``stop`` strings,
        the last ``max(len(stop)) - 1`` characters until they cannot start a stop string. The
        concatenated deltas equal ``tokenizer.decode(generated, skip_special_tokens=True)`` (cut
        before the first stop string, which is not included, as in vLLM).
        """
        user_stop = should_stop or (lambda: False)
        generated: list[int] = []
        stop_hit: list[bool] = []
        cancelled, closed = threading.Event(), threading.Event()
        n_prompt = len(prompt_ids)

        def text_of(ids):
            return self.tokenizer.decode(ids, skip_special_tokens=True)

        def stop_now(ids: torch.Tensor) -> bool:  # on the generate thread, after every token
            if closed.is_set() or user_stop():
                cancelled.set()
                return True
            if sampling.stop and _cut_at_stop(text_of(ids[0, n_prompt:].tolist()), sampling.stop)[1]:
                stop_hit.append(True)
                return True
            return False

        input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
        kw = self.generate_kwargs(sampling)
        if with_talker_inputs:
            kw.update(output_hidden_states=True, return_dict_in_generate=True)
        q: queue.Queue = queue.Queue()
        done = object()

        def run():
            from transformers import StoppingCriteriaList

            with self._lock:
                if sampling.seed is not None:
                    torch.manual_seed(int(sampling.seed))
                return self.thinker.generate(
                    input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                    streamer=_QueueStreamer(q), stopping_criteria=StoppingCriteriaList([_stopping(stop_now)]), **kw)

        sent = ""
        hold = max((len(s) for s in sampling.stop), default=1) - 1
        result = None
        it = _threaded(run, q, done, closed)
        for items in it:
            if not isinstance(items, list):
                result = items
                break
            generated.extend(items)
            if cancelled.is_set():
                continue
            text, cut = _cut_at_stop(text_of(generated), sampling.stop)
            upto = len(text) if cut else len(text) - hold
            while upto > len(sent) and text[upto - 1] == "\ufffd":
                upto -= 1
            if upto > len(sent):
                yield ThinkerStep(text[len(sent):upto], len(generated))
                sent = text[:upto]
        for rest in it:  # exhaust (joins the thread)
            result = rest
        if cancelled.is_set():
            yield ThinkerStep("", len(generated), "abort")
            return
        text, cut = _cut_at_stop(text_of(generated), sampling.stop)
        reason = "length"
        if cut or stop_hit:
            reason = "stop"
        elif not sampling.ignore_eos and generated and generated[-1] == self.eos_token_id:
            reason = "stop"
        output = None
        if with_talker_inputs and result is not None:
            hs = result.hidden_states
            layer = int(self.config.talker_config.accept_hidden_layer)
            output = ThinkerOutput(
                sequence=result.sequences[0].numpy().astype(np.int64),
                prompt_len=len(prompt_ids),
                embeds=torch.cat([h[0] for h in hs], dim=1)[0].float().numpy(),
                hidden=torch.cat([h[layer] for h in hs], dim=1)[0].float().numpy(),
                tts_embeds=self.tts_embeds(),
            )
        yield ThinkerStep(text[len(sent):] if text.startswith(sent) else "", len(generated), reason, output)


def prepare_thinker_request(thinker: "OmniThinker | ChatTokenizer", prompt: str | None, messages: str | None, sampling: str | None,
                            default_max_tokens: int, max_model_len: int, talker_inputs: bool = False
                            ) -> tuple[list[int], SamplingSettings]:
    """Validate one chat-contract request for the thinker; returns ``(prompt_ids, sampling)``.

    ``max_tokens`` defaults to ``min(default_max_tokens, max_model_len - prompt_len)``; a prompt of
    ``max_model_len`` tokens or more, or ``prompt + max_tokens > max_model_len``, is an
    :class:`OmniInputError` (as vLLM's OpenAI server refuses it). With ``talker_inputs`` the prompt
    must contain ``<|im_start|>assistant`` (the talker's prompt is built from that turn on).
    """
    if (prompt is None) == (messages is None):
        raise OmniInputError("exactly one of PROMPT and MESSAGES must be given")
    ids = thinker.encode(prompt=prompt) if messages is None else thinker.encode(messages=parse_messages(messages))
    if len(ids) >= max_model_len:
        raise OmniInputError(f"the prompt has {len(ids)} tokens; this model's context is max_model_len={max_model_len}")
    s = parse_sampling(sampling, min(default_max_tokens, max_model_len - len(ids)))
    if len(ids) + s.max_tokens > max_model_len:
        raise OmniInputError(f"prompt ({len(ids)} tokens) + max_tokens ({s.max_tokens}) exceeds max_model_len={max_model_len}")
    if talker_inputs and not thinker.has_assistant_start(ids):
        raise OmniInputError("audio output needs a chat prompt ending in <|im_start|>assistant (send MESSAGES)")
    return ids, s


# ------------------------------------------------------------------------------------ talker


def build_talker_inputs(model_like, out: ThinkerOutput, speaker_id: int, thinker_eos_token_id) -> dict:
    """The talker's ``generate`` inputs from the thinker's outputs, as
    ``Qwen3OmniMoeForConditionalGeneration.generate`` builds them (transformers 5.19,
    ``modeling_qwen3_omni_moe.py`` "2. Prepare talker input"), batch 1, text or multimodal user turns.

    ``model_like`` has ``.config`` (``Qwen3OmniMoeConfig``) and ``.talker``; the reference's own
    ``_get_talker_user_parts`` / ``_get_talker_assistant_parts`` are called on it.
    Returns ``inputs_embeds`` [1, S, Ht], ``trailing_text_hidden`` [1, N, Ht], ``tts_pad_embed``
    [1, 1, Ht], ``talker_input_ids`` int64 [1, S], ``attention_mask`` int64 [1, S].
    Raises :class:`OmniInputError` when the sequence has no ``<|im_start|>assistant`` or the thinker
    generated fewer than 2 tokens (the reference needs the first generated token's embedding).
    """
    from transformers import Qwen3OmniMoeForConditionalGeneration as Ref

    cfg, talker = model_like.config, model_like.talker
    seq = torch.from_numpy(np.asarray(out.sequence, np.int64))[None]
    input_ids = seq[:, : out.prompt_len]
    thinker_embed = torch.from_numpy(np.asarray(out.embeds, np.float32))[None].to(talker.dtype)
    thinker_hidden = torch.from_numpy(np.asarray(out.hidden, np.float32))[None].to(talker.dtype)
    if seq.shape[1] - out.prompt_len < 2:
        raise OmniInputError("the thinker generated fewer than 2 tokens: nothing to speak")
    tc = cfg.thinker_config
    multimodal_mask = (seq == tc.audio_token_id) | (seq == tc.image_token_id) | (seq == tc.video_token_id)
    attn = input_ids.new_ones(input_ids.shape)
    L = input_ids.shape[1]
    pos = torch.arange(L).unsqueeze(0).expand_as(input_ids)
    im_start_pos = torch.where(input_ids == cfg.im_start_token_id, pos, pos.new_full((), -1))
    prev_im_start = torch.cummax(im_start_pos, dim=-1).values.clamp_min(0)
    role_ids = input_ids.gather(1, (prev_im_start + 1).clamp_max(L - 1))
    user_mask = (role_ids == cfg.user_token_id) & attn.bool()
    user_lengths = user_mask.sum(dim=-1)
    max_user = int(user_lengths.max().item())
    user_idx = torch.where(user_mask, L + pos, pos).argsort(dim=-1)[:, -max_user:] if max_user else pos[:, :0]
    full_user = Ref._get_talker_user_parts(model_like, 0, L, multimodal_mask, thinker_hidden, thinker_embed)
    user_embeds = full_user.gather(1, user_idx.unsqueeze(-1).expand(-1, -1, full_user.shape[-1]))
    user_ids = seq[:, :L].gather(1, user_idx)
    user_attn = (torch.arange(max_user).unsqueeze(0) >= (max_user - user_lengths).unsqueeze(1)).to(attn.dtype)
    starts = torch.nonzero(((input_ids[:, :-1] == cfg.im_start_token_id)
                            & (input_ids[:, 1:] == cfg.assistant_token_id))[0]).flatten()
    if starts.numel() == 0:
        raise OmniInputError("speech needs a chat prompt (<|im_start|>assistant); use MESSAGES")
    assistant_start = int(starts[-1].item())
    # the thinker's input embeddings of tts_bos/eos/pad arrive in out.tts_embeds
    tts = talker.text_projection(torch.from_numpy(np.asarray(out.tts_embeds, np.float32))[None].to(talker.dtype))
    tts_bos, tts_eos, tts_pad = tts.chunk(3, dim=1)
    asst_embeds, asst_ids, trailing = Ref._get_talker_assistant_parts(
        model_like, assistant_start, seq.shape[-1], speaker_id, thinker_embed, tts_pad, tts_bos, tts_eos)
    if thinker_eos_token_id is not None:
        gen_ids = seq[:, L:]
        eos_ids = torch.as_tensor(thinker_eos_token_id).flatten()
        is_eos = (gen_ids.unsqueeze(-1) == eos_ids).any(dim=-1)
        n = gen_ids.shape[1]
        first_eos = torch.where(is_eos, torch.arange(n), n).min(dim=-1).values
        tpos = torch.arange(trailing.shape[1]).unsqueeze(0)
        trailing = torch.where((tpos > first_eos.unsqueeze(1)).unsqueeze(-1), tts_pad.to(trailing.dtype), trailing)
        trailing = torch.where((tpos == first_eos.unsqueeze(1)).unsqueeze(-1), tts_eos.to(trailing.dtype), trailing)
    return {
        "inputs_embeds": torch.cat((user_embeds, asst_embeds), dim=1),
        "trailing_text_hidden": trailing,
        "tts_pad_embed": tts_pad,
        "talker_input_ids": torch.cat((user_ids, asst_ids), dim=1),
        "attention_mask": torch.cat((user_attn, attn.new_ones((1, asst_embeds.shape[1]))), dim=1),
    }


@dataclass
class TalkerSettings:
    """Talker generation; defaults are the reference ``generate``'s (``talker_*`` arguments),
    except ``do_sample`` which the served config sets (greedy for parity tests)."""

    max_frames: int = 4096
    min_frames: int = 0
    do_sample: bool = True
    top_k: int = 50
    top_p: float = 1.0
    temperature: float = 0.9
    repetition_penalty: float = 1.05


def talker_generate_kwargs(config, s: TalkerSettings) -> dict:
    """``talker.generate`` keyword arguments exactly as the reference builds ``talker_kwargs``."""
    tcfg = config.talker_config
    vocab = tcfg.text_config.vocab_size
    kw = {
        "max_new_tokens": int(s.max_frames), "do_sample": bool(s.do_sample), "top_k": int(s.top_k),
        "top_p": float(s.top_p), "temperature": float(s.temperature), "eos_token_id": tcfg.codec_eos_token_id,
        "repetition_penalty": float(s.repetition_penalty),
        "suppress_tokens": [i for i in range(vocab - 1024, vocab) if i != tcfg.codec_eos_token_id],
        "output_hidden_states": True, "return_dict_in_generate": True,
    }
    if s.min_frames:
        kw["min_new_tokens"] = int(s.min_frames)
    return kw


class OmniTalker:
    """Talker + code predictor of a Qwen3-Omni checkpoint, streaming codec frames.

    Runs ``model.talker.generate`` with :func:`build_talker_inputs` and
    :func:`talker_generate_kwargs` (the reference's own path). A frame's residual codebooks are
    drawn by the code predictor inside the *next* step's ``prepare_inputs_for_generation`` and come
    out of that step's forward as ``hidden_states[1]`` (``residual_codes`` [1, G]); a forward hook
    on the talker queues each one, so a frame streams out one talker step after its codebook 0.
    The reference collects the same tensors from ``talker_result.hidden_states`` afterwards.
    """

    def __init__(self, model, manifest: dict | None = None):
        self.model = model
        self.talker = model.talker
        self.config = model.config
        self.manifest = manifest or {}
        self.num_code_groups = int(self.config.talker_config.num_code_groups)
        self.speaker_ids = {k.lower(): int(v) for k, v in self.config.talker_config.speaker_id.items()}
        self.thinker_eos_token_id = int(self.manifest.get("thinker_eos_token_id", self.config.im_end_token_id))
        self._lock = threading.Lock()

    @classmethod
    def from_pretrained(cls, model_dir, device: str = "cpu") -> "OmniTalker":
        """Loads the whole checkpoint, then drops the thinker and code2wav (a real deployment would
        save the talker as its own folder; the tiny one is a few MB)."""
        from transformers import Qwen3OmniMoeForConditionalGeneration

        model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir).to(device).eval()
        del model.thinker, model.code2wav
        return cls(model, read_manifest(model_dir))

    def speaker_id(self, voice: str) -> int:
        try:
            return self.speaker_ids[voice.lower()]
        except KeyError:
            raise OmniInputError(f"unknown voice {voice!r}; available: {', '.join(self.speaker_ids)}") from None

    def stream(self, out: ThinkerOutput, voice: str, settings: TalkerSettings,
               should_stop: Callable[[], bool] | None = None) -> Iterator[np.ndarray]:
        """Yield int64 [n, G] codec frames (n >= 1) as they are generated. Stops at the codec EOS,
        ``max_frames``, or when ``should_stop()`` is True (checked after every talker step)."""
        inputs = build_talker_inputs(self.model, out, self.speaker_id(voice), self.thinker_eos_token_id)
        kw = talker_generate_kwargs(self.config, settings)
        user_stop = should_stop or (lambda: False)
        closed = threading.Event()
        q: queue.Queue = queue.Queue()
        done = object()

        def hook(module, args, output):
            codes = output.hidden_states[1] if output.hidden_states is not None else None
            if codes is not None:
                q.put(codes[0].to(torch.int64).numpy().copy())

        def run():
            from transformers import StoppingCriteriaList

            with self._lock:
                handle = self.talker.register_forward_hook(hook)
                try:
                    stop = _stopping(lambda ids: closed.is_set() or user_stop())
                    self.talker.generate(**inputs, stopping_criteria=StoppingCriteriaList([stop]), **kw)
                finally:
                    handle.remove()

        for items in _threaded(run, q, done, closed):
            if isinstance(items, list) and items:
                yield np.stack(items).astype(np.int64)


# ---------------------------------------------------------------------------------- code2wav


class OmniCode2Wav:
    """Qwen3-Omni code2wav: int64 [T, G] codec frames -> float32 24 kHz PCM, chunk by chunk.

    ``samples_per_frame`` = ``total_upsample`` (1920). A decode of n frames gives
    ``n * spf - trailing_loss`` samples (the causal transposed convs of the decoder blocks trim
    the samples that need the next frame; 555 for upsample_rates 8,5,4,3), measured at load time.
    Chunks with left context keep :func:`keep_new_samples`, so the concatenated chunks tile the
    one-shot decode. Batched decode right-pads to the longest item: every layer is causal up to
    that trimmed tail, so padding does not reach the kept samples (see the unit tests).
    """

    def __init__(self, code2wav, sampling_rate: int = 24000):
        self.code2wav = code2wav.eval()
        cfg = code2wav.config
        self.sampling_rate = int(sampling_rate)
        self.samples_per_frame = int(code2wav.total_upsample)
        self.num_code_groups = int(cfg.num_quantizers)
        self.codebook_size = int(cfg.codebook_size)
        with torch.inference_mode():
            n = self.code2wav(torch.zeros((1, self.num_code_groups, 2), dtype=torch.long)).shape[-1]
        self.trailing_loss = 2 * self.samples_per_frame - int(n)

    @classmethod
    def from_pretrained(cls, model_dir, device: str = "cpu") -> "OmniCode2Wav":
        from transformers import Qwen3OmniMoeForConditionalGeneration

        model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir).to(device).eval()
        sr = read_manifest(model_dir).get("sampling_rate", 24000)
        return cls(model.code2wav, sr)

    def output_samples(self, n_frames: int, left_context: int) -> int:
        """Samples :meth:`decode` returns for a chunk."""
        lo = left_context * self.samples_per_frame - (self.trailing_loss if left_context > 0 else 0)
        return max(n_frames * self.samples_per_frame - self.trailing_loss - max(lo, 0), 0)

    def decode(self, codes_list: Sequence[np.ndarray], left_context_list: Sequence[int] | None = None) -> list[np.ndarray]:
        """Decode a batch in one forward pass: ``[T_i, G]`` int arrays (0 allowed) -> float32 PCM of
        each item's new frames (:func:`keep_new_samples`). Codes outside [0, codebook_size) raise."""
        return decode_ragged(codes_list, left_context_list, self.num_code_groups, self.codebook_size,
                             self.samples_per_frame, lambda codes: self.code2wav(codes)[:, 0],
                             trailing_loss=self.trailing_loss)

    def decode_reference(self, codes: np.ndarray) -> np.ndarray:
        """The reference's own decode: ``code2wav.chunked_decode(codes, chunk_size=300,
        left_context_size=25)`` as ``Qwen3OmniMoeForConditionalGeneration.generate`` calls it."""
        with torch.inference_mode():
            t = torch.from_numpy(np.asarray(codes, np.int64)).T[None]
            return self.code2wav.chunked_decode(t, chunk_size=300, left_context_size=25)[0, 0].float().numpy()


# ------------------------------------------------------------------------- in-process pipeline


@dataclass
class OmniResult:
    """Output of :func:`run_pipeline`: text deltas, codes int64 [T, G], audio chunks float32."""

    text_deltas: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0
    codes: np.ndarray | None = None
    audio_chunks: list[np.ndarray] = field(default_factory=list)
    timings: dict = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "".join(self.text_deltas)

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.audio_chunks) if self.audio_chunks else np.zeros(0, np.float32)


def run_pipeline(thinker: OmniThinker, talker: OmniTalker | None, decoder: OmniCode2Wav | None,
                 prompt_ids: Sequence[int], sampling: SamplingSettings, voice: str = "Ethan",
                 talker_settings: TalkerSettings | None = None, audio: bool = True,
                 first_chunk_frames: int = 5, chunk_frames: int = 25, left_context_frames: int = 25) -> OmniResult:
    """The whole pipeline in-process, doing what the ``omni`` BLS model does through Triton:
    thinker text deltas -> (audio) talker frames -> :class:`ChunkSchedule` -> code2wav chunks.
    The no-Triton baseline of the benchmark and the unit parity test's subject.

    ``timings`` (seconds): ``ttft_s`` (first text delta), ``thinker_s`` (thinker done),
    ``ttfp_s`` (first audio chunk), ``total_s``; stage costs ``talker_s`` (talker + code
    predictor, wall time while streaming minus decoding) and ``code2wav_s`` (sum over chunks);
    ``frames``: codec frames generated."""
    t0 = time.perf_counter()
    res = OmniResult()
    out = None
    for step in thinker.stream(prompt_ids, sampling, with_talker_inputs=audio):
        if step.text:
            res.text_deltas.append(step.text)
            res.timings.setdefault("ttft_s", time.perf_counter() - t0)
        res.completion_tokens = step.completion_tokens
        if step.finish_reason:
            res.finish_reason, out = step.finish_reason, step.output
    res.timings["thinker_s"] = time.perf_counter() - t0
    if not audio or out is None or len(out.sequence) - out.prompt_len < 2:
        return res
    sched = ChunkSchedule(first_chunk_frames, chunk_frames, left_context_frames)
    frames: list[np.ndarray] = []
    res.timings["code2wav_s"] = 0.0

    def emit(chunks):
        codes = np.concatenate(frames)
        for c, left in chunk_slices(codes, chunks):
            td = time.perf_counter()
            res.audio_chunks.append(decoder.decode([c], [left])[0])
            res.timings["code2wav_s"] += time.perf_counter() - td
            res.timings.setdefault("ttfp_s", time.perf_counter() - t0)

    total = 0
    t_talker = time.perf_counter()
    for new in talker.stream(out, voice, talker_settings or TalkerSettings()):
        frames.append(new)
        total += len(new)
        emit(sched.push(total))
    if frames:
        emit(sched.flush(total))
    res.codes = np.concatenate(frames) if frames else np.zeros((0, talker.num_code_groups), np.int64)
    res.timings["total_s"] = time.perf_counter() - t0
    res.timings["talker_s"] = time.perf_counter() - t_talker - res.timings["code2wav_s"]
    res.timings["frames"] = int(total)
    return res
