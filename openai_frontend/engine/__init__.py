"""The frontend's view of Triton, in five modules:

* ``protocol``: the ``Engine`` protocol the serving layer uses and the data it exchanges
  (``GenerationRequest``/``GenerationChunk``, ``ImageJob``/``GeneratedImage``, audio chunks);
* ``errors``: typed ``EngineError`` subclasses carrying their HTTP mapping;
* ``model_info``: ``ModelInfo``, built from a Triton model config's ``parameters``;
* ``triton``: ``TritonEngine``, the protocol over ``tritonclient.grpc.aio``.
* ``triton_private``: every use of tritonclient's private API (its docstring says which and why).
"""

from .errors import (
    EngineError,
    InferenceError,
    InvalidRequestError,
    ModelNotFoundError,
    ModelNotReadyError,
    TritonUnavailableError,
)
from .model_info import ModelInfo, model_info_from_config, parse_size, unready_dependencies
from .protocol import (
    AudioChunk,
    AudioGenerateEvent,
    AudioGenerateJob,
    Engine,
    GeneratedImage,
    GenerationChunk,
    GenerationRequest,
    ImageJob,
    SpeechOptions,
    StageStatistics,
    VideoEvent,
    VideoJob,
)
from .triton import TritonEngine, chat_inputs, chunk_from_result

__all__ = [
    "AudioChunk", "Engine", "EngineError", "GeneratedImage", "GenerationChunk", "GenerationRequest",
    "ImageJob", "InferenceError", "InvalidRequestError", "ModelInfo", "ModelNotFoundError",
    "ModelNotReadyError", "SpeechOptions", "StageStatistics", "TritonEngine", "TritonUnavailableError", "chat_inputs",
    "chunk_from_result", "model_info_from_config", "parse_size", "unready_dependencies",
    "VideoEvent", "VideoJob", "AudioGenerateEvent", "AudioGenerateJob",
]
