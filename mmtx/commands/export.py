"""``mmtx-export``: write a checkpoint as safetensors weights, a JSON config and its tokenizer, in
mmtx's format or as a transformers VisionEncoderDecoderModel."""

from __future__ import annotations

from omegaconf import DictConfig

from mmtx.checkpoint import load_task
from mmtx.config_error import ConfigError
from mmtx.export import export_task
from mmtx.pretrained.hf_export import export_hf

FORMATS = {
    "mmtx": (export_task, "model.safetensors, config.json, tokenizer.json"),
    "hf": (export_hf, "a transformers VisionEncoderDecoderModel with its tokenizer and image processor"),
}


def run(cfg: DictConfig) -> None:
    """Write ``ckpt`` to ``out`` in ``format``."""
    if cfg.format not in FORMATS:
        raise ConfigError(f"format={cfg.format!r} is not one of {', '.join(FORMATS)}")
    write, what = FORMATS[cfg.format]
    out = write(load_task(cfg.ckpt), cfg.out)
    print(f"exported {cfg.ckpt} to {out}/ ({what})")
