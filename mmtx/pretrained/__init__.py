"""Start mmtx models from public pretrained weights, without timm or transformers at run time.

- :func:`load_vit`: timm ``vit_*_patch16_*`` and Hugging Face ``ViTModel`` checkpoints ->
  :class:`~mmtx.models.vit.VisionEncoder`;
- :func:`load_text_encoder`: BERT -> :class:`~mmtx.models.text.TextEncoder` (a two-stream
  model's text stream);
- :func:`load_decoder`: GPT-2, or BERT with or without cross-attention ->
  :class:`~mmtx.models.decoder.CaptionDecoder`.

Each takes a directory or a ``.safetensors``/``.bin``/``.pth`` file (``config.json`` is read when
present) and is a Hydra target: ``_target_: mmtx.pretrained.load_vit`` with ``pretrained: PATH``.
The module it returns keeps the plain constructor arguments it was built with in
``build_config``, so an export can rebuild it without the files.
"""

from mmtx.pretrained.bert import load_text_encoder
from mmtx.pretrained.decoder import load_decoder
from mmtx.pretrained.files import PretrainedError, read_pretrained
from mmtx.pretrained.vit import load_vit

__all__ = ["PretrainedError", "load_decoder", "load_text_encoder", "load_vit", "read_pretrained"]
