"""The codec decoder stage both talker families with a chunked decode share (``csm_code2wav``:
Mimi; ``qwen3_omni_code2wav``: the Qwen3-Omni code2wav): ragged dynamic batches of CODES chunks with
left context -> PCM of the new frames. A family subclass says which decoder to ``load``. Also the
codec BLS's dynamic first chunk helpers (:func:`open_stream_counts`, :func:`first_chunk_of_new_stream`;
docs/scheduling.md "The first chunk"), shared by ``csm`` and ``qwen3_omni``."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from omni_triton.adapters.batched import BatchedStage, set_torch_threads
from omni_triton.adapters.triton_io import required_array
from omni_triton.contracts import codec as cd
from omni_triton.contracts import speech as sp


class CodecDecoderStage(BatchedStage):
    """A codec decoder, ragged dynamic batches: CODES [1, T_i, K] + LEFT_CONTEXT [1, 1] -> AUDIO
    [1, samples] (float32) of the new frames, one forward pass per batch. Subclasses implement
    :meth:`load`; the decoder needs ``decode(codes_list, left_list)``, ``codebook_size`` and
    ``num_codebooks`` (or ``num_code_groups``). A malformed chunk is a ValueError (INVALID_ARG)."""

    def setup(self, args, params):
        set_torch_threads()
        self.decoder = self.load(params)
        self.num_codebooks = int(getattr(self.decoder, "num_codebooks", None) or self.decoder.num_code_groups)

    def load(self, params):
        """The family's decoder, from the config ``parameters`` (``model_name``)."""
        raise NotImplementedError

    def parse(self, request):
        from omni_triton.stages.chunking import validate_chunk

        return validate_chunk(required_array(request, cd.CODES), required_array(request, cd.LEFT_CONTEXT),
                              self.num_codebooks, self.decoder.codebook_size)

    def run(self, items):
        return self.decoder.decode([c for c, _ in items], [left for _, left in items])

    def outputs(self, pcm):
        return {sp.AUDIO: pcm[None, :]}


def open_stream_counts(args: dict):
    """The open streams of this BLS model across its instances (the load signal of its dynamic
    first chunk): :class:`~omni_triton.runtime.instance_balance.OpenStreams` in the server's run
    folder (``streams/<model>``), from ``initialize``'s ``args``."""
    import os

    from omni_triton.paths import server_run_dir
    from omni_triton.runtime.instance_balance import OpenStreams

    model = args["model_name"]
    return OpenStreams(server_run_dir(os.getppid()) / "streams" / model, args.get("model_instance_name", model))


@contextmanager
def first_chunk_of_new_stream(bls) -> Iterator[int]:
    """The frames of a new request's first chunk at a codec BLS (``bls.initial``, an
    :class:`~omni_triton.stages.chunking.InitialChunk`, by ``bls.open_streams``' count when it
    starts; the config's ``first_chunk_frames`` when either is unset), counting the request open
    for the ``with`` block."""
    fixed = int(bls.chunks["first_chunk_frames"])
    streams, initial = getattr(bls, "open_streams", None), getattr(bls, "initial", None)
    if streams is None or initial is None:
        yield fixed
        return
    with streams.counted() as others:
        yield initial.frames(others, fixed)
