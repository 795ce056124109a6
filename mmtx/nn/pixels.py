"""The pixel normalisation the image towers read: ImageNet's per-channel mean and std.

The data pipeline normalises with them (`mmtx.data.transforms`); what reads pixels back out of a
normalised batch (a masked patch's colour target, an image drawn beside its caption) undoes it.
"""

IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)
