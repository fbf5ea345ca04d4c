"""The ``Engine`` protocol the serving layer talks to, and the plain data it exchanges.

As in Triton server's ``python/openai`` frontend, ``openai_frontend.serving`` only sees this
protocol, so unit tests plug in small fakes; the real server path is
``openai_frontend.engine.triton.TritonEngine``. No torch, no tritonclient types here.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from numpy.typing import NDArray

from .model_info import ModelInfo

#: (float32 PCM chunk of shape [T] in [-1, 1], sample rate in Hz)
AudioChunk = tuple[NDArray[Any], int]


@dataclass(frozen=True, eq=False)
class SpeechOptions:
    """Qwen3-TTS extras of one speech request (``omni_triton.contracts.qwen3_tts``), sent only to
    a model that declares the input: ``task`` (``custom_voice`` | ``voice_design`` | ``base``),
    ``instructions`` (style, or the voice description of ``voice_design``), ``language``,
    ``voice_prompt`` (stored clone prompt bytes), ``ref_audio`` (float32 mono [T] in [-1, 1]) at
    ``ref_sample_rate`` Hz with its transcript ``ref_text``, ``x_vector_only``."""

    task: str | None = None
    instructions: str | None = None
    language: str | None = None
    voice_prompt: bytes | None = None
    ref_audio: NDArray[Any] | None = None
    ref_sample_rate: int | None = None
    ref_text: str | None = None
    x_vector_only: bool | None = None

    def __bool__(self) -> bool:
        return any(getattr(self, f) is not None for f in self.__dataclass_fields__)


@dataclass(frozen=True)
class GenerationRequest:
    """One request to a chat-contract model (``docs/chat_contracts.md``).

    Exactly one of ``messages`` (OpenAI chat messages, sent as the ``MESSAGES`` JSON) and
    ``prompt`` (sent as ``PROMPT``) is set. ``sampling`` holds vLLM ``SamplingParams`` names
    (``temperature``, ``top_p``, ``max_tokens``, ``stop``, ``seed``...), sent as the
    ``SAMPLING_PARAMETERS`` JSON with only the keys the client gave. ``modalities`` / ``voice``
    go to speech models only (``MODALITIES`` / ``VOICE``). ``request_id`` is Triton's request id.
    """

    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    modalities: tuple[str, ...] | None = None
    voice: str | None = None
    request_id: str = ""
    paced: bool = False  # a streamed answer with audio paced to real time (PACED, if declared)


@dataclass(frozen=True)
class GenerationChunk:
    """One streamed response of a chat-contract model.

    text: text generated since the previous chunk (``TEXT_DELTA``, may be empty).
    finish_reason: None until the last text chunk, then ``stop``, ``length`` or ``abort``.
    prompt_tokens / completion_tokens: prompt length and tokens generated so far (cumulative);
        None when the response did not carry them.
    audio: float32 PCM [T] in [-1, 1] generated since the previous chunk, or None.
    sample_rate: Hz of ``audio`` (``SAMPLE_RATE``), or None.
    stage_compute_ms: the model's own compute for this request so far (``STAGE_COMPUTE_MS``,
        ms, cumulative), or None.
    stage_metrics: a BLS model's per-request timing of the stages it called (``STAGE_METRICS``,
        parsed JSON; on its last response), or None. A chunk may carry only these two.
    """

    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    audio: NDArray[Any] | None = None
    sample_rate: int | None = None
    stage_compute_ms: float | None = None
    stage_metrics: dict[str, Any] | None = None



@dataclass(frozen=True)
class ImageJob:
    """What to generate: ``n`` images of ``width`` x ``height`` pixels for ``prompt``.

    Image ``i`` uses seed ``seed + i``, so each image equals a single-image request with that
    seed whatever else is batched with it. ``negative_prompt`` ``None`` (or ``""``) turns true CFG
    off; ``image`` (``uint8 [H, W, 3]`` RGB) is the condition image of an edit model, or with
    ``mask`` (``uint8 [H, W]``, the image's size, 255 = repaint: diffusers' convention) the image an
    inpaint model repaints with ``strength`` in (0, 1]; ``more_images`` the 2nd, 3rd... condition
    images of a multi-image edit model (its ``max_input_images`` > 1: ``qwen_image_edit_plus``), in
    order; ``lora_id`` (hex SHA-256 of a registered adapter, docs/lora.md) and ``lora_scale``
    select a LoRA adapter for the denoiser (None: none).
    """

    prompt: str
    width: int
    height: int
    steps: int
    seed: int
    n: int = 1
    negative_prompt: str | None = None
    true_cfg_scale: float = 4.0
    guidance_scale: float | None = None
    image: NDArray[Any] | None = None
    lora_id: str | None = None
    lora_scale: float = 1.0
    mask: NDArray[Any] | None = None
    strength: float | None = None
    more_images: tuple[NDArray[Any], ...] = ()

    @property
    def condition_images(self) -> tuple[NDArray[Any], ...]:
        """Every condition image in order (``image`` then ``more_images``); empty without."""
        return ((self.image,) if self.image is not None else ()) + self.more_images


@dataclass(frozen=True)
class GeneratedImage:
    """One generated image: ``uint8 [H, W, 3]`` RGB pixels, its seed, the denoising steps run and
    the wall time (seconds) of the denoiser call it was part of; ``stage_compute_ms``: each
    ensemble step's own compute for this image (its ``STAGE_COMPUTE_MS``, ms; steps that sent
    none are absent) and ``wall_s``: the ensemble request's wall time seen by the frontend."""

    pixels: NDArray[Any]
    seed: int
    steps: int
    denoise_seconds: float
    stage_compute_ms: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0



@dataclass(frozen=True)
class StageStatistics:
    """Triton's cumulative inference statistics of one model (``ModelStatistics.inference_stats``,
    summed over versions): requests that succeeded, executions (batches), and the summed
    durations in nanoseconds that requests spent queued and computing (input + infer + output).

    Triton counts a batch's compute time once per request in it, so ``compute_ns / success`` is
    the mean compute time a request saw. For a decoupled Python model the compute time is that
    of ``execute()``, which only hands the request to a worker (the generation itself is not in it).
    """

    success: int = 0
    executions: int = 0
    queue_ns: int = 0
    compute_ns: int = 0


@dataclass(frozen=True)
class VideoJob:
    """What to generate on a text-to-video model: ``num_frames`` frames of ``width`` x
    ``height`` pixels for ``prompt`` with ``steps`` denoising steps and ``seed``. Optional scales
    ``None``: the model's own (docs/video_contracts.md). ``input_reference``: image-to-video only,
    the reference frame already ``width x height``, as base64 PNG
    (``omni_triton.media.image.png_base64``; stored with the job, so a resumed job has it)."""

    prompt: str
    width: int
    height: int
    num_frames: int
    steps: int
    seed: int
    negative_prompt: str = ""
    guidance_scale: float = 4.0
    guidance_scale_2: float | None = None
    boundary_ratio: float | None = None
    flow_shift: float | None = None
    input_reference: str | None = None


@dataclass(frozen=True)
class VideoEvent:
    """One response of a video model: progress (``step`` of ``total`` denoising steps finished),
    or the last one with ``frames`` (``uint8 [F, H, W, 3]`` RGB), the steps run and the
    denoiser's wall time (seconds)."""

    step: int = 0
    total: int = 0
    frames: NDArray[Any] | None = None
    num_steps: int | None = None
    denoise_seconds: float | None = None


@dataclass(frozen=True)
class AudioGenerateJob:
    """What to generate on a text-to-audio model (``docs/audio_generation.md``): the clip
    ``[audio_start_s, audio_end_s)`` (seconds conditioning and cut) for ``prompt`` with ``steps``
    denoising steps, CFG ``guidance_scale`` and ``seed``; ``negative_prompt`` None: none."""

    prompt: str
    audio_start_s: float
    audio_end_s: float
    steps: int
    seed: int
    guidance_scale: float
    negative_prompt: str | None = None


@dataclass(frozen=True)
class AudioGenerateEvent:
    """One response of a text-to-audio model: progress (``step`` of ``total`` denoising steps
    finished), or the last one with ``audio`` (``float32 [channels, samples]``), its
    ``sample_rate`` (Hz), the steps run and the denoiser's wall time (s)."""

    step: int = 0
    total: int = 0
    audio: NDArray[Any] | None = None
    sample_rate: int = 0
    num_steps: int | None = None
    denoise_seconds: float | None = None


@runtime_checkable
class Engine(Protocol):
    """What the routers need from a backend (``TritonEngine``; the unit tests' fakes).

    Every method is required: mypy checks each implementation against this class. A backend
    without a feature still has the method; the serving layer decides from the served models
    (``ModelInfo``) whether a feature is there, never from the engine's attributes.
    """

    async def is_live(self) -> bool:
        """True when the inference server answers and reports itself live."""

    async def list_models(self) -> list[ModelInfo]:
        """Every served model with its current state (READY or not). Raises ``TritonUnavailableError``."""

    async def get_model(self, name: str) -> ModelInfo:
        """The served, READY model ``name``.

        Raises ``ModelNotFoundError``, ``ModelNotReadyError`` or ``TritonUnavailableError``.
        """

    def synthesize(
        self, model: str, text: str, voice: str | None = None, speed: float | None = None,
        options: SpeechOptions | None = None, paced: bool = False,
    ) -> AsyncGenerator[AudioChunk, None]:
        """Stream ``(float32 [T] PCM, sample_rate Hz)`` chunks as the model produces them.
        ``options``: Qwen3-TTS extras (the serving layer passes it only when non-empty).
        ``paced``: the client asked for real-time pacing (``stream_pacing: "realtime"``; passed
        only when True; the model may then compute it just ahead of playback, docs/scheduling.md
        "Pacing"); otherwise it is computed as fast as the model can.

        Closing the iterator early must cancel the request in the server. Raises
        ``InferenceError`` (model error) or ``TritonUnavailableError`` while iterating.
        """

    async def generate_images(self, model: str, job: ImageJob) -> list[GeneratedImage]:
        """Generate ``job.n`` images on the image model ``model`` (all requests in flight at once).

        Raises ``InvalidRequestError`` (the model rejected an input), ``InferenceError``,
        ``ModelNotReadyError`` or ``TritonUnavailableError``.
        """

    def generate(self, model: str, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        """Stream the chat-contract responses of one request as the model produces them.

        Closing the iterator early must cancel the request in the server (the stage then aborts
        it in its engine). Raises ``InvalidRequestError`` (the model rejected the input),
        ``InferenceError``, ``ModelNotReadyError`` or ``TritonUnavailableError`` while iterating.
        """

    def generate_video(self, model: str, job: VideoJob, request_id: str = "") -> AsyncGenerator[VideoEvent, None]:
        """Stream the events of one video request on the video model ``model``: a
        :class:`VideoEvent` per finished denoising step, then one with the frames
        (``uint8 [F, H, W, 3]``). ``request_id`` is Triton's request id (the job id).

        Closing the iterator early must cancel the request in the server (the denoiser stops at
        its next step). Raises ``InvalidRequestError``, ``InferenceError`` (also: the stream
        ended without frames), ``ModelNotReadyError`` or ``TritonUnavailableError`` while iterating.
        """

    def generate_audio(self, model: str, job: AudioGenerateJob) -> AsyncGenerator[AudioGenerateEvent, None]:
        """Stream the events of one text-to-audio request on ``model``: an
        :class:`AudioGenerateEvent` per finished denoising step, then one with the audio.

        Closing the iterator early must cancel the request in the server (the denoiser stops at
        its next step). Raises ``InvalidRequestError``, ``InferenceError`` (also: the stream
        ended without audio), ``ModelNotReadyError`` or ``TritonUnavailableError`` while iterating.
        """

    def transcribe(self, model: str, audio: NDArray[Any], language: str | None = None, prompt: str | None = None,
                   task: str = "transcribe") -> AsyncGenerator[str, None]:
        """Stream the text of one ASR request (``omni_triton.contracts.asr``) as the model makes it.

        ``audio``: float32 mono [T] in [-1, 1] at 16 kHz (``contracts.asr.SAMPLE_RATE``), at most
        the model's ``max_audio_s`` (one segment: the serving layer cuts longer audio at VAD
        pauses); ``language``: ISO-639-1 or None; ``prompt``: OpenAI's ``prompt`` or None;
        ``task``: ``transcribe`` | ``translate``. Yields the ``TEXT_DELTA`` of each response (text
        since the previous one; a model that cannot stream yields its whole text once).

        Closing the iterator early must cancel the request in the server. Raises
        ``InvalidRequestError`` (the model rejected an input: ``ASRInputError``),
        ``InferenceError``, ``ModelNotReadyError`` or ``TritonUnavailableError`` while iterating.
        """

    async def voice_prompt(self, model: str, audio: NDArray[Any], sample_rate: int, ref_text: str | None,
                           x_vector_only: bool) -> tuple[bytes, float]:
        """Compute a voice-clone prompt once on ``model`` (``qwen3_tts_voice_prompt``).

        ``audio``: float32 mono [T] in [-1, 1] at ``sample_rate`` Hz, with its transcript
        ``ref_text`` (or ``x_vector_only``: speaker embedding only). Returns (``VOICE_PROMPT``
        bytes, clip seconds). Raises ``InvalidRequestError`` (the stage rejected the clip),
        ``InferenceError``, ``ModelNotReadyError`` or ``TritonUnavailableError``.
        """

    def abort_inflight(self, models: list[str], dead_stage: str) -> int:
        """End every in-flight call on ``models`` because the stage ``dead_stage`` died (its
        callers then raise a 503 ``StageRestartedError``); returns how many were ended. Called by
        ``stage_watch.ServeStatusWatch``; an engine with nothing in flight returns 0."""

    async def close(self) -> None:
        """Release connections."""
