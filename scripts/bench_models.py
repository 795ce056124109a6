"""The two models `bench.py` compares, behind one face, and what a step of them costs.

mmtx's image captioner and Hugging Face's ``VisionEncoderDecoderModel`` (ViT + a BERT decoder
with cross-attention) at the same shapes (`BenchConfig`); the FLOPs of a training step counted
from the shapes, and the least a decoding step can take on a machine (`decode_step_floor_ms`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
MLP_RATIO = 4


@dataclass(frozen=True)
class BenchConfig:
    """Model shapes and workload, shared by both models (see ``bench.parse_args`` for each field)."""

    image: int = 224
    patch: int = 16
    dim: int = 384
    heads: int = 6
    enc_layers: int = 6
    dec_layers: int = 6
    vocab: int = 8192
    text_len: int = 32
    batch: int = 16
    steps: int = 5
    warmup: int = 2
    gen_batch: int = 16
    new_tokens: int = 32
    beams: int = 4
    device: str = "cpu"
    compile: bool = False
    activation_checkpointing: bool = False  # mmtx's blocks recomputed in the backward pass
    precisions: tuple[str, ...] = ("fp32", "bf16")
    seed: int = 0

    @property
    def max_positions(self) -> int:
        """Position-table size: the training text, or BOS plus the generated tokens."""
        return max(self.text_len, 1 + self.new_tokens)


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------
def build_mmtx(cfg: BenchConfig) -> torch.nn.Module:
    from mmtx.activation_checkpointing import checkpoint_blocks
    from mmtx.models import CaptionDecoder, ImageCaptioner, VisionEncoder

    encoder = VisionEncoder(
        image_size=cfg.image,
        patch_size=cfg.patch,
        dim=cfg.dim,
        depth=cfg.enc_layers,
        num_heads=cfg.heads,
        mlp_ratio=MLP_RATIO,
    )
    decoder = CaptionDecoder(
        cfg.vocab,
        context_dim=cfg.dim,
        dim=cfg.dim,
        depth=cfg.dec_layers,
        num_heads=cfg.heads,
        mlp_ratio=MLP_RATIO,
        max_length=cfg.max_positions,
        tie_embeddings=True,
        pad_id=PAD_ID,
    )
    model = ImageCaptioner(encoder, decoder)
    if cfg.activation_checkpointing:
        checkpoint_blocks(model)
    return model


def build_reference(cfg: BenchConfig) -> torch.nn.Module:
    from transformers import BertConfig, VisionEncoderDecoderConfig, VisionEncoderDecoderModel, ViTConfig
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    encoder = ViTConfig(
        hidden_size=cfg.dim,
        num_hidden_layers=cfg.enc_layers,
        num_attention_heads=cfg.heads,
        intermediate_size=MLP_RATIO * cfg.dim,
        image_size=cfg.image,
        patch_size=cfg.patch,
    )
    decoder = BertConfig(
        vocab_size=cfg.vocab,
        hidden_size=cfg.dim,
        num_hidden_layers=cfg.dec_layers,
        num_attention_heads=cfg.heads,
        intermediate_size=MLP_RATIO * cfg.dim,
        max_position_embeddings=cfg.max_positions,
        is_decoder=True,
        add_cross_attention=True,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,  # mmtx's bench model has none either
    )
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = BOS_ID, PAD_ID, EOS_ID
    return VisionEncoderDecoderModel(config=config)


def caption_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy in fp32, padding ignored (what ``ImageCaptioner.loss`` computes)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=PAD_ID)


class Adapter:
    """One model behind a common face: a training loss and fixed-length generation."""

    name: str
    model: torch.nn.Module

    def loss(self, images: torch.Tensor, ids: torch.Tensor, eager: bool = False) -> torch.Tensor:
        """Training loss; ``eager`` bypasses ``torch.compile`` (for counting FLOPs)."""
        raise NotImplementedError

    def generate(self, images: torch.Tensor, new_tokens: int, beams: int) -> torch.Tensor:
        """Generated ids (B, new_tokens), without the start token."""
        raise NotImplementedError

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """The image tokens the decoder reads (what generation computes first)."""
        raise NotImplementedError


class MmtxAdapter(Adapter):
    name = "mmtx"

    def __init__(self, cfg: BenchConfig) -> None:
        self.model = build_mmtx(cfg)
        self.compiled = torch.compile(self.model) if cfg.compile else None
        self._encode = torch.compile(self.model.encode) if cfg.compile else self.model.encode

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        return self._encode(images)

    def loss(self, images: torch.Tensor, ids: torch.Tensor, eager: bool = False) -> torch.Tensor:
        forward = self.model if eager or self.compiled is None else self.compiled
        return caption_loss(forward(images, ids[:, :-1]), ids[:, 1:])

    def generate(self, images: torch.Tensor, new_tokens: int, beams: int) -> torch.Tensor:
        from mmtx.generation import GenerationConfig, generate

        config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, num_beams=beams)
        context = self.encode(images)
        return generate(self.model.decoder, context, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID, config=config)


class ReferenceAdapter(Adapter):
    name = "ref"

    def __init__(self, cfg: BenchConfig) -> None:
        self.model = build_reference(cfg)

    def loss(self, images: torch.Tensor, ids: torch.Tensor, eager: bool = False) -> torch.Tensor:
        logits = self.model(pixel_values=images, decoder_input_ids=ids[:, :-1]).logits
        return caption_loss(logits, ids[:, 1:])

    def generate(self, images: torch.Tensor, new_tokens: int, beams: int) -> torch.Tensor:
        out = self.model.generate(
            pixel_values=images,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            num_beams=beams,
            do_sample=False,
            early_stopping=True,
            length_penalty=1.0,
            decoder_start_token_id=BOS_ID,
            bos_token_id=BOS_ID,
            eos_token_id=EOS_ID,
            pad_token_id=PAD_ID,
        )
        return out[:, 1:]  # drop the decoder start token

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        return self.model.encoder(pixel_values=images).last_hidden_state


# --------------------------------------------------------------------------------------------
# FLOPs
# --------------------------------------------------------------------------------------------
def analytic_train_flops(cfg: BenchConfig) -> dict[str, float]:
    """Matmul FLOPs of one training step (forward x3), by component. A multiply-add is 2 FLOPs."""
    B, d, V, Le, Ld = cfg.batch, cfg.dim, cfg.vocab, cfg.enc_layers, cfg.dec_layers
    P = (cfg.image // cfg.patch) ** 2  # patches
    N = P + 1  # image tokens with CLS
    T = cfg.text_len - 1  # decoder inputs (the caption minus its last token)
    h = MLP_RATIO * d
    forward = {
        "patch_embed": 2 * B * P * (3 * cfg.patch**2) * d,
        "enc_attn_proj": Le * 2 * B * N * d * 4 * d,  # fused QKV + output
        "enc_attn_scores": Le * 2 * (2 * B * N * N * d),  # QK^T and (softmax)V
        "enc_mlp": Le * 2 * B * N * 2 * d * h,
        "dec_self_proj": Ld * 2 * B * T * d * 4 * d,
        "dec_self_scores": Ld * 2 * (2 * B * T * T * d),
        "dec_cross_proj": Ld * (2 * B * T * d * 2 * d + 2 * B * N * d * 2 * d),  # Q + output; K, V of the image
        "dec_cross_scores": Ld * 2 * (2 * B * T * N * d),
        "dec_mlp": Ld * 2 * B * T * 2 * d * h,
        "lm_head": 2 * B * T * d * V,
    }
    return {k: 3.0 * v for k, v in forward.items()}


def decode_step_floor_ms(cfg: BenchConfig, rows: int, bandwidth_gbs: float, peak_gflops: float) -> float:
    """Lower bound (ms) on one fp32 decoding step of ``rows`` sequences: the larger of the bytes it
    must read at the measured memory bandwidth and the FLOPs it must do at the measured matmul peak.

    Bytes: every decoder weight used per step (self-attention QKV and output, cross-attention Q and
    output, MLP, LM head; the cross-attention K/V projections ran once, before the loop), the
    images' cross-attention keys/values (once per image: the beams of an image may share them) and
    the self-attention cache at its mean length. FLOPs: 2 per multiply-add of the same products.
    """
    d, Ld, V = cfg.dim, cfg.dec_layers, cfg.vocab
    N = (cfg.image // cfg.patch) ** 2 + 1
    t = 1 + cfg.new_tokens / 2  # mean self-attention length
    weights = Ld * (4 * d * d + 2 * d * d + 2 * MLP_RATIO * d * d) + V * d
    cross_kv = cfg.gen_batch * N * 2 * d * Ld
    self_kv = rows * t * 2 * d * Ld
    seconds_memory = 4 * (weights + cross_kv + self_kv) / (bandwidth_gbs * 1e9)
    flops = 2 * rows * weights + rows * Ld * 4 * d * (t + N)
    seconds_compute = flops / (peak_gflops * 1e9)
    return 1e3 * max(seconds_memory, seconds_compute)
