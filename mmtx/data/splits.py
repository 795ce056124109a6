"""Splits and the files that make them: which splits there are, the files config of each
(``data.<split>``), and the one-line check that a split's image folder is the right one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SPLITS = ("train", "val", "test")
PROBED_IMAGES = 20  # a split none of whose first this many images exists names the wrong image folder


def split_files(splits: dict[str, dict | None], split: str, needed: tuple[str, ...]) -> dict:
    """The files config ``data.<split>`` with every key of ``needed`` set, else a clear error."""
    files = splits.get(split) or {}
    missing = [k for k in needed if not files.get(k)]
    if missing:
        raise ValueError(f"data.{split}.{missing[0]} is not set (needed to read the {split} split)")
    return files


class FileSplits:
    """What a data module of the user's files adds: ``data.<split>`` names each split's files
    (``train``, ``val``, ``test``: ``{key: path}``); a split is there when its ``index_file`` is."""

    index_file: str  # the key whose file lists a split's examples

    def __init__(self, train: dict | None = None, val: dict | None = None, test: dict | None = None,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(**kwargs)
        self.splits = {"train": train, "val": val, "test": test}

    def has_split(self, split: str) -> bool:
        files = self.splits.get(split)
        return bool(files and files.get(self.index_file))

    def image_folder(self, split: str) -> tuple[str, str] | None:
        folder = (self.splits.get(split) or {}).get("images")
        return (f"data.{split}.images", folder) if folder else None


def check_images_found(split: str, records: list[Any], key: str, folder: str) -> None:
    """One line when none of the first `PROBED_IMAGES` images of ``records`` is in ``folder``
    (config key ``key``): the wrong folder for the annotations, better said once than as a missing
    file per image with the advice to skip them, which would leave out every one."""
    first = [r.path for r in records[:PROBED_IMAGES]]
    if first and all(isinstance(p, Path) and not p.exists() for p in first):
        name = first[0].relative_to(folder) if first[0].is_relative_to(folder) else first[0]
        raise FileNotFoundError(
            f"{key}: none of the first {len(first)} images of the {split} split is in {folder} (e.g. {name}); "
            "is it the folder of these annotations' images?"
        )
