"""Image captions: the COCO and Karpathy files (`files`) and their data modules (`datamodule`)."""

from mmtx.data.captions.datamodule import CaptionDataModule, CocoCaptions, KarpathyCaptions, PairsCaptions
from mmtx.data.captions.files import CaptionRecord, read_coco_captions, read_karpathy, read_pairs, write_coco_captions

__all__ = [
    "CaptionDataModule",
    "CaptionRecord",
    "CocoCaptions",
    "KarpathyCaptions",
    "PairsCaptions",
    "read_coco_captions",
    "read_karpathy",
    "read_pairs",
    "write_coco_captions",
]
