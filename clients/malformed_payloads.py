"""Malformed-payload cases for the OpenAI frontend, generated from its pydantic request schemas
plus hostile strings, and a driver that sends them to a running server.

Run against a running stack (loopback only)::

    python -m clients.malformed_payloads --url http://127.0.0.1:9000 [--endpoints chat,speech,videos,voices]

Every case must be answered with a 4xx and the OpenAI error body ``{"error": {"message",
"type", "param", "code"}}``; the driver prints the answers per endpoint and class and exits 1 if
any case got something else (a 5xx above all). Endpoints: chat, completions, image generations
and edits, speech, and the form routes ``/v1/videos`` and ``/v1/audio/voices``. Cases per
endpoint (``cases(endpoint)``):

* **schema cases**: for every field of the request model (nested models and list items too), a
  pool of wrong values (wrong JSON types, lone surrogates, NUL, non-ASCII digits, huge numbers,
  ``NaN``/``Infinity``, empty strings, deep nesting), each kept only if the schema itself
  rejects it (``model_validate`` on the decoded JSON, exactly what FastAPI does); missing
  required fields; an unknown field (only for a server started with ``--strict-params``: by
  default unknown fields are ignored, as vLLM does, and named in ``X-Ignored-Fields``);
* **semantic cases** the schema accepts but the API must refuse (unknown model, sizes like
  ``"²³x64"``, ``top_k`` 2^70, huge fan-out, extreme aspect-ratio uploads, ...);
* **body cases**: truncated JSON, non-JSON, wrong content types, empty and non-object bodies,
  an oversized body; for edits: corrupt, empty and oversized uploads, broken multipart; for
  speech and edits: bogus multipart content types, too many files, a text part over 1 MiB.

No pytest here: ``tests/unit/test_frontend_malformed.py`` runs all cases through ASGI against a
fake engine, ``tests/e2e/test_malformed.py`` against the real server.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import typing
from collections import Counter
from dataclasses import dataclass, field

from pydantic import BaseModel, ValidationError

from openai_frontend.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    ImageEditForm,
    ImageGenerationRequest,
    SpeechRequest,
)

ENDPOINTS = ("chat", "completions", "images_generations", "images_edits", "speech")
#: the routes that read their own form (or JSON) body: video jobs and custom voices (issue 23)
FORM_ENDPOINTS = ("videos", "voices")
ALL_ENDPOINTS = ENDPOINTS + FORM_ENDPOINTS

PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "images_generations": "/v1/images/generations",
    "images_edits": "/v1/images/edits",
    "speech": "/v1/audio/speech",
    "videos": "/v1/videos",
    "voices": "/v1/audio/voices",
}

#: the request schema of each JSON endpoint (the form endpoints: ``_form_schema_cases`` and
#: ``_voice_field_cases``)
SCHEMAS: dict[str, type[BaseModel]] = {
    "chat": ChatCompletionRequest,
    "completions": CompletionRequest,
    "images_generations": ImageGenerationRequest,
    "images_edits": ImageEditForm,
    "speech": SpeechRequest,
}


@dataclass(frozen=True)
class Models:
    """Model names the valid base requests use (those of the embedded defaults)."""

    chat: str = "llm"
    image: str = "qwen_image"
    image_edit: str = "qwen_image_edit"
    speech: str = "piper"
    video: str = "wan_t2v"


def valid_request(endpoint: str, models: Models = Models()) -> dict:
    """A small request of ``endpoint`` that a served model answers with 200 (for edits: the form
    fields; ``valid_files`` holds the upload)."""
    return {
        "chat": {"model": models.chat, "messages": [{"role": "user", "content": "Say hi."}],
                 "max_tokens": 4, "temperature": 0},
        "completions": {"model": models.chat, "prompt": "The capital of France is", "max_tokens": 4,
                        "temperature": 0},
        "images_generations": {"model": models.image, "prompt": "a red fox", "size": "32x32",
                               "num_inference_steps": 2, "seed": 1},
        "images_edits": {"model": models.image_edit, "prompt": "make it blue", "size": "32x32",
                         "num_inference_steps": 2, "seed": 1},
        "speech": {"model": models.speech, "input": "Hello.", "response_format": "wav"},
        "videos": {"model": models.video, "prompt": "a red fox"},
        "voices": {"name": "calm", "type": "prompt", "prompt": "a calm, low voice"},
    }[endpoint]


def send_valid(client, endpoint: str, models: Models = Models()):
    """Send ``endpoint``'s valid request with the ``httpx`` ``client`` (forms as forms; a voice
    gets a fresh name each time, as names are unique)."""
    valid = valid_request(endpoint, models)
    if endpoint == "images_edits":
        return client.post(PATHS[endpoint], data=valid, files=valid_files())
    if endpoint == "voices":
        import uuid

        return client.post(PATHS[endpoint], data={**valid, "name": f"v-{uuid.uuid4().hex[:12]}"})
    if endpoint == "videos":
        return client.post(PATHS[endpoint], data=valid)
    return client.post(PATHS[endpoint], json=valid)


def png(width: int = 32, height: int = 32) -> bytes:
    """A PNG of ``width`` x ``height`` pixels (Pillow)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), (30, 120, 200)).save(buf, "PNG")
    return buf.getvalue()


def valid_files(name: str = "image") -> list[tuple[str, tuple[str, bytes, str]]]:
    """The upload of a valid edit request (httpx ``files=``)."""
    return [(name, ("in.png", png(), "image/png"))]


@dataclass
class Case:
    """One request to send.

    ``json`` is serialised by Python's encoder (``allow_nan``: lone surrogates stay ``\\ud800``
    escapes, ``NaN``/``Infinity`` are written as such); ``content`` is sent as-is; ``form`` /
    ``files`` make a multipart body (``form_bytes`` adds raw field values, e.g. invalid UTF-8).
    """

    endpoint: str
    name: str
    json: typing.Any = None
    content: bytes | None = None
    content_type: str | None = "application/json"
    form: dict | None = None
    form_bytes: dict | None = None
    files: list | None = None
    has_json: bool = False

    @property
    def path(self) -> str:
        return PATHS[self.endpoint]

    def request_kwargs(self) -> dict:
        """``httpx`` keyword arguments of this case (``content`` + ``headers``)."""
        headers = {}
        if self.content_type is not None and "multipart" in self.content_type and self.content is not None:
            # as-is, even bytes that are not ASCII (httpx encodes str header values as ASCII)
            return {"content": self.content, "headers": {"content-type": self.content_type.encode("latin-1")}}
        if self.form is not None or self.files is not None or self.form_bytes is not None:
            body, ctype = multipart(self.form or {}, self.files or [], self.form_bytes or {})
            return {"content": body, "headers": {"content-type": ctype}}
        if self.has_json:
            body = json.dumps(self.json, allow_nan=True).encode("ascii")
        else:
            body = self.content if self.content is not None else b""
        if self.content_type is not None:
            headers["content-type"] = self.content_type
        return {"content": body, "headers": headers}


def multipart(form: dict, files: list, raw_fields: dict, boundary: str = "malformed-0123456789") -> tuple[bytes, str]:
    """A ``multipart/form-data`` body built by hand, so field values may be any bytes (httpx
    would refuse to encode a lone surrogate)."""
    out = io.BytesIO()
    for key, value in list(form.items()) + list(raw_fields.items()):
        data = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")
        out.write(f"--{boundary}\r\nContent-Disposition: form-data; name=\"{key}\"\r\n\r\n".encode())
        out.write(data + b"\r\n")
    for key, (filename, data, ctype) in files:
        out.write(f"--{boundary}\r\nContent-Disposition: form-data; name=\"{key}\"; "
                  f"filename=\"{filename}\"\r\nContent-Type: {ctype}\r\n\r\n".encode())
        out.write(data + b"\r\n")
    out.write(f"--{boundary}--\r\n".encode())
    return out.getvalue(), f"multipart/form-data; boundary={boundary}"


# --------------------------------------------------------------------------- hostile values
HOSTILE_STRINGS = [
    "\ud800",  # lone high surrogate
    "ok\udfffok",  # lone low surrogate inside text
    "a\x00b",  # NUL
    "\x00",
]
WRONG_TYPES = [123, -1, 1.5, True, False, [], {}, ["x"], {"a": 1}, None]
HUGE_NUMBERS = [2**70, -(2**70), 1180591620717411303424, 1e308, -1e308, float("nan"), float("inf"),
                float("-inf")]
NUMERIC_STRINGS = ["2", "1.5", "²", "①⑥", "1e400", "NaN", "Infinity", "0x10", "", " "]
DEEP = [[[[[[[[[[[[[[[[[[[[[[[[[["deep"]]]]]]]]]]]]]]]]]]]]]]]]]]


#: Cases per field at most (the first values of ``_pool`` that the field's schema rejects), so
#: the suite stays a few seconds per endpoint against a real server.
MAX_VALUES_PER_FIELD = 10


def _pool() -> list:
    """Wrong values, most telling first: text that cannot travel as UTF-8, numbers no engine
    holds, then wrong JSON types."""
    return (HOSTILE_STRINGS[:1] + HUGE_NUMBERS[:1] + [float("nan"), float("inf")] + HOSTILE_STRINGS[1:]
            + ["2", "²"] + WRONG_TYPES + HUGE_NUMBERS[1:] + NUMERIC_STRINGS + [DEEP, "x" * 70000])


def _rejected(schema: type[BaseModel], payload) -> bool:
    """True when the schema refuses ``payload`` after a JSON round trip (what FastAPI sees)."""
    try:
        decoded = json.loads(json.dumps(payload, allow_nan=True))
        schema.model_validate(decoded)
    except (ValidationError, ValueError, RecursionError):
        return True
    return False


def _field_paths(schema: type[BaseModel], base: dict) -> list[tuple]:
    """Paths (tuples of keys / list indexes) of every field of ``schema`` and of the nested
    models present in ``base`` (e.g. ``("messages", 0, "content")``)."""
    paths = [(name,) for name in schema.model_fields]
    for name, value in base.items():
        sub = _nested_model(schema.model_fields[name].annotation) if name in schema.model_fields else None
        if sub is None:
            continue
        if isinstance(value, list) and value and isinstance(value[0], dict):
            paths += [(name, 0) + p for p in _field_paths(sub, value[0])]
        elif isinstance(value, dict):
            paths += [(name,) + p for p in _field_paths(sub, value)]
    return paths


def _nested_model(annotation):
    """The pydantic model inside ``annotation`` (``X``, ``list[X]``, ``X | None``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _nested_model(arg)
        if found is not None:
            return found
    return None


def _with(base: dict, path: tuple, value) -> dict:
    out = json.loads(json.dumps(base))
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


def _without(base: dict, path: tuple) -> dict:
    out = json.loads(json.dumps(base))
    target = out
    for key in path[:-1]:
        target = target[key]
    target.pop(path[-1], None)
    return out


def _label(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def schema_cases(endpoint: str, models: Models = Models(), strict_params: bool = False) -> list[Case]:
    """Wrong values for every field (kept only when the schema rejects them), missing required
    fields and, with ``strict_params`` (a server run with ``--strict-params``), an unknown field."""
    base = valid_request(endpoint, models)
    out = []
    if endpoint in ("images_edits", "videos"):
        return _form_schema_cases(endpoint, base, strict_params)
    if endpoint == "voices":
        return _voice_field_cases(base)
    schema = SCHEMAS[endpoint]
    for path in _field_paths(schema, base):
        where = ".".join(str(p) for p in path)
        kept = 0
        for value in _pool():
            payload = _with(base, path, value)
            if kept < MAX_VALUES_PER_FIELD and _rejected(schema, payload):
                out.append(Case(endpoint, f"{where}={_label(value)}", json=payload, has_json=True))
                kept += 1
        if path[-1] in base or len(path) > 1:
            payload = _without(base, path)
            if _rejected(schema, payload):
                out.append(Case(endpoint, f"missing {where}", json=payload, has_json=True))
    if strict_params:
        out.append(Case(endpoint, "unknown field", json={**base, "not_a_field": 1}, has_json=True))
        # a name that is not Latin-1 (the X-Ignored-Fields header of a lenient server once failed on it)
        out.append(Case(endpoint, "unknown non-Latin-1 field", json={**base, "€": 1}, has_json=True))
    return out


#: Form values (a lone surrogate cannot be sent: it is not UTF-8; Starlette reads a field that is
#: not valid UTF-8 as Latin-1 rather than refusing it, so such a field is not a case here).
_FORM_VALUES = ["abc", "NaN", "Infinity", "-Infinity", "1e400", "²", "①⑥", "0x10", "-5", "1.5",
                "99999999999999999999999", "a\x00b", "\x00", "true?", "[1]", "{}"]


def _form_schema_cases(endpoint: str, base: dict, strict_params: bool = False) -> list[Case]:
    """Form fields (strings by nature) of edits and videos: each field given strings its type
    refuses, then the same as a JSON body where the route takes one (videos)."""
    from openai_frontend.serving.videos import VideoCreateForm

    schema = ImageEditForm if endpoint == "images_edits" else VideoCreateForm
    files = valid_files() if endpoint == "images_edits" else None
    out = []
    for name in schema.model_fields:
        for value in _FORM_VALUES:
            fields = {**{k: str(v) for k, v in base.items()}, name: value}
            try:
                schema.model_validate(fields)
            except ValidationError:
                out.append(Case(endpoint, f"form {name}={_label(value)}", form=fields, files=files))
        if endpoint == "videos":  # JSON bodies: wrong types and text that is not Unicode
            for value in [HOSTILE_STRINGS[0], "a\x00b", [], {}, ["x"], True, 2**70, float("nan")]:
                payload = {**base, name: value}
                if _rejected(schema, payload):
                    out.append(Case(endpoint, f"json {name}={_label(value)}", json=payload, has_json=True))
    fields = {k: str(v) for k, v in base.items()}
    del fields["prompt"]
    out.append(Case(endpoint, "missing prompt", form=fields, files=files))
    if strict_params or endpoint == "videos":  # videos refuse unknown fields always
        out.append(Case(endpoint, "unknown field", form={**{k: str(v) for k, v in base.items()},
                                                         "not_a_field": "1"}, files=files))
    return out


def _voice_field_cases(base: dict) -> list[Case]:
    """``/v1/audio/voices`` fields, as a form and as JSON: values the route refuses."""
    out = []
    for name in ("name", "type", "prompt"):
        for value in [HOSTILE_STRINGS[0], "ok\udfffok", "a\x00b", "\x00", 123, 1.5, True, [], {}, ["x"], {"a": 1}]:
            out.append(Case("voices", f"json {name}={_label(value)}", json={**base, name: value}, has_json=True))
        for value in (["", " ", "\x00", "a\x00b"] + (["x" * 65, "\x01ab", "a\x7fb"] if name == "name" else [])
                      + (["voice", "Prompt", "audio"] if name == "type" else [])):
            out.append(Case("voices", f"form {name}={_label(value)}", form={**base, name: value}))
        out.append(Case("voices", f"missing {name}", form={k: v for k, v in base.items() if k != name}))
    return out


def semantic_cases(endpoint: str, models: Models = Models()) -> list[Case]:
    """Requests the schema accepts that the API must still refuse with a 4xx."""
    base = valid_request(endpoint, models)

    def j(name: str, **changes) -> Case:
        return Case(endpoint, name, json={**base, **changes}, has_json=True)

    common = [j("unknown model", model="no-such-model"), j("model with spaces", model="  "),
              j("model is an API path", model="../../v2/models")]
    if endpoint == "chat":
        return common + [
            j("empty messages", messages=[]),
            j("content null", messages=[{"role": "user", "content": None}]),
            j("max_tokens over the context", max_tokens=10**6),
            j("audio without audio modality", audio={"format": "wav"}),
            j("audio from a text model with no twin", modalities=["audio"], model=models.speech),
            j("unknown voice", modalities=["text", "audio"], audio={"format": "wav", "voice": "nobody"}),
            j("unstreamable audio format", modalities=["text", "audio"], stream=True,
              audio={"format": "mp3"}),
            j("image fields on a text model", size="64x64"),
            j("n over the fan-out", n=17),
            j("logprobs true", logprobs=True),
            j("presence_penalty", presence_penalty=1.0),
            j("speech model", model=models.speech),
            j("image size with non-ASCII digits", model=models.image, size="²³x64"),
            j("image size ①⑥x16", model=models.image, size="①⑥x16"),
            j("image true_cfg_scale 1e308", model=models.image, true_cfg_scale=1e308),
            j("image true_cfg_scale Infinity", model=models.image, true_cfg_scale=float("inf")),
            j("image stream with audio", model=models.image, stream=True, modalities=["text", "audio"]),
            j("image with only a system message", model=models.image,
              messages=[{"role": "system", "content": "x"}]),
            j("chat on the edit model", model=models.image_edit),
        ]
    if endpoint == "completions":
        return common + [
            j("empty prompt", prompt=""),
            j("empty prompt list", prompt=[]),
            j("list with an empty prompt", prompt=["x", ""]),
            j("64 prompts x n=16", prompt=["x"] * 64, n=16),
            j("17 prompts", prompt=["x"] * 17),
            j("max_tokens over the context", max_tokens=10**6),
            j("speech model", model=models.speech),
            j("image model", model=models.image),
            j("top_k 2^70", top_k=2**70),
            j("echo true", echo=True),
        ]
    if endpoint == "images_generations":
        return common + [
            j("empty prompt", prompt="   "),
            j("prompt over 32000 characters", prompt="x" * 32001),
            j("size ²³x64", size="²³x64"), j("size ①⑥x16", size="①⑥x16"), j("size 64x", size="64x"),
            j("size not a multiple", size="30x30"), j("size too large", size="4096x4096"),
            j("size 0x0", size="0x0"), j("size with 5000 digits", size="9" * 5000 + "x64"),
            j("n 0", n=0), j("n 1000", n=1000), j("n -1", n=-1),
            j("one step", num_inference_steps=1), j("steps 10^6", num_inference_steps=10**6),
            j("true_cfg_scale 1e308", true_cfg_scale=1e308),
            j("true_cfg_scale Infinity", true_cfg_scale=float("inf")),
            j("guidance_scale NaN", guidance_scale=float("nan")),
            j("output_format empty", output_format=""), j("output_format gif", output_format="gif"),
            j("response_format url", response_format="url"), j("stream", stream=True),
            j("edit model", model=models.image_edit), j("speech model", model=models.speech),
            j("output_compression 101", output_compression=101), j("seed 2^63", seed=2**63),
        ]
    if endpoint == "videos":
        fields = {k: str(v) for k, v in base.items()}

        def v(name: str, files=None, **changes) -> Case:
            return Case(endpoint, name, form={**fields, **changes}, files=files)

        sizes = ["²x²", "①⑥x16", "１６x１６", "16x16 ", "16x", "x16", "16x16x16", "9" * 5000 + "x16", "-16x16",
                 "0x0", "30x30", "4096x4096"]
        return [Case(endpoint, "unknown model", form={**fields, "model": "no-such-model"}),
                v("image model", model=models.image), v("speech model", model=models.speech),
                v("empty prompt", prompt="   "), v("lora", lora="x"),
                v("num_frames not 4k+1", num_frames="6"), v("num_frames 10^6", num_frames="1000000"),
                v("seconds and num_frames conflict", seconds="1", num_frames="5", fps="16"),
                v("fps 1000", fps="1000"), v("steps 10^6", num_inference_steps="1000000"),
                v("input_reference on a text-to-video model", files=valid_files("input_reference")),
                v("input_reference as text", input_reference="x"),
                v("input_reference[image_url] not a data URL", **{"input_reference[image_url]": "http://x/a.png"}),
                Case(endpoint, "prompt twice", form=fields, form_bytes={"prompt": b"again"}),
                Case(endpoint, "JSON input_reference not an object", json={**base, "input_reference": 5},
                     has_json=True),
                Case(endpoint, "JSON input_reference without image_url", json={**base, "input_reference": {}},
                     has_json=True),
                Case(endpoint, "JSON input_reference bad base64",
                     json={**base, "input_reference": {"image_url": "data:image/png;base64,@@@"}}, has_json=True),
                ] + [v(f"size {size[:20]!r}", size=size) for size in sizes]
    if endpoint == "voices":
        def f(name: str, files=None, **changes) -> Case:
            return Case(endpoint, name, form={**base, **changes}, files=files)

        clip = [("audio_sample", ("a.wav", b"RIFF0000WAVEnot audio", "audio/wav"))]
        return [f("clone without consent", files=clip, type="audio_sample"),
                f("clone with an unknown consent", files=clip, type="audio_sample", consent="cons_nope"),
                f("clone without a clip", type="audio_sample", consent="cons_nope"),
                f("clip as a text field", type="audio_sample", audio_sample="x"),
                f("type unknown", type="design"),
                f("prompt as a file", files=[("prompt", ("p.txt", b"x", "text/plain"))],
                                                    prompt=None),
                Case(endpoint, "name twice", form=base, form_bytes={"name": b"again"}),
                Case(endpoint, "33 fields", form={**base, **{f"f{i}": "x" for i in range(33)}}),
                Case(endpoint, "3 files", form=base, files=clip * 3)]
    if endpoint == "speech":
        return common + [
            j("empty input", input=""), j("blank input", input="   "),
            j("input over the limit", input="x" * 5000),
            j("unknown voice", voice="nobody"), j("voice object unknown", voice={"id": "nobody"}),
            j("format aac", response_format="aac"), j("format nonsense", response_format="wav2"),
            j("stream mp3", stream=True, response_format="mp3"),
            j("speed 0.1", speed=0.1), j("speed 10", speed=10),
            j("instructions", instructions="whisper"), j("stream_format ws", stream_format="ws"),
            j("image model", model=models.image), j("chat model", model=models.chat),
        ]
    # edits
    fields = {k: str(v) for k, v in base.items()}

    def e(name: str, files=None, **changes) -> Case:
        return Case(endpoint, name, form={**fields, **changes},
                    files=valid_files() if files is None else files)

    return [
        e("unknown model", model="no-such-model"), e("text-to-image model", model=models.image),
        e("empty prompt", prompt=" "), e("size ²³x64", size="²³x64"), e("size ①⑥x16", size="①⑥x16"),
        e("true_cfg_scale 1e308", true_cfg_scale="1e308"), e("true_cfg_scale inf", true_cfg_scale="inf"),
        e("n 0", n="0"), e("one step", num_inference_steps="1"), e("output_format empty", output_format=""),
        e("no image", files=[]),
        e("empty image", files=[("image", ("a.png", b"", "image/png"))]),
        e("corrupt image", files=[("image", ("a.png", png()[:40], "image/png"))]),
        e("text as image", files=[("image", ("a.png", b"not an image at all", "image/png"))]),
        e("4096x4 image", files=[("image", ("a.png", png(4096, 4), "image/png"))]),
        e("2x4096 image", files=[("image", ("a.png", png(2, 4096), "image/png"))]),
        e("two images", files=valid_files() * 2),
        e("nine images", files=valid_files() * 9),
        e("mask", files=valid_files() + [("mask", ("m.png", png(), "image/png"))]),
        e("image as a text field", files=[], image="not a file"),
        Case(endpoint, "prompt twice", form=fields, form_bytes={"prompt": b"again"}, files=valid_files()),
        e("unexpected file field", files=valid_files() + [("other", ("o.png", png(), "image/png"))]),
        e("oversized upload", files=[("image", ("big.png", png() + b"\0" * (9 << 20), "image/png"))]),
    ]


def body_cases(endpoint: str, models: Models = Models(), max_body_bytes: int = 16 << 20) -> list[Case]:
    """Broken bodies: truncated JSON, wrong content types, non-objects, oversized, and for edits
    broken multipart."""
    base = json.dumps(valid_request(endpoint, models)).encode()
    out = [Case(endpoint, f"truncated at {n}", content=base[:n]) for n in (1, len(base) // 2, len(base) - 1)]
    out += [
        Case(endpoint, "empty body", content=b""),
        Case(endpoint, "null", content=b"null"), Case(endpoint, "array", content=b"[1, 2]"),
        Case(endpoint, "string", content=b'"x"'), Case(endpoint, "number", content=b"42"),
        Case(endpoint, "not JSON", content=b"model=llm&input=x"),
        Case(endpoint, "invalid UTF-8", content=b'{"model": "\xff\xfe"}'),
        Case(endpoint, "NaN literal body", content=b"NaN"),
        Case(endpoint, "deep nesting", content=b"[" * 100000 + b"]" * 100000),
        Case(endpoint, "text/plain", content=base, content_type="text/plain"),
        Case(endpoint, "no content type", content=base, content_type=None),
        Case(endpoint, "oversized body", content=b'{"x": "' + b"a" * (max_body_bytes + 1) + b'"}'),
    ]
    out += _multipart_cases(endpoint, models)
    if endpoint in FORM_ENDPOINTS:
        out += [Case(endpoint, "JSON nested 100000 deep", content=b"[" * 100000 + b"]" * 100000),
                Case(endpoint, "multipart without boundary", content=b"--x\r\n\r\n",
                     content_type="multipart/form-data")]
    if endpoint == "images_edits":
        out = [c for c in out if c.name != "oversized body"] + [
            Case(endpoint, "JSON instead of multipart", content=base),
            Case(endpoint, "multipart without boundary", content=b"--x\r\n\r\n", content_type="multipart/form-data"),
            Case(endpoint, "multipart cut short", content=multipart({"prompt": "x"}, valid_files(), {})[0][:80],
                 content_type=multipart({}, [], {})[1]),
            Case(endpoint, "oversized body", content=b"-" * (max_body_bytes + 1),
                 content_type=multipart({}, [], {})[1]),
        ]
    return out


#: ``multipart/form-data`` content types no parser can use (no or an empty boundary, bytes
#: that are not ASCII, an unknown charset): each was a 500 on the speech form (issue 23)
BOGUS_MULTIPART_TYPES = ["multipart/form-data", "multipart/form-data; boundary=", 'multipart/form-data; boundary=""',
                         "multipart/form-data; boundary=\xe4\xff", "multipart/form-data;;;=;",
                         "multipart/form-data; boundary=x; charset=no-such-charset"]


def _multipart_cases(endpoint: str, models: Models) -> list[Case]:
    """Forms for the endpoints that read one (speech takes its fields as a form too): bogus
    multipart content types, too many files, a text part over 1 MiB."""
    if endpoint not in ("speech", "images_edits", "videos", "voices"):
        return []
    fields = {k: str(v) for k, v in valid_request(endpoint, models).items()}
    junk = b"--x\r\nContent-Disposition: form-data; name=\"input\"\r\n\r\n\xff\r\n--y--\r\n"
    out = [Case(endpoint, f"content type {ctype!r}", content=junk, content_type=ctype)
           for ctype in BOGUS_MULTIPART_TYPES]
    upload = ("clip.wav", b"RIFF0000WAVE", "audio/wav") if endpoint in ("speech", "voices") else valid_files()[0][1]
    name = {"speech": "ref_audio", "images_edits": "image", "videos": "input_reference",
            "voices": "audio_sample"}[endpoint]
    text = "input" if endpoint == "speech" else "name" if endpoint == "voices" else "prompt"
    out += [Case(endpoint, "9 files", form=fields, files=[(name, upload)] * 9),
            Case(endpoint, "text part over 1 MiB", form={**fields, text: "x" * ((1 << 20) + 1)},
                 files=[(name, upload)])]
    if endpoint == "speech":
        out.append(Case(endpoint, "3 files", form=fields, files=[(name, upload)] * 3))
    return out


def cases(endpoint: str, models: Models = Models(), max_body_bytes: int = 16 << 20,
          strict_params: bool = False) -> list[Case]:
    """Every malformed case of ``endpoint`` (schema, semantic and body cases); ``strict_params``:
    the server runs with ``--strict-params`` (unknown fields are 400s there)."""
    return (schema_cases(endpoint, models, strict_params) + semantic_cases(endpoint, models)
            + body_cases(endpoint, models, max_body_bytes))


def check(response_status: int, body: bytes) -> str | None:
    """None when the answer is a 4xx with the OpenAI error body, else what is wrong."""
    if not 400 <= response_status < 500:
        return f"status {response_status}"
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return f"status {response_status} without the OpenAI error body: {body[:200]!r}"
    if set(error) != {"message", "type", "param", "code"} or not error["message"]:
        return f"error body {error!r}"
    return None


@dataclass
class Report:
    """Answers per endpoint: ``statuses`` (status -> count over the cases), ``valid`` (status of
    the valid request sent afterwards), ``failures`` (endpoint, case name, problem)."""

    statuses: dict[str, Counter] = field(default_factory=dict)
    valid: dict[str, int] = field(default_factory=dict)
    failures: list[tuple[str, str, str]] = field(default_factory=list)

    def count_5xx(self) -> int:
        return sum(n for c in self.statuses.values() for s, n in c.items() if s >= 500)


def run(url: str, endpoints=ALL_ENDPOINTS, models: Models = Models(), timeout_s: float = 30.0,
        api_key: str | None = None) -> Report:
    """Send every case of ``endpoints`` to the frontend at ``url``, one after another, then one
    valid request per endpoint; returns the report."""
    import httpx

    report = Report()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=url, timeout=timeout_s, headers=headers) as client:
        for endpoint in endpoints:
            counts: Counter = Counter()
            for case in cases(endpoint, models):
                kwargs = case.request_kwargs()
                kwargs["headers"] = {**headers, **kwargs["headers"]}
                try:
                    r = client.post(case.path, **kwargs)
                    status, body = r.status_code, r.content
                except httpx.HTTPError as exc:
                    status, body = 599, repr(exc).encode()
                counts[status] += 1
                problem = check(status, body)
                if problem:
                    report.failures.append((endpoint, case.name, problem))
            r = send_valid(client, endpoint, models)
            report.valid[endpoint] = r.status_code
            if r.status_code != 200:
                report.failures.append((endpoint, "valid request afterwards",
                                        f"status {r.status_code}: {r.text[:200]}"))
            report.statuses[endpoint] = counts
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m clients.malformed_payloads", description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:9000", help="frontend URL (loopback)")
    p.add_argument("--endpoints", default=",".join(ALL_ENDPOINTS))
    p.add_argument("--api-key", default=None)
    args = p.parse_args(argv)
    report = run(args.url, [e for e in args.endpoints.split(",") if e], api_key=args.api_key)
    for endpoint, counts in report.statuses.items():
        valid = report.valid[endpoint]
        print(f"{endpoint:20s} cases={sum(counts.values()):4d} 5xx={sum(n for s, n in counts.items() if s >= 500):3d} "
              f"statuses={dict(sorted(counts.items()))} valid-afterwards={valid}")
    for endpoint, name, problem in report.failures:
        print(f"FAIL {endpoint}: {name}: {problem}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
