"""Qwen3-Omni pipeline (thinker -> talker -> code2wav) as separable stages, no Triton.

Architecture (transformers 5.19 ``Qwen3OmniMoeForConditionalGeneration``, model type
``qwen3_omni_moe``; Qwen3-Omni technical report, arXiv:2509.17765):

- **thinker** (``model.thinker``, a MoE decoder LM with audio/vision encoders) generates the text
  answer. The talker is conditioned on the thinker's *input embeddings* of every token
  (``hidden_states[0]`` of each generate step) and, for multimodal (audio/image/video) positions
  of the user turns only, on its hidden state at layer ``talker_config.accept_hidden_layer``;
- **talker** (``model.talker``, a MoE decoder over codec tokens) generates codebook 0 of each codec
  frame; its **code predictor** (a small decoder run once per frame) generates codebooks
  1..G-1 from the talker's last hidden state. One frame = G codes (``num_code_groups``);
- **code2wav** (``model.code2wav``) decodes ``[G, T]`` codes into 24 kHz mono PCM,
  ``total_upsample`` (1920) samples per frame, i.e. 12.5 frames/s.

The stages reproduce ``Qwen3OmniMoeForConditionalGeneration.generate(..., return_audio=True)``:
:class:`OmniThinker` runs ``model.thinker.generate`` (same arguments as the reference, plus a
streamer for text deltas) and returns the per-token embeddings / accept-layer hidden states the
reference concatenates; :func:`build_talker_inputs` rebuilds the talker's prompt exactly as the
reference's ``generate`` does (calling its own ``_get_talker_user_parts`` /
``_get_talker_assistant_parts``); :class:`OmniTalker` runs ``model.talker.generate`` with the
reference's talker arguments and streams each frame as the next forward pass completes it;
:class:`OmniCode2Wav` decodes chunks with left context (the :class:`ChunkSchedule` shared with the
codec TTS pipeline).

No checkpoint can be downloaded here, so :func:`build_tiny_qwen3_omni` makes a tiny random-weight
model (+ a locally trained ChatML tokenizer) and saves it with ``save_pretrained``; everything else
loads it with ``from_pretrained`` as it would load ``Qwen/Qwen3-Omni-30B-A3B-Instruct``.

Data contract between the stages (also the Triton tensors, see ``docs/omni_pipeline.md``):
- thinker -> talker (:class:`ThinkerOutput`): ``sequence`` int64 [L] (prompt + generated ids),
  ``prompt_len`` int, ``embeds`` float32 [L-1, H_thinker] (input embedding of every token fed to
  the thinker: all but the last generated one), ``hidden`` float32 [L-1, H_thinker] (layer
  ``accept_hidden_layer``), ``tts_embeds`` float32 [3, H_thinker] (thinker input embeddings of
  ``tts_bos``, ``tts_eos``, ``tts_pad``);
- talker -> code2wav: codec frames int64 [T, G] (frame-major);
- code2wav -> client: float32 mono PCM in [-1, 1] at 24 kHz.

Layout: ``request`` (parsing), ``inputs`` (multimodal processor: audio/image/video parts ->
tensors), ``thinker``, ``talker``, ``code2wav``, ``pipeline`` (in-process);
the tiny checkpoint builder is ``omni_triton.checkpoints.qwen3_omni``.
"""
from omni_triton.stages.qwen3_omni.code2wav import (  # noqa: F401
    OmniCode2Wav,
)
from omni_triton.stages.qwen3_omni.inputs import (  # noqa: F401
    MediaItem,
    MultimodalInputs,
    OmniProcessor,
    prepare_media,
)
from omni_triton.stages.qwen3_omni.pipeline import (  # noqa: F401
    OmniResult,
    run_pipeline,
)
from omni_triton.stages.qwen3_omni.request import (  # noqa: F401
    THINKER_SAMPLING_KEYS,
    SamplingSettings,
    sampling_settings,
)
from omni_triton.stages.qwen3_omni.talker import (  # noqa: F401
    OmniTalker,
    TalkerSettings,
    build_talker_inputs,
    talker_generate_kwargs,
)
from omni_triton.stages.qwen3_omni.thinker import (  # noqa: F401
    ChatTokenizer,
    OmniThinker,
    ThinkerOutput,
    ThinkerStep,
    prepare_multimodal_request,
    prepare_thinker_request,
)
