"""``csm_code2wav``'s adapter (``CsmCode2WavStage``) without Triton: a ragged batch of chunks is
decoded as the decoder decodes them one by one, and a code outside the codebook fails its request
alone with INVALID_ARG."""
import json
import sys

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.unit import fake_pb_utils as pb

sys.modules.setdefault("triton_python_backend_utils", pb)

from omni_triton.contracts import codec as cd  # noqa: E402
from omni_triton.contracts import speech as sp  # noqa: E402


def _request(codes, left):
    return pb.FakeRequest({cd.CODES: codes[None].astype(np.int64), cd.LEFT_CONTEXT: np.array([[left]], np.int32)})


def test_ragged_batch_decodes_like_one_by_one(tmp_path, monkeypatch):
    from omni_triton.adapters.csm import CsmCode2WavStage
    from omni_triton.checkpoints.csm import checkpoint_dir
    from omni_triton.stages.csm import CodecDecoder

    monkeypatch.setenv("OMNI_TRITON_CACHE", str(tmp_path))
    monkeypatch.setenv("OMNI_TRITON_SCHEDULING", "fifo")  # execute answers in its return value
    config = {"max_batch_size": 8, "parameters": {"model_name": {"string_value": "csm-tiny"}}}
    stage = CsmCode2WavStage()
    stage.initialize({"model_name": "csm_code2wav", "model_instance_name": "csm_code2wav_0",
                      "model_config": json.dumps(config)})
    decoder = CodecDecoder.from_pretrained(checkpoint_dir("csm-tiny"))
    rng = np.random.default_rng(0)
    a = rng.integers(0, decoder.codebook_size, (5, decoder.num_codebooks))
    b = rng.integers(0, decoder.codebook_size, (9, decoder.num_codebooks))
    bad = a.copy()
    bad[0, 0] = decoder.codebook_size
    responses = stage.execute([_request(a, 0), _request(b, 4), _request(bad, 0)])
    assert len(responses) == 3
    for response, (codes, left) in zip(responses[:2], [(a, 0), (b, 4)], strict=True):
        assert not response.has_error()
        audio = pb.get_output_tensor_by_name(response, sp.AUDIO).as_numpy()
        expected = decoder.decode([codes], [left])[0]
        assert audio.shape == (1, (len(codes) - left) * decoder.samples_per_frame)
        np.testing.assert_allclose(audio[0], expected, atol=1e-5)
    assert responses[2].has_error() and responses[2].error().code() == pb.TritonError.INVALID_ARG
    stage.finalize()
