"""Pretraining heads and objectives for the two-stream model.

ViLBERT's objectives on image-text pairs — masked language modelling, masked patch modelling
(regressing the masked patch, see :mod:`mmtx.models.patch_targets`), image-text alignment on
``h_IMG * h_CLS`` — plus an optional CLIP-style contrastive loss on the streams' own outputs
(before co-attention; their CLS tokens or the mean of their tokens), whose similarities also pick hard negatives for alignment (as in ALBEF),
and an optional captioning loss: a small decoder writes the caption from the vision stream's own
tokens (BLIP's and CoCa's language-modelling loss), which makes that stream tell the objects of
a scene apart where a masked word can often be guessed from the caption's other words.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmtx.config_error import ArgumentError
from mmtx.models.decoder import CaptionDecoder
from mmtx.models.global_batch import GlobalBatch
from mmtx.models.masking import mask_patches, mask_tokens
from mmtx.models.patch_targets import NormalizedPixels
from mmtx.models.pretraining_losses import caption_loss, itc_loss, itm_loss, mlm_loss, mpm_loss
from mmtx.models.text import mean_of_tokens
from mmtx.models.two_stream import TwoStreamModel, Unimodal
from mmtx.nn.init import init_weights

OBJECTIVES = ("mlm", "mpm", "itm", "itc", "caption")  # the loss weights of `Objectives`
ITC_POOLS = ("cls", "mean")  # what the contrastive embeddings read (`TwoStreamPretrainer`)


@dataclass
class Objectives:
    """Loss weights (0 switches an objective off) and masking settings."""

    mlm: float = 1.0
    mpm: float = 1.0
    itm: float = 1.0
    itc: float = 0.0
    caption: float = 0.0
    mask_prob: float = 0.15  # text tokens picked for MLM (BERT: 80% [MASK], 10% random, 10% kept)
    patch_mask_prob: float = 0.15  # patches picked for MPM
    patch_replace_prob: float = 0.9  # of those, replaced by the mask embedding (ViLBERT: 90%)
    negative_prob: float = 0.5  # pairs whose caption is swapped for another image's
    hard_negatives: bool = True  # with itc > 0: draw negatives by contrastive similarity
    hard_negatives_from: float = 0.3  # ...once this fraction of the run's budget is done (random ones before)

    def __post_init__(self) -> None:
        weights = OBJECTIVES
        rates = ("mask_prob", "patch_mask_prob", "patch_replace_prob", "negative_prob", "hard_negatives_from")
        problems = [
            f"{{objectives.{k}!r}} must be a number >= 0 (0: off)" for k in weights if not getattr(self, k) >= 0
        ]
        problems += [
            f"{{objectives.{k}!r}} must be a number in [0, 1]" for k in rates if not 0 <= getattr(self, k) <= 1
        ]
        if not problems and not any(getattr(self, k) > 0 for k in weights):
            problems.append("{objectives!k}: every loss weight (mlm, mpm, itm, itc, caption) is 0; set one > 0")
        if problems:
            values = {f"objectives.{k}": getattr(self, k) for k in (*weights, *rates)}
            raise ArgumentError("; ".join(problems), objectives=None, **values)


class MlmHead(nn.Module):
    """BERT's prediction head: dense + GELU + LayerNorm, then a decoder tied to the embeddings."""

    def __init__(self, dim: int, embedding: nn.Embedding) -> None:
        super().__init__()
        self.transform = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.LayerNorm(dim))
        self.embedding = embedding
        self.bias = nn.Parameter(torch.zeros(embedding.num_embeddings))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(self.transform(x), self.embedding.weight, self.bias)


class TwoStreamPretrainer(nn.Module):
    """A :class:`TwoStreamModel` with the heads of every pretraining objective.

    Args:
        backbone: the two-stream model.
        patch_target: maps images (B, 3, H, W) to per-patch targets (B, N, dim) and has ``dim``;
            default :class:`NormalizedPixels`.
        itc_dim: width of the contrastive embedding space.
        itc_pool: what the contrastive embeddings read from each stream's own output: ``cls``
            (the CLS tokens, as CLIP's vision tower and ALBEF) or ``mean`` (the mean of the image
            patches and of the text's tokens, as timm's and open_clip's ``avg`` pooling): the
            mean holds every token from the first step, where a CLS token first has to learn to
            gather them (with ``cls`` the contrastive loss can sit near chance for many steps on
            some seeds: docs/learning.md).
        mask_id, special_ids: the tokenizer's [MASK] id and the ids never masked or sampled
            (filled in by the task from its tokenizer).
        heads: the objectives whose heads are built (the task gives those with a weight > 0:
            parameters no loss uses would stop data-parallel training, which reduces every
            parameter's gradient). ``None``: every objective's, the captioning one's when there is
            a ``caption_decoder``.
        caption_decoder: makes the decoder of the ``caption`` objective, given its vocabulary
            size, padding id and context width (a partial :class:`CaptionDecoder` in config).
    """

    def __init__(
        self,
        backbone: TwoStreamModel,
        patch_target: Callable[[Tensor], Tensor] | None = None,
        itc_dim: int = 128,
        mask_id: int | None = None,
        special_ids: list[int] | None = None,
        heads: Sequence[str] | None = None,
        caption_decoder: Callable[..., CaptionDecoder] | None = None,
        itc_pool: str = "cls",
    ) -> None:
        super().__init__()
        if itc_pool not in ITC_POOLS:
            raise ArgumentError(f"{{itc_pool!r}} must be one of {', '.join(ITC_POOLS)}", itc_pool=itc_pool)
        v, t = backbone.vision, backbone.text
        self.backbone, self.itc_pool = backbone, itc_pool
        self.patch_target = patch_target or NormalizedPixels(v.patch_embed.patch_size)
        self.mask_id, self.special_ids = mask_id, list(special_ids or [])
        if heads is None:
            heads = [k for k in OBJECTIVES if k != "caption" or caption_decoder is not None]
        unknown = set(heads) - set(OBJECTIVES)
        if unknown:
            raise ArgumentError(
                f"{{heads}}: {', '.join(sorted(unknown))} not among {', '.join(OBJECTIVES)}", heads=list(heads)
            )
        self.heads = tuple(heads)
        self.mlm_head = MlmHead(t.dim, t.token_embed) if "mlm" in heads else None
        self.mpm_head = nn.Linear(v.dim, self.patch_target.dim) if "mpm" in heads else None
        self.itm_head = nn.Linear(backbone.joint_dim, 2) if "itm" in heads else None
        itc = "itc" in heads
        self.itc_vision = nn.Linear(v.dim, itc_dim) if itc else None
        self.itc_text = nn.Linear(t.dim, itc_dim) if itc else None
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07))) if itc else None
        self.caption_decoder = None
        if "caption" in heads:
            if caption_decoder is None:
                raise ValueError("the caption objective needs a caption_decoder (model.caption_decoder in config)")
            self.caption_decoder = caption_decoder(
                vocab_size=t.token_embed.num_embeddings, pad_id=t.token_embed.padding_idx, context_dim=v.dim
            )
        for head in (
            self.mlm_head and self.mlm_head.transform,
            self.mpm_head,
            self.itm_head,
            self.itc_vision,
            self.itc_text,
        ):
            if head is not None:
                head.apply(init_weights)

    # --- scores used for training and evaluation -------------------------------------------------
    def itc_embeddings(self, u: Unimodal) -> tuple[Tensor, Tensor]:
        """Unit-length contrastive embeddings of the images (B_images, itc_dim) and texts
        (B_texts, itc_dim), from the streams' own outputs pooled by ``itc_pool``."""
        v_norm, t_norm = self.backbone.vision.norm, self.backbone.text.norm  # per token: pick tokens first
        if self.itc_pool == "mean":
            vision, text = v_norm(u.vision[:, 1:]).mean(1), mean_of_tokens(t_norm(u.text), u.text_mask)
        else:
            vision, text = v_norm(u.vision[:, 0]), t_norm(u.text[:, 0])
        return F.normalize(self.itc_vision(vision), dim=-1), F.normalize(self.itc_text(text), dim=-1)

    def itc_scale(self) -> Tensor:
        """The learned temperature's inverse, capped at 100 (CLIP)."""
        return self.logit_scale.exp().clamp(max=100)

    def itc_similarity(self, u: Unimodal) -> Tensor:
        """Scaled cosine similarity (B_images, B_texts) of the streams' own outputs, pooled by ``itc_pool``."""
        v, t = self.itc_embeddings(u)
        return self.itc_scale() * v @ t.T

    def itm_logits(self, u: Unimodal) -> Tensor:
        """Alignment logits (B, 2) [not aligned, aligned] from the fused pooled output."""
        return self.itm_head(self.backbone.fuse(u).pooled)

    @torch.no_grad()
    def retrieval_scores(self, u: Unimodal, rerank: int | None = 16, chunk: int = 256) -> tuple[Tensor, Tensor]:
        """Image-text scores (N_images, M_texts) for ranking texts per image and images per text.

        ``u`` holds N images and M texts (not paired). With ``rerank``, candidates are ranked by
        contrastive similarity and each query's top ``rerank`` are re-scored by the alignment
        head (ALBEF); with ``None`` the alignment head scores every pair (N * M fusions).
        """
        N, M = u.vision.shape[0], u.text.shape[0]
        device = u.vision.device

        def itm(img: Tensor, txt: Tensor) -> Tensor:  # alignment margin for pairs (img[i], txt[i])
            out = []
            for s in range(0, len(img), chunk):
                a, b = img[s : s + chunk], txt[s : s + chunk]
                logits = self.itm_logits(Unimodal(u.vision[a], u.text[b], u.text_mask[b], u.vision_rope, u.text_rope))
                out.append((logits[:, 1] - logits[:, 0]).float())
            return torch.cat(out)

        if self.itm_head is None:  # the contrastive loss alone: its similarity ranks
            sim = self.itc_similarity(u).float()
            return sim, sim
        if rerank is None:
            img, txt = torch.arange(N, device=device).repeat_interleave(M), torch.arange(M, device=device).repeat(N)
            scores = itm(img, txt).view(N, M)
            return scores, scores
        sim = self.itc_similarity(u).float()
        k_txt, k_img = min(rerank, M), min(rerank, N)
        txt = sim.topk(k_txt, dim=1).indices  # (N, k): texts to re-score per image
        img = sim.topk(k_img, dim=0).indices  # (k, M): images to re-score per text
        rows = torch.arange(N, device=device)[:, None].expand(-1, k_txt)
        cols = torch.arange(M, device=device)[None, :].expand(k_img, -1)
        i2t_top = itm(rows.flatten(), txt.flatten()).view(N, k_txt)
        t2i_top = itm(img.flatten(), cols.flatten()).view(k_img, M)
        # candidates not re-scored keep their similarity order, below every re-scored one
        floor = min(i2t_top.min(), t2i_top.min()) - 1 - (sim.max() - sim)
        i2t, t2i = floor.clone(), floor.clone()
        i2t[rows, txt] = i2t_top
        t2i[img, cols] = t2i_top
        return i2t, t2i

    # --- the pretraining losses ----------------------------------------------------------------
    def forward(
        self,
        images: Tensor,
        input_ids: Tensor,
        text_mask: Tensor,
        image_ids: Tensor,
        objectives: Objectives,
        batch: GlobalBatch | None = None,
    ) -> dict[str, Tensor]:
        """Losses and accuracies on this process's pairs (`mmtx.models.pretraining_losses`);
        ``loss`` is their weighted sum.

        Pairs of the same ``image_ids`` count as aligned (a batch may hold two captions of one
        image). ``batch`` places these rows in the global batch of data-parallel training
        (default: one process, torch's generator): the contrastive loss and alignment's negatives
        read every process's rows, the masks are drawn for the whole batch, and every loss is
        scaled so that the processes' averaged gradients are those of one process with the whole
        batch (a mean over tokens or patches is taken over the global batch's).
        """
        obj, batch = objectives, batch or GlobalBatch()
        input_ids, text_mask = self._padded(input_ids, text_mask, batch)
        masked_ids, labels = self._mask_text(input_ids, text_mask, obj, batch) if obj.mlm > 0 else (input_ids, None)
        picked, replaced = self._mask_patches(images, obj, batch) if obj.mpm > 0 else (None, None)
        u = self.backbone.unimodal(images, masked_ids, text_mask, replaced)
        all_ids = batch.gather(image_ids)  # (B,)

        out: dict[str, Tensor] = {}
        if obj.caption > 0:  # from the vision stream alone, on the unmasked text
            out["caption_loss"] = caption_loss(self.caption_decoder, input_ids, text_mask, u.vision, batch)
        similarity = None  # (B, B) of the global batch, to draw hard negatives by
        if obj.itc > 0:  # this process's images against every text, its texts against every image
            vision, text = self.itc_embeddings(u)
            all_vision, all_text = batch.gather(vision), batch.gather(text)
            positives = image_ids[:, None] == all_ids[None, :]  # (b, B)
            out["itc_loss"] = itc_loss(vision, text, all_vision, all_text, positives, self.itc_scale())
            if obj.itm > 0 and obj.hard_negatives:
                similarity = (self.itc_scale() * all_vision @ all_text.T).detach()
        b = images.shape[0]
        text_index = torch.arange(b, device=images.device) + batch.rank * b  # each image's own text, globally
        if obj.itm > 0:
            text_index = pick_negatives(all_ids[:, None] == all_ids[None, :], obj.negative_prob, similarity, batch)
            if batch.world_size > 1:  # negatives from other processes: their texts gathered, gradients flowing back
                u = Unimodal(u.vision, batch.gather(u.text), batch.gather(text_mask), u.vision_rope, u.text_rope)
            u = u.select_text(text_index)
        joint = self.backbone.fuse(u)
        aligned = all_ids[text_index] == image_ids  # (b,)

        if obj.itm > 0:
            out["itm_loss"], out["itm_acc"] = itm_loss(self.itm_head(joint.pooled), aligned)
        if labels is not None:
            out["mlm_loss"], out["mlm_acc"] = mlm_loss(self.mlm_head, joint.text, labels, aligned, batch)
        if picked is not None:
            targets = self.patch_target(images)
            out["mpm_loss"] = mpm_loss(self.mpm_head, joint.vision[:, 1:], targets, picked, aligned, batch)
        out["loss"] = sum(getattr(obj, k.removesuffix("_loss")) * v for k, v in out.items() if k.endswith("_loss"))
        return out

    def _padded(self, input_ids: Tensor, text_mask: Tensor, batch: GlobalBatch) -> tuple[Tensor, Tensor]:
        """The texts padded to the longest of any process, as one process with the whole batch would pad them."""
        width = batch.longest(input_ids.shape[1], input_ids.device)
        if width == input_ids.shape[1]:
            return input_ids, text_mask
        pad = (0, width - input_ids.shape[1])
        input_ids = F.pad(input_ids, pad, value=self.backbone.text.token_embed.padding_idx)
        return input_ids, F.pad(text_mask, pad, value=False)

    def _mask_text(
        self, input_ids: Tensor, text_mask: Tensor, obj: Objectives, batch: GlobalBatch
    ) -> tuple[Tensor, Tensor]:
        """The ids with the words picked for MLM masked, and their labels (b, T) (`IGNORE` elsewhere)."""
        if self.mask_id is None:
            raise ValueError("TwoStreamPretrainer.mask_id is not set (the tokenizer's [MASK] id)")
        maskable = text_mask.clone()
        for special in self.special_ids:  # compared with each id: a tensor of them would be a copy to the device
            maskable &= input_ids != special
        vocab = self.backbone.text.token_embed.num_embeddings
        return mask_tokens(input_ids, maskable, self.mask_id, vocab, obj.mask_prob, batch, self.special_ids)

    def _mask_patches(self, images: Tensor, obj: Objectives, batch: GlobalBatch) -> tuple[Tensor, Tensor]:
        """The patches picked for MPM and those of them replaced by the mask embedding, each (b, N)."""
        rows, cols = self.backbone.vision.patch_embed.grid(*images.shape[-2:])
        return mask_patches(
            images.shape[0], rows * cols, obj.patch_mask_prob, obj.patch_replace_prob, batch, images.device
        )


def pick_negatives(
    same_image: Tensor,
    negative_prob: float,
    similarity: Tensor | None = None,
    draws: GlobalBatch | None = None,
) -> Tensor:
    """For each image row of this process, the text row (of the global batch) it is paired with:
    its own, or (with ``negative_prob``) a text of another image — drawn in proportion to
    softmax(similarity) when given (hard negatives), else uniformly. Rows with no other image
    keep their own text. ``same_image`` and ``similarity`` are (B, B) over the global batch;
    ``draws`` places this process's rows in it (default: one process). Returns (b,)."""
    draws = draws or GlobalBatch()
    B, device = same_image.shape[0], same_image.device
    b = B // draws.world_size
    weights = torch.ones(B, B, device=device) if similarity is None else similarity.float().softmax(1)
    weights = weights.masked_fill(same_image, 0)
    has_other = weights.sum(1) > 0
    weights = torch.where(has_other[:, None], weights, torch.ones_like(weights))
    other = draws.multinomial(weights)
    rows = draws.rows(b)
    swap = (draws.rand(b, device=device) < negative_prob) & has_other[rows]
    return torch.where(swap, other, torch.arange(B, device=device)[rows])
