"""Reading and writing the safetensors format, without the ``safetensors`` package.

A file is: an 8-byte little-endian unsigned header length ``n``; ``n`` bytes of UTF-8 JSON
mapping each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets into
the data that follows the header; an optional ``"__metadata__"`` maps strings to strings); then
the tensors' raw little-endian bytes in C order, back to back, covering the data exactly.
Loading is safe by construction: nothing in the file is executed.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["DTYPES", "SafetensorsError", "load_file", "read_header", "save_file"]

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16, "U8": torch.uint8,
    "BOOL": torch.bool,
}  # fmt: skip
_CODES = {dtype: code for code, dtype in DTYPES.items()}
_MAX_HEADER = 100_000_000  # bytes, the reference implementation's limit
METADATA_KEY = "__metadata__"


class SafetensorsError(ValueError):
    """A file that is not valid safetensors, or tensors that cannot be written as such."""


def _check_host() -> None:
    if sys.byteorder != "little":
        raise SafetensorsError("safetensors data is little-endian; this big-endian host is not supported")


def save_file(tensors: Mapping[str, Tensor], path: str | Path, metadata: Mapping[str, str] | None = None) -> Path:
    """Write ``tensors`` to ``path`` (atomically: a temporary file renamed over it); returns the path.

    Tensors are stored largest element size first, so every tensor starts at an offset aligned
    to its element size (the header is padded to 8 bytes, as the reference writer does).
    """
    _check_host()
    path = Path(path)
    items = []
    for name, tensor in tensors.items():
        if not isinstance(name, str) or name == METADATA_KEY:
            raise SafetensorsError(f"{path}: invalid tensor name {name!r}")
        if not isinstance(tensor, Tensor) or tensor.layout != torch.strided:
            raise SafetensorsError(f"{path}: {name!r} is not a dense tensor ({type(tensor).__name__})")
        if tensor.dtype not in _CODES:
            raise SafetensorsError(f"{path}: {name!r} has dtype {tensor.dtype}, which safetensors cannot store")
        items.append((name, tensor.detach().to("cpu").contiguous()))
    items.sort(key=lambda item: (-item[1].element_size(), item[0]))

    header: dict[str, object] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise SafetensorsError(f"{path}: metadata must map strings to strings")
        header[METADATA_KEY] = dict(metadata)
    offset = 0
    for name, tensor in items:
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": _CODES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + size]
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(len(raw).to_bytes(8, "little"))
            f.write(raw)
            for _, tensor in items:
                if tensor.numel():
                    f.write(tensor.reshape(-1).view(torch.uint8).numpy())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_header(path: str | Path) -> tuple[dict[str, dict], dict[str, str], int]:
    """The validated header of ``path``: (tensor entries by name, metadata, data start in bytes)."""
    path = Path(path)
    if not path.is_file():
        raise SafetensorsError(f"{path}: file not found")
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise SafetensorsError(f"{path}: too short to be a safetensors file ({size} bytes)")
        n = int.from_bytes(prefix, "little")
        if n > _MAX_HEADER or 8 + n > size:
            raise SafetensorsError(f"{path}: header length {n} is invalid for a file of {size} bytes")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SafetensorsError(f"{path}: header is not UTF-8 JSON ({e})") from e
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    metadata = header.pop(METADATA_KEY, None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise SafetensorsError(f"{path}: {METADATA_KEY} must map strings to strings")

    data_size, spans = size - 8 - n, []
    for name, entry in header.items():
        try:
            dtype, shape, (begin, end) = DTYPES[entry["dtype"]], entry["shape"], entry["data_offsets"]
        except (KeyError, TypeError, ValueError) as e:
            raise SafetensorsError(f"{path}: tensor {name!r} has an invalid entry {entry!r}") from e
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise SafetensorsError(f"{path}: tensor {name!r} has an invalid shape {shape!r}")
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= data_size):
            raise SafetensorsError(f"{path}: tensor {name!r} has offsets {[begin, end]} outside the data")
        expected = math.prod(shape) * dtype.itemsize
        if end - begin != expected:
            raise SafetensorsError(
                f"{path}: tensor {name!r} ({entry['dtype']}, shape {shape}) needs {expected} bytes, "
                f"its offsets span {end - begin}"
            )
        spans.append((begin, end, name))
    position = 0
    for begin, end, name in sorted(spans):
        if begin != position:
            raise SafetensorsError(f"{path}: tensor {name!r} starts at {begin}, expected {position} (gap or overlap)")
        position = end
    if position != data_size:
        raise SafetensorsError(f"{path}: tensors cover {position} of the {data_size} data bytes")
    return header, metadata, 8 + n


def load_file(path: str | Path, device: str | torch.device = "cpu") -> dict[str, Tensor]:
    """All tensors of ``path``, by name. On the CPU they are read lazily from a private memory
    map (copy-on-write: changing a tensor never changes the file)."""
    _check_host()
    header, _, start = read_header(path)
    storage = torch.UntypedStorage.from_file(str(path), False, Path(path).stat().st_size)
    data = torch.empty(0, dtype=torch.uint8).set_(storage)  # the whole file, (size,) bytes
    tensors = {}
    for name, entry in header.items():
        dtype = DTYPES[entry["dtype"]]
        begin, end = (start + offset for offset in entry["data_offsets"])
        raw = data[begin:end]
        if begin % dtype.itemsize:
            raw = raw.clone()  # an unaligned tensor (not from our writer) gets its own memory
        tensors[name] = raw.view(dtype).reshape(entry["shape"]).to(device)
    return tensors
