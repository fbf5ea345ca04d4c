"""Torch-free contracts of every pipeline: tensor names and dtypes, request parsing and
validation, one input-error class per API, the UTF-8 BYTES helpers, input and output builders.

Per API: ``chat`` (every chat model: llm, llm_tts, the omni BLS models), ``speech`` (piper and
every speech model), ``image`` (the Qwen-Image ensembles' requests), ``video`` (the Wan2.2
pipelines' requests). Per family, the stage tensors: ``csm``, ``qwen3_omni``, ``qwen2_5_omni``,
``llm``, ``qwen3_tts``, ``qwen_image``, ``wan``; shared by role: ``codec`` (talker -> code2wav),
``omni_stages`` (thinker -> talker). Importable by the OpenAI frontend (which never imports
torch), the clients, the BLS models and the stages; ``tests/unit/test_contracts.py`` checks every
``config.pbtxt`` against :data:`CONTRACTS`.
"""
from omni_triton.contracts import csm, llm, qwen2_5_omni, qwen3_omni, qwen3_tts, qwen_image, speech, wan
from omni_triton.contracts.tensors import INVALID_INPUT_PREFIX, InputError, StageContract, TensorSpec  # noqa: F401

#: model name -> :class:`StageContract`, every model of ``model_repository/`` and ``ensembles/``.
CONTRACTS: dict[str, StageContract] = {
    **llm.CONTRACTS, **qwen3_omni.CONTRACTS, **qwen2_5_omni.CONTRACTS, **speech.CONTRACTS, **csm.CONTRACTS,
    **qwen3_tts.CONTRACTS, **qwen_image.CONTRACTS, **wan.CONTRACTS}
