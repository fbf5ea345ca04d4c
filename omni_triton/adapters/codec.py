"""The codec decoder stage both talker families with a chunked decode share (``csm_code2wav``:
Mimi; ``qwen3_omni_code2wav``: the Qwen3-Omni code2wav): ragged dynamic batches of CODES chunks with
left context -> PCM of the new frames. A family subclass says which decoder to ``load``."""
from __future__ import annotations

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
