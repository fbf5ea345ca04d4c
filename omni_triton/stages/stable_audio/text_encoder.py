"""Text encoder stage (T5): prompts -> last hidden states + attention masks."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def encode_prompts(pipe, prompts: Sequence[str], negative: Sequence[bool]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Steps 1-2 of ``StableAudioPipeline.encode_prompt`` for each text, alone (batch 1, as
    ``__call__`` encodes one prompt): tokenize to ``model_max_length`` (padding, truncation), run
    ``text_encoder`` with the attention mask; a negative prompt's padding rows are set to 0.0
    (``torch.where(mask, embeds, 0.0)``, as ``encode_prompt`` does for ``negative_prompt`` only).

    Args:
        prompts: the texts.
        negative: per text, True for a negative prompt.

    Returns:
        per text ``(float32 [L, D] embeddings, int64 [L] attention mask)``, ``L`` =
        ``tokenizer.model_max_length``; ``__call__(prompt_embeds=..., attention_mask=...)``
        projects and masks them exactly as it does its own.
    """
    out = []
    with torch.no_grad():
        for text, neg in zip(prompts, negative, strict=True):
            ids = pipe.tokenizer([text], padding="max_length", max_length=pipe.tokenizer.model_max_length,
                                 truncation=True, return_tensors="pt")
            pipe.text_encoder.eval()
            embeds = pipe.text_encoder(ids.input_ids, attention_mask=ids.attention_mask)[0]
            if neg:
                embeds = torch.where(ids.attention_mask.to(torch.bool).unsqueeze(2), embeds, 0.0)
            out.append((embeds[0].float().numpy(), ids.attention_mask[0].to(torch.int64).numpy()))
    return out


def check_prompt_tokens(pipe, text: str, name: str = "the prompt") -> int:
    """Tokens of ``text`` untruncated (``</s>`` included); returns the count.

    Raises:
        AudioGenerateInputError: more than the tokenizer's ``model_max_length`` (``encode_prompt``
            would truncate the rest with a warning).
    """
    from omni_triton.contracts.stable_audio import AudioGenerateInputError

    n = len(pipe.tokenizer(text).input_ids)
    limit = pipe.tokenizer.model_max_length
    if n > limit:
        raise AudioGenerateInputError(f"{name} has {n} tokens; the text encoder takes at most {limit}")
    return n
