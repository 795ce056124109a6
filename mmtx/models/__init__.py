"""Towers and the models composed from them."""

from mmtx.models.captioner import ImageCaptioner
from mmtx.models.decoder import CaptionDecoder
from mmtx.models.text import TextEncoder, TextTransformer
from mmtx.models.vit import VisionEncoder

__all__ = ["CaptionDecoder", "ImageCaptioner", "TextEncoder", "TextTransformer", "VisionEncoder"]
