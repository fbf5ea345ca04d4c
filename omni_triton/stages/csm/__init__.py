"""Codec-token TTS stage: CSM talker -> Mimi code2wav, with chunked streaming decode.

Architecture (transformers ``CsmForConditionalGeneration``, Sesame's CSM):
- the **backbone** (Llama-style decoder over text tokens and audio frames) predicts codebook 0 of
  the next codec frame;
- the **depth decoder** (small decoder, one position per codebook) predicts codebooks 1..K-1 of
  that frame from the backbone's last hidden state;
- the **codec** (transformers ``MimiModel``, Kyutai's Mimi) decodes a [K, T] code matrix into
  24 kHz mono PCM, ``samples_per_frame = sampling_rate / frame_rate`` samples per frame
  (1920 at Mimi's 12.5 Hz).

Data contract (what the Triton models in ``model_repository/tts_*`` carry, see
``docs/speech_contracts.md``):
- codec frames: ``np.int64`` arrays of shape ``[T, num_codebooks]`` (frame-major; Mimi itself wants
  ``[batch, num_codebooks, T]``, the transpose happens inside :class:`CodecDecoder`);
- audio: ``np.float32`` mono PCM in [-1, 1] at ``CodecDecoder.sampling_rate`` Hz.

No checkpoint can be downloaded here, so :func:`build_tiny_csm` makes a tiny random-weight CSM
(+ tiny Mimi + locally trained tokenizer) and saves it with ``save_pretrained``; everything else
loads it with ``from_pretrained`` exactly as it would load ``sesame/csm-1b``.

Chunked streaming follows vLLM-Omni's Qwen3-TTS code2wav scheme (25-frame chunks decoded with
25 frames of left context, a smaller first chunk for a low time-to-first-packet); see
:func:`chunk_schedule`.

Layout: ``talker`` (CSM backbone + depth decoder), ``code2wav`` (Mimi), ``request`` (validation),
``pipeline`` (in-process reference); the chunk schedule is ``omni_triton.stages.chunking``, the tiny
checkpoint builder ``omni_triton.checkpoints.csm``.
"""
from omni_triton.stages.csm.code2wav import (  # noqa: F401
    CodecDecoder,
    decode_ragged,
    keep_new_samples,
    validate_chunk,
)
from omni_triton.stages.csm.pipeline import (  # noqa: F401
    SynthesisResult,
    synthesize_reference,
)
from omni_triton.stages.csm.talker import (  # noqa: F401
    CodecTalker,
    GenerationCancelled,
)
