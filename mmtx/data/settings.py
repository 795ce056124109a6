"""The data modules' own settings, refused when a data module is built if they cannot work.

Each refusal is an `ArgumentError` naming the argument: ``batch_size=0 must be a positive
integer``, which ``mmtx-train``'s start-up check reports as ``data.batch_size=0 ...``.
"""

from __future__ import annotations

from typing import Any

from mmtx.config_error import ArgumentError, is_int, is_number


def check_settings(
    *,
    image_size: Any,
    batch_size: Any,
    eval_batch_size: Any,
    num_workers: Any,
    max_length: Any,
    max_text_chars: Any,
    crop_scale: Any,
    shift_px: Any,
    max_image_pixels: Any,
    in_memory: Any,
) -> None:
    """Refuse the first setting that cannot work."""
    _positive(image_size=image_size)
    _positive(batch_size=batch_size)
    if eval_batch_size is not None:
        _positive(eval_batch_size=eval_batch_size)
    if not (is_int(num_workers) and num_workers >= 0):
        raise ArgumentError(
            "{num_workers!r} must be an integer >= 0 (0: load in the main process)", num_workers=num_workers
        )
    if not (is_int(max_length) and max_length >= 3):
        raise ArgumentError("{max_length!r} must be an integer >= 3 ([BOS], a token, [EOS])", max_length=max_length)
    _positive(max_text_chars=max_text_chars)
    if crop_scale is not None and not (
        len(crop_scale) == 2 and all(is_number(v) for v in crop_scale) and 0 < crop_scale[0] <= crop_scale[1] <= 1
    ):
        raise ArgumentError("{crop_scale} must be null or [lo, hi] with 0 < lo <= hi <= 1", crop_scale=list(crop_scale))
    if not (is_int(shift_px) and 0 <= shift_px < image_size // 2):
        raise ArgumentError("{shift_px!r} must be an integer from 0 to image_size/2 - 1", shift_px=shift_px)
    _positive(max_image_pixels=max_image_pixels)
    if in_memory not in (True, False, "auto"):
        raise ArgumentError("{in_memory!r} must be true, false or auto", in_memory=in_memory)


def _positive(**setting: Any) -> None:
    ((name, value),) = setting.items()
    if not (is_int(value) and value > 0):
        raise ArgumentError(f"{{{name}!r}} must be a positive integer", **setting)
