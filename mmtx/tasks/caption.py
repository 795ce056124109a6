"""Image captioning as a LightningModule: teacher-forced training, generated-caption validation."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import lightning as L
import torch

from mmtx.attention_maps import attention_grid, caption_maps
from mmtx.config_build import build
from mmtx.config_error import ArgumentError
from mmtx.data.tokenizer import Tokenizer
from mmtx.data.transforms import IMAGENET_MEAN, IMAGENET_STD, normalize_images
from mmtx.generation import GenerationConfig, generate
from mmtx.metrics.caption import caption_metrics, constant_baseline
from mmtx.models.captioner import ImageCaptioner
from mmtx.tasks.base import Task
from mmtx.tasks.gather import gather_unique


class CaptionTask(Task):
    """Trains an :class:`ImageCaptioner` and scores its generated captions with the COCO metrics.

    The model is built here from its config and the tokenizer is stored as JSON text, so a
    checkpoint holds only plain data and rebuilds itself (no pickled objects).

    Args:
        model: the captioner's config (``_target_`` + arguments); the decoder's ``vocab_size``
            and ``pad_id`` are filled in from the tokenizer.
        tokenizer: the tokenizer as JSON text (``Tokenizer.to_str()``).
        lr, weight_decay, betas: AdamW settings (no decay on biases, norms, positions).
        warmup_ratio, min_lr_ratio: linear warm-up over this fraction of the steps, then cosine
            decay to ``min_lr_ratio * lr``.
        label_smoothing: cross-entropy label smoothing (pads are always ignored).
        word_weights: the training loss's weight of each listed word's tokens, others 1 (e.g. the
            words that carry a caption's claims: kinds and relations); ``train/loss`` is then the
            weighted mean, ``val/loss`` stays the plain one.
        generation: :class:`GenerationConfig` fields used for validation captions
            (``max_new_tokens: null`` = up to the decoder's ``max_length``).
        num_samples: validation images kept (with their captions) for loggers to show.
        freeze: the weights that do not train (:class:`mmtx.tasks.freezing.Freeze`).
        lora: low-rank adapters (:class:`mmtx.tasks.lora.Lora`).
    """

    # a two-stream pretraining checkpoint's vision stream becomes the captioner's image encoder
    init_renames = MappingProxyType({"model.backbone.vision.": "model.encoder."})

    def __init__(
        self,
        model: dict,
        tokenizer: str,
        lr: float = 5e-4,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.98),
        warmup_ratio: float = 0.05,
        min_lr_ratio: float = 0.01,
        label_smoothing: float = 0.1,
        word_weights: dict[str, float] | None = None,
        generation: dict | None = None,
        num_samples: int = 16,
        freeze: dict | None = None,
        lora: dict | None = None,
        data_config: dict | None = None,
    ) -> None:
        super().__init__(tokenizer=tokenizer, data_config=data_config, freeze=freeze, lora=lora)
        self.model: ImageCaptioner = build(
            model, key="model", decoder={"vocab_size": self.tokenizer.vocab_size, "pad_id": self.tokenizer.pad_id}
        )
        self.check_text_length("decoder", self.model.decoder.max_length)
        check_word_weights(word_weights)
        if word_weights and label_smoothing:  # torch spreads the smoothing by the vocabulary's weights
            raise ArgumentError(
                "{word_weights!k} needs no label smoothing, got {label_smoothing}: torch's would favour the weighted words",
                word_weights=word_weights,
                label_smoothing=label_smoothing,
            )
        self.token_weights: torch.Tensor | None = None  # (vocab,), set when the fit starts
        generation = dict(generation or {})
        if generation.get("max_new_tokens") is None:  # as long as the decoder's positions allow
            generation["max_new_tokens"] = self.model.decoder.max_length - 1
        self.generation = GenerationConfig(**generation)
        self.samples: list[dict[str, Any]] = []  # for loggers: image, prediction, references
        self.choose_trainable()

    # --- training ------------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        super().on_fit_start()
        # spelt by the run's vocabulary, which the start-up check only has a stand-in for
        weights = token_weights(self.tokenizer, self.hparams.word_weights)
        self.token_weights = None if weights is None else weights.to(self.device)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        """The loss summed over the batch's target tokens (`Task.summed_loss`): each optimizer step
        then trains on the mean over all its tokens, as one batch holding every process's and
        micro-batch's captions would, though captions of different lengths give the processes and
        micro-batches different numbers of tokens."""
        pad_id, weights = self.tokenizer.pad_id, self.token_weights
        targets = batch["input_ids"][:, 1:]
        real = targets != pad_id
        tokens = real.sum() if weights is None else weights[targets][real].sum()  # the mean's denominator
        loss = self.model.loss(
            batch["images"], batch["input_ids"], pad_id, self.hparams.label_smoothing, weights, batch.get("image_index")
        )
        return self.summed_loss(loss * tokens, tokens)

    # --- captions ------------------------------------------------------------------------------
    def caption(self, images: torch.Tensor, config: GenerationConfig | None = None) -> list[str]:
        """Generated captions for a batch of transformed images (B, 3, H, W)."""
        return self.tokenizer.decode_batch(self.generate_ids(images, config).cpu())

    @torch.no_grad()
    def attention_grids(self, images: torch.Tensor) -> list[Any]:
        """For uint8 images (B, 3, S, S): each one's caption and a heat map per word of where it
        was read from, drawn as one picture (`mmtx.attention_maps.attention_grid`)."""
        inputs = normalize_images(images.to(self.device))
        ids = self.generate_ids(inputs)
        texts = self.tokenizer.decode_batch(ids.cpu())
        return [attention_grid(image, text, words, maps)
                for image, text, (words, maps) in zip(images.cpu(), texts, caption_maps(self, inputs, ids))]  # fmt: skip

    def generate_ids(self, images: torch.Tensor, config: GenerationConfig | None = None) -> torch.Tensor:
        """The generated token ids (B, L) of :meth:`caption`: no [BOS], padded after [EOS]."""
        tok = self.tokenizer
        return generate(
            self.model.decoder,
            self.model.encode(images),
            bos_id=tok.bos_id,
            eos_id=tok.eos_id,
            pad_id=tok.pad_id,
            config=config or self.generation,
        )

    # --- validation / test ---------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        super().on_validation_epoch_start()
        self.samples = []

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        images = batch["images"]
        loss = self.model.loss(images, batch["input_ids"], self.tokenizer.pad_id)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True, batch_size=images.shape[0])
        predictions = self.caption(images)
        for image_id, pred, refs in zip(batch["image_ids"].tolist(), predictions, batch["references"]):
            self.val_outputs.append({"image_id": image_id, "caption": pred, "references": refs})
        for i in range(min(len(predictions), self.hparams.num_samples - len(self.samples))):
            self.samples.append(
                {"image": _to_uint8(images[i]), "prediction": predictions[i], "references": batch["references"][i]}
            )

    def on_validation_epoch_end(self) -> None:
        outputs = gather_unique(self.val_outputs, key="image_id", strategy=self.trainer.strategy)
        if self.trainer.sanity_checking or not outputs:
            return
        metrics = None
        if self.trainer.is_global_zero:
            preds = {o["image_id"]: o["caption"] for o in outputs if o["references"]}
            refs = {o["image_id"]: o["references"] for o in outputs if o["references"]}
            metrics = caption_metrics(preds, refs)
            datamodule = self.trainer.datamodule
            if datamodule is not None and hasattr(datamodule, "score_captions"):
                metrics |= datamodule.score_captions(datamodule.val_split, preds)
        self.metrics = self.trainer.strategy.broadcast(metrics)
        self.log_dict({f"val/{k}": v for k, v in self.metrics.items()}, sync_dist=True)  # equal on every rank
        self.val_outputs = outputs  # all ranks' predictions, each image once

    def predictions(self) -> list[dict[str, Any]]:
        """The last evaluation's captions in the official results format."""
        return [{"image_id": o["image_id"], "caption": o["caption"]} for o in self.val_outputs]

    def baseline(self, datamodule: L.LightningDataModule) -> tuple[str, dict[str, float]]:
        """The constant-caption baseline on the images the last validation scored."""
        evaluated = {o["image_id"]: o["references"] for o in self.val_outputs if o["references"]}
        caption, metrics = constant_baseline(datamodule.references("train"), evaluated)
        return f"the same caption for every image: {caption!r}", metrics


def check_word_weights(word_weights: Mapping[str, float] | None) -> None:
    """Refuses what is not a map of words to positive finite numbers, naming ``word_weights``."""
    if word_weights is not None and not isinstance(word_weights, Mapping):
        raise ArgumentError("{word_weights} must map words to weights, e.g. {{circle: 3}}", word_weights=word_weights)
    for word, weight in (word_weights or {}).items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < math.inf:
            raise ArgumentError(f"{{word_weights!k}}: {word!r} takes a positive finite number, got {weight!r}",
                                word_weights=word_weights)  # fmt: skip


def token_weights(tokenizer: Tokenizer, word_weights: Mapping[str, float] | None) -> torch.Tensor | None:
    """A loss weight per token id (vocab,): each word's weight on its tokens, 1 elsewhere; None
    when no word is weighted. A word must be one token of the vocabulary where a caption has it
    (after a space, as byte-level BPE spells it): a word spelt in pieces, or as [UNK], is refused,
    since its pieces are other words' too; so is a weight `check_word_weights` refuses. A cased
    vocabulary's token for the word capitalised weighs the same where it is one token. Byte-level
    BPE spells a word opening a caption as it spells a piece inside other words ("circle" in
    "semicircle"), so that token keeps weight 1."""
    check_word_weights(word_weights)
    if not word_weights:
        return None
    weights = torch.ones(tokenizer.vocab_size)
    lead = tokenizer.encode("a", add_special=False)

    def inside(text: str) -> list[int]:  # the ids that spell `text` inside a caption, after "a "
        ids = tokenizer.encode(f"a {text}", add_special=False)
        return ids[len(lead) :] if ids[: len(lead)] == lead else [tokenizer.unk_id]  # "a" merged into it

    def one_token(ids: list[int]) -> bool:
        return len(ids) == 1 and ids[0] != tokenizer.unk_id

    for word, weight in word_weights.items():
        ids = inside(word)
        if not one_token(ids):
            pieces = [tokenizer.backend.id_to_token(i) for i in ids]
            raise ArgumentError(f"{{word_weights!k}}: {word!r} is not one token of the run's vocabulary, "
                                f"which spells it {pieces}", word_weights=word_weights)  # fmt: skip
        weights[ids[0]] = float(weight)
        if one_token(capital := inside(word[:1].upper() + word[1:])):
            weights[capital[0]] = float(weight)
    return weights


def _to_uint8(image: torch.Tensor) -> torch.Tensor:
    """Undo the ImageNet normalisation: (3, H, W) float -> (H, W, 3) uint8 on the CPU."""
    mean = torch.tensor(IMAGENET_MEAN, device=image.device)[:, None, None]
    std = torch.tensor(IMAGENET_STD, device=image.device)[:, None, None]
    return ((image.float() * std + mean).clamp(0, 1) * 255).round().byte().permute(1, 2, 0).cpu()
