"""Tiny random-weight Qwen2.5-Omni checkpoint (thinker, talker, token2wav = DiT + BigVGAN, the
speaker dict ``spk_dict.pt``, a locally trained ChatML tokenizer), saved with ``save_pretrained``.

Loaded with ``Qwen2_5OmniForConditionalGeneration.from_pretrained(dir)`` exactly as
``Qwen/Qwen2.5-Omni-7B`` would be (its ``from_pretrained`` also reads ``spk_dict.pt``).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from omni_triton.checkpoints.common import MANIFEST, build_once, kaiming_init_convs_, read_manifest

BUILDER_VERSION = 1

NAME = "qwen2.5-omni-tiny"
#: Text-side bos token of each voice (the real spk_dict gives each speaker its own ``bos_token``):
#: one special token per speaker, added after the ChatML specials.
SPEAKERS = ("Chelsie", "Ethan")
SPEAKER_BOS = {name: f"<|tts_bos_{name.lower()}|>" for name in SPEAKERS}


@dataclass(frozen=True)
class TinyQwen25OmniSpec:
    """Sizes of the tiny random Qwen2.5-Omni. The real Qwen2.5-Omni-7B: thinker 3584 hidden x 28
    layers (Qwen2.5-7B), talker 896 x 24 over 8448 codec ids (8192 codes), DiT 1024 x 22 (mel 80,
    block 24, 2 mel frames per code), BigVGAN 1536 initial channels, upsample 5,3,2,2,2,2 (240
    samples per mel frame at 24 kHz: 50 codes/s)."""

    text_vocab: int = 512
    thinker_hidden: int = 64
    thinker_layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    mrope_section: tuple = (2, 3, 3)  # sums to head_dim / 2 = 64 / 4 / 2
    talker_hidden: int = 64
    talker_layers: int = 2
    talker_head_dim: int = 16
    codebook_size: int = 64  # codes 0..63, then the talker's special ids
    dit_hidden: int = 32
    dit_layers: int = 2
    dit_heads: int = 2
    mel_dim: int = 16
    block_size: int = 24
    bigvgan_channels: int = 128  # halved per upsample: 128 / 2**6 = 2 channels at the last stage
    ref_mel_frames: int = 30
    wave_std: float = 0.1  # BigVGAN output std on random codes (calibrated by the builder)
    speakers: tuple = SPEAKERS

    def config_hash(self, seed: int) -> str:
        blob = json.dumps({"spec": self.__dict__, "seed": seed, "v": BUILDER_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def build_tiny_qwen2_5_omni(out_dir: Path, seed: int = 0, spec: TinyQwen25OmniSpec | None = None) -> Path:
    """Build and save a tiny random-weight ``Qwen2_5OmniForConditionalGeneration`` into ``out_dir``.

    Writes ``config.json``, ``model.safetensors``, ``generation_config.json`` (greedy thinker),
    ``spk_dict.pt`` (per voice: ``bos_token`` int, ``cond`` float32 [1, enc_emb_dim], ``ref_mel``
    float32 [1, frames, mel_dim]), the tokenizer files and ``manifest.json`` (seed, config hash,
    special ids, the talker's EOS ids). Idempotent: returns at once when the manifest has the same
    hash. A few MB, seconds.
    """
    spec = spec or TinyQwen25OmniSpec()
    return build_once(Path(out_dir), spec.config_hash(seed), lambda d, h: _build(d, seed, spec, h))


def _tokenizer(spec: TinyQwen25OmniSpec):
    """The Qwen3-Omni builder's ChatML BPE tokenizer plus one bos token per voice."""
    from omni_triton.checkpoints.qwen3_omni import train_chatml_tokenizer

    tok = train_chatml_tokenizer(spec.text_vocab)
    tok.add_special_tokens({"additional_special_tokens": [SPEAKER_BOS[s] for s in spec.speakers]},
                           replace_extra_special_tokens=False)
    return tok


def _build(out_dir: Path, seed: int, spec: TinyQwen25OmniSpec, h: str) -> None:
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

    from omni_triton.checkpoints import qwen3_omni as q3

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    tok = _tokenizer(spec)
    names = q3.SPECIAL_TOKENS + list(q3.ROLE_WORDS) + [SPEAKER_BOS[s] for s in spec.speakers]
    ids = {t: tok.convert_tokens_to_ids(t) for t in names}
    assert len(set(ids.values())) == len(ids), "special tokens must be distinct single tokens"
    C = spec.codebook_size
    # Talker ids: codes [0, C), then pad, bos (start), eos (end), mask, as 8192 + (100, 101, 102, 104)
    # in the real vocabulary; a few spare ids round the vocabulary up.
    codec = dict(tts_codec_pad_token_id=C, tts_codec_start_token_id=C + 1, tts_codec_end_token_id=C + 2,
                 tts_codec_mask_token_id=C + 3)
    talker_vocab = C + 8
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(spec.mrope_section)}
    mm = dict(audio_token_index=ids[q3.AUDIO_PAD], image_token_index=ids[q3.IMAGE_PAD],
              video_token_index=ids[q3.VIDEO_PAD])
    thinker_cfg = dict(
        text_config=dict(
            vocab_size=len(tok), hidden_size=spec.thinker_hidden, intermediate_size=2 * spec.thinker_hidden,
            num_hidden_layers=spec.thinker_layers, num_attention_heads=spec.heads,
            num_key_value_heads=spec.kv_heads, max_position_embeddings=4096, rope_parameters=rope,
            pad_token_id=ids[q3.ENDOFTEXT], eos_token_id=ids[q3.IM_END], tie_word_embeddings=False,
        ),
        audio_config=dict(num_mel_bins=32, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64,
                          d_model=32, output_dim=spec.thinker_hidden),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                           out_hidden_size=spec.thinker_hidden, fullatt_block_indexes=[0]),
        audio_start_token_id=ids[q3.AUDIO_START], audio_end_token_id=ids[q3.AUDIO_END],
        user_token_id=ids["user"], **mm,
        vision_start_token_id=ids[q3.VISION_START],  # read by get_rope_index, not a declared field in 5.19
    )
    talker_cfg = dict(
        vocab_size=talker_vocab, embedding_size=spec.thinker_hidden, hidden_size=spec.talker_hidden,
        intermediate_size=2 * spec.talker_hidden, num_hidden_layers=spec.talker_layers,
        num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads, head_dim=spec.talker_head_dim,
        max_position_embeddings=4096, rope_parameters=rope,
        tts_text_start_token_id=ids[q3.TTS_BOS], tts_text_end_token_id=ids[q3.TTS_EOS],
        tts_text_pad_token_id=ids[q3.TTS_PAD], vision_start_token_id=ids[q3.VISION_START],
        vision_end_token_id=ids[q3.VISION_END], audio_start_token_id=ids[q3.AUDIO_START],
        audio_end_token_id=ids[q3.AUDIO_END], **codec, **mm,
    )
    dit_cfg = dict(
        hidden_size=spec.dit_hidden, num_hidden_layers=spec.dit_layers, num_attention_heads=spec.dit_heads,
        head_dim=spec.dit_hidden // spec.dit_heads, ff_mult=2, emb_dim=16, block_size=spec.block_size,
        look_ahead_layers=[1], look_backward_layers=[0], repeats=2,
        # every talker id is a valid DiT code (the reference passes whatever the talker emitted; a
        # random talker can emit its special ids, a trained one does not)
        num_embeds=talker_vocab, mel_dim=spec.mel_dim, enc_emb_dim=16, enc_dim=16,
        enc_channels=[16, 16, 16, 16, 48], enc_attention_channels=8, enc_se_channels=8,
        max_position_embeddings=8192,
    )
    bigvgan_cfg = dict(mel_dim=spec.mel_dim, upsample_initial_channel=spec.bigvgan_channels,
                       resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1, 3, 5]])
    cfg = Qwen2_5OmniConfig(thinker_config=thinker_cfg, talker_config=talker_cfg,
                            token2wav_config=dict(dit_config=dit_cfg, bigvgan_config=bigvgan_cfg))
    model = Qwen2_5OmniForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        # Default init (std 0.02) makes a random LM's attention near-uniform (its output ignores the
        # prompt); larger embeddings and linears make text and codes prompt-dependent.
        for lm in (model.thinker.model, model.talker.model):
            for mod in lm.modules():
                if isinstance(mod, torch.nn.Embedding):
                    mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen))
                elif isinstance(mod, torch.nn.Linear):
                    mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen) * (1.5 / mod.in_features ** 0.5))
        for head in (model.thinker.lm_head.weight, model.talker.codec_head.weight):
            head.copy_(torch.randn(head.shape, generator=gen) * 0.5)
        proj = model.talker.thinker_to_talker_proj
        proj.weight.copy_(torch.randn(proj.weight.shape, generator=gen) * (1.0 / proj.in_features ** 0.5))
        # DiT: random linears (its AdaLN-zero modulation would be ~0 with std 0.02, the mel flat).
        dit = model.token2wav.code2wav_dit_model
        for mod in dit.modules():
            if isinstance(mod, torch.nn.Embedding):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen))
            elif isinstance(mod, torch.nn.Linear):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen) * (1.0 / mod.in_features ** 0.5))
        # BigVGAN: default conv init gives a near-silent waveform, kaiming convs one of std ~1e5
        # (its residual AMP blocks grow the signal), clamped to +-1 by its forward. Kaiming convs,
        # then the last conv scaled so that a decode of random codes has std ``wave_std``.
        bigvgan = model.token2wav.code2wav_bigvgan_model
        kaiming_init_convs_(bigvgan, gen, last_conv=bigvgan.conv_post, last_conv_scale=1.0)
        spk0 = torch.randn((1, dit.config.enc_emb_dim), generator=gen)
        mel = dit.sample(spk0, torch.randn((1, spec.ref_mel_frames, spec.mel_dim), generator=gen),
                         torch.randint(0, C, (1, 50), generator=gen), num_steps=4)
        raw = {}
        handle = bigvgan.conv_post.register_forward_hook(lambda mod, args, out: raw.setdefault("pcm", out))
        bigvgan(mel)
        handle.remove()
        bigvgan.conv_post.weight.mul_(spec.wave_std / float(raw["pcm"].std()))
    gc = model.generation_config
    gc.do_sample = False
    gc.eos_token_id = ids[q3.IM_END]
    gc.pad_token_id = ids[q3.ENDOFTEXT]
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    dit_cfg_obj = model.config.token2wav_config.dit_config
    spk = {name: {"bos_token": int(ids[SPEAKER_BOS[name]]),
                  "cond": torch.randn((1, dit_cfg_obj.enc_emb_dim), generator=gen),
                  "ref_mel": torch.randn((1, spec.ref_mel_frames, dit_cfg_obj.mel_dim), generator=gen)}
           for name in spec.speakers}
    torch.save(spk, out_dir / "spk_dict.pt")
    manifest = {
        "name": NAME, "seed": seed, "config_hash": h, "builder_version": BUILDER_VERSION,
        "spec": {k: list(v) if isinstance(v, tuple) else v for k, v in spec.__dict__.items()},
        "thinker_eos_token_id": ids[q3.IM_END], "im_start_token_id": ids[q3.IM_START],
        "assistant_token_id": ids["assistant"], "speakers": list(spec.speakers),
        # the reference generate's talker_eos_token_id default is [8292, 8294] (codec pad, end)
        "talker_eos_token_id": [codec["tts_codec_pad_token_id"], codec["tts_codec_end_token_id"]],
        "sampling_rate": 24000, "codes_per_second": 50,
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1))  # written last: build complete


def checkpoint_dir(name: str = NAME) -> Path:
    """Folder of the Qwen2.5-Omni checkpoint ``name`` in the cache; ``qwen2.5-omni-tiny`` is (re)built
    here if missing (idempotent, seconds), any other name must already be there."""
    from omni_triton.paths import model_dir

    path = model_dir(name)
    if name == NAME:
        build_tiny_qwen2_5_omni(path)
    return path


def read_speakers(model_dir: Path) -> list[str]:
    """Voice names of a checkpoint (the manifest's, else the keys of ``spk_dict.pt``)."""
    man = read_manifest(model_dir)
    if man.get("speakers"):
        return list(man["speakers"])
    return list(torch.load(Path(model_dir) / "spk_dict.pt", weights_only=True))
