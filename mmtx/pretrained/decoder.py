"""Caption decoders from GPT-2 or BERT checkpoints, the layout recognised from the tensor names."""

from __future__ import annotations

import logging
from pathlib import Path

from mmtx.models.decoder import CaptionDecoder
from mmtx.pretrained import bert, gpt2
from mmtx.pretrained.convert import context_width, find_prefix, fit_tables, load_converted, with_choices
from mmtx.pretrained.files import read_pretrained

log = logging.getLogger(__name__)

READERS = {"gpt2": gpt2.gpt2_decoder_parts, "bert": bert.bert_decoder_parts}
ANCHORS = {"gpt2": gpt2.ANCHOR, "bert": bert.ANCHOR}


def load_decoder(
    pretrained: str | Path,
    *,
    vocab_size: int | None = None,
    context_dim: int | None = None,
    max_length: int | None = None,
    pad_id: int | None = None,
    num_heads: int | None = None,
    dropout: float | None = None,
    attn_dropout: float | None = None,
    prefix: str | None = None,
) -> CaptionDecoder:
    """A :class:`CaptionDecoder` with the weights of a GPT-2 or BERT checkpoint.

    Cross-attention is imported when the checkpoint has it (``add_cross_attention=True``, e.g. a
    VisionEncoderDecoder's decoder) and is new otherwise, reading a context of ``context_dim``.

    Args:
        pretrained: a directory or weights file, read by :func:`~mmtx.pretrained.read_pretrained`.
        vocab_size: the tokenizer's size (default: the checkpoint's); ids past the checkpoint's
            vocabulary (an appended ``[PAD]``) get new embeddings.
        context_dim: width of the encoder's tokens (default: the decoder's width); must match
            imported cross-attention.
        max_length: keep the first positions only (default: all of them).
        pad_id: the padding id (default: the config's ``pad_token_id``).
        num_heads: only for checkpoints without a config.json (default: width / 64).
        dropout, attn_dropout: default the config's (0.1 for GPT-2 and BERT).
        prefix: where the decoder sits in a checkpoint that holds several models.
    """
    ckpt = read_pretrained(pretrained)
    layout, prefix = find_prefix(ckpt, ANCHORS, prefix, "decoder (GPT-2 or BERT)")
    found, converted, fresh = READERS[layout](ckpt, prefix)
    src = ckpt.source
    kwargs = with_choices(
        found,
        src,
        vocab_size=vocab_size,
        pad_id=pad_id,
        max_length=max_length,
        num_heads=num_heads,
        dropout=dropout,
        attn_dropout=attn_dropout,
    )
    kv = converted.get("body.blocks.0.cross_attn.kv.weight")  # the checkpoint's cross-attention, if any
    kwargs["context_dim"] = context_width(kv, context_dim, kwargs["dim"], src)
    decoder = CaptionDecoder(**kwargs)
    fit_tables(converted, decoder, kwargs, src, "body.")
    if kv is None:  # new cross-attention
        fresh += [f"body.blocks.{i}.{part}" for i in range(kwargs["depth"]) for part in ("cross_attn.", "norm_cross.")]
    load_converted(decoder, converted, src, fresh)
    decoder.build_config = {"_target_": "mmtx.models.decoder.CaptionDecoder", **kwargs}
    log.info(
        "%s: %s decoder, width %d, %d blocks, %d heads, cross-attention %s",
        src,
        layout,
        kwargs["dim"],
        kwargs["depth"],
        kwargs["num_heads"],
        "imported" if kv else "new",
    )
    return decoder
