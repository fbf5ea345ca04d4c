"""``POST /tokenize`` and ``POST /detokenize`` with vLLM's request and response shapes, for the
chat models (vLLM's benchmark uses them to align its prompts with the server's tokenizer).

The frontend has no model and never imports torch (so not transformers either): it loads the
model's own tokenizer files from its prepared folder (the config parameter ``assets``, or that of
the first stage in ``depends_on`` that has one: ``llm_tts`` -> ``llm`` -> ``smollm2``) with the
``tokenizers`` library (``tokenizer.json``), and renders the model's chat template
(``chat_template.jinja``) with jinja2 in a sandbox, as transformers' ``apply_chat_template`` does.
The counts therefore equal what the chat stages count (``PROMPT_TOKENS``).

* ``/tokenize``: ``{"model", "prompt", "add_special_tokens": true}`` or ``{"model", "messages",
  "add_generation_prompt": true, "add_special_tokens": false}`` (either with
  ``return_token_strs``) -> ``{"count", "max_model_len", "tokens", "token_strs"}``.
* ``/detokenize``: ``{"model", "tokens"}`` -> ``{"prompt"}``.

Limits (checked before any work): the prompt, or the messages' text, at most
``--max-prompt-chars`` characters (400 ``prompt_too_long``); at most
``schemas.MAX_DETOKENIZE_TOKENS`` token ids. Rendering, encoding, decoding and the JSON of the
answer run off the event loop (``offload.off_loop``); the encoder runs with the GIL released
(``Tokenizer.encode_batch``).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, NoReturn

from fastapi import Request
from fastapi.responses import Response
from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from omni_triton.paths import model_dir

from ..engine import Engine, ModelInfo
from ..errors import OpenAIError, bad_request
from ..generation import message_json
from ..offload import off_loop
from ..schemas import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from .common import check_fields, check_prompt_chars, messages_chars, resolve_model


class ChatTokenizer:
    """A model folder's tokenizer and chat template (``tokenizer.json``, ``tokenizer_config.json``,
    ``chat_template.jinja`` or ``tokenizer_config.json``'s ``chat_template``)."""

    def __init__(self, folder: Path):
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        config_path = folder / "tokenizer_config.json"
        self.config = json.loads(config_path.read_text()) if config_path.exists() else {}
        template_path = folder / "chat_template.jinja"
        source = template_path.read_text() if template_path.exists() else self.config.get("chat_template")
        self.template = None
        if source:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

            def raise_exception(message: str) -> NoReturn:
                raise ValueError(message)

            env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
            env.globals["raise_exception"] = raise_exception
            self.template = env.from_string(source)

    def _special(self, name: str) -> str | None:
        value = self.config.get(name)
        return value.get("content") if isinstance(value, dict) else value

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The chat template applied to ``messages`` (text). Raises ``ValueError`` without one, or
        when the template fails on them (client messages the template does not expect, e.g. a
        ``null`` content, raise ``TypeError`` or a Jinja error inside it)."""
        if self.template is None:
            raise ValueError("the model has no chat template")
        try:
            return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        bos_token=self._special("bos_token") or "",
                                        eos_token=self._special("eos_token") or "")
        except (TypeError, TemplateError) as exc:
            raise ValueError(f"the chat template cannot render these messages ({type(exc).__name__}: {exc})") from None

    def encode(self, text: str, add_special_tokens: bool) -> tuple[list[int], list[str]]:
        """Token ids and their strings."""
        # encode_batch releases the GIL while it runs: a long text encoded in a worker thread
        # leaves the event loop free
        enc = self.tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0]
        return list(enc.ids), list(enc.tokens)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)


@functools.lru_cache(maxsize=8)
def load_tokenizer(folder: str) -> ChatTokenizer:
    """The (cached) tokenizer of a prepared model folder."""
    return ChatTokenizer(Path(folder))


async def tokenizer_folder(engine: Engine, info: ModelInfo) -> Path:
    """The folder holding ``info``'s tokenizer: its first asset with a ``tokenizer.json``, else that
    of the first ``depends_on`` stage that has one. 400 ``tokenizer_unavailable`` when none."""
    for asset in info.assets:
        if (model_dir(asset) / "tokenizer.json").exists():
            return model_dir(asset)
    for dep in info.depends_on:
        try:
            stage = await engine.get_model(dep)
        except Exception:
            continue
        for asset in stage.assets:
            if (model_dir(asset) / "tokenizer.json").exists():
                return model_dir(asset)
    raise bad_request(f"The model '{info.public_name}' has no tokenizer this server can use",
                      param="model", code="tokenizer_unavailable")


async def _chat_model(body: TokenizeRequest | DetokenizeRequest, request: Request) -> tuple[ModelInfo, ChatTokenizer]:
    check_fields(body, request)
    engine = request.app.state.engine
    info = await resolve_model(engine, body.model)
    if not (info.is_chat or info.is_completion):
        raise bad_request(f"The model '{body.model}' is not a chat or completion model", param="model",
                          code="unsupported_model")
    return info, await off_loop(load_tokenizer, str(await tokenizer_folder(engine, info)))


async def tokenize(body: TokenizeRequest, request: Request) -> Response:
    """``POST /tokenize``: a ``prompt`` (special tokens added unless ``add_special_tokens`` is
    false) or chat ``messages`` (the chat template applied; no special tokens added by default,
    the template holds them). Answers a ``TokenizeResponse`` JSON."""
    if (body.prompt is None) == (body.messages is None):
        raise bad_request("Send exactly one of 'prompt' and 'messages'", param="prompt", code="invalid_value")
    if body.messages is not None:
        check_prompt_chars(messages_chars(body.messages), request, "messages")
    else:
        check_prompt_chars(len(body.prompt or ""), request, "prompt")
    info, tok = await _chat_model(body, request)
    return Response(await off_loop(_tokenize, body, info, tok), media_type="application/json")


def _tokenize(body: TokenizeRequest, info: ModelInfo, tok: ChatTokenizer) -> bytes:
    """The JSON of ``/tokenize``'s answer (a worker thread's work: render, encode, serialise)."""
    if body.messages is not None:
        try:
            text = tok.render([message_json(m) for m in body.messages], body.add_generation_prompt)
        except ValueError as exc:
            raise bad_request(str(exc), param="messages", code="invalid_value") from None
        except Exception as exc:
            raise OpenAIError(400, f"The chat template failed on these messages ({type(exc).__name__})",
                              param="messages", code="invalid_value") from None
        special = bool(body.add_special_tokens)
    else:
        text = body.prompt or ""  # set: tokenize() checked that exactly one of prompt and messages is
        special = True if body.add_special_tokens is None else body.add_special_tokens
    ids, strs = tok.encode(text, special)
    return TokenizeResponse(count=len(ids), max_model_len=info.max_model_len, tokens=ids,
                            token_strs=strs if body.return_token_strs else None).model_dump_json().encode()


async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
    """``POST /detokenize``: the text of ``tokens`` (400 for an id outside the vocabulary)."""
    _, tok = await _chat_model(body, request)
    return await off_loop(_detokenize, body.tokens, tok)


def _detokenize(tokens: list[int], tok: ChatTokenizer) -> DetokenizeResponse:
    size = tok.tokenizer.get_vocab_size(with_added_tokens=True)
    bad = next((t for t in tokens if not 0 <= t < size), None)
    if bad is not None:
        raise bad_request(f"Token id {bad} is outside the vocabulary (size {size})", param="tokens",
                          code="invalid_value")
    return DetokenizeResponse(prompt=tok.decode(tokens))
