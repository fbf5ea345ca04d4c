"""Audio encoding and bounded decoding for the HTTP edge (no torch; numpy + soundfile + soxr +
stdlib ``wave``; PyAV for the containers libsndfile does not read).

Everything that crosses a Triton boundary is mono float32 PCM in [-1, 1] (``AUDIO``) with its
sample rate in Hz (``SAMPLE_RATE``), see ``docs/speech_contracts.md``. This module turns such
arrays into the bytes an HTTP client asked for:

* ``float_to_pcm16``: float32 samples -> little-endian signed 16-bit PCM bytes (``pcm``).
* ``encode_audio``: one whole clip -> ``wav`` / ``flac`` / ``mp3`` / ``opus`` / ``pcm`` bytes,
  framed by libsndfile (through ``soundfile``); headers are never written by hand.
* ``streaming_wav_header``: the 44-byte RIFF/WAVE header that starts a WAV *stream* whose length
  is not known yet (written by the stdlib ``wave`` module, see its docstring for the size fields).
* ``decode_audio``: a client's upload (voices, consents, ``ref_audio``, chat ``input_audio``) ->
  mono float32 at a target rate, under :class:`AudioLimits`: the one audio decoder of the project,
  safe against decompression bombs (header checked first, decoding stopped at the limit).

Speed changes are not done here: the Triton model applies ``SPEED`` itself.
All sample counts are per channel (mono: samples == frames); rates are in Hz.
"""

from __future__ import annotations

import io
import wave
from dataclasses import dataclass

import numpy as np
import soundfile as sf

#: int16 full scale used for float -> int16 conversion (x * 32767, so +1.0 -> 32767, -1.0 -> -32767).
PCM16_SCALE = 32767


@dataclass(frozen=True)
class AudioFormat:
    """One ``response_format`` value and how it is framed.

    ``sf_format``/``sf_subtype`` are libsndfile's names (None for headerless ``pcm``);
    ``rates`` restricts the sample rates the codec accepts (None: any).
    """

    name: str
    content_type: str
    sf_format: str | None
    sf_subtype: str | None
    rates: frozenset[int] | None = None
    streamable: bool = False


def _probe(fmt: str, subtype: str) -> bool:
    """True when this libsndfile build can really *write* ``fmt``/``subtype`` (checked once)."""
    try:
        if subtype not in sf.available_subtypes(fmt):
            return False
        buf = io.BytesIO()
        rate = 48000 if subtype == "OPUS" else 22050
        sf.write(buf, np.zeros(rate // 10, dtype=np.int16), rate, format=fmt, subtype=subtype)
        return len(buf.getvalue()) > 0
    except Exception:
        return False


_OPUS_RATES = frozenset({8000, 12000, 16000, 24000, 48000})

_CANDIDATES = (
    AudioFormat("mp3", "audio/mpeg", "MP3", "MPEG_LAYER_III"),
    AudioFormat("opus", "audio/ogg", "OGG", "OPUS", rates=_OPUS_RATES),
    AudioFormat("flac", "audio/flac", "FLAC", "PCM_16"),
    AudioFormat("wav", "audio/wav", "WAV", "PCM_16", streamable=True),
    AudioFormat("pcm", "audio/pcm", None, None, streamable=True),
)

#: The formats this process can encode, by ``response_format`` name. ``aac`` is never here:
#: libsndfile has no AAC encoder. ``mp3``/``opus`` appear only if the linked libsndfile
#: (>= 1.1 for mp3, built with libopus for opus) can write them.
SUPPORTED_FORMATS: dict[str, AudioFormat] = {
    f.name: f
    for f in _CANDIDATES
    if f.sf_format is None or _probe(f.sf_format, f.sf_subtype or "")
}

#: Formats that can be streamed chunk by chunk as the model produces audio.
STREAMING_FORMATS: tuple[str, ...] = tuple(n for n, f in SUPPORTED_FORMATS.items() if f.streamable)


class UnsupportedFormatError(ValueError):
    """The requested format cannot be produced (unknown name or incompatible sample rate)."""


def float_to_pcm16(samples: np.ndarray) -> bytes:
    """Convert float PCM to little-endian int16 PCM bytes.

    Args:
        samples: float array of shape [T] (any float dtype; float32 per the Triton contract),
            nominally in [-1, 1]. Values outside are clipped, NaN becomes 0.
    Returns:
        ``2 * T`` bytes: int16 little-endian, ``round(x * 32767)``.
    """
    x = np.nan_to_num(np.asarray(samples, dtype=np.float32).reshape(-1), nan=0.0)
    x = np.clip(x, -1.0, 1.0) * PCM16_SCALE
    return np.rint(x).astype("<i2").tobytes()


def get_format(name: str, sample_rate: int | None = None) -> AudioFormat:
    """Look up a ``response_format``; raise ``UnsupportedFormatError`` naming the supported ones.

    Args:
        name: ``response_format`` value (``wav``, ``pcm``, ...).
        sample_rate: the model's output rate in Hz, when known; codecs with fixed rates
            (Opus: 8/12/16/24/48 kHz) are refused for other rates (no resampling here).
    """
    fmt = SUPPORTED_FORMATS.get(name)
    if fmt is None:
        raise UnsupportedFormatError(
            f"response_format '{name}' is not supported; supported formats: "
            + ", ".join(SUPPORTED_FORMATS)
        )
    if sample_rate is not None and fmt.rates is not None and sample_rate not in fmt.rates:
        raise UnsupportedFormatError(
            f"response_format '{name}' needs a sample rate in "
            f"{sorted(fmt.rates)} Hz but this model produces {sample_rate} Hz; "
            "use wav, flac, mp3 or pcm"
        )
    return fmt


def encode_audio(samples: np.ndarray, sample_rate: int, response_format: str) -> bytes:
    """Encode one whole clip.

    Args:
        samples: float32 [T] in [-1, 1] (clipped), mono; or [T, C] for C channels (interleaved
            in the output, as libsndfile writes frames).
        sample_rate: Hz.
        response_format: a key of ``SUPPORTED_FORMATS``.
    Returns:
        The encoded file (``pcm``: raw int16 LE, no header). WAV/FLAC/MP3/Opus are all 16-bit
        sources: the float samples are quantised exactly as ``float_to_pcm16`` does, so the
        WAV payload equals the ``pcm`` bytes and equals a streamed WAV's payload.
    """
    fmt = get_format(response_format, sample_rate)
    channels = samples.shape[1] if np.ndim(samples) == 2 else 1
    pcm = float_to_pcm16(samples)
    if fmt.sf_format is None:
        return pcm
    buf = io.BytesIO()
    frames = np.frombuffer(pcm, dtype="<i2")
    sf.write(
        buf,
        frames.reshape(-1, channels) if channels > 1 else frames,
        int(sample_rate),
        format=fmt.sf_format,
        subtype=fmt.sf_subtype,
    )
    return buf.getvalue()


def streaming_wav_header(sample_rate: int, channels: int = 1, sample_width: int = 2) -> bytes:
    """RIFF/WAVE header (44 bytes) for a PCM stream of unknown length.

    Written by the stdlib ``wave`` module with ``nframes`` preset to the maximum, so the
    header's size fields say "as long as a 32-bit WAV can be": data size = 0xFFFFFFDA and
    RIFF size = 0xFFFFFFFE for 16-bit mono. Readers that honour the sizes (libsndfile,
    ``wave``, ffmpeg, browsers) read until end of stream. This is the usual convention for
    streamed WAV (the sizes cannot be patched once bytes have left the server); a client that
    needs exact sizes should buffer and rewrite, or request ``pcm``.

    Args:
        sample_rate: Hz.
        channels: interleaved channels (1 for every model here).
        sample_width: bytes per sample (2: int16 PCM, what ``float_to_pcm16`` produces).
    """
    buf = io.BytesIO()
    w = wave.open(buf, "wb")
    w.setnchannels(channels)
    w.setsampwidth(sample_width)
    w.setframerate(int(sample_rate))
    w.setnframes((0xFFFFFFFF - 36) // (channels * sample_width))
    w.writeframesraw(b"")  # emits the header and nothing else
    header = buf.getvalue()
    # The writer would patch the sizes of *its* buffer on close; that buffer is discarded.
    w.close()
    return header


# --------------------------------------------------------------------------- resampling
#: Output rates ``/v1/audio/speech``'s ``sample_rate`` may ask for (besides the model's own):
#: the usual telephony, speech and media rates.
RESAMPLE_RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)


class StreamResampler:
    """Sample-rate conversion of a mono float32 stream, chunk by chunk, with soxr (libsoxr's
    ``ResampleStream``, high quality): the chunks it returns concatenated equal converting the
    whole clip at once (``resample``). ``source_rate == target_rate`` passes chunks through.

    ``process(chunk)`` takes float32 [T] at ``source_rate`` and returns float32 [T'] at
    ``target_rate`` (possibly empty: the filter holds some samples back); ``flush()`` returns
    what it still holds once the stream has ended.
    """

    def __init__(self, source_rate: int, target_rate: int):
        if source_rate <= 0 or target_rate <= 0:
            raise ValueError("sample rates must be positive")
        self.source_rate, self.target_rate = int(source_rate), int(target_rate)
        self._stream = None
        if self.source_rate != self.target_rate:
            import soxr

            self._stream = soxr.ResampleStream(self.source_rate, self.target_rate, 1, dtype="float32")

    def process(self, chunk: np.ndarray, last: bool = False) -> np.ndarray:
        chunk = np.ascontiguousarray(chunk, dtype=np.float32).reshape(-1)
        if self._stream is None:
            return chunk
        return self._stream.resample_chunk(chunk, last=last)

    def flush(self) -> np.ndarray:
        return self.process(np.zeros(0, np.float32), last=True)


def resample(samples: np.ndarray, source_rate: int, target_rate: int) -> np.ndarray:
    """A whole mono float32 clip [T] at ``source_rate`` converted to ``target_rate`` (soxr)."""
    r = StreamResampler(source_rate, target_rate)
    return np.concatenate([r.process(samples), r.flush()])


# --------------------------------------------------------------------------- bounded decoding
@dataclass(frozen=True)
class AudioLimits:
    """What one uploaded clip may hold (units in the names). Checked on the container header
    before decoding, then again on what is really decoded (a lying header cannot overshoot).

    ``max_seconds`` / ``min_seconds``: clip length; ``max_channels``: channels mixed to mono;
    ``min_sample_rate`` / ``max_sample_rate``: the file's own rate, in Hz.
    """

    max_seconds: float = 60.0
    min_seconds: float = 0.0
    max_channels: int = 8
    min_sample_rate: int = 4000
    max_sample_rate: int = 192_000


class AudioDecodeError(ValueError):
    """An upload is not usable audio. ``code``: ``invalid_audio`` (not audio, empty, non-finite,
    a rate or channel count outside :class:`AudioLimits`), ``audio_too_long``,
    ``audio_too_short``. The message does not name the field: callers add it."""

    def __init__(self, message: str, code: str = "invalid_audio"):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class DecodedAudio:
    """A decoded clip: ``samples`` float32 mono [T] in [-1, 1] at ``sample_rate`` Hz,
    ``seconds`` its length as decoded, ``source_rate`` / ``channels`` of the file."""

    samples: np.ndarray
    sample_rate: int
    seconds: float
    source_rate: int
    channels: int


#: frames decoded per block (per channel): the memory of one block is 4 * channels * this
DECODE_BLOCK_FRAMES = 16384
#: demuxers PyAV may use for audio libsndfile does not read (MP4/M4A/AAC, WebM/Matroska, MP3 and
#: OGG streams libsndfile refuses, FLAC without a length); anything else is refused before probing
AV_AUDIO_FORMATS = "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm,mp3,aac,ogg,flac,wav"
#: libsndfile's frame count for a stream whose length is unknown (SF_COUNT_MAX)
_UNKNOWN_FRAMES = 1 << 62


class _MonoSink:
    """Mixes decoded blocks ``[n, channels]`` to mono, resamples them to ``target_rate`` (soxr
    stream) and counts source frames, refusing once they pass ``max_frames``: what is held is
    at most ``max_seconds * target_rate`` float32 samples, whatever the file claims."""

    def __init__(self, source_rate: int, target_rate: int, limits: AudioLimits):
        self.rate, self.limits = source_rate, limits
        self.max_frames = int(limits.max_seconds * source_rate)
        self.frames = 0
        self.resampler = StreamResampler(source_rate, target_rate)
        self.out: list[np.ndarray] = []

    def too_long(self) -> AudioDecodeError:
        return AudioDecodeError(f"the audio decodes to more than {self.limits.max_seconds:g} s: over the limit of "
                               f"{self.limits.max_seconds:g} s", "audio_too_long")

    def add(self, block: np.ndarray) -> None:
        if not len(block):
            return
        self.frames += len(block)
        if self.frames > self.max_frames:
            raise self.too_long()
        mono = block.mean(axis=1, dtype=np.float32) if block.ndim == 2 else block.astype(np.float32, copy=False)
        if not np.all(np.isfinite(mono)):
            raise AudioDecodeError("the audio holds non-finite samples")
        self.out.append(self.resampler.process(mono))

    def finish(self, source_rate: int, channels: int) -> DecodedAudio:
        if self.frames == 0:
            raise AudioDecodeError("the audio holds no samples")
        seconds = self.frames / self.rate
        if seconds < self.limits.min_seconds:
            raise AudioDecodeError(f"the audio is {seconds:.2f} s long; at least {self.limits.min_seconds:g} s is "
                                   "needed", "audio_too_short")
        self.out.append(self.resampler.flush())
        samples = np.clip(np.concatenate(self.out), -1.0, 1.0).astype(np.float32, copy=False)
        return DecodedAudio(samples, self.resampler.target_rate, seconds, source_rate, channels)


def _check_header(rate: int, channels: int, seconds: float | None, limits: AudioLimits) -> None:
    if not limits.min_sample_rate <= rate <= limits.max_sample_rate:
        raise AudioDecodeError(f"a sample rate of {rate} Hz is outside {limits.min_sample_rate}-"
                               f"{limits.max_sample_rate} Hz")
    if not 1 <= channels <= limits.max_channels:
        raise AudioDecodeError(f"{channels} channels; at most {limits.max_channels} are accepted")
    if seconds is not None and seconds > limits.max_seconds:
        raise AudioDecodeError(f"the audio is {seconds:.2f} s long (its header says); "
                               f"over the limit of {limits.max_seconds:g} s",
                               "audio_too_long")


def decode_audio(data: bytes, target_rate: int, limits: AudioLimits = AudioLimits()) -> DecodedAudio:
    """A client's audio file (WAV, FLAC, OGG Vorbis/Opus, MP3 through libsndfile; MP4/AAC, WebM
    and the rest of :data:`AV_AUDIO_FORMATS` through PyAV) -> float32 mono in [-1, 1] at
    ``target_rate`` Hz (channels averaged, soxr resampling), decompression-safe:

    1. the container header's rate, channel count and length (frames / rate; the container
       duration for PyAV) are checked against ``limits`` before any sample is decoded;
    2. decoding runs in blocks of :data:`DECODE_BLOCK_FRAMES`, each mixed to mono and resampled
       at once; it stops with ``audio_too_long`` as soon as the decoded frames pass
       ``limits.max_seconds`` (MP3/OGG lengths are estimates, and headers can lie).

    Memory: one block plus ``max_seconds * target_rate`` float32 samples, whatever the file claims.

    Raises:
        AudioDecodeError: see its ``code``s.
    """
    if not data:
        raise AudioDecodeError("the audio file is empty")
    try:
        f = sf.SoundFile(io.BytesIO(data))
    except Exception:
        return _decode_av(data, target_rate, limits)
    with f:
        if f.frames >= _UNKNOWN_FRAMES or not f.seekable():  # a stream of unknown length: PyAV counts it
            return _decode_av(data, target_rate, limits)
        rate, channels = int(f.samplerate), int(f.channels)
        _check_header(rate, channels, f.frames / rate if rate > 0 else None, limits)
        sink = _MonoSink(rate, target_rate, limits)
        try:
            while len(block := f.read(DECODE_BLOCK_FRAMES, dtype="float32", always_2d=True)):
                sink.add(block)
        except AudioDecodeError:
            raise
        except Exception as exc:
            raise AudioDecodeError(f"the audio stream is damaged ({type(exc).__name__})") from None
        return sink.finish(rate, channels)


def _decode_av(data: bytes, target_rate: int, limits: AudioLimits) -> DecodedAudio:
    import av

    try:
        with av.open(io.BytesIO(data), mode="r", options={"format_whitelist": AV_AUDIO_FORMATS}) as container:
            if not container.streams.audio:
                raise AudioDecodeError("not an audio file (no audio stream)")
            stream = container.streams.audio[0]
            rate = int(stream.rate or stream.codec_context.sample_rate or 0)
            channels = int(stream.codec_context.channels or 0)
            seconds = None
            if container.duration:
                seconds = container.duration / 1e6
            elif stream.duration and stream.time_base:
                seconds = float(stream.duration * stream.time_base)
            _check_header(rate, channels, seconds, limits)
            sink = _MonoSink(rate, target_rate, limits)
            mixer = av.AudioResampler(format="flt", layout="mono", rate=rate)
            for frame in container.decode(stream):
                if frame.layout.nb_channels > limits.max_channels or frame.sample_rate != rate:
                    raise AudioDecodeError(f"the stream changes to {frame.layout.nb_channels} channels at "
                                           f"{frame.sample_rate} Hz mid-way")
                if sink.frames + frame.samples > sink.max_frames:
                    raise sink.too_long()
                for out in mixer.resample(frame):
                    sink.add(out.to_ndarray().reshape(-1))
            for out in mixer.resample(None):
                sink.add(out.to_ndarray().reshape(-1))
            return sink.finish(rate, channels)
    except AudioDecodeError:
        raise
    except Exception as exc:
        raise AudioDecodeError(f"not a decodable audio file ({type(exc).__name__})") from None
