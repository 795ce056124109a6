"""What to do with bad images and annotation entries, and the record of what was left out.

Two policies, each ``error`` (the default: stop, naming every culprit) or ``skip`` (drop them,
count them, say which): ``data.on_bad_image`` for image files that are missing or cannot be
decoded, ``data.on_bad_annotation`` for entries of an annotation file that are malformed
(missing keys, wrong types, duplicate ids, empty or invalid text, questions without answers).
Problems with a whole file (not found, not JSON, no ``images`` array) are always errors.

`BadDataError` lists what the ``error`` policies found; `BadDataReport` keeps one line per
item left out (and per text cut to ``max_length``) for a run to write next to its checkpoints
(``bad_data.txt``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Policy = Literal["error", "skip"]
POLICIES: tuple[str, ...] = ("error", "skip")
LISTED = 20  # how many culprits an error message or log line names before "and N more"
REPORT_FILE = "bad_data.txt"


def check_policy(value: object, key: str) -> Policy:
    """``value`` if it is a policy name, else a ValueError naming ``key`` and the choices."""
    if value not in POLICIES:
        raise ValueError(f"{key}={value!r} is not one of {', '.join(POLICIES)}")
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
        self, split: str, annotations: Sequence[str] = (), images: dict[Path, str] | None = None,
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
            parts.append(f"Repair or remove them, or set {' and '.join(f'data.{k}=skip' for k in keys)} "
                         "to leave them out.")
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
