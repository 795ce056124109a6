"""Data sets mmtx draws itself: shapes scenes with captions and with VQA questions, and grid
scenes with captions."""

from mmtx.data.synthetic.datamodules import GridCaptions, ShapesCaptions, ShapesVqa

__all__ = ["GridCaptions", "ShapesCaptions", "ShapesVqa"]
