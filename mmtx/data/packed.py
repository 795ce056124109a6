"""A read-only list kept as one byte buffer, for the records that loader workers read.

Loader workers are forked from the process that holds the data set; reading a Python object
there writes its reference count, which copies the memory page holding it into the worker. Over
an epoch every record's page is touched, so each worker ends up with its own copy of a big
annotation file's millions of small objects, and the machine's memory grows with the number of
workers (PyTorch issue 13246). `PackedList` keeps each item pickled in one NumPy byte buffer
(offsets in another): reading an item builds a fresh object from bytes that no one writes, so
the shared pages stay shared.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar, overload

import numpy as np

T = TypeVar("T")


class PackedList(Sequence[T]):
    """``items`` pickled into one buffer; ``packed[i]`` unpickles item ``i`` (a new object)."""

    def __init__(self, items: Iterable[T]) -> None:
        blobs = [pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL) for item in items]
        self.offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in blobs], out=self.offsets[1:])
        self.buffer = np.frombuffer(b"".join(blobs), dtype=np.uint8)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> list[T]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} items")
        return pickle.loads(self.buffer[self.offsets[i] : self.offsets[i + 1]])

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes + self.offsets.nbytes
