"""Reading a split's records and screening them, where bad input is cheapest to name.

See `mmtx.data.bad_data` for the policies: a split's annotation entries are screened as they are
read, its image files by a pre-flight scan before any training, texts longer than
``max_text_chars`` characters as they are read (cut), texts longer than ``max_length`` tokens once
the tokenizer is known (cut: `report_long_texts`). Images that still fail to decode inside a
loader worker are handled by the main process (`mmtx.data.bad_data.ScreenedLoader`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmtx.data.annotations import TextLimit
from mmtx.data.bad_data import BadDataReport, Policy, screen
from mmtx.data.splits import check_images_found
from mmtx.data.tokenizer import Tokenizer, longer_than

log = logging.getLogger(__name__)

# load(split, skipped, limit): the split's records, each with a ``path``; its reader describes
# the bad entries it leaves out in ``skipped`` and the texts it cuts in ``limit.cut``
Load = Callable[[str, list[str], TextLimit], list[Any]]


def read_split(
    split: str,
    load: Load,
    *,
    folder: tuple[str, str] | None,
    scan: bool,
    max_text_chars: int,
    on_bad_image: Policy,
    on_bad_annotation: Policy,
    max_pixels: int,
    report: BadDataReport,
    describe: Callable[[list[Any]], str],
) -> list[Any]:
    """The split's good records, read by ``load`` and screened (`mmtx.data.bad_data.screen`).

    ``folder`` is (its config key, the path) of the split's image folder, for a source that
    reads one: a wrong one is one line, a folder that does not exist before the records are read,
    one that holds none of the first images they list before each is reported missing. ``scan``
    says whether image files are checked before training; ``describe(records)`` what leaving
    records out drops."""
    if folder is not None and not Path(folder[1]).is_dir():
        key, path = folder
        raise FileNotFoundError(
            f"{key}: folder {path} does not exist"
            if not Path(path).exists()
            else f"{key}: {path} is a file, not a folder"
        )
    skipped: list[str] = []
    limit = TextLimit(max_text_chars)
    records = load(split, skipped, limit)
    if folder is not None and scan and on_bad_image == "error":
        check_images_found(split, records, *folder)
    for what, length in limit.cut:  # each file's count is logged by its reader
        report.add(split, "truncated", what, f"{length} characters > data.max_text_chars={limit.max_chars}")
    return screen(
        split, records, skipped, on_bad_image, on_bad_annotation, report, describe, scan=scan, max_pixels=max_pixels
    )


def report_long_texts(
    split: str, items: list[tuple[str, str]], tokenizer: Tokenizer, max_length: int, report: BadDataReport
) -> None:
    """Count the (what, text) ``items`` longer than ``max_length`` tokens, which the collator
    cuts: each is added to ``report`` and their number logged once."""
    long = longer_than(tokenizer, items, max_length)
    for what, length in long:
        report.add(split, "truncated", what, f"{length} tokens > data.max_length={max_length}")
    if long:
        log.warning(
            "%s split: %d of %d texts are longer than data.max_length=%d tokens and are cut (the longest has %d)",
            split,
            len(long),
            len(items),
            max_length,
            max(n for _, n in long),
        )
