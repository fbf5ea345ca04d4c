"""The Qwen3-Omni pipeline's stage contracts (``docs/omni_pipeline.md``): ``qwen3_omni`` (BLS, the
chat contract of ``omni_triton.contracts.chat``; API name ``omni``) -> ``qwen3_omni_thinker`` ->
``qwen3_omni_talker`` -> ``qwen3_omni_code2wav``.

The thinker hands the talker the tensors of ``contracts/omni_stages.py`` (shared with
Qwen2.5-Omni); this family adds media prompts (MESSAGES with ``input_audio`` / ``image_url`` /
``video_url`` parts, passed through by the BLS: the thinker decodes and processes them and hands
the talker their positions, ``TALKER_MEDIA_TENSORS``) and ``ASYNC_CHUNK`` (speaking while
thinking). The talker streams ``CODES`` (``contracts/codec.py``), decoded chunk by chunk by
``qwen3_omni_code2wav``. Input problems are
:class:`~omni_triton.contracts.chat.ChatInputError`.
"""
from __future__ import annotations

from omni_triton.contracts.chat import CHAT_IN, MAX_AUDIO_FRAMES, MODALITIES, SPEECH_OUT, TEXT_OUT
from omni_triton.contracts.codec import CODE2WAV, CODES, FIRST_CHUNK_FRAMES, MIN_FRAMES
from omni_triton.contracts.omni_stages import TALKER_IN, TALKER_INPUTS
from omni_triton.contracts.speech import MAX_FRAMES
from omni_triton.contracts.tensors import PACED, REQUEST_ID, VOICE, StageContract, TensorSpec

#: BOOL [1]: speak while thinking. qwen3_omni: override of its ``async_chunk`` parameter;
#: qwen3_omni_thinker (with TALKER_INPUTS): the talker tensors as increments on every response
#: (docs/omni_pipeline.md)
ASYNC_CHUNK = "ASYNC_CHUNK"

#: modalities ``qwen3_omni`` takes in MESSAGES content parts (``chat.parse_messages(accept=...)``):
#: the BLS checks the messages against them and sends them on as they came; ``qwen3_omni_thinker``
#: decodes the media parts and runs the processor (``omni_triton/stages/qwen3_omni/inputs.py``)
MEDIA_ACCEPT = ("text", "audio", "image", "video")

# qwen3_omni_thinker -> qwen3_omni (-> qwen3_omni_talker), multimodal prompts only: with the talker's
# inputs (TALKER_INPUTS) the thinker's last response also carries what the reference passes to
# talker.generate (the media positions of its 3D rope), made by the thinker's processor;
# A audio clips, I images, V videos in message order, each present only for its modality.
AUDIO_FEATURE_LENGTHS = "AUDIO_FEATURE_LENGTHS"  #: INT64 [A]: feature frames per clip (100 per second)
IMAGE_GRID_THW = "IMAGE_GRID_THW"  #: INT64 [I, 3]: patches per image (t, h, w)
VIDEO_GRID_THW = "VIDEO_GRID_THW"  #: INT64 [V, 3]: patches per video (t, h, w)
VIDEO_SECOND_PER_GRID = "VIDEO_SECOND_PER_GRID"  #: FP32 [V]: seconds per temporal patch

#: ``MultimodalInputs.talker_arrays`` key -> thinker output / talker input tensor
TALKER_MEDIA_TENSORS = {"audio_feature_lengths": AUDIO_FEATURE_LENGTHS, "image_grid_thw": IMAGE_GRID_THW,
                        "video_grid_thw": VIDEO_GRID_THW, "video_second_per_grid": VIDEO_SECOND_PER_GRID}


def _s(name: str, optional: bool = False) -> TensorSpec:
    return TensorSpec(name, "BYTES", (1,), optional)


_TALKER_MEDIA = (TensorSpec(AUDIO_FEATURE_LENGTHS, "INT64", (-1,), True),
                 TensorSpec(IMAGE_GRID_THW, "INT64", (-1, 3), True),
                 TensorSpec(VIDEO_GRID_THW, "INT64", (-1, 3), True),
                 TensorSpec(VIDEO_SECOND_PER_GRID, "FP32", (-1,), True))
#: the same tensors as thinker outputs (in its last response, for multimodal prompts only)
_TALKER_MEDIA_OUT = tuple(TensorSpec(t.name, t.datatype, t.dims) for t in _TALKER_MEDIA)

QWEN3_OMNI = StageContract(
    CHAT_IN + (_s(MODALITIES, optional=True), _s(VOICE, optional=True),
               TensorSpec(MAX_AUDIO_FRAMES, "INT32", optional=True), TensorSpec(ASYNC_CHUNK, "BOOL", optional=True),
               TensorSpec(PACED, "BOOL", optional=True)),
    TEXT_OUT + SPEECH_OUT, decoupled=True)
QWEN3_OMNI_THINKER = StageContract(
    CHAT_IN + (TensorSpec(TALKER_INPUTS, "BOOL", optional=True), _s(REQUEST_ID, optional=True),
               TensorSpec(ASYNC_CHUNK, "BOOL", optional=True), TensorSpec(PACED, "BOOL", optional=True)),
    TEXT_OUT + TALKER_IN + _TALKER_MEDIA_OUT, decoupled=True)
# qwen3_omni_talker takes either the thinker's finished outputs (TALKER_IN, with _TALKER_MEDIA for
# multimodal prompts) or, speaking while thinking, the chat inputs, which it sends to qwen3_omni_thinker
# itself (it then streams the thinker's text too; text-only prompts: the omni BLS speaks while
# thinking only for those).
QWEN3_OMNI_TALKER = StageContract(
    tuple(TensorSpec(t.name, t.datatype, t.dims, True) for t in TALKER_IN) + CHAT_IN
    + (_s(VOICE, optional=True), TensorSpec(MAX_FRAMES, "INT32", optional=True),
       TensorSpec(MIN_FRAMES, "INT32", optional=True), _s(REQUEST_ID, optional=True),
       TensorSpec(PACED, "BOOL", optional=True), TensorSpec(FIRST_CHUNK_FRAMES, "INT32", optional=True))
    + _TALKER_MEDIA,
    (TensorSpec(CODES, "INT64", (-1, -1)),) + TEXT_OUT, decoupled=True)
QWEN3_OMNI_CODE2WAV = CODE2WAV

#: model name -> contract, for the models of this pipeline in ``model_repository/``.
CONTRACTS = {"qwen3_omni": QWEN3_OMNI, "qwen3_omni_thinker": QWEN3_OMNI_THINKER,
             "qwen3_omni_talker": QWEN3_OMNI_TALKER, "qwen3_omni_code2wav": QWEN3_OMNI_CODE2WAV}
