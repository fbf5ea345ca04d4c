"""Text encoder stage (Qwen2.5-VL; edit: with its vision tower): prompts -> embeddings.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


# --------------------------------------------------------------------------- text encoder
def encode_prompts(pipe, prompts: Sequence[str], images: Sequence | None = None) -> list[np.ndarray]:
    """Prompt embeddings for each prompt, through the pipeline's own ``encode_prompt``.

    Args:
        pipe: a loaded pipeline (text encoder + tokenizer [+ processor]).
        prompts: texts (the pipeline wraps each in its prompt template).
        images: edit pipelines only: one PIL condition image per prompt, already resized to
            :func:`edit_condition_size` as ``__call__`` does before encoding; for a multi-image
            pipeline (``QwenImageEditPlusPipeline``) a list of such images per prompt.

    Returns:
        one ``float32 [L_i, D]`` array per prompt (padding removed: the pipeline pads a batch to
        its longest prompt and returns the mask; the rows the mask marks valid are kept).

    Prompts of equal token length are encoded together in one forward pass; different lengths
    in separate passes, so no prompt is ever padded (a padded forward differs from an unpadded one
    in float rounding, which would break bit-exact parity with ``__call__``). A multi-image
    pipeline encodes prompt by prompt: its ``encode_prompt`` reads an image list as the pictures
    of one prompt.
    """
    from omni_triton.stages.qwen_image.loading import is_multi_image_pipeline

    multi = images is not None and is_multi_image_pipeline(pipe)
    out: list[np.ndarray | None] = [None] * len(prompts)
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(prompts):
        key = (i,) if multi else (_token_length(pipe, p), None if images is None else images[i].size)
        groups.setdefault(key, []).append(i)
    with torch.no_grad():
        for idx in groups.values():
            kwargs = {}
            if multi:
                kwargs["image"] = list(images[idx[0]])
            elif images is not None:
                kwargs["image"] = [images[i] for i in idx]
            embeds, mask = pipe.encode_prompt(prompt=[prompts[i] for i in idx], device="cpu", **kwargs)
            for j, i in enumerate(idx):
                e = embeds[j] if mask is None else embeds[j][mask[j].bool()]
                out[i] = e.float().numpy()
    return out  # type: ignore[return-value]


def _token_length(pipe, prompt: str) -> int:
    return len(pipe.tokenizer(pipe.prompt_template_encode.format(prompt)).input_ids)
