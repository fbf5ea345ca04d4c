"""Stage-side caps on client text: Triton's inference port is reachable without the frontend
(loopback, no key), so every stage that takes client text refuses an oversize input in its own
request parsing, before any work, with the ``invalid input: ...`` error (HTTP 400). Before the
fix, a 2 MB ``TEXT`` sent straight to ``piper`` grew its stub from 508 MB to 2 GB.
No Triton: ``fake_pb_utils`` stands in for the stub's module; each stage's heavy ``setup`` is
replaced by the attributes its ``parse`` reads, and its work (``generate``/``dispatch``) fails the
test if it is ever called."""
import json
import sys

import numpy as np
import pytest

from tests.unit import fake_pb_utils as pb

sys.modules.setdefault("triton_python_backend_utils", pb)

from omni_triton.adapters import csm, piper, qwen3_tts  # noqa: E402
from omni_triton.adapters import llm as chat  # noqa: E402
from omni_triton.adapters import qwen3_omni as omni  # noqa: E402
from omni_triton.adapters import qwen_image as diffusion  # noqa: E402
from omni_triton.adapters import wan as video  # noqa: E402
from omni_triton.contracts import chat as ch  # noqa: E402
from omni_triton.contracts import csm as cs  # noqa: E402
from omni_triton.contracts import qwen3_tts as q  # noqa: E402
from omni_triton.contracts import qwen_image as im  # noqa: E402
from omni_triton.contracts import speech as sp  # noqa: E402
from omni_triton.contracts import tensors  # noqa: E402
from omni_triton.contracts import wan as vc  # noqa: E402

HUGE = b"x" * 2_000_000  # the finding's TEXT


def _args(params: dict) -> dict:
    return {"model_name": "toy", "model_instance_name": "toy_0", "model_config": json.dumps(
        {"parameters": {k: {"string_value": v} for k, v in params.items()}})}


def _caged(cls, setup):
    """``cls`` with ``setup`` replaced and its work refused."""

    def no_work(self, *a, **k):
        raise AssertionError(f"{cls.stage}: work started on an oversize request")

    return type(f"Caged{cls.__name__}", (cls,), {"setup": setup, "generate": no_work, "dispatch": no_work,
                                                   "workers": 0})


def _refused(stage_cls, setup, params, inputs) -> str:
    stage = _caged(stage_cls, setup)()
    stage.initialize(_args(params))
    request = pb.FakeRequest({k: np.array([v], dtype=object) for k, v in inputs.items()})
    stage.execute([request])
    [err] = request.sender.errors()
    assert err.code() == pb.TritonError.INVALID_ARG, err.message()
    assert request.sender.finals == 1 and not request.sender.outputs()
    return err.message()


def _piper_setup(self, args, params):
    self.read_params(params)


def _tts_setup(self, args, params):
    self.voices, self.default_voice, self.max_input_chars = ["0"], "0", sp.max_input_chars(params, "2000")
    self.budget = cs.FrameBudget()


def _qwen3_setup(self, args, params):
    self.voices, self.default_voice, self.max_input_chars = ["Ryan"], "Ryan", sp.max_input_chars(params, "2000")


def _chat_setup(self, args, params):
    self.voices, self.default_voice, self.tokenizer = ["joe"], "joe", None
    if isinstance(self, omni.Qwen3OmniPipeline):  # what its setup reads for MESSAGES (inline media parts)
        self.messages_chars = omni._messages_chars(params)


SPEECH = [
    ("piper", piper.PiperStage, _piper_setup, sp.TEXT),
    ("csm", csm.CsmPipeline, _tts_setup, sp.TEXT),
    ("qwen3_tts", qwen3_tts.Qwen3TtsPipeline, _qwen3_setup, sp.TEXT),
    ("qwen3_tts INSTRUCTIONS", qwen3_tts.Qwen3TtsPipeline, _qwen3_setup, q.INSTRUCTIONS),
    ("qwen3_tts REF_TEXT", qwen3_tts.Qwen3TtsPipeline, _qwen3_setup, q.REF_TEXT),
]


@pytest.mark.parametrize("label,cls,setup,name", SPEECH, ids=[s[0] for s in SPEECH])
def test_speech_text_over_max_input_chars_is_refused_before_work(label, cls, setup, name):
    inputs = {sp.TEXT: b"Hello there.", name: HUGE}
    msg = _refused(cls, setup, {"max_input_chars": "500"}, inputs)
    # refused on its byte length, before decoding 2 MB
    assert msg.startswith(f"invalid input: {name} has 2000000 bytes, more than max_input_chars=500"), msg
    # within the byte bound (4 bytes a character) but over the character cap: still refused
    msg = _refused(cls, setup, {"max_input_chars": "500"}, {**inputs, name: b"y" * 501})
    assert msg.startswith("invalid input: ") and f"{name} has 501 characters" in msg, msg


def test_piper_reads_max_input_chars_from_its_config():
    """``model_repository/piper/config.pbtxt`` sets 4096; at the cap the text is accepted."""
    stage = _caged(piper.PiperStage, _piper_setup)()
    stage.initialize(_args({"max_input_chars": "4096"}))
    assert stage.max_input_chars == 4096
    assert stage.parse(pb.FakeRequest({sp.TEXT: np.array([b"a" * 4096], dtype=object)}))[0] == "a" * 4096


CHAT = [("llm", chat.LlmStage), ("llm_tts", chat.LlmTtsPipeline), ("qwen3_omni", omni.Qwen3OmniPipeline)]


@pytest.mark.parametrize("stage_cls", [c for _, c in CHAT], ids=[n for n, _ in CHAT])
@pytest.mark.parametrize("name", [ch.PROMPT, ch.MESSAGES])
def test_chat_prompt_over_the_cap_is_refused_before_work(stage_cls, name):
    # omni takes media parts inline in MESSAGES: none allowed here, so its cap is the text's
    params = {"max_media_parts": "0"} if stage_cls is omni.Qwen3OmniPipeline else {}
    msg = _refused(stage_cls, _chat_setup, params, {name: b"x" * (8 * tensors.MAX_PROMPT_CHARS + 1)})
    assert msg.startswith("invalid input: ") and f"{name} has " in msg and "bytes" in msg, msg
    cap = tensors.MAX_PROMPT_CHARS if name == ch.PROMPT else tensors.MAX_MESSAGES_CHARS
    assert f"={cap} characters" in msg, msg


def test_omni_messages_cap_admits_its_media_parts():
    """omni's MESSAGES carry up to ``max_media_parts`` base64 data URLs of ``max_media_part_bytes``."""
    from omni_triton.media.inputs import MediaLimits

    d = MediaLimits()
    assert omni.Qwen3OmniPipeline.messages_chars == omni._messages_chars({})
    assert omni._messages_chars({}) > tensors.MAX_MESSAGES_CHARS + d.max_parts * 4 * d.max_part_bytes // 3


def test_omni_bls_and_thinker_cap_media_alike():
    """``qwen3_omni`` passes MESSAGES on as they came and ``qwen3_omni_thinker`` decodes their media
    parts: the BLS's MESSAGES cap (``max_media_parts`` x ``max_media_part_bytes``) must be the
    thinker's, or one admits what the other refuses."""
    from omni_triton.serve.repository import available_models, model_parameters

    models = available_models()
    bls, thinker = model_parameters(models["qwen3_omni"]), model_parameters(models["qwen3_omni_thinker"])
    for key in ("max_media_parts", "max_media_part_bytes"):
        assert bls[key] == thinker[key], key
    assert omni._messages_chars(bls) == omni._messages_chars(thinker)


def test_diffusion_prompts_over_the_cap_are_refused():
    for name in (im.PROMPT, im.NEGATIVE_PROMPT):
        inputs = {im.PROMPT: b"a cat", name: HUGE}
        stage = diffusion.QwenImageTextEncoder.__new__(diffusion.QwenImageTextEncoder)
        stage.edit = False
        with pytest.raises(im.ImageInputError, match=f"{name} has 2000000 bytes, more than max_chars=32000"):
            stage.parse(pb.FakeRequest({k: np.array([[v]], dtype=object) for k, v in inputs.items()}))


@pytest.mark.parametrize("stage_cls", [video.WanTextEncoder, video.WanT2VPipeline], ids=["wan_text_encoder", "wan_t2v"])
def test_video_prompts_over_the_cap_are_refused(stage_cls):
    stage = stage_cls.__new__(stage_cls)
    for name in (vc.PROMPT, vc.NEGATIVE_PROMPT):
        inputs = {vc.PROMPT: b"a cat", name: HUGE}
        with pytest.raises(vc.VideoInputError, match=f"{name} has 2000000 bytes, more than max_chars=32000"):
            stage.parse(pb.FakeRequest({k: np.array([[v]], dtype=object) for k, v in inputs.items()}))


def test_bounded_str_checks_bytes_before_decoding():
    """Bytes over 4 x the cap are refused without decoding (not even invalid UTF-8 is looked at)."""
    with pytest.raises(sp.SpeechInputError, match="TEXT has 9 bytes, more than max_input_chars=2"):
        tensors.bounded_str(np.array([b"\xff" * 9], dtype=object), "TEXT", 2, sp.SpeechInputError, "max_input_chars")
    assert tensors.bounded_str(np.array(["\u00e9\u00e9".encode()], dtype=object), "TEXT", 2) == "\u00e9\u00e9"
    assert tensors.bounded_str(None, "TEXT", 2) is None
