"""The per-request LoRA contract of the Qwen-Image denoisers (docs/lora.md), torch-free: what the
frontend sends Triton, where the denoiser finds an adapter, and the checks of an adapter file
made before anything of it is stored or loaded.

Tensors (optional inputs of the ``qwen_image`` / ``qwen_image_edit`` ensembles and their
denoisers; absent or ``LORA_ID = ""``: no adapter, the request runs exactly as without LoRA):

- ``LORA_ID`` BYTES ``[1]``: the adapter's id, the lowercase hex SHA-256 of its stored file
  (:data:`ID_PATTERN`). Never a path: the denoiser opens only ``<lora dir>/<id>.safetensors``
  (:func:`adapter_file`), so Triton cannot be made to read any other file.
- ``LORA_SCALE`` FP32 ``[1]``: the adapter's weight (``set_adapters(..., adapter_weights=scale)``),
  in [:data:`MIN_LORA_SCALE`, :data:`MAX_LORA_SCALE`]; absent: 1.0.

The LoRA directory (:func:`lora_dir`) is shared by the frontend (which writes the files, content
addressed, and the registry ``loras.sqlite``) and the denoisers (which read the files and write
their module manifests, ``targets/<triton model>.json``: :func:`manifest_file`). Both sides run on
one host (``omni-triton serve``); ``$OMNI_TRITON_LORA_DIR`` or ``$OMNI_TRITON_CACHE/loras``.

Accepted files (:func:`inspect`): safetensors whose tensors are all LoRA down/up matrices of
Linear layers of the transformer, in one of the key formats diffusers' ``load_lora_weights``
loads for ``QwenImageTransformer2DModel``:

- diffusers: ``transformer.<module>.lora_A.weight`` ``[r, in]`` / ``...lora_B.weight`` ``[out, r]``
  (what ``QwenImagePipeline.save_lora_weights`` writes; optional ``lora_adapter_metadata``);
- PEFT: ``base_model.model.<module>.lora_A.weight`` (``peft``'s ``save_pretrained``) or bare
  ``<module>.lora_A.weight``; stored with the keys renamed to the diffusers form, and, when its
  ``adapter_config.json`` gives ``lora_alpha != r``, with that config as diffusers'
  ``lora_adapter_metadata`` (so the scaling is ``alpha / r`` as in PEFT).

Refused (:class:`LoraFileError`, HTTP 400): not safetensors, a truncated file or a header whose
offsets do not tile the data, dtypes other than F32/F16/BF16, other key formats (Kohya
``lora_unet_*``, ``.alpha``, ``lora_down``/``lora_up``, DoRA, LoRA biases, text-encoder keys),
an A without its B, ranks of A and B that differ, ranks above ``max_rank``, and (against a
denoiser's manifest, :func:`check_against`) modules the transformer lacks or shapes it does not have.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

LORA_ID = "LORA_ID"  #: BYTES [1]: hex SHA-256 of the stored adapter file; "" = none
LORA_SCALE = "LORA_SCALE"  #: FP32 [1]: the adapter's weight (default 1.0)

#: ``LORA_SCALE`` bounds: finite; outside them an image is noise for any real adapter. Negative
#: scales (subtracting a style) are allowed, as diffusers allows them.
MIN_LORA_SCALE, MAX_LORA_SCALE = -8.0, 8.0

#: environment variable naming the LoRA directory (both the frontend and the denoisers read it)
ENV = "OMNI_TRITON_LORA_DIR"
ID_PATTERN = re.compile(r"^[0-9a-f]{64}$")
SUFFIX = ".safetensors"

#: safetensors' own limit on the JSON header (100 MB, ``safetensors`` ``MAX_HEADER_SIZE``)
MAX_HEADER_BYTES = 100_000_000
#: bytes per element of the accepted dtypes (safetensors dtype names)
DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}
#: the metadata key diffusers reads the LoRA config from (``LORA_ADAPTER_METADATA_KEY``)
DIFFUSERS_METADATA_KEY = "lora_adapter_metadata"

FORMAT_DIFFUSERS, FORMAT_PEFT = "diffusers", "peft"
_DIFFUSERS_KEY = re.compile(r"^transformer\.(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")
_PEFT_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")
_BARE_KEY = re.compile(r"^(?P<module>[A-Za-z_][\w.]*)\.lora_(?P<ab>[AB])\.weight$")


class LoraFileError(ValueError):
    """The adapter cannot be used as given; ``code`` is the OpenAI error code the frontend
    answers with (``invalid_lora``, ``unsupported_lora_format``, ``lora_incompatible``)."""

    def __init__(self, message: str, code: str = "invalid_lora"):
        super().__init__(message)
        self.code = code


def lora_dir() -> Path:
    """The LoRA directory: ``$OMNI_TRITON_LORA_DIR``, else ``$OMNI_TRITON_CACHE/loras``
    (``~/.cache/omni-triton/loras``)."""
    env = os.environ.get(ENV)
    if env:
        return Path(env)
    from omni_triton.paths import cache_dir

    return cache_dir() / "loras"


def check_id(lora_id: str) -> str:
    """``lora_id`` if it is a lowercase hex SHA-256 (64 characters); else ``LoraFileError``."""
    if not ID_PATTERN.match(lora_id):
        raise LoraFileError(f"LORA_ID must be 64 lowercase hex digits (an adapter's SHA-256), got {lora_id[:80]!r}")
    return lora_id


def adapter_file(directory: Path, lora_id: str) -> Path:
    """``<directory>/<id>.safetensors``: the only file an adapter id can name (the id is checked)."""
    return Path(directory) / f"{check_id(lora_id)}{SUFFIX}"


def manifest_file(directory: Path, model: str) -> Path:
    """``<directory>/targets/<model>.json``: the LoRA-targetable modules of a denoiser (written
    by the denoiser at start, read by the frontend to validate adapters)."""
    if not re.match(r"^[A-Za-z0-9_.-]+$", model):
        raise ValueError(f"bad model name {model!r}")
    return Path(directory) / "targets" / f"{model}.json"


def check_scale(scale: float) -> float:
    """``scale`` if finite and within [MIN_LORA_SCALE, MAX_LORA_SCALE]; else ``LoraFileError``."""
    if not (MIN_LORA_SCALE <= scale <= MAX_LORA_SCALE):
        raise LoraFileError(f"LoRA scale {scale}: must be in [{MIN_LORA_SCALE}, {MAX_LORA_SCALE}]",
                            code="invalid_value")
    return float(scale)


# --------------------------------------------------------------------------- safetensors header
@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors header: dtype name, shape, byte offsets in the data section."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass
class Header:
    """A checked safetensors header: ``tensors`` (name -> entry, in file order), ``metadata``
    (``__metadata__``, str -> str), ``data_start`` (byte offset of the data section: 8 + header
    length) and ``data_bytes`` (its length)."""

    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]
    data_start: int
    data_bytes: int


def read_header(f: IO[bytes], size: int) -> Header:
    """Read and check the header of a safetensors file of ``size`` bytes open in ``f`` (at 0).

    Only the header is read (at most :data:`MAX_HEADER_BYTES`); the tensors' offsets must tile
    the data section exactly (no gap, no overlap, nothing after: a truncated file fails here),
    and each tensor's byte length must equal its dtype size times its element count.

    Raises:
        LoraFileError: not a safetensors file, truncated, or an inconsistent header.
    """
    first = f.read(8)
    if len(first) < 8:
        raise LoraFileError("not a safetensors file: shorter than its 8-byte header length")
    n = int.from_bytes(first, "little")
    if n < 2 or n > MAX_HEADER_BYTES or 8 + n > size:
        raise LoraFileError(f"not a safetensors file (header length {n} for a file of {size} bytes)")
    raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise LoraFileError("not a safetensors file: its header is not JSON") from None
    if not isinstance(header, dict):
        raise LoraFileError("not a safetensors file: its header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise LoraFileError("safetensors __metadata__ must map strings to strings")
    data_bytes = size - 8 - n
    tensors: dict[str, TensorEntry] = {}
    for name, info in header.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            if not all(isinstance(v, int) and v >= 0 for v in (*shape, begin, end)):
                raise TypeError
        except (TypeError, KeyError, ValueError):
            raise LoraFileError(f"safetensors header entry {name[:200]!r} is malformed") from None
        if dtype not in DTYPE_BYTES:
            raise LoraFileError(f"tensor {name[:200]!r} has dtype {str(dtype)[:20]}; LoRA weights must be "
                                f"one of {sorted(DTYPE_BYTES)}")
        count = 1
        for d in shape:
            count *= d
        if end - begin != count * DTYPE_BYTES[dtype]:
            raise LoraFileError(f"tensor {name[:200]!r}: {end - begin} bytes for shape {list(shape)} {dtype}")
        tensors[name] = TensorEntry(dtype, shape, begin, end)
    if not tensors:
        raise LoraFileError("the safetensors file holds no tensors")
    pos = 0
    for entry in sorted(tensors.values(), key=lambda e: (e.begin, e.end)):
        if entry.begin != pos:
            raise LoraFileError("safetensors tensors overlap or leave gaps in the data section")
        pos = entry.end
    if pos != data_bytes:
        raise LoraFileError(f"the file is truncated or has trailing bytes: its header covers {pos} bytes of "
                            f"data, the file has {data_bytes}")
    return Header(tensors, metadata, 8 + n, data_bytes)


# --------------------------------------------------------------------------- LoRA structure
@dataclass
class LoraInfo:
    """What :func:`inspect` found: ``format`` (diffusers / peft), ``modules`` (module name ->
    ``(rank, in_features, out_features)``), ``rename`` (old key -> diffusers key; empty for the
    diffusers format), ``metadata`` (the ``__metadata__`` to store) and ``rank`` (the largest)."""

    format: str
    modules: dict[str, tuple[int, int, int]]
    rename: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return max(r for r, _, _ in self.modules.values())

    @property
    def needs_rewrite(self) -> bool:
        """True when the stored file differs from the given one (renamed keys or new metadata)."""
        return bool(self.rename)


def _match(name: str) -> tuple[str, str, str] | None:
    for fmt, pattern in ((FORMAT_DIFFUSERS, _DIFFUSERS_KEY), (FORMAT_PEFT, _PEFT_KEY), (FORMAT_PEFT, _BARE_KEY)):
        m = pattern.match(name)
        if m:
            if fmt == FORMAT_PEFT and pattern is _BARE_KEY and name.startswith(("transformer.", "base_model.")):
                return None
            return fmt, m.group("module"), m.group("ab")
    return None


def inspect(header: Header, *, max_rank: int = 256, adapter_config: dict[str, Any] | None = None) -> LoraInfo:
    """Check that ``header`` is a LoRA for a transformer in an accepted key format.

    Args:
        header: from :func:`read_header`.
        max_rank: largest accepted rank.
        adapter_config: PEFT's ``adapter_config.json`` (its ``r`` and ``lora_alpha``), for the
            PEFT format only; ``None``: alpha = r (diffusers' default, scaling 1).

    Raises:
        LoraFileError: ``unsupported_lora_format`` for other key formats or mixed formats,
            ``invalid_lora`` for a missing A or B, rank mismatches, bad shapes or ranks.
    """
    formats: set[str] = set()
    halves: dict[str, dict[str, TensorEntry]] = {}
    rename: dict[str, str] = {}
    for name, entry in header.tensors.items():
        hit = _match(name)
        if hit is None:
            raise LoraFileError(
                f"unsupported LoRA key {name[:200]!r}: accepted are diffusers keys "
                "'transformer.<module>.lora_A.weight' / '.lora_B.weight' and PEFT keys "
                "'base_model.model.<module>.lora_A.weight' (transformer LoRA only; no alpha keys, "
                "biases, DoRA or Kohya 'lora_unet_' names)", code="unsupported_lora_format")
        fmt, module, ab = hit
        formats.add(fmt)
        if len(entry.shape) != 2:
            raise LoraFileError(f"{name[:200]!r} has shape {list(entry.shape)}; LoRA matrices are 2-D")
        halves.setdefault(module, {})[ab] = entry
        if fmt == FORMAT_PEFT:
            rename[name] = f"transformer.{module}.lora_{ab}.weight"
    if len(formats) > 1:
        raise LoraFileError("the file mixes diffusers ('transformer.') and PEFT key formats",
                            code="unsupported_lora_format")
    fmt = formats.pop()
    modules: dict[str, tuple[int, int, int]] = {}
    for module, pair in halves.items():
        if set(pair) != {"A", "B"}:
            raise LoraFileError(f"module {module[:200]!r} has lora_{''.join(pair)} but not both lora_A and lora_B")
        (r_a, in_f), (out_f, r_b) = pair["A"].shape, pair["B"].shape
        if r_a != r_b:
            raise LoraFileError(f"rank mismatch in {module[:200]!r}: lora_A has rank {r_a}, lora_B {r_b}")
        if not 1 <= r_a <= max_rank:
            raise LoraFileError(f"{module[:200]!r} has rank {r_a}; at most {max_rank}")
        modules[module] = (r_a, in_f, out_f)
    metadata = dict(header.metadata)
    if fmt == FORMAT_DIFFUSERS and adapter_config:
        raise LoraFileError("adapter_config is for PEFT-format files; this file has diffusers keys",
                            code="invalid_value")
    if fmt == FORMAT_PEFT and adapter_config:
        metadata.update(_peft_metadata(adapter_config, modules))
    return LoraInfo(fmt, modules, rename, metadata)


def _peft_metadata(config: dict[str, Any], modules: dict[str, tuple[int, int, int]]) -> dict[str, str]:
    """diffusers' ``lora_adapter_metadata`` for a PEFT adapter whose ``lora_alpha`` differs from
    ``r`` (``{}`` when equal: diffusers' default alpha is r)."""
    try:
        r, alpha = int(config["r"]), float(config.get("lora_alpha", config["r"]))
    except (KeyError, TypeError, ValueError):
        raise LoraFileError("adapter_config needs an integer 'r' (and a number 'lora_alpha')",
                            code="invalid_value") from None
    if config.get("rank_pattern") or config.get("alpha_pattern") or config.get("use_dora"):
        raise LoraFileError("adapter_config with rank_pattern, alpha_pattern or use_dora is not supported",
                            code="unsupported_lora_format")
    ranks = {rank for rank, _, _ in modules.values()}
    if ranks != {r}:
        raise LoraFileError(f"adapter_config says r={r} but the tensors have rank(s) {sorted(ranks)}")
    if not (0 < alpha < 1e6):
        raise LoraFileError(f"adapter_config lora_alpha={alpha}: must be positive", code="invalid_value")
    if alpha == r and not config.get("use_rslora"):
        return {}
    meta = {"r": r, "lora_alpha": alpha, "target_modules": sorted(modules),
            "use_rslora": bool(config.get("use_rslora", False))}
    return {DIFFUSERS_METADATA_KEY: json.dumps({f"transformer.{k}": v for k, v in meta.items()}, sort_keys=True)}


def check_against(modules: dict[str, tuple[int, int, int]], manifest: dict[str, list[int]],
                  model: str = "the model") -> None:
    """Check an adapter's modules (:attr:`LoraInfo.modules`) against a denoiser manifest
    (module name -> ``[in_features, out_features]`` of each Linear of its transformer).

    Raises:
        LoraFileError: ``lora_incompatible``: a module the transformer lacks, or whose shape differs.
    """
    for module, (rank, in_f, out_f) in modules.items():
        shape = manifest.get(module)
        if shape is None:
            raise LoraFileError(f"the adapter targets {module[:200]!r}, which {model}'s transformer does not "
                                "have as a Linear layer", code="lora_incompatible")
        if list(shape) != [in_f, out_f]:
            raise LoraFileError(f"the adapter's {module[:200]!r} is {in_f}->{out_f} (rank {rank}); "
                                f"{model}'s layer is {shape[0]}->{shape[1]}", code="lora_incompatible")


def serialized_header(tensors: dict[str, TensorEntry], rename: dict[str, str], metadata: dict[str, str]) -> bytes:
    """The 8-byte length + JSON header of a safetensors file holding ``tensors`` under their
    ``rename``\\ d keys, with ``metadata``; padded with spaces to a multiple of 8 bytes as
    safetensors writes it. The data section is unchanged (same offsets)."""
    body: dict[str, Any] = {}
    if metadata:
        body["__metadata__"] = metadata
    for name, e in tensors.items():
        body[rename.get(name, name)] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [e.begin, e.end]}
    raw = json.dumps(body, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def manifest_of(named_linears: Iterable[tuple[str, int, int]]) -> dict[str, list[int]]:
    """A manifest (module -> ``[in, out]``) from ``(name, in_features, out_features)`` triples."""
    return {name: [int(i), int(o)] for name, i, o in named_linears}


def write_canonical(src: IO[bytes], dst: IO[bytes], header: Header, info: LoraInfo,
                    chunk: int = 1 << 20) -> None:
    """Write the stored form of an adapter to ``dst``: the diffusers-keyed header
    (:func:`serialized_header` with ``info.rename`` and ``info.metadata``) followed by ``src``'s
    data section, copied in ``chunk``-byte blocks (never the whole file in memory)."""
    dst.write(serialized_header(header.tensors, info.rename, info.metadata))
    src.seek(header.data_start)
    left = header.data_bytes
    while left:
        block = src.read(min(chunk, left))
        if not block:
            raise LoraFileError("the file is shorter than its header says (truncated)")
        dst.write(block)
        left -= len(block)
