"""What the frontend knows about a served model, read from Triton's model config ``parameters``
(docs/speech_contracts.md, docs/chat_contracts.md, docs/image_contracts.md)."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from omni_triton.contracts import asr as asr_contract
from omni_triton.contracts import chat as chat_contract
from omni_triton.contracts import image as image_contract
from omni_triton.contracts import speech as speech_contract
from omni_triton.contracts import stable_audio as audio_generate_contract
from omni_triton.contracts import video as video_contract

logger = logging.getLogger(__name__)

#: OpenAI's built-in voice names (``openai.types.audio.speech_create_params``). A speech model
#: maps each to one of its own voices: the config parameter ``openai_voices``
#: (``"alloy=joe,echo=joe,..."``, docs/voices.md), else its ``default_voice``.
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer",
                 "verse", "marin", "cedar")

@dataclass(frozen=True)
class ModelInfo:
    """What the frontend knows about one served model.

    ``voices``/``default_voice``/``sample_rate``/``supports_speed``/``max_input_chars`` come from
    the model config's ``parameters`` (empty/None when the model is not READY, since Triton only
    returns configs of loaded models).
    """

    name: str
    state: str = "READY"
    reason: str = ""
    inputs: frozenset[str] = field(default_factory=frozenset)
    outputs: frozenset[str] = field(default_factory=frozenset)
    decoupled: bool = False
    voices: tuple[str, ...] = ()
    default_voice: str | None = None
    sample_rate: int | None = None
    supports_speed: bool = False
    max_input_chars: int | None = None
    #: Stage models a BLS model calls (config parameter ``depends_on``): Triton reports a BLS
    #: model READY even when they are not, so the frontend checks them itself.
    depends_on: tuple[str, ...] = ()
    #: image models (diffusion ensembles): the config ``parameters`` of docs/image_contracts.md
    task: str | None = None
    default_size: tuple[int, int] | None = None  # (width, height)
    size_multiple: int = 16
    max_size: int | None = None
    default_steps: int | None = None
    max_steps: int | None = None
    default_true_cfg_scale: float | None = None
    max_images: int | None = None
    max_input_images: int | None = None
    supports_mask: bool = False
    #: Output modalities (config parameter ``modalities``, e.g. ``("text", "audio")``); empty
    #: when the config does not say (speech models: see ``output_modalities``).
    modalities: tuple[str, ...] = ()
    #: The name clients use (config parameter ``served_model_name``); None: the Triton name.
    served_model_name: str | None = None
    #: On a speech twin (``llm_tts``): the text model whose spoken answers it produces.
    speaks_for: str | None = None
    #: Context length in tokens (config parameter ``max_model_len``), if declared.
    max_model_len: int | None = None
    #: An ensemble's steps, in order (``ensemble_scheduling``); empty for other models.
    ensemble_steps: tuple[str, ...] = ()
    #: Prepared model folders the model loads (config parameter ``assets``, ``omni_triton.paths.model_dir``).
    assets: tuple[str, ...] = ()
    #: OpenAI voice name -> one of ``voices`` (config parameter ``openai_voices``).
    voice_aliases: tuple[tuple[str, str], ...] = ()
    #: Loaded on its first request and unloaded when idle (``--on-demand``,
    #: ``omni_triton.serve.on_demand``); its ``state`` is then ``READY``, ``LOADING``,
    #: ``UNLOADED`` or ``FAILED``, and ``/health`` does not wait for it.
    on_demand: bool = False
    #: Real-time-paced streams the model serves at once (config parameter ``max_paced_streams``;
    #: a paced request above it is served unpaced: ``engine.paced_slots``); None: no bound.
    max_paced_streams: int | None = None
    #: ASR models (``task`` ``transcription``, ``omni_triton.contracts.asr``): longest ``AUDIO``
    #: one request may carry (config parameter ``max_audio_s``, seconds), the ISO-639-1 codes
    #: ``LANGUAGE`` takes (``languages``; empty: any) and whether ``TASK=translate`` is served
    #: (``supports_translation``).
    max_audio_s: float | None = None
    languages: tuple[str, ...] = ()
    supports_translation: bool = False
    #: Every config parameter as a string (video models read theirs in ``serving.videos``).
    parameters: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def resolve_voice(self, name: str) -> str | None:
        """The model's own voice for ``name``: ``name`` itself when it is one of ``voices`` (or
        the model declares none), else the ``openai_voices`` entry of an OpenAI voice name, else
        ``default_voice`` for an OpenAI name; None when ``name`` means nothing to this model."""
        if not self.voices or name in self.voices:
            return name
        mapped = dict(self.voice_aliases).get(name)
        if mapped is not None and mapped in self.voices:
            return mapped
        if name in OPENAI_VOICES:
            return self.default_voice
        return None

    @property
    def openai_voice_table(self) -> dict[str, str]:
        """Every OpenAI voice name -> the voice it speaks with on this model (``resolve_voice``)."""
        if not self.voices:
            return {}
        return {n: v for n in OPENAI_VOICES if n not in self.voices and (v := self.resolve_voice(n))}

    @property
    def stage_models(self) -> tuple[str, ...]:
        """The Triton models that serve one request, in pipeline order: an ensemble's steps, a
        BLS model and the stages it calls (``depends_on``), else the model itself."""
        if self.ensemble_steps:
            return self.ensemble_steps
        return (self.name, *self.depends_on)

    @property
    def ready(self) -> bool:
        return self.state == "READY"

    @property
    def public_name(self) -> str:
        """The id clients see in ``/v1/models`` and send as ``model``."""
        return self.served_model_name or self.name

    @property
    def is_chat(self) -> bool:
        """Implements the chat contract (``docs/chat_contracts.md``): ``MESSAGES`` in,
        ``TEXT_DELTA`` out: servable by ``/v1/chat/completions``."""
        return chat_contract.MESSAGES in self.inputs and chat_contract.TEXT_DELTA in self.outputs

    @property
    def is_completion(self) -> bool:
        """``PROMPT`` in, ``TEXT_DELTA`` out: servable by ``/v1/completions`` (an ASR model also
        takes a ``PROMPT``, its transcription hint: not a completion model)."""
        return (chat_contract.PROMPT in self.inputs and chat_contract.TEXT_DELTA in self.outputs
                and not self.is_transcription)

    @property
    def output_modalities(self) -> tuple[str, ...]:
        """What the model can answer with: the ``modalities`` parameter, else ``("audio",)`` for
        a speech model, ``("image",)`` for a diffusion ensemble, ``("text",)`` for a chat/completion
        or transcription model, ``()`` for internal stages."""
        if self.modalities:
            return self.modalities
        if self.is_image:
            return ("image",)
        if self.is_video:
            return ("video",)
        if self.is_speech or self.is_audio_generation:
            return ("audio",)
        if self.is_chat or self.is_completion or self.is_transcription:
            return ("text",)
        return ()

    @property
    def input_modalities(self) -> tuple[str, ...]:
        """What chat content parts the model takes (config parameter ``input_modalities``, e.g.
        ``text,audio,image,video`` for ``omni``); ``("text",)`` when the config does not say."""
        declared = self.parameters.get("input_modalities", "")
        return tuple(m.strip().lower() for m in declared.split(",") if m.strip()) or ("text",)

    @property
    def can_speak(self) -> bool:
        """A chat model that can answer with audio (``AUDIO`` out, ``audio`` in its modalities)."""
        return ("audio" in self.output_modalities and chat_contract.AUDIO in self.outputs
                and not self.is_audio_generation)

    @property
    def is_speech(self) -> bool:
        """Text in, PCM out (``TEXT`` -> ``AUDIO``): servable by ``/v1/audio/speech``."""
        return speech_contract.TEXT in self.inputs and speech_contract.AUDIO in self.outputs

    @property
    def is_image(self) -> bool:
        """Prompt in, image out (``PROMPT`` -> ``IMAGE``): servable by ``/v1/images/*``."""
        return image_contract.PROMPT in self.inputs and image_contract.IMAGE in self.outputs

    @property
    def is_video(self) -> bool:
        """Prompt in, frames out (``PROMPT`` -> ``VIDEO``, the Wan BLS): servable by ``/v1/videos``."""
        return video_contract.PROMPT in self.inputs and video_contract.VIDEO in self.outputs

    @property
    def is_audio_generation(self) -> bool:
        """Prompt and seconds in, waveform out (``PROMPT`` + ``AUDIO_END_S`` -> ``AUDIO``, the
        ``stable_audio`` BLS): servable by ``/v1/audio/generate`` (docs/audio_generation.md)."""
        ac = audio_generate_contract
        return ac.PROMPT in self.inputs and ac.AUDIO_END_S in self.inputs and ac.AUDIO in self.outputs

    @property
    def is_image_to_video(self) -> bool:
        """A video model that takes a reference image (``INPUT_IMAGE``, the ``wan_i2v`` BLS)."""
        return self.is_video and video_contract.INPUT_IMAGE in self.inputs

    @property
    def is_image_edit(self) -> bool:
        """An image model that takes a condition image (``INPUT_IMAGE``) or several
        (``INPUT_IMAGES``, up to ``max_input_images``)."""
        return self.is_image and (image_contract.INPUT_IMAGE in self.inputs
                                  or image_contract.INPUT_IMAGES in self.inputs)

    @property
    def is_transcription(self) -> bool:
        """An ASR model (``omni_triton.contracts.asr``: config ``task`` ``transcription``, ``AUDIO``
        in, ``TEXT_DELTA`` out): servable by ``/v1/audio/transcriptions`` (and ``/translations``
        when ``supports_translation``)."""
        return (self.task == asr_contract.MODEL_TASK and asr_contract.AUDIO in self.inputs
                and asr_contract.TEXT_DELTA in self.outputs)

    @property
    def hears(self) -> bool:
        """A chat model that takes ``input_audio`` parts (``audio`` in its ``input_modalities``:
        ``omni``): it transcribes through ``/v1/chat/completions``' path with an instruction."""
        return self.is_chat and "audio" in self.input_modalities

    @property
    def modality(self) -> str:
        """``image``, ``audio`` or ``text`` (what ``/v1/models`` reports)."""
        if self.is_image:
            return "image"
        if self.is_video:
            return "video"
        if speech_contract.AUDIO in self.outputs:
            return "audio"
        return "text"


#: ``WIDTHxHEIGHT``: ASCII digits only (``str.isdigit`` also accepts "²" or "①", which ``int``
#: rejects), at most 5 digits each (longer numbers are out of range for any model anyway).
_SIZE = re.compile(r"([0-9]{1,5})[xX]([0-9]{1,5})")


def parse_size(text: str) -> tuple[int, int] | None:
    """``"WxH"`` -> (W, H) in pixels; ``None`` when ``text`` is not of that form."""
    m = _SIZE.fullmatch(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def model_info_from_config(config: Any, state: str = "READY", reason: str = "") -> ModelInfo:
    """Build a ``ModelInfo`` from a ``inference.ModelConfig`` protobuf."""
    params = {k: v.string_value.strip() for k, v in config.parameters.items()}
    inputs = frozenset(i.name for i in config.input)
    voices = tuple(v.strip() for v in params.get("voices", "").split(",") if v.strip())
    default_voice = params.get("default_voice") or (voices[0] if voices else None)
    if "supports_speed" in params:
        supports_speed = params["supports_speed"].lower() in ("true", "1", "yes")
    else:
        supports_speed = False

    def _number(key: str, kind: type[int] | type[float] = int) -> int | float | None:
        """Parameter ``key`` as ``kind`` (``int``/``float``); None when absent or malformed."""
        try:
            return kind(params[key]) if params.get(key) else None
        except ValueError:
            logger.warning("model %s: parameter %s=%r is not a %s", config.name, key, params[key],
                           kind.__name__)
            return None

    def _int(key: str) -> int | None:
        value = _number(key, int)
        return None if value is None else int(value)

    def _float(key: str) -> float | None:
        return _number(key, float)

    return ModelInfo(
        name=config.name,
        state=state,
        reason=reason,
        inputs=inputs,
        outputs=frozenset(o.name for o in config.output),
        decoupled=bool(config.model_transaction_policy.decoupled),
        voices=voices,
        default_voice=default_voice,
        sample_rate=_int("sample_rate"),
        supports_speed=supports_speed,
        max_input_chars=_int("max_input_chars"),
        depends_on=tuple(d.strip() for d in params.get("depends_on", "").split(",") if d.strip()),
        task=params.get("task") or None,
        default_size=parse_size(params.get("default_size", "")),
        size_multiple=_int("size_multiple") or 16,
        max_size=_int("max_size"),
        default_steps=_int("default_steps"),
        max_steps=_int("max_steps"),
        default_true_cfg_scale=_float("default_true_cfg_scale"),
        max_images=_int("max_images"),
        max_input_images=_int("max_input_images"),
        supports_mask=params.get("supports_mask", "").lower() in ("true", "1", "yes"),
        modalities=tuple(m.strip().lower() for m in params.get("modalities", "").split(",") if m.strip()),
        served_model_name=params.get("served_model_name") or None,
        speaks_for=params.get("speaks_for") or None,
        max_model_len=_int("max_model_len"),
        ensemble_steps=tuple(step.model_name for step in config.ensemble_scheduling.step),
        assets=tuple(a.strip() for a in params.get("assets", "").split(",") if a.strip()),
        voice_aliases=_voice_aliases(config.name, params.get("openai_voices", ""), voices),
        max_paced_streams=_int("max_paced_streams"),
        max_audio_s=_float("max_audio_s"),
        languages=tuple(x.strip().lower() for x in params.get("languages", "").split(",") if x.strip()),
        supports_translation=params.get("supports_translation", "").lower() in ("true", "1", "yes"),
        parameters=dict(params),
    )


def _voice_aliases(model: str, text: str, voices: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``"alloy=joe, echo=joe"`` -> ``(("alloy", "joe"), ("echo", "joe"))``; entries that are not
    ``name=voice`` with ``voice`` one of ``voices`` are logged and left out."""
    out = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        name, sep, voice = (p.strip() for p in item.partition("="))
        if not sep or not name or (voices and voice not in voices):
            logger.warning("model %s: openai_voices entry %r is not name=<one of its voices>", model, item)
            continue
        out.append((name, voice))
    return tuple(out)


def unready_dependencies(info: ModelInfo, states: dict[str, tuple[str, str]]) -> ModelInfo:
    """``info`` itself when all its ``depends_on`` stages are READY, else an UNAVAILABLE copy
    whose reason names the stages that are not (it keeps ``served_model_name``, so a client that
    calls the model by its OpenAI name gets 503, not 404)."""
    missing = [f"{d} ({states.get(d, ('MISSING', ''))[0]})" for d in info.depends_on
               if states.get(d, ("MISSING", ""))[0] != "READY"]
    if not missing:
        return info
    return ModelInfo(name=info.name, state="UNAVAILABLE", served_model_name=info.served_model_name,
                     reason="stages not ready: " + ", ".join(missing))
