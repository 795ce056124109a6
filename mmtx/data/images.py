"""Load any image file as an upright 8-bit RGB PIL image, or fail with the file's name.

Data sets in the wild hold grayscale, palette, alpha, CMYK and 16-bit files, JPEGs whose
pixels are stored sideways with an EXIF orientation tag, and the odd truncated download.
`load_image` turns all of them into the one thing the transforms expect, and turns every
decoder failure into an `ImageLoadError` that says which file broke and why. `read_image` gives
the same pixels as a uint8 tensor, decoded by TorchCodec (libjpeg-turbo, libpng: PyTorch's image
decoders, which replace torchvision.io's; ``scripts/bench_decode.py`` times them) wherever that
decoder gives them — 8-bit RGB and grayscale JPEG and PNG — and by `load_image` otherwise. `check_image` is the cheap
counterpart for a pre-flight scan (headers, checksums, the end of a JPEG), and `scan_images`
runs it over a whole split with a progress bar. Both readers also take a `FileSlice`: an image
stored inside a larger file, as a member of a WebDataset tar shard is.

Image files are untrusted (downloaded by the million), so every path here opens a file with
Pillow's lazy ``Image.open`` first, which parses the header and decodes nothing, and refuses it
before any decoder runs unless it is one of the raster formats training images come in
(`IMAGE_FORMATS`: no other Pillow plugin is even tried, so a PostScript file named ``.png`` never
reaches Ghostscript) and its width x height is at most ``max_pixels`` (``data.max_image_pixels``,
`MAX_IMAGE_PIXELS` by default): a small PNG of one colour can declare a huge image.
"""

from __future__ import annotations

import functools
import io
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

import numpy as np
import torch
from PIL import Image, ImageOps
from torchvision.transforms.v2.functional import pil_to_tensor
from tqdm import tqdm

try:
    from torchcodec.decoders import decode_image
except (ImportError, OSError, RuntimeError) as _unavailable:  # not installed, or built for another torch
    # TorchCodec's compiled ops follow torch releases, and GPU images often ship a torch that no
    # TorchCodec release matches: torchvision.io's decoders (the same libjpeg-turbo and libpng;
    # deprecated for TorchCodec since torchvision 0.29) give the same pixels there.
    from torchvision.io import ImageReadMode, read_file
    from torchvision.io import decode_image as _decode_tensor

    warnings.warn(f"TorchCodec cannot be loaded ({_unavailable}); torchvision.io decodes the images", stacklevel=1)

    def decode_image(source: Path | torch.Tensor, mode: str = "RGB") -> torch.Tensor:
        """TorchCodec's ``decode_image`` (file or encoded bytes), by torchvision.io."""
        data = read_file(str(source)) if isinstance(source, Path) else source
        return _decode_tensor(data, mode=ImageReadMode[mode], apply_exif_orientation=True)


# Pillow's default ``Image.MAX_IMAGE_PIXELS`` (a 0.25 GiB RGB image), fixed here rather than read
# from Pillow, where another library may have raised or disabled it: data.max_image_pixels by default.
MAX_IMAGE_PIXELS = 89_478_485
# The raster formats training images come in, as Pillow names them; multi-picture JPEGs from phones
# (Pillow's "MPO") open through the JPEG plugin, so are read too.
IMAGE_FORMATS: tuple[str, ...] = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
_NOT_RASTER = f"not a raster image mmtx reads ({', '.join(IMAGE_FORMATS)}): cannot identify its format"

# Transparent pixels are composited onto white: transparent regions in logos, icons and
# scanned documents are meant to be shown on a (white) page, and white keeps dark line art
# readable. Change this constant, not the call sites, if a data set needs black.
ALPHA_BACKGROUND: tuple[int, int, int] = (255, 255, 255)

_ALPHA_MODES = frozenset({"RGBA", "RGBa", "LA", "La", "PA"})
_TIFF_BITS_PER_SAMPLE = 258
_JPEG_END = b"\xff\xd9"  # the EOI marker every complete JPEG ends with (before any zero padding)
_SCAN_THREADS = 8  # checking is mostly waiting for the disk: threads overlap that
_FAST_FORMATS = frozenset({"JPEG", "PNG"})  # what TorchCodec decodes to the same pixels ...
_FAST_MODES = frozenset({"RGB", "L"})  # ... in these 8-bit modes without transparency


@dataclass(frozen=True)
class FileSlice:
    """``size`` bytes at ``offset`` of ``file``, named ``name`` (e.g. a tar shard's member
    ``KEY.jpg``): an image that is not a file of its own, read with one seek."""

    file: Path
    offset: int
    size: int
    name: str

    def read_bytes(self) -> bytes:
        with open(self.file, "rb") as f:
            f.seek(self.offset)
            data = f.read(self.size)
        if len(data) != self.size:
            raise OSError(f"{self.file} ends {self.size - len(data)} bytes into {self.name}")
        return data

    def __str__(self) -> str:
        return f"{self.file}:{self.name}"


ImageSource = str | os.PathLike | FileSlice
T = TypeVar("T")
R = TypeVar("R")


class ImageLoadError(Exception):
    """An image file could not be read; `path` is the file and `reason` says why."""

    def __init__(self, path: ImageSource, reason: str) -> None:
        super().__init__(str(path), reason)  # both in args, so the error pickles across workers
        self.path = Path(str(path))
        self.reason = reason

    def __str__(self) -> str:
        return f"cannot load image {self.path}: {self.reason}"


def load_image(path: ImageSource, max_pixels: int = MAX_IMAGE_PIXELS) -> Image.Image:
    """Open `path`, fully decode it, apply its EXIF orientation and return it as 8-bit RGB.

    Alpha (including palette transparency) is composited onto `ALPHA_BACKGROUND`; 16- and
    32-bit integer images are scaled to 8 bits by their bit depth; float images by their
    range (see `_high_depth_to_uint8`). Only `IMAGE_FORMATS` of at most ``max_pixels`` pixels
    are decoded (see the module docs); Pillow's own decompression-bomb limit stays in force.

    Raises:
        ImageLoadError: the file is missing, empty, not an image, truncated, too large or
            in a mode that has no RGB meaning; the message names the file.
    """
    return _decoded_by_pillow(*_opened(path, max_pixels), max_pixels)


def _decoded_by_pillow(path: ImageSource, file: Path | BinaryIO, max_pixels: int) -> Image.Image:
    """`load_image` of what `_opened` gave (a slice's bytes are read once, not again)."""
    # Decoders signal broken input with many exception types (OSError, SyntaxError,
    # struct.error, IndexError from malformed EXIF, ...), so this boundary converts all of
    # them, keeping the original as the cause.
    with _header(path, file, max_pixels) as raw:
        try:
            raw.load()  # decode now so a truncated file fails here, not inside a worker later
            return _to_rgb(ImageOps.exif_transpose(raw))
        except Exception as err:
            raise ImageLoadError(path, f"{type(err).__name__}: {err}") from err


def read_image(path: ImageSource, max_pixels: int = MAX_IMAGE_PIXELS) -> torch.Tensor:
    """The upright 8-bit RGB pixels of `path` as a uint8 tensor (3, H, W): those of `load_image`.

    8-bit RGB or grayscale JPEG and PNG files without transparency (most photos) are decoded by
    TorchCodec (EXIF orientation applied); every other file by `load_image`. Either way the
    header is checked first, as `load_image` does: TorchCodec has no size limit of its own.

    Raises:
        ImageLoadError: as `load_image`.
    """
    path, file = _opened(path, max_pixels)
    with _header(path, file, max_pixels) as img:
        fast = _decoded_alike(img)
    if fast:
        try:
            data = file if isinstance(file, Path) else torch.frombuffer(bytearray(file.getvalue()), dtype=torch.uint8)
            return decode_image(data, mode="RGB")
        except Exception as err:  # as in load_image: decoders raise many types
            raise ImageLoadError(path, f"{type(err).__name__}: {err}") from err
    if isinstance(file, Path):
        return pil_to_tensor(load_image(file, max_pixels=max_pixels))
    file.seek(0)  # a slice's bytes, already read
    return pil_to_tensor(_decoded_by_pillow(path, file, max_pixels))


def _decoded_alike(img: Image.Image) -> bool:
    """Whether TorchCodec decodes the opened (not loaded) ``img`` to `load_image`'s pixels: 8-bit
    RGB or grayscale JPEG and PNG without transparency. A 16-bit RGB PNG also opens as mode RGB,
    but its raw mode ("RGB;16B") says so: the two decoders round its samples to 8 bits apart."""
    if img.format not in _FAST_FORMATS or img.mode not in _FAST_MODES or "transparency" in img.info:
        return False
    args = img.tile[0].args if img.tile else None
    return (args[0] if isinstance(args, tuple) else args) == img.mode


def check_image(path: str | os.PathLike, max_pixels: int = MAX_IMAGE_PIXELS) -> str | None:
    """Why ``path`` cannot be loaded, or None if it looks fine; far cheaper than `load_image`.

    Checks that the file exists, is not empty and has the header of an image `load_image`
    decodes (one of `IMAGE_FORMATS`, at most ``max_pixels`` pixels, within Pillow's own
    decompression-bomb limit), then its integrity as cheaply as the format allows: a PNG's
    chunk checksums (``verify``), a JPEG's end-of-image marker (a full decode only when the
    marker is missing, as some cameras append data after it), a full decode for other formats.
    A file that passes can still fail to decode (corrupt data inside a complete JPEG); such
    failures are left to `load_image` during training. Reasons read as `load_image`'s do.
    """
    path = Path(path)
    problem = _file_problem(path, max_pixels)
    if problem is not None:
        return problem
    try:
        with _header(path, path, max_pixels) as img:
            fmt = img.format
            if fmt == "PNG":
                img.verify()
            elif fmt != "JPEG":
                _to_rgb(ImageOps.exif_transpose(img))  # loads, and finds modes with no RGB meaning
        if fmt == "JPEG" and not _ends_like_jpeg(path):
            with _header(path, path, max_pixels) as img:
                img.draft("RGB", (1, 1))  # decode at 1/8 scale: every byte is still read
                img.load()
    except ImageLoadError as err:
        return err.reason
    except Exception as err:  # as in load_image: decoders raise many types
        return f"{type(err).__name__}: {err}"
    return None


def header_size(source: ImageSource, max_pixels: int = MAX_IMAGE_PIXELS) -> tuple[int, int]:
    """(width, height) as the file's header states it (before any EXIF rotation), nothing
    decoded; an `ImageLoadError` naming the file where `load_image` would refuse it."""
    path, file = _opened(source, max_pixels)
    with _header(path, file, max_pixels) as img:
        return img.size


def scan_images(
    paths: Iterable[str | os.PathLike], desc: str = "checking images", max_pixels: int = MAX_IMAGE_PIXELS
) -> dict[Path, str]:
    """``{path: reason}`` for each of ``paths`` that `check_image` finds bad (each path once),
    checked on a few threads with a progress bar (`map_images`)."""
    unique = list(dict.fromkeys(Path(p) for p in paths))
    check = functools.partial(check_image, max_pixels=max_pixels)
    problems = map_images(check, unique, min(_SCAN_THREADS, max(1, len(unique) // 64)), desc)
    return {path: problem for path, problem in zip(unique, problems) if problem is not None}


def map_images(fn: Callable[[T], R], items: list[T], max_threads: int, desc: str) -> Iterator[R]:
    """``fn(item)`` for each of ``items``, in order, computed on up to ``max_threads`` threads
    (at most one per CPU), with a progress bar on the terminal (none when output is redirected)."""
    with (
        ThreadPoolExecutor(min(max_threads, os.cpu_count() or 1)) as pool,
        tqdm(total=len(items), desc=desc, unit="img", file=sys.stderr, disable=None, leave=False) as bar,
    ):
        for result in pool.map(fn, items):
            yield result
            bar.update()


def _opened(source: ImageSource, max_pixels: int) -> tuple[ImageSource, Path | BinaryIO]:
    """``source`` and what the decoders open: the file's path, or a slice's bytes in memory
    (read only if it is no larger than `max_file_bytes` allows)."""
    if isinstance(source, FileSlice):
        if source.size > max_file_bytes(max_pixels):
            raise ImageLoadError(source, _too_many_bytes(source.size, max_pixels))
        try:
            return source, io.BytesIO(source.read_bytes())
        except OSError as err:
            raise ImageLoadError(source, getattr(err, "strerror", None) or str(err)) from err
    path = Path(source)
    problem = _file_problem(path, max_pixels)
    if problem is not None:
        raise ImageLoadError(path, problem)
    return path, path


def max_file_bytes(max_pixels: int) -> int:
    """The most bytes an image file of at most ``max_pixels`` pixels may have: every pixel stored
    raw at 16-bit RGBA, and room for metadata, thumbnails and what phones append (a motion
    photo's video). A file larger than that holds something else, and is not read into memory."""
    return max_pixels * 8 + 64 * 2**20


def _too_many_bytes(size: int, max_pixels: int) -> str:
    return (
        f"{size:,} bytes, more than an image of up to {max_pixels:,} pixels (data.max_image_pixels) "
        f"takes ({max_file_bytes(max_pixels):,})"
    )


def _header(path: ImageSource, file: Path | BinaryIO, max_pixels: int) -> Image.Image:
    """``file`` opened by Pillow, its header parsed and nothing decoded, if it is one of
    `IMAGE_FORMATS` with at most ``max_pixels`` pixels; else `ImageLoadError` naming ``path``."""
    try:
        with warnings.catch_warnings():
            # Pillow warns of an image over its own limit as it opens it: the size is compared below.
            # (Before Python 3.14 the filter is process-wide: threads opening images at once can
            # only see it a moment early or late, which decides whether this warning shows, no more.)
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(file, formats=IMAGE_FORMATS)
    except Image.UnidentifiedImageError as err:
        raise ImageLoadError(path, _NOT_RASTER) from err
    except Image.DecompressionBombError as err:  # over twice Pillow's limit: refused before its size is known here
        raise ImageLoadError(path, _bomb_reason(err, max_pixels)) from err
    except Exception as err:  # a header broken in a way the plugin does not catch
        raise ImageLoadError(path, f"{type(err).__name__}: {err}") from err
    width, height = img.size
    if width * height > max_pixels:
        img.close()
        raise ImageLoadError(
            path,
            f"{width}x{height} = {width * height:,} pixels, over the limit of {max_pixels:,} (data.max_image_pixels)",
        )
    return img


def _bomb_reason(err: Image.DecompressionBombError, max_pixels: int) -> str:
    """What Pillow's refusal of an image over twice its own limit means against ``max_pixels``."""
    found = re.search(r"\((\d+) pixels\)", str(err))  # "Image size (400000000 pixels) exceeds limit of ..."
    if found and int(found[1]) > max_pixels:
        return f"{int(found[1]):,} pixels, over the limit of {max_pixels:,} (data.max_image_pixels)"
    return f"{type(err).__name__}: {err} (Pillow's own limit: PIL.Image.MAX_IMAGE_PIXELS)"


def _file_problem(path: Path, max_pixels: int) -> str | None:
    """Why ``path`` is not a readable, non-empty regular file of at most `max_file_bytes` (None if it is)."""
    try:
        size = path.stat().st_size
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the name
        return getattr(err, "strerror", None) or f"{type(err).__name__}: {err}"
    if not path.is_file():
        return "not a regular file"
    if size == 0:
        return "file is empty"
    if size > max_file_bytes(max_pixels):
        return _too_many_bytes(size, max_pixels)
    return None


def _ends_like_jpeg(path: Path) -> bool:
    """Whether the file ends with the JPEG end-of-image marker, ignoring trailing zero bytes."""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - 4096))
        return f.read().rstrip(b"\0").endswith(_JPEG_END)


def _to_rgb(img: Image.Image) -> Image.Image:
    """Convert a decoded image of any mode to 8-bit RGB (see `load_image`)."""
    if img.mode.startswith("I") or img.mode == "F":
        return Image.fromarray(_high_depth_to_uint8(img)).convert("RGB")
    if img.mode in _ALPHA_MODES or "transparency" in img.info:
        rgba = img.convert("RGBA")  # also resolves palette / tRNS transparency
        background = Image.new("RGBA", rgba.size, (*ALPHA_BACKGROUND, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    if img.mode == "RGB":
        return img
    try:
        return img.convert("RGB")  # 1, L, P, CMYK, YCbCr, HSV
    except ValueError as err:
        raise ValueError(f"image mode {img.mode!r} has no RGB conversion") from err


def _high_depth_to_uint8(img: Image.Image) -> np.ndarray:
    """Scale a single-channel 16/32-bit integer or float image to uint8 without clipping.

    Integers are divided by the largest value of their real bit depth: the TIFF
    BitsPerSample tag when there is one (12-bit sensors store into 16-bit containers),
    16 for the I;16 modes, and for 32-bit mode I the smallest of 16/32 bits that holds the
    samples (16-bit PNG/PGM data often arrives as mode I). Negative samples become 0.
    Floats in [0, 1] are taken as unit range, floats in [0, 255] as 8-bit range, anything
    else is stretched from its minimum to its maximum.
    """
    arr = np.asarray(img)
    if img.mode == "F":
        arr = arr.astype(np.float64)
        lo, hi = float(arr.min()), float(arr.max())
        if not np.isfinite([lo, hi]).all():
            raise ValueError("float image holds NaN or infinite values")
        if lo >= 0.0 and hi <= 1.0:
            scaled = arr * 255.0
        elif lo >= 0.0 and hi <= 255.0:
            scaled = arr
        else:
            scaled = (arr - lo) * (255.0 / (hi - lo)) if hi > lo else np.zeros_like(arr)
        return np.rint(scaled).astype(np.uint8)

    arr = arr.astype(np.int64)
    declared = _declared_bits(img)
    if img.mode.startswith("I;16"):
        bits = declared if declared is not None and declared <= 16 else 16
    elif declared is not None and declared < 32:
        bits = declared
    else:
        bits = 16 if arr.max(initial=0) <= 0xFFFF else 31  # mode I is signed 32-bit
    peak = (1 << bits) - 1
    scaled = np.clip(arr, 0, peak) * (255.0 / peak)
    return np.rint(scaled).astype(np.uint8)


def _declared_bits(img: Image.Image) -> int | None:
    """Bits per sample declared by the file (TIFF only; other formats do not say)."""
    tags = getattr(img, "tag_v2", None)
    if tags is None:
        return None
    bits = tags.get(_TIFF_BITS_PER_SAMPLE)
    if isinstance(bits, tuple):
        bits = bits[0] if bits else None
    return int(bits) if bits else None
