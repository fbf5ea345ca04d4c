"""Tiny random-weight Whisper checkpoint (``WhisperForConditionalGeneration`` + a locally trained
byte-level BPE tokenizer with Whisper's special tokens + ``WhisperFeatureExtractor``), saved with
``save_pretrained`` so the stages (and the parity tests) load it with ``from_pretrained`` exactly
as they would load ``openai/whisper-tiny``, and ``model.generate(input_features, language=...,
task=...)`` works on it (the generation config carries ``lang_to_id``, ``task_to_id``,
``no_timestamps_token_id``, ``prev_sot_token_id``...).

Special tokens follow Whisper's layout (``openai/whisper`` tokenizer.py): after the text vocabulary
``<|endoftext|>``, ``<|startoftranscript|>``, one ``<|xx|>`` per language of
``transformers.models.whisper.tokenization_whisper.LANGUAGES`` in that order (the tokenizer's
``prefix_tokens`` computes a language id as ``sot + 1 + index``), ``<|translate|>``,
``<|transcribe|>``, ``<|startoflm|>``, ``<|startofprev|>``, ``<|nospeech|>``, ``<|notimestamps|>``
(no timestamp tokens: the stages never predict timestamps).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from omni_triton.checkpoints.common import MANIFEST, build_once

BUILDER_VERSION = 1
NAME = "whisper-tiny-random"

EOT, SOT = "<|endoftext|>", "<|startoftranscript|>"
TRANSLATE, TRANSCRIBE = "<|translate|>", "<|transcribe|>"
SOLM, SOPREV, NOSPEECH, NOTIMESTAMPS = "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"

# English text the byte-level BPE is trained on (any text works: byte-level BPE encodes every
# string; merges make common words single tokens, so random decoding prints word-like text).
_TRAIN_TEXT = """\
The quick brown fox jumps over the lazy dog. Hello, world! How are you today?
The capital of France is Paris. Speech recognition turns audio into text.
Omni Triton serves speech, text, images and video with NVIDIA Triton Inference Server.
This is a test of the speech to text system. The weather is nice and the sky is blue.
She sells sea shells by the sea shore. Peter Piper picked a peck of pickled peppers.
One, two, three, four, five, six, seven, eight, nine, ten. Good morning and good night.
An encoder turns log mel features into hidden states; a decoder writes the words one by one.
What time is it? It is half past nine. Please speak slowly and clearly, thank you.
"""


@dataclass(frozen=True)
class TinyWhisperSpec:
    """Sizes of the tiny random Whisper. Real whisper-tiny: d_model 384, 4+4 layers, 6 heads,
    80 mel bins, 1500 source / 448 target positions, vocab 51865. The source positions are kept
    (30 s of 10 ms mel frames, halved by the second conv: 1500) so the feature extractor's
    fixed 30 s padding fits."""

    d_model: int = 64
    encoder_layers: int = 2
    decoder_layers: int = 2
    heads: int = 4
    ffn_dim: int = 128
    num_mel_bins: int = 80
    max_source_positions: int = 1500
    max_target_positions: int = 128
    bpe_vocab: int = 600
    default_max_new_tokens: int = 24
    embed_std: float = 0.05  # token embeddings (tied to proj_out)
    linear_std: float = 3.0  # x 1/sqrt(fan_in): larger than the default init, so the text follows the audio

    def config_hash(self, seed: int) -> str:
        blob = json.dumps({"spec": self.__dict__, "seed": seed, "v": BUILDER_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def special_tokens() -> list[str]:
    """Whisper's special tokens in id order (module docstring)."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    return [EOT, SOT, *(f"<|{code}|>" for code in LANGUAGES), TRANSLATE, TRANSCRIBE, SOLM, SOPREV, NOSPEECH,
            NOTIMESTAMPS]


def _train_tokenizer(spec: TinyWhisperSpec):
    """A ``WhisperTokenizer`` over a byte-level BPE trained on ``_TRAIN_TEXT`` (text ids first,
    then :func:`special_tokens` as added special tokens)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import WhisperTokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=spec.bpe_vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(_TRAIN_TEXT.splitlines(), trainer=trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = WhisperTokenizer(vocab=model["vocab"], merges=merges, model_max_length=spec.max_target_positions)
    specials = special_tokens()
    tok.add_special_tokens({"additional_special_tokens": specials[1:]})  # EOT is already bos/eos/unk
    tok.pad_token = EOT
    ids = tok.convert_tokens_to_ids(specials)
    if ids != list(range(ids[0], ids[0] + len(specials))):
        raise RuntimeError("Whisper special tokens did not get consecutive ids")
    return tok


def build_tiny_whisper(out_dir: Path, seed: int = 0, spec: TinyWhisperSpec | None = None) -> Path:
    """Build and save a tiny random-weight Whisper into ``out_dir``; return ``out_dir``.

    Writes (all via ``save_pretrained``): ``config.json`` + ``model.safetensors`` +
    ``generation_config.json`` (greedy; ``lang_to_id``/``task_to_id`` for ``generate(language=,
    task=)``; every special token but ``<|endoftext|>`` suppressed, ``<|endoftext|>`` suppressed at
    the first position as Whisper's ``begin_suppress_tokens``; ``max_new_tokens``), the
    ``WhisperProcessor`` files (tokenizer + 80-bin 16 kHz feature extractor) and
    ``manifest.json`` (seed, config hash). Idempotent: returns at once when the manifest exists
    with the same hash.
    """
    spec = spec or TinyWhisperSpec()
    return build_once(Path(out_dir), spec.config_hash(seed), lambda d, h: _build(d, seed, spec, h))


def _build(out_dir: Path, seed: int, spec: TinyWhisperSpec, h: str) -> None:
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
    )
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    tok = _train_tokenizer(spec)
    fe = WhisperFeatureExtractor(feature_size=spec.num_mel_bins, sampling_rate=16000, hop_length=160,
                                 chunk_length=30, n_fft=400)
    ids = {t: tok.convert_tokens_to_ids(t) for t in special_tokens()}
    cfg = WhisperConfig(
        vocab_size=len(tok), num_mel_bins=spec.num_mel_bins, d_model=spec.d_model,
        encoder_layers=spec.encoder_layers, decoder_layers=spec.decoder_layers,
        encoder_attention_heads=spec.heads, decoder_attention_heads=spec.heads,
        encoder_ffn_dim=spec.ffn_dim, decoder_ffn_dim=spec.ffn_dim,
        max_source_positions=spec.max_source_positions, max_target_positions=spec.max_target_positions,
        pad_token_id=ids[EOT], bos_token_id=ids[EOT], eos_token_id=ids[EOT], decoder_start_token_id=ids[SOT],
        begin_suppress_tokens=[ids[EOT]], suppress_tokens=[],
    )
    model = WhisperForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        # The default init (std 0.02) gives near-uniform attention: the text would not depend on
        # the audio. Larger weights make different audio give different text.
        for mod in model.modules():
            if isinstance(mod, torch.nn.Linear) and mod is not model.proj_out:
                std = spec.linear_std / mod.in_features ** 0.5
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen) * std)
        emb = model.model.decoder.embed_tokens.weight
        emb.copy_(torch.randn(emb.shape, generator=gen) * spec.embed_std)  # proj_out is tied to it

    gc = GenerationConfig(
        decoder_start_token_id=ids[SOT], bos_token_id=ids[EOT], eos_token_id=ids[EOT], pad_token_id=ids[EOT],
        do_sample=False, num_beams=1, max_new_tokens=spec.default_max_new_tokens,
        # every special token but <|endoftext|> suppressed (the random model would emit them), and
        # the 256 single-byte tokens, so any decoded prefix is whole UTF-8 text (merges are ASCII)
        suppress_tokens=list(range(256)) + [i for t, i in ids.items() if t != EOT],
        begin_suppress_tokens=[ids[EOT]],  # never an empty transcript (Whisper's [220, eot])
    )
    gc.is_multilingual = True
    gc.lang_to_id = {f"<|{code}|>": ids[f"<|{code}|>"] for code in LANGUAGES}
    gc.task_to_id = {"transcribe": ids[TRANSCRIBE], "translate": ids[TRANSLATE]}
    gc.no_timestamps_token_id = ids[NOTIMESTAMPS]
    gc.prev_sot_token_id = ids[SOPREV]
    gc.max_initial_timestamp_index = 50
    gc.return_timestamps = False
    model.generation_config = gc

    model.save_pretrained(out_dir)
    WhisperProcessor(feature_extractor=fe, tokenizer=tok).save_pretrained(out_dir)
    manifest = {"name": NAME, "seed": seed, "config_hash": h, "builder_version": BUILDER_VERSION,
                "spec": spec.__dict__, "languages": list(LANGUAGES), "sampling_rate": 16000}
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1))  # written last: marks the build complete


def checkpoint_dir(name: str = NAME) -> Path:
    """Folder of the Whisper checkpoint ``name`` in the cache (``omni_triton.paths.model_dir``);
    the tiny random one is (re)built here if missing (idempotent, a few seconds), any other
    name must already be there."""
    from omni_triton.paths import model_dir

    path = model_dir(name)
    if name == NAME:
        build_tiny_whisper(path)
    return path
