"""Who may do what: the API key check (one helper for HTTP, the WebSocket and ``/health``),
loopback and browser tests, and the redaction of keys from log lines.

Credentials are read from headers only, never from the URL (a URL lands in access logs, proxy
logs and browser history):

- ``Authorization: Bearer <key>``: what the OpenAI SDKs send, on HTTP and on WebSockets
  (``openai`` Python ``client.realtime.connect`` sends it in the handshake);
- ``Sec-WebSocket-Protocol: openai-insecure-api-key.<key>`` on a WebSocket handshake: browsers
  cannot set an ``Authorization`` header there, so OpenAI's Realtime API (and the ``openai`` JS
  SDK in a browser) carry the key as a subprotocol, next to a real one (``realtime``). The frontend
  accepts the same convention and answers with the other offered subprotocol, never echoing
  the key.

A key in the query string (``?api_key=``) is refused (401), and :class:`RedactSecrets` removes
any ``api_key``/``key``/``token``-like query parameter from uvicorn's log lines anyway.
Keys are compared with ``hmac.compare_digest`` (constant time). Docs: docs/openai_frontend.md
"Authentication and browsers".
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import re
from urllib.parse import parse_qsl

from starlette.types import Scope

#: the subprotocol prefix that carries a key in a browser WebSocket handshake (OpenAI Realtime's)
KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."

#: RFC 7230 token characters, all a WebSocket subprotocol (RFC 6455) may hold
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def browser_ws_sendable(key: str) -> bool:
    """Whether a browser can send ``key`` in the ``openai-insecure-api-key.<key>`` subprotocol:
    only RFC 7230 token characters (a base64 key with ``/`` or ``=`` cannot; browsers refuse to
    open such a WebSocket). HTTP headers take any printable key."""
    return bool(_TOKEN.fullmatch(key))


#: query parameters that look like credentials: refused when a key is configured, and redacted
#: from log lines either way (compared lower-case, ``-`` read as ``_``)
URL_KEY_PARAMS = frozenset({"api_key", "apikey", "key", "token", "access_token", "auth", "authorization",
                            "password", "secret", "client_secret"})

REDACTED = "REDACTED"


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower-case bytes) in an ASGI ``scope``, or None."""
    for key, value in scope.get("headers") or ():
        if key == name:
            return bytes(value)
    return None


def offered_subprotocols(scope: Scope) -> list[str]:
    """The subprotocols a WebSocket client offered (``Sec-WebSocket-Protocol``), in order."""
    if scope.get("type") == "websocket" and scope.get("subprotocols") is not None:
        return [str(p) for p in scope["subprotocols"]]
    raw = header(scope, b"sec-websocket-protocol") or b""
    return [p.strip() for p in raw.decode("latin-1").split(",") if p.strip()]


def _bearer(scope: Scope) -> bytes | None:
    auth = header(scope, b"authorization")
    if auth is None:
        return None
    scheme, _, token = auth.partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else b""


def _subprotocol_key(scope: Scope) -> bytes | None:
    if scope.get("type") != "websocket":
        return None
    for proto in offered_subprotocols(scope):
        if proto.startswith(KEY_SUBPROTOCOL_PREFIX):
            # servers decode the header as latin-1: back to its bytes (never raises)
            return proto[len(KEY_SUBPROTOCOL_PREFIX):].encode("latin-1", "replace")
    return None


def url_credentials(scope: Scope) -> list[str]:
    """Names of the query parameters of ``scope`` that look like credentials (``URL_KEY_PARAMS``)."""
    query = (scope.get("query_string") or b"").decode("latin-1")
    if not query:
        return []
    return [name for name, _ in parse_qsl(query, keep_blank_values=True)
            if name.lower().replace("-", "_") in URL_KEY_PARAMS]


class ApiKeyCheck:
    """The configured API key and the one test "does this request carry it".

    ``authorized(scope)`` reads ``Authorization: Bearer`` (HTTP and WebSocket) and, on a WebSocket
    handshake, the ``openai-insecure-api-key.<key>`` subprotocol; compares in constant time
    (``hmac.compare_digest`` on bytes). ``key=None``: no key is configured and every request is
    authorised.
    """

    def __init__(self, key: str | None):
        self._key = key.encode("utf-8") if key else None

    @property
    def enabled(self) -> bool:
        """True when a key is configured."""
        return self._key is not None

    def presented(self, scope: Scope) -> bool:
        """True when the request carries some credential (right or wrong) in a header."""
        return header(scope, b"authorization") is not None or _subprotocol_key(scope) is not None

    def authorized(self, scope: Scope) -> bool:
        """True when no key is configured or ``scope`` carries it (see the class docstring)."""
        if self._key is None:
            return True
        # every candidate is compared (no early exit on the first header), in constant time
        ok = False
        for candidate in (_bearer(scope), _subprotocol_key(scope)):
            if candidate is not None and hmac.compare_digest(candidate, self._key):
                ok = True
        return ok


def is_loopback(host: str | None) -> bool:
    """True for a loopback IP address (127.0.0.0/8, ::1, IPv4-mapped loopback); False for names
    and anything unparsable."""
    if not host:
        return False
    try:
        addr = ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)
    return addr.is_loopback or bool(mapped and mapped.is_loopback)


def loopback_client(scope: Scope) -> bool:
    """True when the request's peer (``scope["client"]``, after uvicorn's trusted
    ``X-Forwarded-For`` handling) is a loopback address."""
    client = scope.get("client")
    return client is not None and bool(client) and is_loopback(client[0])


# --------------------------------------------------------------------------- log redaction
_SECRET_PARAM = re.compile(
    r"(?P<sep>[?&;])(?P<name>(?:" + "|".join(sorted((re.escape(p).replace("_", "[-_]?") for p in URL_KEY_PARAMS),
                                                    key=len, reverse=True))
    + r"))=(?P<value>[^&;\s\"']*)",
    re.IGNORECASE)
_KEY_SUBPROTOCOL = re.compile(re.escape(KEY_SUBPROTOCOL_PREFIX) + r"[^,\s\"']*", re.IGNORECASE)
_BEARER = re.compile(r"(Bearer\s+)[^\s,\"']+", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with credential-like query parameter values, key subprotocols and bearer tokens
    replaced by ``REDACTED`` (``/x?api_key=abc&b=1`` -> ``/x?api_key=REDACTED&b=1``)."""
    if "=" in text:
        text = _SECRET_PARAM.sub(lambda m: f"{m['sep']}{m['name']}={REDACTED}", text)
    if KEY_SUBPROTOCOL_PREFIX in text.lower():
        text = _KEY_SUBPROTOCOL.sub(KEY_SUBPROTOCOL_PREFIX + REDACTED, text)
    if "bearer" in text.lower():
        text = _BEARER.sub(lambda m: m[1] + REDACTED, text)
    return text


class RedactSecrets(logging.Filter):
    """A ``logging.Filter`` that passes every record with its message and string arguments run
    through :func:`redact`: uvicorn's access lines (``uvicorn.access``: ``"GET /path?query"``)
    and WebSocket lines (``uvicorn.error``: ``"WebSocket /path?query" [accepted]``) log the full
    query string."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: redact(v) if isinstance(v, str) else v for k, v in record.args.items()}
        return True


#: the loggers whose lines hold request URLs: uvicorn's access log and its WebSocket lines
REDACTED_LOGGERS = ("uvicorn.access", "uvicorn.error", "uvicorn")


def install_log_redaction(loggers: tuple[str, ...] = REDACTED_LOGGERS) -> RedactSecrets:
    """Adds one :class:`RedactSecrets` to each named logger (idempotent) and returns it. A logger
    filter sees only records logged on that logger, so each URL-logging logger gets it."""
    shared = RedactSecrets()
    for name in loggers:
        log = logging.getLogger(name)
        existing = [f for f in log.filters if isinstance(f, RedactSecrets)]
        if not existing:
            log.addFilter(shared)
    return shared
