"""Tiny random-weight Qwen3-TTS checkpoints in the official ``qwen-tts`` package's layout, built from
its own config classes and saved with ``save_pretrained`` (runs in the Qwen3-TTS environment,
``requirements-qwen3-tts.lock``: transformers 4.57.3).

One folder per form (``tts_model_type``): ``custom_voice/``, ``voice_design/``, ``base/`` (the
only one with a speaker encoder), each holding ``config.json`` + weights (``Qwen3TTSConfig`` ->
``Qwen3TTSForConditionalGeneration``), ``generation_config.json`` (greedy), the text tokenizer
(a locally trained byte-level BPE with the ChatML and TTS special tokens, wrapped as
``Qwen2TokenizerFast``: ``omni_triton.checkpoints.qwen3_omni.train_chatml_tokenizer``) and
``speech_tokenizer/`` (the 12 Hz codec ``Qwen3TTSTokenizerV2Model``: Mimi encoder + causal
decoder, one random codec shared by the three forms, with an ``EncodecFeatureExtractor``).
Everything loads with the package's real loading code, ``qwen_tts.Qwen3TTSModel.from_pretrained``.

The decoder's receptive field (sliding window 4 frames, one layer, short causal convs) is kept
below the streaming left context (25 frames), so chunked streaming decode equals the package's
one-shot decode up to float rounding (docs/qwen3_tts.md, "Parity").

Run as ``python -m omni_triton.checkpoints.qwen3_tts OUT_DIR`` (``omni-triton prepare`` does this
with the Qwen3-TTS environment's interpreter).
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

BUILDER_VERSION = 3  # 3: initializer_range 0.2 (at 0.02 the inputs never changed a greedy frame)
FORMS = ("custom_voice", "voice_design", "base")
SPEAKERS = ("vivian", "ryan", "serena")  #: built-in speakers of the tiny custom_voice form
LANGUAGES = ("english", "chinese")


@dataclass(frozen=True)
class TinyQwen3TtsSpec:
    codebook_size: int = 64  # C: codes per codebook (the real 12 Hz codec has 2048)
    num_code_groups: int = 4  # G: codebooks per frame (real: 16)
    hidden: int = 32  # talker / code predictor / speaker-embedding width
    talker_layers: int = 2
    predictor_layers: int = 1
    text_vocab: int = 384
    text_hidden: int = 32
    codec_hidden: int = 32  # Mimi encoder + codec decoder width

    def config_hash(self, seed: int) -> str:
        blob = json.dumps({"spec": asdict(self), "seed": seed, "v": BUILDER_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _codec_ids(c: int) -> dict:
    """Talker special ids above the codebook range (the talker's vocabulary is C + 1024; the package
    suppresses its last 1024 ids except EOS while generating)."""
    return dict(codec_pad_id=c, codec_bos_id=c + 1, codec_eos_token_id=c + 2, codec_think_id=c + 3,
                codec_nothink_id=c + 4, codec_think_bos_id=c + 5, codec_think_eos_id=c + 6,
                codec_language_id={lang: c + 10 + i for i, lang in enumerate(LANGUAGES)},
                spk_id={s: c + 20 + i for i, s in enumerate(SPEAKERS)},
                spk_is_dialect={s: False for s in SPEAKERS})


def build_tiny_qwen3_tts(out_dir: Path, seed: int = 0, spec: TinyQwen3TtsSpec | None = None) -> Path:
    """Write the three tiny forms under ``out_dir`` (idempotent: skipped when ``manifest.json``
    records the same spec and seed). Fixed seed; a few seconds and ~2 MB.

    Returns:
        ``out_dir``; ``out_dir/<form>`` loads with ``Qwen3TTSModel.from_pretrained``.
    """
    from omni_triton.checkpoints.common import build_once

    spec = spec or TinyQwen3TtsSpec()
    return build_once(Path(out_dir), spec.config_hash(seed), lambda d, h: _build(d, seed, spec, h))


def _build(out_dir: Path, seed: int, spec: TinyQwen3TtsSpec, h: str) -> None:
    import shutil

    import torch
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration, Qwen3TTSProcessor
    from transformers import EncodecFeatureExtractor, MimiConfig

    from omni_triton.checkpoints.common import MANIFEST, kaiming_init_convs_
    from omni_triton.checkpoints.qwen3_omni import IM_END, IM_START, TTS_BOS, TTS_EOS, TTS_PAD, train_chatml_tokenizer

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    c, g, d = spec.codebook_size, spec.num_code_groups, spec.hidden
    tok = train_chatml_tokenizer(spec.text_vocab)
    ids = {name: tok.convert_tokens_to_ids(name) for name in (IM_START, IM_END, TTS_PAD, TTS_BOS, TTS_EOS)}

    # --- the 12 Hz codec (speech tokenizer): Mimi encoder + causal decoder, 1920 samples per frame
    codec_dir = out_dir / "_speech_tokenizer"
    mimi = MimiConfig(hidden_size=spec.codec_hidden, num_filters=8, num_hidden_layers=1,
                      intermediate_size=2 * spec.codec_hidden, num_attention_heads=2, num_key_value_heads=2,
                      codebook_size=c, codebook_dim=16, vector_quantization_hidden_dimension=16,
                      num_quantizers=g, num_semantic_quantizers=1, upsample_groups=spec.codec_hidden,
                      sliding_window=16, max_position_embeddings=8000)
    codec_cfg = Qwen3TTSTokenizerV2Config(
        encoder_config=mimi.to_dict(), encoder_valid_num_quantizers=g,
        decoder_config=dict(codebook_size=c, codebook_dim=16, hidden_size=spec.codec_hidden,
                            latent_dim=spec.codec_hidden, num_attention_heads=2, num_key_value_heads=2,
                            intermediate_size=2 * spec.codec_hidden, num_hidden_layers=1, sliding_window=4,
                            num_quantizers=g, upsample_rates=(8, 5, 4, 3), upsampling_ratios=(2, 2),
                            decoder_dim=64, max_position_embeddings=8000))
    codec = Qwen3TTSTokenizerV2Model(codec_cfg).eval()
    with torch.no_grad():
        dec = codec.decoder
        kaiming_init_convs_(dec, gen, dec.decoder[-1].conv, 0.01)
        for name, p in dec.named_parameters():
            if name.endswith("embedding_sum"):  # codebooks start as zeros (trained by EMA): random here
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith((".alpha", ".beta")):  # SnakeBeta (log-scale): a little spread
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    codec.save_pretrained(codec_dir)
    EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0).save_pretrained(codec_dir)

    talker = dict(vocab_size=c + 1024, hidden_size=d, intermediate_size=2 * d, num_hidden_layers=spec.talker_layers,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_code_groups=g,
                  text_hidden_size=spec.text_hidden, text_vocab_size=len(tok), max_position_embeddings=4096,
                  # ~1/sqrt(width) instead of the package's 0.02 (made for width 1024+): at 0.02 in
                  # width 32 the layers barely mix, each frame followed from the last token alone,
                  # and text, instructions and speaker never changed a greedy frame (tests rely on them)
                  initializer_range=0.2,
                  rope_scaling={"rope_type": "default", "mrope_section": [4, 2, 2], "interleaved": True},
                  code_predictor_config=dict(vocab_size=c, hidden_size=d, intermediate_size=2 * d,
                                             num_hidden_layers=spec.predictor_layers, num_attention_heads=2,
                                             num_key_value_heads=1, head_dim=16, num_code_groups=g,
                                             max_position_embeddings=g + 2, initializer_range=0.2),
                  **_codec_ids(c))
    speaker_enc = dict(mel_dim=128, enc_dim=d, enc_channels=[16, 16, 16, 16, 48], enc_attention_channels=8,
                       enc_res2net_scale=4, enc_se_channels=8, sample_rate=24000)
    for form in FORMS:
        torch.manual_seed(seed + FORMS.index(form))
        cfg = Qwen3TTSConfig(talker_config=talker, speaker_encoder_config=speaker_enc,
                             tokenizer_type="qwen3_tts_tokenizer_12hz",
                             tts_model_size="tiny", tts_model_type=form, im_start_token_id=ids[IM_START],
                             im_end_token_id=ids[IM_END], tts_pad_token_id=ids[TTS_PAD],
                             tts_bos_token_id=ids[TTS_BOS], tts_eos_token_id=ids[TTS_EOS])
        model = Qwen3TTSForConditionalGeneration(cfg).eval()
        dest = out_dir / form
        model.save_pretrained(dest)
        # Qwen3TTSSpeakerEncoderConfig takes no **kwargs: keep only its own fields in config.json,
        # as the published checkpoints do (save_pretrained adds model_type, transformers_version ...).
        cfg_path = dest / "config.json"
        saved = json.loads(cfg_path.read_text())
        saved["speaker_encoder_config"] = speaker_enc
        cfg_path.write_text(json.dumps(saved, indent=2))
        Qwen3TTSProcessor(tokenizer=tok).save_pretrained(dest)
        (dest / "generation_config.json").write_text(json.dumps(dict(
            do_sample=False, subtalker_dosample=False, repetition_penalty=1.05, max_new_tokens=200,
            top_k=50, top_p=1.0, temperature=0.9, subtalker_top_k=50, subtalker_top_p=1.0,
            subtalker_temperature=0.9), indent=1))
        shutil.copytree(codec_dir, dest / "speech_tokenizer", dirs_exist_ok=True)
    shutil.rmtree(codec_dir)
    (out_dir / MANIFEST).write_text(json.dumps({
        "config_hash": h, "seed": seed, "spec": asdict(spec), "forms": list(FORMS), "speakers": list(SPEAKERS),
        "languages": list(LANGUAGES), "sample_rate": 24000, "frame_rate": 12.5, "builder_version": BUILDER_VERSION,
    }, indent=1))


if __name__ == "__main__":
    build_tiny_qwen3_tts(Path(sys.argv[1]))
    print(sys.argv[1])
