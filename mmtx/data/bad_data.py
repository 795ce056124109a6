"""What to do with bad images and annotation entries, and the record of what was left out.

Two policies, each ``error`` (the default: stop, naming every culprit) or ``skip`` (drop them,
count them, say which): ``data.on_bad_image`` for image files that are missing or cannot be
decoded, ``data.on_bad_annotation`` for entries of an annotation file that are malformed
(missing keys, wrong types, duplicate ids, empty or invalid text, questions without answers)
or too large to read (a JSONL line, a CSV field, a shard's text member).
Problems with a whole file (not found, not JSON, no ``images`` array) are always errors.

`BadDataError` lists what the ``error`` policies found; `BadDataReport` keeps one line per
item left out (and per text cut to ``max_text_chars`` characters or ``max_length`` tokens) for
a run to write next to its checkpoints (``bad_data.txt``). `screen` applies the policies to a
split before training; `ScreenedLoader` and `DecodeFailures` apply them, in the main process,
to images that fail to decode later (inside a loader worker).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from torch.utils.data import DataLoader, Dataset

from mmtx.config_error import ArgumentError
from mmtx.data.images import MAX_IMAGE_PIXELS, ImageLoadError, scan_images

log = logging.getLogger(__name__)

Policy = Literal["error", "skip"]
POLICIES: tuple[str, ...] = ("error", "skip")
LISTED = 20  # how many culprits an error message or log line names before "and N more"
REPORT_FILE = "bad_data.txt"
FAILURES_KEY = "image_failures"  # a batch's [(path, reason)] of images replaced after failing to decode
DECODE_HINT = "set data.on_bad_image=skip to replace such images and go on"


def check_policy(value: object, name: str) -> Policy:
    """``value`` if it is a policy name, else an `ArgumentError` naming the argument ``name``
    and the choices."""
    if value not in POLICIES:
        raise ArgumentError(f"{{{name}!r}} is not one of {', '.join(POLICIES)}", **{name: value})
    return value  # type: ignore[return-value]


def listing(items: Sequence[str], limit: int = LISTED) -> str:
    """The first ``limit`` items, one per line, then "and N more" for the rest."""
    lines = [f"  {item}" for item in items[:limit]]
    if len(items) > limit:
        lines.append(f"  ... and {len(items) - limit} more")
    return "\n".join(lines)


class BadDataError(ValueError):
    """Bad annotation entries and image files of a split under the ``error`` policies (or so
    many bad images under ``skip`` that none is left); the message lists them."""

    def __init__(
        self,
        split: str,
        annotations: Sequence[str] = (),
        images: dict[Path, str] | None = None,
        none_left: bool = False,
    ) -> None:
        self.split, self.annotations, self.images = split, list(annotations), dict(images or {})
        self.none_left = none_left
        parts = [f"bad data in the {split} split:"]
        if self.annotations:
            parts.append(f"{len(self.annotations)} bad annotation entries (data.on_bad_annotation=error):")
            parts.append(listing(self.annotations))
        if self.images:
            policy = "skip" if none_left else "error"
            parts.append(f"{len(self.images)} bad image file(s) (data.on_bad_image={policy}):")
            parts.append(listing([f"{path}: {reason}" for path, reason in sorted(self.images.items())]))
        if none_left:
            parts.append("No image of the split is left to use.")
        else:
            keys = [k for k, found in (("on_bad_annotation", self.annotations), ("on_bad_image", self.images)) if found]
            parts.append(
                f"Repair or remove them, or set {' and '.join(f'data.{k}=skip' for k in keys)} to leave them out."
            )
        super().__init__("\n".join(parts))

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.split, self.annotations, self.images, self.none_left)


@dataclass(frozen=True)
class Dropped:
    """One item left out of (or cut in) a split: ``kind`` is image, annotation, decode or truncated."""

    split: str
    kind: str
    what: str
    reason: str

    def line(self) -> str:
        return "\t".join((self.split, self.kind, self.what, self.reason))


@dataclass
class BadDataReport:
    """Everything a data module dropped or cut, in the order found; written to `path` if set."""

    items: list[Dropped] = field(default_factory=list)
    path: Path | None = None

    def add(self, split: str, kind: str, what: str, reason: str) -> None:
        self.items.append(Dropped(split, kind, what, reason))
        if self.path is not None:
            self.write(self.path)

    def count(self, kind: str, split: str | None = None) -> int:
        return sum(1 for d in self.items if d.kind == kind and split in (None, d.split))

    def write(self, path: str | Path) -> Path | None:
        """Write the report to ``path`` (and keep it there as items come in); nothing if empty."""
        self.path = Path(path)
        if not self.items:
            return None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        header = "# what mmtx left out of the data (or cut): split, kind, file or entry, reason\n"
        self.path.write_text(header + "".join(d.line() + "\n" for d in self.items), encoding="utf-8")
        return self.path


def screen(
    split: str,
    records: list[Any],
    skipped: list[str],
    on_bad_image: Policy,
    on_bad_annotation: Policy,
    report: BadDataReport,
    describe: Callable[[list[Any]], str],
    scan: bool = True,
    max_pixels: int = MAX_IMAGE_PIXELS,
) -> list[Any]:
    """The split's good ``records`` (each with a ``path``): the bad annotation entries its reader
    described in ``skipped`` and the records whose image file fails the pre-flight scan are left
    out under ``skip`` (logged, and added to ``report``), and raised together under ``error``.
    ``describe(records)`` says what leaving records out drops, e.g. "their 12 caption(s)";
    ``scan=False`` leaves the images to be checked where they are decoded; images over
    ``max_pixels`` pixels are bad (`mmtx.data.images.check_image`)."""
    bad = scan_images((r.path for r in records), f"checking {split} images", max_pixels) if scan else {}
    kept = [r for r in records if r.path not in bad]
    failed_annotations = skipped if on_bad_annotation == "error" else []
    failed_images = bad if on_bad_image == "error" else {}
    if failed_annotations or failed_images:
        raise BadDataError(split, failed_annotations, failed_images)
    if records and not kept:
        raise BadDataError(split, images=bad, none_left=True)
    if skipped:
        for problem in skipped:
            report.add(split, "annotation", problem, "entry left out")
        log.warning(
            "%s split: left out %d bad annotation entries (data.on_bad_annotation=skip):\n%s",
            split,
            len(skipped),
            listing(skipped),
        )
    if bad:
        for path, reason in sorted(bad.items()):
            report.add(split, "image", str(path), reason)
        log.warning(
            "%s split: left out %d bad image file(s) and %s (data.on_bad_image=skip):\n%s",
            split,
            len(bad),
            describe([r for r in records if r.path in bad]),
            listing([f"{path}: {reason}" for path, reason in sorted(bad.items())]),
        )
    return kept


@dataclass
class DecodeFailures:
    """Applies ``on_bad_image`` in the main process to images that failed to decode in a worker;
    under ``skip`` each file is reported once, however many epochs meet it."""

    split: str
    policy: Policy
    report: BadDataReport

    def __call__(self, failures: list[tuple[str, str]]) -> None:
        for path, reason in failures:
            if self.policy == "error":
                raise ImageLoadError(path, f"{reason} ({DECODE_HINT})")
            if not any(d.kind == "decode" and d.what == path for d in self.report.items):
                self.report.add(self.split, "decode", path, reason)
                log.warning(
                    "%s split: cannot decode %s (%s): replaced by another example "
                    "(data.on_bad_image=skip; %d such file(s) so far)",
                    self.split,
                    path,
                    reason,
                    self.report.count("decode", self.split),
                )


class ScreenedLoader(DataLoader):
    """A DataLoader that hands each batch's ``image_failures`` to ``failures`` (main process)."""

    def __init__(self, dataset: Dataset, *, failures: DecodeFailures | None = None, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.failures = failures

    def __iter__(self):  # type: ignore[override]
        batches = super().__iter__()
        for batch in batches:
            found = batch.pop(FAILURES_KEY, None) if isinstance(batch, dict) else None
            if found and self.failures is not None:
                try:
                    self.failures(found)
                except ImageLoadError:
                    self._stop_workers(batches)
                    raise
            yield batch

    def _stop_workers(self, batches: Any) -> None:
        """End the worker processes now: left to garbage collection they linger for seconds."""
        shutdown = getattr(batches, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._iterator = None  # persistent workers: the next pass starts new ones
