"""Image encoding/decoding for the frontend (Pillow + numpy only, no torch).

Pixels everywhere are ``uint8 [H, W, 3]`` RGB arrays (the ``IMAGE`` tensor of the diffusion
ensembles, docs/image_contracts.md).
"""
from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

#: output_format -> (Pillow format name, MIME type)
FORMATS = {"png": ("PNG", "image/png"), "jpeg": ("JPEG", "image/jpeg"), "webp": ("WEBP", "image/webp")}
#: upload limit in pixels (Pillow's decompression-bomb guard, tightened: ~16.7 MP)
MAX_UPLOAD_PIXELS = 4096 * 4096
#: Pillow formats probed for client images (a camera's multi-picture JPEG opens as JPEG/MPO: its
#: first picture is decoded)
UPLOAD_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")


class UnsupportedImageFormatError(ValueError):
    """``output_format`` is not one of :data:`FORMATS`."""


class InvalidImageError(ValueError):
    """An uploaded file is not a decodable image (or is too large)."""


class ImageTooLargeError(InvalidImageError):
    """An uploaded image has more pixels than allowed."""


class MaskWithoutAlphaError(InvalidImageError):
    """An uploaded edit mask has no alpha channel (OpenAI: the mask's transparent pixels mark
    the area to edit)."""


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


#: bytes of decompressed PNG text (zTXt/iTXt/iCCP) one image may hold: Pillow's own
#: ``PngImagePlugin.MAX_TEXT_MEMORY`` is 64 MB (a 211 KB PNG of 200 zTXt chunks grew the process
#: by 66 MB); client images' text is never used, so it is lowered to this on first use
MAX_PNG_TEXT_BYTES = 1 << 20


def _limit_png_text() -> None:
    from PIL import PngImagePlugin

    PngImagePlugin.MAX_TEXT_MEMORY = min(PngImagePlugin.MAX_TEXT_MEMORY, MAX_PNG_TEXT_BYTES)
    PngImagePlugin.MAX_TEXT_CHUNK = min(PngImagePlugin.MAX_TEXT_CHUNK, MAX_PNG_TEXT_BYTES)


def _rgb(img):
    return img.convert("RGB")


def open_image(data: bytes, max_pixels: int = MAX_UPLOAD_PIXELS, exif_transpose: bool = False,
               convert: Callable[[Any], Any] = _rgb):
    """A client's image file -> RGB ``PIL.Image`` (alpha dropped; ``exif_transpose``: a camera
    photo's EXIF orientation applied first; ``convert``: what is made of the decoded frame
    instead of its RGB copy, e.g. its alpha channel, :func:`decode_mask_alpha`): the one image
    decoder of the project, safe against decompression bombs:

    - only :data:`UPLOAD_FORMATS` are probed (no TIFF/PSD/ICO... parsers for client bytes);
    - the size is read from the header (``Image.open`` is lazy) and ``width * height`` checked
      against ``max_pixels`` before any pixel is decoded (Pillow's own ``MAX_IMAGE_PIXELS`` guard
      is far looser: 89 MP warns, 179 MP refuses);
    - an animation (GIF, APNG, animated WebP) decodes its first frame only (frames are never
      counted or seeked: ``n_frames`` would parse every frame);
    - a truncated file is refused (Pillow's ``LOAD_TRUNCATED_IMAGES`` stays off);
    - PNG text chunks decompress to at most :data:`MAX_PNG_TEXT_BYTES` in all (Pillow's
      process-wide limits, lowered).

    Memory: at most ``max_pixels`` * 4 bytes for the decoded frame plus its RGB copy.

    Raises:
        ImageTooLargeError: more than ``max_pixels`` pixels (judged from the header).
        InvalidImageError: empty, not an image of :data:`UPLOAD_FORMATS`, truncated or damaged.
    """
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise InvalidImageError("the uploaded image is empty")
    _limit_png_text()
    try:
        img = Image.open(io.BytesIO(data), formats=UPLOAD_FORMATS)
    except Image.DecompressionBombError as exc:  # over Pillow's own (looser) guard: header only
        raise ImageTooLargeError(f"the uploaded image is too large ({exc})") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise InvalidImageError(f"the uploaded file is not a readable image ({type(exc).__name__})") from None
    with img:
        w, h = img.size
        if w * h > max_pixels:
            raise ImageTooLargeError(f"the uploaded image: {w}x{h} = {w * h} pixels is over the limit of "
                                     f"{max_pixels} pixels")
        try:
            img.load()  # the current frame: the first one of an animation
            if img.size != (w, h):  # a frame that grew past the header's size (GIF frames can)
                raise ImageTooLargeError(f"the uploaded image grew to {img.size[0]}x{img.size[1]} while decoding")
            if exif_transpose:
                from PIL import ImageOps

                img = ImageOps.exif_transpose(img)
            return convert(img)
        except InvalidImageError:
            raise
        except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as exc:
            raise InvalidImageError(f"the uploaded file is not a readable image ({type(exc).__name__})") from None


def decode_image(data: bytes, max_pixels: int = MAX_UPLOAD_PIXELS, exif_transpose: bool = False) -> np.ndarray:
    """Decode an uploaded PNG/JPEG/WEBP/GIF/BMP file to ``uint8 [H, W, 3]`` RGB through
    :func:`open_image` (header size checked before decoding; first frame of an animation).

    Raises:
        ImageTooLargeError: over ``max_pixels`` (judged from the header, before decoding).
        InvalidImageError: empty, not an image Pillow can read, truncated.
    """
    return np.asarray(open_image(data, max_pixels, exif_transpose), dtype=np.uint8)


def _alpha(img):
    """The frame's alpha channel as an ``L`` image; :class:`MaskWithoutAlphaError` when it has
    none (an RGBA/LA/PA frame, or a palette/grey/RGB one with a ``transparency`` entry, has one)."""
    if not img.has_transparency_data:
        raise MaskWithoutAlphaError(f"the mask has no alpha channel (mode {img.mode}); OpenAI's mask is a "
                                    "PNG whose fully transparent pixels (alpha 0) mark the area to edit")
    return img.convert("RGBA").getchannel("A")


def decode_mask_alpha(data: bytes, max_pixels: int = MAX_UPLOAD_PIXELS) -> np.ndarray:
    """An uploaded edit mask -> its alpha channel ``uint8 [H, W]`` (0 = fully transparent),
    decoded by :func:`open_image` with its limits (header size checked before decoding).

    Raises:
        ImageTooLargeError: over ``max_pixels``.
        MaskWithoutAlphaError: the image has no alpha channel.
        InvalidImageError: empty, not an image Pillow can read, truncated.
    """
    return np.asarray(open_image(data, max_pixels, convert=_alpha), dtype=np.uint8)


def fit_image(pixels: np.ndarray, width: int, height: int) -> np.ndarray:
    """Centre-crop ``uint8 [H, W, 3]`` pixels to the aspect ratio ``width : height`` and resize
    them to exactly ``width x height`` (Lanczos): Pillow's ``ImageOps.fit``. Nothing is
    stretched; an image already of that size is returned unchanged.

    Returns:
        ``uint8 [height, width, 3]``.
    """
    from PIL import Image, ImageOps

    if pixels.shape[:2] == (height, width):
        return pixels
    img = Image.fromarray(np.ascontiguousarray(pixels), "RGB")
    return np.asarray(ImageOps.fit(img, (width, height), method=Image.Resampling.LANCZOS), dtype=np.uint8)


def size_for_aspect(image_width: int, image_height: int, area: int, multiple: int, max_size: int) -> tuple[int, int]:
    """(width, height) with the image's aspect ratio and about ``area`` pixels, each a multiple
    of ``multiple`` in ``[multiple, max_size]`` (how diffusers' Wan image-to-video example sizes
    its video from the input image)."""
    aspect = image_height / image_width
    h = round((area * aspect) ** 0.5) // multiple * multiple
    w = round((area / aspect) ** 0.5) // multiple * multiple
    return (min(max(w, multiple), max_size // multiple * multiple),
            min(max(h, multiple), max_size // multiple * multiple))


def png_base64(pixels: np.ndarray) -> str:
    """``uint8 [H, W, 3]`` -> base64 (ASCII) of its PNG: how a video job stores its reference image."""
    import base64

    return base64.b64encode(encode_image(pixels, "png").data).decode("ascii")


def pixels_from_png_base64(text: str) -> np.ndarray:
    """Inverse of :func:`png_base64` (``uint8 [H, W, 3]``).

    Raises:
        InvalidImageError: not a base64 PNG.
    """
    import base64
    import binascii

    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidImageError("the stored reference image is not base64") from None
    return decode_image(data)
