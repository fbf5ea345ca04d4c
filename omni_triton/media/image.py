"""Image encoding/decoding for the frontend (Pillow + numpy only, no torch).

Pixels everywhere are ``uint8 [H, W, 3]`` RGB arrays (the ``IMAGE`` tensor of the diffusion
ensembles, docs/image_contracts.md).
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

#: output_format -> (Pillow format name, MIME type)
FORMATS = {"png": ("PNG", "image/png"), "jpeg": ("JPEG", "image/jpeg"), "webp": ("WEBP", "image/webp")}
#: upload limit in pixels (Pillow's decompression-bomb guard, tightened: ~16.7 MP)
MAX_UPLOAD_PIXELS = 4096 * 4096


class UnsupportedImageFormatError(ValueError):
    """``output_format`` is not one of :data:`FORMATS`."""


class InvalidImageError(ValueError):
    """An uploaded file is not a decodable image (or is too large)."""


@dataclass(frozen=True)
class EncodedImage:
    """One encoded image: ``data`` bytes in ``fmt`` (``png``/``jpeg``/``webp``), its MIME type."""

    data: bytes
    fmt: str
    mime_type: str


def normalise_format(name: str | None) -> str:
    """``png``/``jpeg``/``webp`` (``jpg`` accepted as ``jpeg``; ``None`` -> ``png``).

    Raises:
        UnsupportedImageFormatError: any other name.
    """
    fmt = (name or "png").lower()
    fmt = "jpeg" if fmt == "jpg" else fmt
    if fmt not in FORMATS:
        raise UnsupportedImageFormatError(
            f"Unsupported output_format '{name}'; supported: {', '.join(FORMATS)}")
    return fmt


def encode_image(pixels: np.ndarray, fmt: str = "png", compression: int | None = None) -> EncodedImage:
    """Encode ``uint8 [H, W, 3]`` RGB pixels.

    Args:
        pixels: the image.
        fmt: ``png`` (lossless; ``compression`` 0-100 maps to zlib level 0-9), ``jpeg`` or
            ``webp`` (``compression`` 0-100 is OpenAI's ``output_compression``: quality =
            100 - compression; default quality 90 for jpeg, 80 for webp, Pillow's defaults).

    Raises:
        UnsupportedImageFormatError: unknown ``fmt``.
        ValueError: ``pixels`` is not ``uint8 [H, W, 3]`` or ``compression`` outside 0-100.
    """
    from PIL import Image

    fmt = normalise_format(fmt)
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"pixels must be uint8 [H, W, 3], got {pixels.dtype} {list(pixels.shape)}")
    if compression is not None and not 0 <= compression <= 100:
        raise ValueError("output_compression must be in [0, 100]")
    pil_name, mime = FORMATS[fmt]
    kwargs: dict = {}
    if fmt == "png" and compression is not None:
        kwargs["compress_level"] = round(compression * 9 / 100)
    elif fmt in ("jpeg", "webp") and compression is not None:
        kwargs["quality"] = 100 - compression
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels), "RGB").save(buf, format=pil_name, **kwargs)
    return EncodedImage(buf.getvalue(), fmt, mime)


def decode_image(data: bytes) -> np.ndarray:
    """Decode an uploaded PNG/JPEG/WEBP/... file to ``uint8 [H, W, 3]`` RGB (alpha dropped).

    Raises:
        InvalidImageError: empty, not an image Pillow can read, truncated, or over
            :data:`MAX_UPLOAD_PIXELS`.
    """
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise InvalidImageError("the uploaded image is empty")
    try:
        with Image.open(io.BytesIO(data)) as img:
            w, h = img.size
            if w * h > MAX_UPLOAD_PIXELS:
                raise InvalidImageError(f"the uploaded image is {w}x{h}; at most {MAX_UPLOAD_PIXELS} pixels")
            img.load()
            return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except InvalidImageError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise InvalidImageError(f"the uploaded file is not a readable image ({type(exc).__name__})") from None
