"""Qwen2.5-Omni thinker stage: the Qwen3-Omni :class:`OmniThinker` on a Qwen2.5-Omni checkpoint.

The two architectures' thinkers stream the same way and hand the talker the same tensors
(:class:`~omni_triton.stages.qwen3_omni.ThinkerOutput`); they differ only in which hidden layer
the talker reads (Qwen2.5-Omni: the last, ``hidden_states[-1]``) and where the special ids live in
the config. :class:`_ThinkerView` presents a Qwen2.5-Omni model under the attribute names
:class:`OmniThinker` reads, so no thinker code is duplicated.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from omni_triton.checkpoints.common import read_manifest
from omni_triton.stages.qwen3_omni import ChatTokenizer, OmniThinker


class _ThinkerView:
    """``model.thinker`` + the config fields :class:`OmniThinker` reads, for a Qwen2.5-Omni model:
    ``im_start/im_end/assistant`` ids (from the builder's manifest), the accept layer (the last
    decoder layer: ``hidden_states[num_hidden_layers]`` is ``hidden_states[-1]``), and as
    ``tts_bos/eos/pad`` the talker config's ``tts_text_start/end/pad`` ids."""

    def __init__(self, model, manifest: dict):
        self.thinker = model.thinker
        tc = model.config.talker_config
        self.config = SimpleNamespace(
            im_start_token_id=int(manifest["im_start_token_id"]), im_end_token_id=int(manifest["thinker_eos_token_id"]),
            assistant_token_id=int(manifest["assistant_token_id"]),
            tts_bos_token_id=tc.tts_text_start_token_id, tts_eos_token_id=tc.tts_text_end_token_id,
            tts_pad_token_id=tc.tts_text_pad_token_id,
            talker_config=SimpleNamespace(accept_hidden_layer=model.config.thinker_config.text_config.num_hidden_layers))


def load_model(model_dir, audio: bool = True, device: str = "cpu"):
    """``Qwen2_5OmniForConditionalGeneration.from_pretrained(model_dir)`` (with ``spk_dict.pt``),
    eval mode; ``audio=False`` skips the talker and token2wav weights."""
    from transformers import AutoConfig, Qwen2_5OmniForConditionalGeneration
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # skipped talker weights are "UNEXPECTED"; default sub-config warnings
    try:
        cfg = AutoConfig.from_pretrained(model_dir)
        cfg.enable_audio_output = audio
        return Qwen2_5OmniForConditionalGeneration.from_pretrained(model_dir, config=cfg).to(device).eval()
    finally:
        hf_logging.set_verbosity(level)


def chat_tokenizer(model_dir) -> ChatTokenizer:
    """The checkpoint's tokenizer + ChatML ids (for the BLS model's validation; no weights)."""
    from transformers import AutoTokenizer

    man = read_manifest(model_dir)
    return ChatTokenizer(AutoTokenizer.from_pretrained(model_dir), man["im_start_token_id"], man["assistant_token_id"])


class Qwen25Thinker(OmniThinker):
    """The thinker of a Qwen2.5-Omni checkpoint (text-only inputs), streaming text as it generates;
    its last step's :class:`ThinkerOutput` is what :class:`~.talker.Qwen25Talker` takes.
    ``generate`` arguments as the reference (``max_new_tokens``, ``eos_token_id`` =
    ``<|im_end|>``, ``output_hidden_states`` / ``return_dict_in_generate`` with audio)."""

    def __init__(self, model, tokenizer, manifest: dict):
        super().__init__(_ThinkerView(model, manifest), tokenizer, manifest)

    @classmethod
    def from_pretrained(cls, model_dir, device: str = "cpu") -> Qwen25Thinker:
        from transformers import AutoTokenizer

        return cls(load_model(model_dir, audio=False, device=device), AutoTokenizer.from_pretrained(model_dir),
                   read_manifest(Path(model_dir)))
