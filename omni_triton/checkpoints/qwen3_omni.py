"""Tiny random-weight Qwen3-Omni checkpoint (thinker, talker + code predictor, code2wav, a locally
trained ChatML tokenizer), saved with ``save_pretrained``.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from omni_triton.checkpoints.common import MANIFEST, build_once, kaiming_init_convs_, read_manifest

BUILDER_VERSION = 2  # 2: MoE experts initialised (were uninitialised memory)

# ChatML special tokens (names as in Qwen3-Omni's tokenizer). Each is one token.
IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TTS_PAD, TTS_BOS, TTS_EOS = "<|tts_pad|>", "<|tts_bos|>", "<|tts_eos|>"
AUDIO_START, AUDIO_END, AUDIO_PAD = "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>"
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, TTS_PAD, TTS_BOS, TTS_EOS, AUDIO_START, AUDIO_END, AUDIO_PAD,
                  VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]
ROLE_WORDS = ("system", "user", "assistant")

# Qwen2/ChatML chat template; media parts ({"type": "audio"|"image"|"video"}) render as Qwen3-Omni's
# placeholders, which the processor expands (omni_triton/stages/qwen3_omni/inputs.py):
# "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then "<|im_start|>assistant\n" when add_generation_prompt.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}{%- if part['type'] == 'text' %}{{- part['text'] }}"
    "{%- elif part['type'] == 'audio' %}{{- '<|audio_start|><|audio_pad|><|audio_end|>' }}"
    "{%- elif part['type'] == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'video' %}{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
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
        code_embedding = model.code2wav.code_embedding.weight
        code_embedding.copy_(torch.randn(code_embedding.shape, generator=gen))
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
    write_processor_files(out_dir)
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
        write_processor_files(path)
    return path


#: The tiny checkpoint's processor settings (``preprocessor_config.json``): a WhisperFeatureExtractor
#: with the audio tower's mel bins and a Qwen2-VL image processor with the vision tower's patch /
#: merge / temporal sizes; images resized to 64..256 tokens' worth of pixels (the real checkpoint:
#: 128 mel bins, up to 16384 * 28^2 pixels).
TINY_PREPROCESSOR = {
    "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 32, "sampling_rate": 16000,
    "hop_length": 160, "chunk_length": 300, "n_fft": 400, "padding_value": 0.0, "padding_side": "right",
    "return_attention_mask": True, "dither": 0.0,
    "image_processor_type": "Qwen2VLImageProcessor", "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_rescale": True, "rescale_factor": 1 / 255,
    "do_normalize": True, "do_resize": True, "do_convert_rgb": True,
    "size": {"shortest_edge": 16 * 32 * 32, "longest_edge": 64 * 32 * 32},
}


def write_processor_files(model_dir: Path) -> None:
    """Write the tiny checkpoint's ``preprocessor_config.json`` and refresh its chat template with
    the media placeholders, when missing or different (added after the weights: they leave the
    weights and the manifest's hash alone, so earlier builds are not rebuilt). Atomic
    (``os.replace``), idempotent."""
    import os

    model_dir = Path(model_dir)
    files = {"preprocessor_config.json": json.dumps(TINY_PREPROCESSOR, indent=1), "chat_template.jinja": CHAT_TEMPLATE}
    for name, text in files.items():
        path = model_dir / name
        if path.exists() and path.read_text() == text:
            continue
        tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def read_speakers(model_dir: Path) -> list[str]:
    """Voice names of a checkpoint (``talker_config.speaker_id`` keys, as the manifest spells them)."""
    man = read_manifest(model_dir)
    if man.get("speakers"):
        return list(man["speakers"])
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return list(cfg["talker_config"]["speaker_id"])
