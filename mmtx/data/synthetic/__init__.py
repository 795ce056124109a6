"""Data sets mmtx draws itself: shapes scenes with captions and with VQA questions."""

from mmtx.data.synthetic.datamodules import ShapesCaptions, ShapesVqa

__all__ = ["ShapesCaptions", "ShapesVqa"]
