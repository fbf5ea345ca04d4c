"""Bases of the thinker -> talker omni families (``qwen3_omni``, ``qwen2_5_omni``): the thinker
stage, the talker stage and the BLS pipeline share their request parsing, the thinker-to-talker
hand-off and the response layout (contract: ``omni_triton.contracts.chat``). Each family subclasses
them with its own ``setup`` (checkpoint, stages, voices), stage and callee names, metric names and
``pass_paced`` (whether its callees declare PACED), and adds what only it has as explicit methods
(Qwen3-Omni: media inputs, speaking while thinking, chunked code2wav; Qwen2.5-Omni: one
whole-utterance token2wav). Stub-only imports; the logic lives in ``omni_triton.stages``.

The BLS imports no torch (nor transformers): it checks what it reads itself (modalities, voice,
frame cap, the messages' structure) and passes PROMPT / MESSAGES / SAMPLING_PARAMETERS on as they
came; the thinker stage tokenizes them, decodes and processes media parts, and refuses what it
cannot take with ``invalid input: ...``, which reaches the BLS as a ``StageError`` with
``invalid`` set and leaves it as the BLS's own INVALID_ARG (HTTP 400).
``tests/unit/test_bls_imports.py`` fails if a BLS imports torch again."""
from __future__ import annotations

import uuid
from dataclasses import dataclass, replace

import numpy as np

from omni_triton.adapters.api_inputs import chat_request_pairs, read_chat_request
from omni_triton.adapters.bls import stream_stage
from omni_triton.adapters.stream import DecoupledStage, Final
from omni_triton.adapters.triton_io import optional_array, optional_input, optional_str_input, required_array
from omni_triton.contracts import chat as ch
from omni_triton.contracts import codec as cd
from omni_triton.contracts import omni_stages as om
from omni_triton.contracts import qwen3_omni as q3
from omni_triton.contracts import speech as sp
from omni_triton.contracts.tensors import audio_outputs, media_messages_chars, scalar_array, scalar_int
from omni_triton.media.inputs import MediaLimits
from omni_triton.stages.chunking import FrameGroups


def _messages_chars(params) -> int:
    """MESSAGES cap with the media parts the config allows inline (``max_media_parts`` x
    ``max_media_part_bytes``)."""
    d = MediaLimits()
    return media_messages_chars(int(params.get("max_media_parts", d.max_parts)),
                                int(params.get("max_media_part_bytes", d.max_part_bytes)))


#: before ``setup`` reads the config: the ``MediaLimits`` defaults
_DEFAULT_MESSAGES_CHARS = media_messages_chars(MediaLimits.max_parts, MediaLimits.max_part_bytes)


def _paced(stage) -> dict:
    """``{"paced": True}`` under the deadline scheduler (one token / frame per step), else no
    keyword at all: the Qwen2.5 stages inherit these ``generate`` methods, and their thinker and
    talker have no paced mode (their configs do not opt into scheduling)."""
    return {"paced": True} if stage.step_scheduler is not None else {}


def _read_media(request, names: dict):
    """The optional media tensors of ``request`` (``names``: field -> tensor name) as a dict of
    numpy arrays (absent ones left out)."""
    out = {}
    for field, name in names.items():
        array = optional_array(request, name)
        if array is not None:
            out[field] = array
    return out


def _media_pairs(arrays: dict | None, names: dict) -> dict:
    """``{tensor name: array}`` for the present fields of ``arrays`` (None: none)."""
    return {names[k]: np.ascontiguousarray(v) for k, v in (arrays or {}).items() if v is not None and k in names}


class FrameGroupResponses(FrameGroups):
    """``qwen3_omni_talker``'s CODES responses of ``emit_frames`` frames: ``outputs`` is a step's
    response (None while a group fills, so the scheduler still steps one frame at a time),
    ``tail`` the last frames at the stream's end (None when none, or when it was cancelled)."""

    def outputs(self, frames: np.ndarray):
        codes = self.push(frames)
        return None if codes is None else {cd.CODES: codes}

    def tail(self, stream):
        rest = self.flush()
        return None if rest is None or stream.cancel_seen else {cd.CODES: rest}


@dataclass
class AsyncTalkerJob:
    inputs: list
    voice: str
    settings: object
    first_chunk_frames: int | None = None  # FIRST_CHUNK_FRAMES: the BLS's first chunk (None: config's)


def _talker_increments(step) -> dict:
    """The talker tensors of one streamed thinker step (ThinkerStep increments -> tensors)."""
    out = {om.SEQUENCE: np.asarray(step.ids if step.ids is not None else (), np.int64)}
    if step.embeds is not None:
        out.update({om.THINKER_EMBEDS: step.embeds, om.THINKER_HIDDEN: step.hidden})
    if step.prompt_len is not None:
        out.update({om.PROMPT_LEN: scalar_array(step.prompt_len, "INT32"), om.TTS_EMBEDS: step.tts_embeds})
    return out


def _step_increments(out: dict) -> dict:
    """The inverse of :func:`_talker_increments`: ThinkerStep keyword arguments from tensors."""
    kw = {"ids": out.get(om.SEQUENCE), "embeds": out.get(om.THINKER_EMBEDS), "hidden": out.get(om.THINKER_HIDDEN),
          "tts_embeds": out.get(om.TTS_EMBEDS)}
    if om.PROMPT_LEN in out:
        kw["prompt_len"] = scalar_int(out[om.PROMPT_LEN], om.PROMPT_LEN, ch.ChatInputError)
    return kw


@dataclass
class ThinkerJob:
    """One thinker request: prompt ``ids`` (int64 [T]), ``sampling`` (``SamplingSettings``),
    whether the last response carries the talker's inputs (``talker_inputs``), streamed as
    increments (``streamed``: ASYNC_CHUNK), and the ``media`` (``MultimodalInputs``) of a
    multimodal prompt."""

    ids: np.ndarray
    sampling: object
    talker_inputs: bool
    streamed: bool
    media: object

    @property
    def waits_for_whole_answer(self) -> bool:
        """Its talker starts only after the whole answer (TALKER_INPUTS without ASYNC_CHUNK)."""
        return self.talker_inputs and not self.streamed


@dataclass
class TalkerJob:
    """One talker request fed a finished thinker's outputs (``ThinkerOutput``)."""

    thinker_output: object
    voice: str
    settings: object
    first_chunk_frames: int | None = None  # FIRST_CHUNK_FRAMES: the BLS's first chunk (None: config's)


@dataclass
class OmniJob:
    """One omni BLS request: the thinker's inputs, whether to speak, in which voice, the frame cap."""

    inputs: list
    audio: bool
    voice: str
    max_frames: int | None
    async_chunk: bool = False
    media: bool = False  # MESSAGES has media parts (the thinker processes them; Qwen3-Omni only)
    paced: bool = False  # PACED: played as it arrives, so the low-water chunks apply



class OmniThinkerBase(DecoupledStage):
    """A thinker stage: chat inputs (+ TALKER_INPUTS, ASYNC_CHUNK, media tensors, REQUEST_ID) ->
    text deltas; the last response (FINAL) also carries the talker's inputs when asked (or every
    step's increments with ASYNC_CHUNK). A family's ``setup`` sets ``thinker`` (its
    ``OmniThinker``), ``processor`` (None: text only, media parts refused), ``default_max_tokens``
    and ``max_model_len``."""

    input_error = ch.ChatInputError
    cancel_flags = True
    per_instance_metrics = True
    processor = None
    messages_chars = _DEFAULT_MESSAGES_CHARS  # MESSAGES cap (inline media parts included)

    def parse(self, request):
        """The request's raw chat inputs -> a :class:`ThinkerJob`: the chat template and the
        tokenizer run here, and media data parts (``input_audio`` / ``image_url`` / ``video_url``,
        as the client sent them through the BLS) are decoded and processed here (``processor``).

        Raises:
            ChatInputError / MediaInputError: what ``prepare_multimodal_request`` refuses.
        """
        from omni_triton.stages.qwen3_omni import prepare_multimodal_request

        talker_inputs = bool(optional_input(request, om.TALKER_INPUTS) or False)
        streamed = talker_inputs and bool(optional_input(request, q3.ASYNC_CHUNK) or False)
        ids, sampling, media = prepare_multimodal_request(
            self.thinker, *read_chat_request(request, self.messages_chars), self.default_max_tokens,
            self.max_model_len, talker_inputs, self.processor)
        return ThinkerJob(ids, sampling, talker_inputs, streamed, media)

    def generate(self, job, stream):
        ids, sampling, talker_inputs, streamed, media = (job.ids, job.sampling, job.talker_inputs, job.streamed,
                                                         job.media)
        counted = 0
        for step in self.thinker.stream(ids, sampling, talker_inputs and not streamed, stream.cancelled,
                                        stream_talker_inputs=streamed, media=media, **_paced(self)):
            if step is None:
                yield None  # a token whose text is held back: nothing to send
                continue
            self.metrics.count("tokens", step.completion_tokens - counted)
            counted = step.completion_tokens
            out = ch.text_response(step.text, step.finish_reason or "", len(ids), step.completion_tokens)
            if streamed:  # increments (q3.ASYNC_CHUNK): what this step appended to the talker tensors
                out.update(_talker_increments(step))
            elif step.output is not None:
                o = step.output
                handoff = om.ThinkerToTalker(o.sequence, o.prompt_len, o.embeds, o.hidden, o.tts_embeds)
                out.update(handoff.thinker_outputs())
                # a multimodal prompt's media positions, for the talker (the BLS passes them on)
                out.update(_media_pairs(o.talker_media, q3.TALKER_MEDIA_TENSORS))
            yield Final(out) if step.finish_reason else out



class OmniTalkerBase(DecoupledStage):
    """A talker stage: the thinker's outputs (+ VOICE, MIN/MAX_FRAMES, REQUEST_ID) -> CODES
    responses of ``emit_frames`` codec frames (the last may hold fewer); one request at a time
    per instance. A family's ``setup`` sets ``talker``, ``default_voice`` and ``settings``."""

    emit_frames = 1  # frames per CODES response
    frames_output = cd.CODES  # deadline_unit frames
    input_error = ch.ChatInputError
    cancel_flags = True
    per_instance_metrics = True
    messages_chars = _DEFAULT_MESSAGES_CHARS  # MESSAGES cap (inline media parts included)

    def parse(self, request):
        settings = self._settings(request)
        voice = optional_str_input(request, ch.VOICE) or self.default_voice
        return TalkerJob(self._thinker_output(request), voice, settings, self._first_chunk(request))

    @staticmethod
    def _first_chunk(request) -> int | None:
        """The optional ``FIRST_CHUNK_FRAMES`` (the BLS's first chunk of this request; declared by
        ``qwen3_omni_talker``); ``ChatInputError`` when < 1."""
        value = optional_input(request, cd.FIRST_CHUNK_FRAMES)
        if value is None:
            return None
        if int(value) < 1:
            raise ch.ChatInputError(f"FIRST_CHUNK_FRAMES must be >= 1, got {int(value)}")
        return int(value)

    def playback_deadline(self, arrival, job=None, paced=False):
        """The config's frame deadline, with the request's FIRST_CHUNK_FRAMES as its first chunk
        when sent (docs/scheduling.md "The first chunk")."""
        first = getattr(job, "first_chunk_frames", None)
        return self.playback.deadline(arrival, paced, first_chunk_frames=first)

    @staticmethod
    def _thinker_output(request):
        """The thinker's hand-off (SEQUENCE, PROMPT_LEN, THINKER_EMBEDS/HIDDEN, TTS_EMBEDS, talker
        media) as a ``ThinkerOutput``; a missing tensor is an input error."""
        from omni_triton.stages.qwen3_omni import ThinkerOutput

        handoff = om.ThinkerToTalker.from_tensors({n: required_array(request, n) for n in om.TALKER_TENSORS})
        return ThinkerOutput(handoff.sequence, handoff.prompt_len, handoff.embeds, handoff.hidden, handoff.tts_embeds,
                             talker_media=_read_media(request, q3.TALKER_MEDIA_TENSORS) or None)

    def _settings(self, request):
        settings = self.settings
        max_frames, min_frames = optional_input(request, sp.MAX_FRAMES), optional_input(request, cd.MIN_FRAMES)
        if max_frames is not None:
            settings = replace(settings, max_frames=int(max_frames))
        if min_frames is not None:
            settings = replace(settings, min_frames=int(min_frames))
        return settings

    def generate(self, job, stream):
        out, voice, settings = job.thinker_output, job.voice, job.settings
        groups = FrameGroupResponses(self.emit_frames, job.first_chunk_frames)  # first response: the first chunk
        for frames in self.talker.stream(out, voice, settings, stream.cancelled, **_paced(self)):
            if frames is None:
                yield None  # a talker step without a frame (its last)
                continue
            self.metrics.count("frames", len(frames))
            yield groups.outputs(frames)
        yield groups.tail(stream)


class OmniPipelineBase(DecoupledStage):
    """An omni BLS, torch-free: checks what it reads itself (MODALITIES, VOICE, MAX_AUDIO_FRAMES,
    exactly one of PROMPT and MESSAGES, the messages' structure and content part types against
    ``media_accept``) and passes the chat inputs on as they came; the thinker tokenizes them,
    processes their media and refuses the rest with ``invalid input: ...`` (a ``StageError``
    with ``invalid``: INVALID_ARG here too, as a 2.51 BLS gets a stage's INVALID_ARG as INTERNAL).
    It streams the thinker's text deltas as they come and hands its outputs to the talker
    (:meth:`_think`); what becomes of the talker's codes is the family's ``generate``. A family's
    ``setup`` sets ``voices``, ``default_voice``, ``sample_rate``, ``stage_flags``; its class
    names ``thinker``, ``talker`` and ``media_accept`` (the content part modalities its thinker
    takes) and ``talker_media_outputs`` (the thinker outputs of a multimodal prompt that the
    talker takes too)."""

    input_error = ch.ChatInputError
    reads_bls_streams = True
    per_instance_metrics = True  # several instances (stub processes)
    media_accept: tuple[str, ...] = ("text",)  # text only
    talker_media_outputs: tuple[str, ...] = ()
    messages_chars = _DEFAULT_MESSAGES_CHARS  # MESSAGES cap (inline media parts included)

    def parse(self, request):
        """The request -> an :class:`OmniJob` (the chat inputs unchanged).

        Raises:
            ChatInputError: bad MODALITIES / VOICE / MAX_AUDIO_FRAMES, both or neither of PROMPT
                and MESSAGES, MESSAGES that ``chat.parse_messages`` refuses (not JSON, a bad role,
                a content part this model does not take), an input over its cap.
        """
        modalities = ch.parse_modalities(optional_str_input(request, ch.MODALITIES), default=("text", "audio"))
        voice = ch.match_voice(optional_str_input(request, ch.VOICE), self.voices, self.default_voice,
                               case_sensitive=False)
        audio = "audio" in modalities
        prompt, messages, sampling = read_chat_request(request, self.messages_chars)
        if (prompt is None) == (messages is None):
            raise ch.ChatInputError("exactly one of PROMPT and MESSAGES must be given")
        media = messages is not None and bool(ch.media_parts(ch.parse_messages(messages, accept=self.media_accept)))
        max_frames = optional_input(request, ch.MAX_AUDIO_FRAMES)
        if max_frames is not None and int(max_frames) < 1:
            raise ch.ChatInputError(f"MAX_AUDIO_FRAMES must be >= 1, got {int(max_frames)}")
        return OmniJob(chat_request_pairs((prompt, messages, sampling)), audio, voice,
                       None if max_frames is None else int(max_frames), False, media, self.paced(request))

    def _response(self, text="", finish="", counts=(0, 0), audio=None):
        return {**ch.text_response(text, finish, *counts), **audio_outputs(audio, self.sample_rate)}

    def _think(self, job, stream, request_prefix: str):
        """Stream the thinker (``self.thinker``), yielding a text response per delta; returns
        ``(talker_in, counts)``: the talker's inputs (the thinker's talker tensors, VOICE, the
        prompt's media positions, MAX_FRAMES) or None when nothing is to be spoken (text only,
        cancelled, aborted, or under two generated tokens: the reference needs the first
        generated token's states), and the (prompt, completion) token counts. Used as
        ``talker_in, counts = yield from self._think(...)`` (also by the Qwen2.5-Omni BLS)."""
        inputs = job.inputs + [(om.TALKER_INPUTS, np.array([job.audio], dtype=bool))]
        outputs = ch.TEXT_OUTPUTS + ((om.TALKER_TENSORS + self.talker_media_outputs) if job.audio else ())
        final, counts, finish = None, (0, 0), ""
        for out in stream_stage(self.thinker, inputs, outputs, stream.cancelled, self.stage_flags,
                                f"{request_prefix}-{uuid.uuid4().hex}", parent=stream):
            response = ch.TextResponse.from_tensors(out)
            finish, counts = response.finish_reason, response.counts
            yield self._response(response.text, finish, counts)
            if job.audio and om.SEQUENCE in out:
                final = out  # the thinker's last response: it carries the talker's tensors
        if stream.cancel_seen or stream.cancelled() or finish == "abort" or final is None:
            return None, counts
        media = [(name, final[name]) for name in self.talker_media_outputs if name in final]
        handoff = om.thinker_to_talker(final, job.voice, media, job.max_frames)
        if handoff.generated_tokens < 2:
            return None, counts
        return handoff.to_tensors(), counts

