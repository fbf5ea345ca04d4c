"""Torch-free contracts of every pipeline: tensor names and dtypes, request parsing and
validation, one input-error class per pipeline, the UTF-8 BYTES helpers and input builders.

``chat`` (llm, llm_tts, omni and its stages), ``speech`` (piper, tts and its stages),
``image`` (the Qwen-Image ensembles and stages), ``video`` (the Wan2.2 BLS pipeline and stages).
Importable by the OpenAI frontend (which never imports torch), the clients, the BLS models and
the stages; ``tests/unit/test_contracts.py`` checks every ``config.pbtxt`` against
:data:`CONTRACTS`.
"""
from omni_triton.contracts import chat, image, qwen3_tts, speech, video
from omni_triton.contracts.tensors import INVALID_INPUT_PREFIX, InputError, StageContract, TensorSpec  # noqa: F401

#: model name -> :class:`StageContract`, every model of ``model_repository/`` and ``ensembles/``.
CONTRACTS: dict[str, StageContract] = {**chat.CONTRACTS, **speech.CONTRACTS, **image.CONTRACTS,
                                     **video.CONTRACTS, **qwen3_tts.CONTRACTS}

from omni_triton.contracts import qwen2_5_omni  # noqa: E402  (the Qwen2.5-Omni pipeline)
CONTRACTS.update(qwen2_5_omni.CONTRACTS)
