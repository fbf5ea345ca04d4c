"""Triton's administrative APIs are locked behind a key only the launcher and the frontend hold.

tritonserver serves, besides inference, APIs that change or reveal the server: the model
repository (index, **load, unload**), model configs, shared-memory registration, trace and log
settings. ``omni-triton serve`` starts it with ``--http-restricted-api`` and
``--grpc-restricted-protocol`` on :data:`RESTRICTED_APIS`: a request to one of them must carry the
header :data:`HEADER` (HTTP) or the metadata :data:`GRPC_HEADER` (gRPC: Triton prefixes the flag's
header name with ``triton-grpc-protocol-``) with the key, else Triton answers HTTP 403 "This API
is restricted, expecting header 'omni-triton-admin-key'" / gRPC ``UNAVAILABLE`` "This protocol is
restricted, expecting header 'triton-grpc-protocol-omni-triton-admin-key'" (the same for a wrong
key). Health,
metadata, inference and statistics stay open (the frontend and perf_analyzer use them), on
loopback by default.

The key: :envvar:`OMNI_TRITON_ADMIN_KEY`, else the file named by
:envvar:`OMNI_TRITON_ADMIN_KEY_FILE` (a Docker/Kubernetes secret file), else a fresh random one per
``serve`` (:func:`new_key`). ``serve`` hands it to the frontend in its environment (readable by the
same user only, unlike argv) and writes it to a 0600 file (:func:`write_key_file`) for local tools
(perf_analyzer, the e2e tests). Limitation: tritonserver takes it on its command line only, so on a
shared host other local users can read it with ``ps`` unless ``/proc`` is mounted ``hidepid=2`` or
the server runs in its own container/pod (its own PID namespace).

Flag syntax (checked with the 2.51 binary; its ``--help`` text, which shows ``<apis>,<key>=<value>``,
is wrong): ``--http-restricted-api=<api>,<api>,...:<header>=<value>``; the gRPC flag is
``--grpc-restricted-protocol`` with the same syntax (``--grpc-restricted-api`` does not exist).
"""
from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

#: HTTP header that carries the key (the name given in the flags; lower case, as gRPC needs)
HEADER = "omni-triton-admin-key"
#: gRPC metadata key that carries it: Triton 2.51 expects the flag's name with this prefix
GRPC_HEADER = "triton-grpc-protocol-" + HEADER
#: environment variable holding the key
ENV = "OMNI_TRITON_ADMIN_KEY"
#: environment variable naming a file that holds the key (first line; Docker/k8s secret files)
ENV_FILE = "OMNI_TRITON_ADMIN_KEY_FILE"
#: Triton API groups that need the key
RESTRICTED_APIS = ("model-repository", "model-config", "shared-memory", "trace", "logging")
#: Triton API groups left open (what the frontend, probes and perf_analyzer use)
OPEN_APIS = ("health", "metadata", "inference", "statistics")

#: what a key may be made of: Triton parses the flag at ':' and '=', headers forbid controls
_KEY = re.compile(r"[A-Za-z0-9._~+/-]{16,512}")


class AdminKeyError(ValueError):
    """An admin key (given or read from a file) that Triton's flag or a header cannot carry."""


def new_key() -> str:
    """A fresh random key (256 bits, URL-safe base64)."""
    return secrets.token_urlsafe(32)


def check_key(key: str) -> str:
    """Return ``key`` if it is usable, else raise.

    Raises:
        AdminKeyError: shorter than 16 or longer than 512 characters, or a character outside
            ``A-Z a-z 0-9 . _ ~ + / -`` (``:`` ``=`` ``,`` would break Triton's flag parsing).
    """
    if not _KEY.fullmatch(key):
        raise AdminKeyError(f"the Triton admin key must be 16-512 characters of A-Z a-z 0-9 . _ ~ + / - "
                            f"(got {len(key)} characters); e.g. python -c 'import secrets; "
                            "print(secrets.token_urlsafe(32))'")
    return key


def key_from_env(environ: dict[str, str] | None = None) -> str | None:
    """The key from :data:`ENV`, else from the file named by :data:`ENV_FILE`, else ``None``
    (empty values count as unset).

    Raises:
        AdminKeyError: the key is not usable (:func:`check_key`).
        OSError: the file cannot be read.
    """
    env = os.environ if environ is None else environ
    if env.get(ENV, "").strip():
        return check_key(env[ENV].strip())
    if env.get(ENV_FILE, "").strip():
        text = Path(env[ENV_FILE].strip()).read_text().strip()
        return check_key(text.splitlines()[0].strip() if text else "")
    return None


def headers(key: str | None, grpc: bool = False) -> dict[str, str]:
    """The headers (HTTP) or metadata (``grpc=True``, for ``tritonclient.grpc``'s ``headers=``)
    to send with a restricted call; empty without a key."""
    return {GRPC_HEADER if grpc else HEADER: key} if key else {}


def server_flags(key: str) -> list[str]:
    """tritonserver flags restricting :data:`RESTRICTED_APIS` on HTTP and gRPC to ``key``."""
    apis = ",".join(RESTRICTED_APIS)
    return [f"--http-restricted-api={apis}:{HEADER}={key}",
            f"--grpc-restricted-protocol={apis}:{HEADER}={key}"]


def write_key_file(path: Path, key: str) -> Path:
    """Write ``key`` to ``path`` readable by this user only (0600, created so: never a moment
    with wider permissions). Returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    tmp.replace(path)
    return path
