"""Tiny random-weight CSM checkpoint (backbone + depth decoder + Mimi codec + a locally trained
byte-level BPE tokenizer), saved with ``save_pretrained`` so the stages load it with
``from_pretrained`` exactly as they would load ``sesame/csm-1b``.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from omni_triton.checkpoints.common import MANIFEST, build_once, kaiming_init_conv_

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


def _build(out_dir: Path, seed: int, spec: TinyCsmSpec, h: str) -> None:
    from transformers import (
        CsmConfig,
        CsmForConditionalGeneration,
        CsmProcessor,
        EncodecFeatureExtractor,
        MimiConfig,
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
        for _name, mod in list(model.backbone_model.named_modules()) + list(model.depth_decoder.named_modules()):
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
