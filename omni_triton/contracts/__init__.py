"""Torch-free contracts of every pipeline: tensor names and dtypes, request parsing and
validation, one input-error class per API, the UTF-8 BYTES helpers, input and output builders.

Per API: ``chat`` (every chat model: llm, llm_tts, the omni BLS models), ``speech`` (piper and
every speech model), ``image`` (the Qwen-Image ensembles' requests), ``video`` (the Wan2.2
pipelines' requests). Per family, the stage tensors: ``csm``, ``qwen3_omni``, ``qwen2_5_omni``,
``llm``, ``qwen3_tts``, ``qwen_image``, ``wan``, ``whisper``, ``stable_audio`` (also the
text-to-audio API's request contract); ``asr`` (every speech-recognition
model); shared by role: ``codec`` (talker -> code2wav),
``omni_stages`` (thinker -> talker). Importable by the OpenAI frontend (which never imports
torch), the clients, the BLS models and the stages; ``tests/unit/test_contracts.py`` checks every
``config.pbtxt`` against :data:`CONTRACTS`.
"""
from dataclasses import replace

from omni_triton.contracts import (
    asr,
    csm,
    llm,
    qwen2_5_omni,
    qwen3_omni,
    qwen3_tts,
    qwen_image,
    speech,
    stable_audio,
    wan,
    whisper,
)
from omni_triton.contracts.tensors import (  # noqa: F401
    INVALID_INPUT_PREFIX,
    REPORTS_STAGE_METRICS,
    STAGE_COMPUTE_MS,
    STAGE_METRICS,
    InputError,
    StageContract,
    TensorSpec,
    step_compute_output,
)

#: The models that call other stages and report them per request (``STAGE_METRICS``).
BLS_MODELS = REPORTS_STAGE_METRICS
#: The ensembles (Triton runs their steps; no Python code of their own) -> their steps, in order.
ENSEMBLES: dict[str, tuple[str, ...]] = {
    "qwen_image": ("qwen_image_text_encoder", "qwen_image_denoiser", "qwen_image_vae_decoder"),
    "qwen_image_edit": ("qwen_image_edit_vae_encoder", "qwen_image_edit_text_encoder", "qwen_image_edit_denoiser",
                        "qwen_image_edit_vae_decoder"),
    "qwen_image_inpaint": ("qwen_image_inpaint_vae_encoder", "qwen_image_text_encoder", "qwen_image_inpaint_denoiser",
                           "qwen_image_vae_decoder"),
    "qwen_image_edit_plus": ("qwen_image_edit_plus_vae_encoder", "qwen_image_edit_plus_text_encoder",
                             "qwen_image_edit_plus_denoiser", "qwen_image_edit_plus_vae_decoder"),
}


def _with_stage_metrics(name: str, contract: StageContract) -> StageContract:
    """``contract`` plus the per-request stage-metric outputs (docs/metrics.md "Per-request stage
    metrics"): ``STAGE_COMPUTE_MS`` FP32 [1] on every Python model, ``STAGE_METRICS`` BYTES [1]
    on :data:`BLS_MODELS`; on an ensemble, each step's ``STAGE_COMPUTE_MS`` under its own name
    (:func:`~omni_triton.contracts.tensors.step_compute_output`)."""
    if name in ENSEMBLES:
        steps = tuple(TensorSpec(step_compute_output(step), "FP32", (1,)) for step in ENSEMBLES[name])
        return replace(contract, outputs=contract.outputs + steps)
    extra = [TensorSpec(STAGE_COMPUTE_MS, "FP32", (1,))]
    if name in BLS_MODELS:
        extra.append(TensorSpec(STAGE_METRICS, "BYTES", (1,)))
    return replace(contract, outputs=contract.outputs + tuple(extra))


#: model name -> :class:`StageContract`, every model of ``model_repository/`` and ``ensembles/``.
CONTRACTS: dict[str, StageContract] = {name: _with_stage_metrics(name, c) for name, c in {
    **llm.CONTRACTS, **qwen3_omni.CONTRACTS, **qwen2_5_omni.CONTRACTS, **speech.CONTRACTS, **csm.CONTRACTS,
    **qwen3_tts.CONTRACTS, **qwen_image.CONTRACTS, **wan.CONTRACTS, **asr.CONTRACTS, **whisper.CONTRACTS,
    **stable_audio.CONTRACTS}.items()}
