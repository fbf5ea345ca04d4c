"""The LoRA adapter registry (``/v1/loras``, docs/lora.md): names -> content-addressed adapter files.

Files live in the LoRA directory shared with the denoisers (``omni_triton.contracts.lora.lora_dir``):
``<dir>/<sha256>.safetensors``, the SHA-256 of the stored file being the adapter's id, the only
thing Triton is ever sent. The registry is ``<dir>/loras.sqlite`` (WAL, ``synchronous=FULL``):
one row per name; two names may share one file (same bytes). Nothing is lost on a restart: a
file is written (temp file, fsync, rename) before its row is committed; at start, temp files of
an interrupted upload older than an hour are removed. A row whose file is missing is listed with an ``error`` and
refused on use (:class:`LoraUnavailable`).

Sources: an upload (a file object the caller already bounded by size) or a server-side path,
which must resolve (symlinks followed) to a place under one of ``allowed_dirs``; anything else is
refused (:class:`LoraPathRefused`). A path is a ``.safetensors`` file or a PEFT folder
(``adapter_model.safetensors`` + ``adapter_config.json``); either is copied into the directory,
so later changes of the source do not change a registered adapter.

Checks before anything is stored (:func:`omni_triton.contracts.lora.inspect`): the safetensors
header (truncation, offsets, dtypes), the key format (diffusers / PEFT), A/B pairs and ranks;
and, against every denoiser manifest present (``targets/<model>.json``), module names and
shapes: an adapter must fit at least one served Qwen-Image transformer. Requests check it again
against their own model's denoiser (:meth:`LoraStore.check_for`).

All methods block (file I/O, hashing, SQLite): call them off the event loop.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from omni_triton.contracts import lora as cl

logger = logging.getLogger(__name__)

#: a registered name: what requests select (``lora.name``); also a URL path segment
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
PEFT_WEIGHTS, PEFT_CONFIG = "adapter_model.safetensors", "adapter_config.json"
#: largest ``adapter_config.json`` read (bytes)
MAX_CONFIG_BYTES = 1 << 20
#: age (seconds) after which a temp file of an upload is an orphan of a crash, removed at start
STALE_UPLOAD_S = 3600.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS loras (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT UNIQUE NOT NULL,
    id TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    format TEXT NOT NULL,
    rank INTEGER NOT NULL,
    modules TEXT NOT NULL,
    source TEXT NOT NULL,
    source_path TEXT
);
CREATE INDEX IF NOT EXISTS loras_id ON loras (id);
"""


@dataclass
class LoraSettings:
    """Registry knobs.

    directory: the LoRA directory (files, ``loras.sqlite``, the denoisers' ``targets/``).
    allowed_dirs: server-side folders ``path`` registrations may come from (empty: paths refused).
    max_upload_bytes: largest adapter file (an upload's body, a path's file); 413 beyond.
    max_loras: registered names at most (400 ``quota_exceeded`` beyond).
    max_stored_bytes: bytes of stored adapter files together (400 ``quota_exceeded`` beyond).
    max_rank: largest LoRA rank accepted.
    """

    directory: Path
    allowed_dirs: tuple[Path, ...] = ()
    max_upload_bytes: int = 2 << 30
    max_loras: int = 256
    max_stored_bytes: int = 50 << 30
    max_rank: int = 256


@dataclass(frozen=True)
class StoredLora:
    """One registered adapter. ``id``: SHA-256 of its stored file; ``modules``: module ->
    ``(rank, in, out)``; ``error``: why it is unusable (its file is gone), else None."""

    name: str
    id: str
    created_at: int
    bytes: int
    format: str
    rank: int
    modules: dict[str, tuple[int, int, int]] = field(repr=False)
    source: str
    source_path: str | None = None
    error: str | None = None

    def to_openai(self) -> dict[str, Any]:
        """The API object (``object: "lora"``)."""
        out: dict[str, Any] = {"object": "lora", "name": self.name, "id": self.id, "created_at": self.created_at,
                               "bytes": self.bytes, "format": self.format, "rank": self.rank,
                               "modules": len(self.modules), "source": self.source}
        if self.source_path:
            out["path"] = self.source_path
        if self.error:
            out["error"] = self.error
        return out


class LoraStoreError(Exception):
    """Base of the registry's errors; ``code`` is the OpenAI error code the API answers with."""

    code = "invalid_lora"


class DuplicateLoraName(LoraStoreError):
    code = "lora_exists"


class InvalidLoraName(LoraStoreError):
    """A name outside :data:`NAME_PATTERN` (answered with ``param: name``)."""

    code = "invalid_lora_name"


class LoraNotFound(LoraStoreError):
    code = "lora_not_found"


class LoraUnavailable(LoraStoreError):
    """The row exists but its file is gone (deleted outside the frontend)."""

    code = "lora_unavailable"


class LoraPathRefused(LoraStoreError):
    code = "lora_path_not_allowed"


class LoraTooLarge(LoraStoreError):
    code = "payload_too_large"


class LoraQuotaExceeded(LoraStoreError):
    code = "quota_exceeded"


def check_name(name: str) -> str:
    """``name`` if it matches :data:`NAME_PATTERN` (1-128 of ``A-Z a-z 0-9 _ . -``, not starting
    with ``.``/``-``/``_``); else ``LoraStoreError``."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise InvalidLoraName("'name' must be 1-128 characters of letters, digits, '_', '.', '-', "
                             "starting with a letter or digit")
    return name


class LoraStore:
    """The registry over :class:`LoraSettings` (thread-safe; every method blocks)."""

    def __init__(self, settings: LoraSettings):
        self.settings = settings
        self.directory = Path(settings.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.directory / "loras.sqlite"), check_same_thread=False,
                                   isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._allowed = tuple(Path(os.path.realpath(d)) for d in settings.allowed_dirs)
        self._manifests: dict[str, tuple[float, dict[str, list[int]]]] = {}
        # an upload interrupted by a crash; only old ones: another frontend on this folder may
        # be writing one now
        for tmp in self.directory.glob(".upload-*"):
            try:
                if time.time() - tmp.stat().st_mtime > STALE_UPLOAD_S:
                    tmp.unlink(missing_ok=True)
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ----------------------------------------------------------------- reading
    def _row(self, row: tuple[Any, ...]) -> StoredLora:
        name, lora_id, created, nbytes, fmt, rank, modules, source, path = row
        error = None if cl.adapter_file(self.directory, lora_id).is_file() else "the adapter file is missing"
        return StoredLora(name, lora_id, int(created), int(nbytes), fmt, int(rank),
                          {k: tuple(v) for k, v in json.loads(modules).items()}, source, path, error)

    _COLUMNS = "name, id, created_at, bytes, format, rank, modules, source, source_path"

    def list_all(self) -> list[StoredLora]:
        """Every registered adapter, oldest first."""
        with self._lock:
            rows = self._db.execute(f"SELECT {self._COLUMNS} FROM loras ORDER BY seq").fetchall()
        return [self._row(r) for r in rows]

    def get(self, name: str) -> StoredLora:
        """The adapter registered as ``name``.

        Raises:
            LoraNotFound: no such name.
        """
        with self._lock:
            row = self._db.execute(f"SELECT {self._COLUMNS} FROM loras WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise LoraNotFound(f"No LoRA adapter named '{name[:128]}' (register it with POST /v1/loras)")
        return self._row(row)

    def manifest(self, model: str) -> dict[str, list[int]] | None:
        """The module manifest the denoiser ``model`` wrote (``targets/<model>.json``), or None
        when it has not (not loaded yet, or no Qwen-Image denoiser); re-read when it changes."""
        try:
            path = cl.manifest_file(self.directory, model)
            mtime = path.stat().st_mtime
        except (OSError, ValueError):
            return None
        cached = self._manifests.get(model)
        if cached is None or cached[0] != mtime:
            try:
                cached = (mtime, json.loads(path.read_text())["modules"])
            except (OSError, ValueError, KeyError, TypeError):
                return None
            self._manifests[model] = cached
        return cached[1]

    def manifests(self) -> dict[str, dict[str, list[int]]]:
        """Every denoiser manifest present: model -> manifest."""
        out = {}
        for path in sorted((self.directory / "targets").glob("*.json")):
            m = self.manifest(path.stem)
            if m is not None:
                out[path.stem] = m
        return out

    def check_for(self, lora: StoredLora, denoisers: list[str]) -> None:
        """Check ``lora`` against the manifest of each of ``denoisers`` that has one (a model's
        denoiser not loaded yet is checked by the stage itself when it loads the adapter).

        Raises:
            LoraUnavailable: its file is gone.
            omni_triton.contracts.lora.LoraFileError: ``lora_incompatible``.
        """
        if lora.error:
            raise LoraUnavailable(f"LoRA adapter '{lora.name}' cannot be used: {lora.error}")
        for model in denoisers:
            manifest = self.manifest(model)
            if manifest is not None:
                cl.check_against(lora.modules, manifest, model)

    # ----------------------------------------------------------------- writing
    def register_upload(self, name: str, f: IO[bytes], size: int,
                        adapter_config: dict[str, Any] | None = None) -> StoredLora:
        """Register the adapter in ``f`` (``size`` bytes; the caller checked the size bound).

        Raises:
            LoraStoreError (a subclass) or ``omni_triton.contracts.lora.LoraFileError``.
        """
        check_name(name)
        return self._register(name, f, size, adapter_config, "upload", None)

    def register_path(self, name: str, path: str) -> StoredLora:
        """Register the adapter at the server-side ``path`` (a ``.safetensors`` file or a PEFT
        folder), which must resolve under one of ``allowed_dirs``.

        Raises:
            LoraPathRefused: no allow-list, a path outside it (after resolving symlinks), or
                not a file/folder of the accepted kinds.
        """
        check_name(name)
        if not isinstance(path, str) or not path or "\x00" in path or len(path) > 4096:
            raise LoraPathRefused("'path' must be a non-empty server-side path")
        if not self._allowed:
            raise LoraPathRefused("registering LoRA adapters by server-side path is disabled "
                                  "(start the frontend with --lora-allowed-dirs); upload the file instead")
        real = Path(os.path.realpath(path))
        if not any(real == d or d in real.parents for d in self._allowed):
            raise LoraPathRefused(f"'path' is not under an allowed LoRA directory ({len(self._allowed)} "
                                  "configured with --lora-allowed-dirs)")
        config = None
        if real.is_dir():
            weights, cfg = real / PEFT_WEIGHTS, real / PEFT_CONFIG
            if not weights.is_file():
                raise LoraPathRefused(f"the folder has no {PEFT_WEIGHTS} (a PEFT adapter folder)")
            if cfg.is_file():
                if cfg.stat().st_size > MAX_CONFIG_BYTES:
                    raise cl.LoraFileError(f"{PEFT_CONFIG} is larger than {MAX_CONFIG_BYTES} bytes")
                try:
                    config = json.loads(cfg.read_text())
                except (ValueError, UnicodeDecodeError):
                    raise cl.LoraFileError(f"{PEFT_CONFIG} is not JSON") from None
                if not isinstance(config, dict):
                    raise cl.LoraFileError(f"{PEFT_CONFIG} is not a JSON object")
            real = weights
        elif not (real.is_file() and real.suffix == cl.SUFFIX):
            raise LoraPathRefused("'path' must be a .safetensors file or a PEFT adapter folder")
        size = real.stat().st_size
        if size > self.settings.max_upload_bytes:
            raise LoraTooLarge(f"the adapter file is {size} bytes; at most {self.settings.max_upload_bytes}")
        with open(real, "rb") as f:
            return self._register(name, f, size, config, "path", path)

    def _register(self, name: str, f: IO[bytes], size: int, adapter_config: dict[str, Any] | None,
                  source: str, source_path: str | None) -> StoredLora:
        header = cl.read_header(f, size)
        info = cl.inspect(header, max_rank=self.settings.max_rank, adapter_config=adapter_config)
        manifests = self.manifests()
        if manifests:  # it must fit at least one served Qwen-Image transformer
            errors = []
            for model, manifest in manifests.items():
                try:
                    cl.check_against(info.modules, manifest, model)
                    break
                except cl.LoraFileError as exc:
                    errors.append(str(exc))
            else:
                raise cl.LoraFileError(errors[0], code="lora_incompatible")
        with self._lock:
            if self._db.execute("SELECT 1 FROM loras WHERE name = ?", (name,)).fetchone():
                raise DuplicateLoraName(f"A LoRA adapter named '{name}' exists already (DELETE it first)")
            count, stored = self._db.execute("SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM loras").fetchone()
        if count >= self.settings.max_loras:
            raise LoraQuotaExceeded(f"{count} LoRA adapters are registered; at most {self.settings.max_loras}")
        if stored + size > self.settings.max_stored_bytes:
            raise LoraQuotaExceeded(f"storing {size} more bytes would exceed {self.settings.max_stored_bytes} "
                                    "bytes of adapters")
        lora_id, nbytes, created = self._store_file(f, header, info)
        row = (name, lora_id, int(time.time()), nbytes, info.format, info.rank,
               json.dumps(info.modules, sort_keys=True), source, source_path)
        with self._lock:
            try:
                self._db.execute(f"INSERT INTO loras ({self._COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)", row)
            except sqlite3.IntegrityError:
                if created:
                    self._remove_unreferenced(lora_id)
                raise DuplicateLoraName(f"A LoRA adapter named '{name}' exists already (DELETE it first)") from None
        logger.info("LoRA '%s' registered: %s (%s, rank %d, %d modules, %d bytes)", name, lora_id[:12],
                    info.format, info.rank, len(info.modules), nbytes)
        return self._row(row)

    def _store_file(self, f: IO[bytes], header: cl.Header, info: cl.LoraInfo) -> tuple[str, int, bool]:
        """Write the stored form (canonical keys) to a temp file in the directory while hashing
        it, fsync, rename to ``<sha256>.safetensors``. Returns (id, bytes, whether it is new)."""
        tmp = self.directory / f".upload-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"
        digest = hashlib.sha256()

        class Hashing:
            def __init__(self, out: IO[bytes]) -> None:
                self.out, self.n = out, 0

            def write(self, b: bytes) -> None:
                digest.update(b)
                self.out.write(b)
                self.n += len(b)

        try:
            with open(tmp, "wb") as out:
                sink = Hashing(out)
                if info.needs_rewrite:
                    cl.write_canonical(f, sink, header, info)  # type: ignore[arg-type]
                else:
                    f.seek(0)
                    left = header.data_start + header.data_bytes
                    while left:
                        block = f.read(min(1 << 20, left))
                        if not block:
                            raise cl.LoraFileError("the file is shorter than its header says (truncated)")
                        sink.write(block)
                        left -= len(block)
                out.flush()
                os.fsync(out.fileno())
            lora_id = digest.hexdigest()
            final = cl.adapter_file(self.directory, lora_id)
            created = not final.exists()
            os.replace(tmp, final)
            return lora_id, sink.n, created
        finally:
            tmp.unlink(missing_ok=True)

    def _remove_unreferenced(self, lora_id: str) -> None:
        """Delete ``<id>.safetensors`` unless a row still names it (call under the lock)."""
        if self._db.execute("SELECT 1 FROM loras WHERE id = ?", (lora_id,)).fetchone() is None:
            cl.adapter_file(self.directory, lora_id).unlink(missing_ok=True)

    def delete(self, name: str) -> StoredLora:
        """Unregister ``name``; its file goes when no other name shares it. A denoiser that has
        it loaded keeps it until evicted, but no request can name it any more.

        Raises:
            LoraNotFound: no such name.
        """
        lora = self.get(name)
        with self._lock:
            self._db.execute("DELETE FROM loras WHERE name = ?", (name,))
            self._remove_unreferenced(lora.id)
        logger.info("LoRA '%s' (%s) deleted", name, lora.id[:12])
        return lora
