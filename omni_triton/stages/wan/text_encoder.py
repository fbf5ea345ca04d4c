"""Text encoder stage (UMT5): prompts -> unpadded embeddings."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

#: ``WanPipeline.__call__``'s default ``max_sequence_length``: prompts are tokenised to (and
#: truncated at) this many tokens and their embeddings padded with zero rows to it.
MAX_SEQUENCE_LENGTH = 512


def encode_prompts(pipe, prompts: Sequence[str], max_sequence_length: int = MAX_SEQUENCE_LENGTH) -> list[np.ndarray]:
    """UMT5 embeddings of each prompt through the pipeline's own ``_get_t5_prompt_embeds``.

    Returns:
        one ``float32 [L_i, D]`` array per prompt: the rows of its ``L_i`` real tokens (the
        pipeline's zero padding rows removed; :func:`pad_embeds` puts them back).

    Each prompt is encoded alone, as ``__call__`` encodes a single prompt (batch 1), so the
    embeddings are bit-identical to the pipeline's (the encoder itself is ~1 % of a video's time).
    """
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = pipe.tokenizer([prompt], padding="max_length", max_length=max_sequence_length, truncation=True,
                                 add_special_tokens=True, return_attention_mask=True)
            length = int(sum(ids["attention_mask"][0]))
            embeds = pipe._get_t5_prompt_embeds(prompt=[prompt], max_sequence_length=max_sequence_length,
                                                device=torch.device("cpu"), dtype=torch.float32)
            out.append(embeds[0, :length].float().numpy())
    return out


def pad_embeds(arrays: Sequence[np.ndarray], max_sequence_length: int = MAX_SEQUENCE_LENGTH) -> torch.Tensor:
    """``[L_i, D]`` arrays -> ``float32 [B, max_sequence_length, D]`` zero-padded, as the pipeline
    pads them.

    Raises:
        ValueError: an array is longer than ``max_sequence_length`` or its width differs.
    """
    dim = arrays[0].shape[1]
    out = torch.zeros(len(arrays), max_sequence_length, dim, dtype=torch.float32)
    for i, a in enumerate(arrays):
        if a.ndim != 2 or a.shape[1] != dim or a.shape[0] > max_sequence_length:
            raise ValueError(f"prompt embeddings {list(a.shape)}: must be [<= {max_sequence_length}, {dim}]")
        out[i, : a.shape[0]] = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
    return out
