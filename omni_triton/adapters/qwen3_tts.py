"""``TritonPythonModel`` classes of the Qwen3-TTS pipeline (contract: ``omni_triton.contracts.qwen3_tts``):
``qwen3_tts`` (BLS, main environment) -> ``qwen3_tts_talker`` (decoupled, batched decoding across
requests) -> ``qwen3_tts_code2wav`` (dynamic batching), and ``qwen3_tts_voice_prompt``. The three
stages run in the Qwen3-TTS environment (``EXECUTION_ENV_PATH``, docs/qwen3_tts.md); the logic lives
in ``omni_triton.stages.qwen3_tts``."""
from __future__ import annotations

import uuid

import numpy as np

from omni_triton.adapters.batched import BatchedStage, set_torch_threads
from omni_triton.adapters.bls import call_stage, stream_stage
from omni_triton.adapters.stream import DecoupledStage
from omni_triton.adapters.triton_io import input_array, optional_input, optional_str_input
from omni_triton.contracts import qwen3_tts as q
from omni_triton.contracts.codec import CODES, DUE_MS, FIRST_CHUNK_FRAMES, LEFT_CONTEXT, talker_to_code2wav
from omni_triton.contracts.speech import MAX_FRAMES, TEXT, max_input_chars
from omni_triton.contracts.tensors import AUDIO, SAMPLE_RATE, VOICE, first_value, scalar_array, scalar_int, utf8_array

CHECKPOINT = "qwen3-tts-tiny"


def _checkpoint(params) -> object:
    from omni_triton.paths import model_dir

    path = model_dir(params.get("model_name", CHECKPOINT))
    if not (path / "manifest.json").is_file() and not (path / "base").is_dir():
        raise RuntimeError(f"no Qwen3-TTS checkpoint at {path}; run `omni-triton prepare --models qwen3_tts`")
    return path


class Qwen3TtsTalkerStage(DecoupledStage):
    """``qwen3_tts_talker``: TEXT + TASK (+ VOICE, INSTRUCTIONS, LANGUAGE, VOICE_PROMPT, MAX_FRAMES,
    REQUEST_ID) -> CODES [n, G] responses of ``emit_frames`` generated frames each (config,
    default 1; the last response may hold fewer), then an empty FINAL. Requests are handed to a
    :class:`~omni_triton.stages.qwen3_tts.scheduler.TalkerScheduler` that decodes up to
    ``max_num_seqs`` of them in shared forward passes."""

    stage = "qwen3_tts_talker"
    input_error = q.Qwen3TtsInputError
    cancel_flags = True
    metric_specs = dict(
        frames=("omni_qwen3_tts_talker_frames_total", "Codec frames generated", "counter"),
        requests=("omni_qwen3_tts_talker_requests_total", "Talker requests started", "counter"),
        cancelled=("omni_qwen3_tts_talker_cancelled_total", "Talker requests cancelled", "counter"),
        steps=("omni_qwen3_tts_talker_steps_total", "Batched decode steps (one forward pass for all rows)", "counter"),
        rows=("omni_qwen3_tts_talker_step_rows_total", "Requests decoded by those steps (rows / steps = mean batch)",
              "counter"),
    )

    def setup(self, args, params):
        from omni_triton.stages.chunking import emit_frames
        from omni_triton.stages.qwen3_tts.engine import Qwen3TtsForm
        from omni_triton.stages.qwen3_tts.scheduler import TalkerScheduler

        set_torch_threads()
        root = _checkpoint(params)
        tasks = [t.strip() for t in params.get("forms", ",".join(q.TASKS)).split(",") if t.strip()]
        self.forms = {t: Qwen3TtsForm(root / t) for t in tasks}
        self.default_max = int(params.get("default_max_frames", "200"))
        self.max_frames_cap = int(params.get("max_frames_cap", "2048"))
        self.emit_frames = emit_frames(params)
        self.scheduler = TalkerScheduler(self.forms, int(params.get("max_num_seqs", "8")), on_step=self._on_step)

    def _on_step(self, rows: int) -> None:
        metrics = getattr(self, "metrics", None)  # set after setup
        if metrics is not None:
            metrics.count("steps")
            metrics.count("rows", rows)

    def parse(self, request):
        from omni_triton.stages.qwen3_tts.request import Qwen3TtsRequest, VoicePrompt, validate_request

        task = optional_str_input(request, q.TASK) or ""
        if task not in self.forms:
            raise q.Qwen3TtsInputError(f"TASK must be one of {', '.join(self.forms)}, got {task!r}")
        prompt = optional_input(request, q.VOICE_PROMPT)
        max_frames = optional_input(request, MAX_FRAMES)
        req = Qwen3TtsRequest(
            task, optional_str_input(request, TEXT) or "", optional_str_input(request, q.LANGUAGE) or "Auto",
            optional_str_input(request, VOICE), optional_str_input(request, q.INSTRUCTIONS),
            VoicePrompt.from_bytes(bytes(prompt)) if prompt is not None and len(prompt) else None,
            self.default_max if max_frames is None else int(max_frames))
        form = self.forms[task]
        req = validate_request(req, form.speakers, form.languages, self.max_frames_cap)
        first = optional_input(request, FIRST_CHUNK_FRAMES)
        if first is not None and int(first) < 1:
            raise q.Qwen3TtsInputError(f"FIRST_CHUNK_FRAMES must be >= 1, got {int(first)}")
        req.first_chunk_frames = None if first is None else int(first)
        return req

    def dispatch(self, job, stream):
        from omni_triton.stages.chunking import FrameGroups

        groups = FrameGroups(self.emit_frames, getattr(job, "first_chunk_frames", None))  # first: the first chunk

        def emit(frame):
            self.metrics.count("frames")
            codes = groups.push(frame)
            if codes is not None:
                stream.send({CODES: codes})

        def done(reason, error=None):
            tail = groups.flush()
            if tail is not None and reason == "stop":
                stream.send({CODES: tail})  # the last frames (fewer than a group)
            self.finish(job, stream, error)

        self.scheduler.submit(job, emit, stream.cancelled, done)

    def finalize(self):
        self.scheduler.close()
        super().finalize()


class Qwen3TtsCode2WavStage(BatchedStage):
    """``qwen3_tts_code2wav``: ragged dynamic batches of CODES [1, T_i, G] + LEFT_CONTEXT [1, 1] ->
    AUDIO [1, samples] of the new frames, one codec forward pass per batch."""

    due_input = DUE_MS  # the BLS says when each chunk is due (the deadline queue's order)

    def setup(self, args, params):
        from omni_triton.stages.qwen3_tts.engine import Qwen3TtsCodec

        set_torch_threads()
        self.codec = Qwen3TtsCodec(_checkpoint(params) / params.get("codec_form", "base"))

    def batch_key(self, item):
        return len(item[0])  # one forward pass per chunk length (Qwen3TtsCodec.decode)

    def parse(self, request):
        from omni_triton.stages.qwen3_tts.streaming import validate_chunk

        return validate_chunk(input_array(request, CODES), input_array(request, LEFT_CONTEXT),
                              self.codec.num_groups, self.codec.codebook_size)

    def run(self, items):
        return self.codec.decode([c for c, _ in items], [left for _, left in items])

    def outputs(self, pcm):
        return {AUDIO: pcm[None, :]}


class Qwen3TtsVoicePromptStage(BatchedStage):
    """``qwen3_tts_voice_prompt``: REF_AUDIO + REF_SAMPLE_RATE (+ REF_TEXT, X_VECTOR_ONLY) ->
    VOICE_PROMPT (the package's ``create_voice_clone_prompt``, as bytes) + REF_SECONDS."""

    def setup(self, args, params):
        from omni_triton.stages.qwen3_tts.engine import Qwen3TtsForm

        set_torch_threads()
        self.form = Qwen3TtsForm(_checkpoint(params) / "base")
        self.min_seconds = float(params.get("min_ref_seconds", "0.5"))
        self.max_seconds = float(params.get("max_ref_seconds", "60"))
        self.max_input_chars = max_input_chars(params, "4096")  # REF_TEXT (the frontend's ref_text cap)

    def parse(self, request):
        from omni_triton.contracts.tensors import INVALID_INPUT_PREFIX

        try:
            return self._parse(request)
        except q.Qwen3TtsInputError as exc:  # prefixed: 2.51 hands a BLS caller INVALID_ARG as INTERNAL
            raise q.Qwen3TtsInputError(INVALID_INPUT_PREFIX + str(exc)) from None

    def _parse(self, request):
        audio = input_array(request, q.REF_AUDIO)
        audio = np.asarray(audio, np.float32).reshape(-1)
        rate = scalar_int(input_array(request, q.REF_SAMPLE_RATE), q.REF_SAMPLE_RATE, q.Qwen3TtsInputError)
        ref_text = optional_str_input(request, q.REF_TEXT, self.max_input_chars, q.Qwen3TtsInputError,
                                      "max_input_chars") or None
        xvec = optional_input(request, q.X_VECTOR_ONLY)
        xvec = bool(xvec) if xvec is not None else False
        if not 8000 <= rate <= 192000:
            raise q.Qwen3TtsInputError(f"REF_SAMPLE_RATE must be in [8000, 192000] Hz, got {rate}")
        seconds = audio.size / rate
        if not self.min_seconds <= seconds <= self.max_seconds:
            raise q.Qwen3TtsInputError(
                f"reference clip must be {self.min_seconds}-{self.max_seconds} s, got {seconds:.2f} s")
        if not np.isfinite(audio).all():
            raise q.Qwen3TtsInputError("REF_AUDIO has non-finite samples")
        if not xvec and not ref_text:
            raise q.Qwen3TtsInputError(
                "REF_TEXT is required unless X_VECTOR_ONLY (in-context cloning needs the transcript)")
        return audio, rate, ref_text, xvec

    def run(self, items):
        return [(self.form.voice_prompt(a, r, t, x).to_bytes(), a.size / r) for a, r, t, x in items]

    def outputs(self, result):
        data, seconds = result
        return {q.VOICE_PROMPT: np.array([data], dtype=np.object_), q.REF_SECONDS: np.array([seconds], np.float32)}


class Qwen3TtsPipeline(DecoupledStage):
    """``qwen3_tts`` BLS: choose the form (TASK, or from the inputs), get a clone prompt for a
    per-request REF_AUDIO from ``qwen3_tts_voice_prompt``, stream ``qwen3_tts_talker``'s frames and
    decode them chunk by chunk with left context on ``qwen3_tts_code2wav`` (a clone prompt's
    reference codes are the first chunk's left context, as the package decodes them), stream PCM."""

    stage = "qwen3_tts"
    input_error = q.Qwen3TtsInputError
    reads_bls_streams = True
    per_instance_metrics = True
    talker, code2wav, voice_prompt = "qwen3_tts_talker", "qwen3_tts_code2wav", "qwen3_tts_voice_prompt"

    def setup(self, args, params):
        from omni_triton.adapters.codec import open_stream_counts
        from omni_triton.runtime.cancel_flags import CancelFlags
        from omni_triton.stages.chunking import InitialChunk, instance_count, schedule_params

        self.chunks = schedule_params(params)  # ChunkSchedule keywords, validated (low water included)
        # the dynamic first chunk (docs/scheduling.md "The first chunk"), by the open qwen3_tts streams
        self.initial = InitialChunk.from_params(params, self.chunks["chunk_frames"], instance_count(args))
        self.open_streams = open_stream_counts(args)
        self.voices = [v.strip() for v in params.get("voices", "").split(",") if v.strip()]
        self.default_voice = params.get("default_voice", self.voices[0] if self.voices else "")
        self.sample_rate = int(params.get("sample_rate", "24000"))
        self.max_input_chars = max_input_chars(params, "2000")
        self.talker_flags = CancelFlags.for_server()

    def parse(self, request):
        from omni_triton.stages.qwen3_tts.request import choose_task

        text = self._text(request, TEXT) or ""
        if not text.strip():
            raise q.Qwen3TtsInputError("TEXT must not be empty")
        voice, instructions = optional_str_input(request, VOICE), self._text(request, q.INSTRUCTIONS)
        self._text(request, q.REF_TEXT)  # forwarded as sent to qwen3_tts_voice_prompt: bounded here
        prompt = optional_input(request, q.VOICE_PROMPT)
        ref_audio = optional_input(request, q.REF_AUDIO)
        has_ref = ref_audio is not None
        task = choose_task(optional_str_input(request, q.TASK), voice, instructions, prompt is not None or has_ref)
        job = dict(task=task, text=text, voice=voice or (self.default_voice if task == "custom_voice" else None),
                   instructions=instructions, language=optional_str_input(request, q.LANGUAGE),
                   prompt=bytes(prompt) if prompt is not None else None, max_frames=optional_input(request, MAX_FRAMES),
                   paced=self.paced(request))
        if task == "base" and prompt is None:
            if not has_ref:
                raise q.Qwen3TtsInputError("base (voice cloning) needs VOICE_PROMPT or REF_AUDIO")
            ref = [(q.REF_AUDIO, np.asarray(input_array(request, q.REF_AUDIO), np.float32).reshape(-1))]
            for name in (q.REF_SAMPLE_RATE, q.REF_TEXT, q.X_VECTOR_ONLY):
                value = input_array(request, name, required=False)
                if value is not None:
                    ref.append((name, np.asarray(value).reshape(-1)))
            job["ref"] = ref
        return job

    def _text(self, request, name):
        """Text input ``name``, refused over the model's ``max_input_chars`` (before any work)."""
        return optional_str_input(request, name, self.max_input_chars, q.Qwen3TtsInputError, "max_input_chars")

    def _decode(self, codes, left, due_s=None):
        out = call_stage(self.code2wav, talker_to_code2wav(codes, left, due_s), [AUDIO])
        return out[AUDIO].reshape(-1).astype(np.float32)

    def generate(self, job, stream):
        from omni_triton.adapters.codec import first_chunk_of_new_stream

        with first_chunk_of_new_stream(self) as first:
            yield from self._generate(job, stream, first)

    def _generate(self, job, stream, first: int):
        from omni_triton.adapters.bls import StageError
        from omni_triton.stages.chunking import ChunkedDecoder, fixed_if_unpaced
        from omni_triton.stages.qwen3_tts.request import VoicePrompt
        from omni_triton.stages.qwen3_tts.streaming import ContextSchedule

        prompt = job["prompt"]
        if job.get("ref"):
            try:
                prompt = first_value(call_stage(self.voice_prompt, job["ref"], [q.VOICE_PROMPT])[q.VOICE_PROMPT])
            except StageError as exc:
                if exc.invalid:
                    raise q.Qwen3TtsInputError(str(exc)) from exc
                raise
        ref_code = VoicePrompt.from_bytes(bytes(prompt)).ref_code if prompt is not None else None
        context = 0 if ref_code is None else len(ref_code)
        kw = {**fixed_if_unpaced(self.chunks, job["paced"]), "first_chunk_frames": first}
        chunked = ChunkedDecoder(ContextSchedule(**kw, context=context),
                                 self._decode, with_due=True)  # the decoder takes the most urgent chunk first
        if context:
            chunked.push(ref_code)  # context only: nothing is ready before the first generated frames
        rate = scalar_array(self.sample_rate, "INT32")
        inputs = [(TEXT, utf8_array(job["text"])), (q.TASK, utf8_array(job["task"])),
                  (FIRST_CHUNK_FRAMES, scalar_array(first, "INT32"))]
        named = ((VOICE, job["voice"]), (q.INSTRUCTIONS, job["instructions"]), (q.LANGUAGE, job["language"]))
        for name, value in named:
            if value:
                inputs.append((name, utf8_array(value)))
        if prompt is not None:
            inputs.append((q.VOICE_PROMPT, np.array([bytes(prompt)], dtype=np.object_)))
        if job["max_frames"] is not None:
            inputs.append((MAX_FRAMES, scalar_array(int(job["max_frames"]), "INT32")))
        for out in stream_stage(self.talker, inputs, [CODES], stream.cancelled, self.talker_flags,
                                f"qwen3tts-{uuid.uuid4().hex}", parent=stream):
            codes = out.get(CODES)
            if stream.cancel_seen:
                break
            for pcm in chunked.push(codes if codes is not None else np.zeros((0, 0), np.int64)):
                yield {AUDIO: pcm, SAMPLE_RATE: rate}
        if not stream.cancel_seen and not stream.cancelled():
            for pcm in chunked.flush():
                yield {AUDIO: pcm, SAMPLE_RATE: rate}
