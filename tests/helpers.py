"""Tiny models and test-only pieces shared by the tests."""

import csv
import importlib.util
import json
import math
import os
import signal as signal_module
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import lightning as L
import torch
from PIL import Image

from mmtx.data.tokenizer import Tokenizer
from mmtx.models import CaptionDecoder, ImageCaptioner, VisionEncoder

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str) -> ModuleType:
    """``scripts/{name}.py`` imported afresh as a module (each call runs it again): registered in
    ``sys.modules`` as ``mmtx_script_{name}`` (its dataclasses look their module up there), with
    ``scripts/`` on the path while it runs (it may import a neighbour)."""
    path = SCRIPTS / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"mmtx_script_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[spec.name]
        raise
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


def tiny_captioner(pos_embed: str = "learned", vocab: int = 40, seed: int = 0, spread: float = 0.3) -> ImageCaptioner:
    """A 2+2-layer captioner on 32-px images whose random weights are spread enough that
    generated tokens vary (a freshly initialised model repeats one token)."""
    torch.manual_seed(seed)
    enc = VisionEncoder(image_size=32, patch_size=8, dim=32, depth=2, num_heads=4, pos_embed=pos_embed)
    dec = CaptionDecoder(vocab, context_dim=32, dim=48, depth=2, num_heads=4, max_length=24, pos_embed=pos_embed)
    model = ImageCaptioner(enc, dec).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0, spread)
    return model


def compose_train(overrides: list[str]):
    """conf/train.yaml composed with ``overrides``, the ``hydra`` node included."""
    from hydra import compose, initialize_config_dir

    from mmtx.cli.common import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name="train", overrides=overrides, return_hydra_config=True)


def draw_data(overrides: list[str]) -> None:
    """Draw (or find) the data set of an ``mmtx-train`` run with ``overrides`` in this process:
    runs started at once then read it, rather than each drawing it, and no launch is spent on it.
    ``paths.data_dir`` must be among ``overrides``, as an absolute path: this process's working
    directory is not the runs'."""
    from hydra.utils import instantiate

    from mmtx.data.tokenizer import Tokenizer

    cfg = compose_train([*overrides, "paths.output_dir=unused"])
    instantiate(cfg.data, tokenizer=Tokenizer.train).prepare_data()


def train_in_process(overrides: list[str]) -> dict[str, float]:
    """``mmtx.commands.train.train`` on a composed config, set up as ``@hydra.main`` would do it.

    ``HydraConfig`` must hold the config for the ``${hydra:...}`` interpolations (``run_name``);
    ``paths.output_dir`` (``${hydra:runtime.output_dir}``, which only a real Hydra run sets)
    has to be among the overrides.
    """
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from mmtx.commands.train import train

    cfg = compose_train(overrides)
    HydraConfig.instance().set_config(cfg)
    try:
        with open_dict(cfg):
            del cfg["hydra"]  # the app receives the job's config without the hydra node
        return train(cfg)
    finally:
        HydraConfig.instance().cfg = None  # type: ignore[assignment]


# a two-stream model of a few tens of thousands of parameters on 32-px images
TINY_TWO_STREAM = [
    "model.backbone.vision.dim=32", "model.backbone.vision.depth=1", "model.backbone.vision.num_heads=2",
    "model.backbone.vision.patch_size=8", "model.backbone.text.dim=32", "model.backbone.text.depth=1",
    "model.backbone.text.num_heads=2", "model.backbone.co_layers=1", "model.backbone.joint_dim=32",
]  # fmt: skip


class SignalAtStep(L.Callback):
    """Test-only: the process sends itself ``signal`` when optimizer step ``step`` ends.

    Added to a run with ``+callbacks.fault._target_=tests.helpers.SignalAtStep`` (the subprocess
    needs the repository on PYTHONPATH): SIGKILL dies at once, as a crashed machine would;
    SIGTERM is a scheduler's preemption notice.
    """

    def __init__(self, step: int, signal: str = "SIGKILL", rank: int = 0) -> None:
        self.step, self.signal, self.rank = step, getattr(signal_module, signal), rank

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            os.kill(os.getpid(), self.signal)


class RecordImageIds(L.Callback):
    """Test-only: appends ``STEP ID ID ...`` (the global step and the batch's image ids, or its
    ``key``: ``question_ids`` for VQA) to ``{path}/rank{R}.txt`` for every training batch, to see
    which steps each process trained and which samples it read."""

    def __init__(self, path: str, key: str = "image_ids") -> None:
        self.path, self.key = Path(path), key

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: dict, *args) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        ids = " ".join(str(i) for i in batch[self.key].tolist())
        with open(self.path / f"rank{trainer.global_rank}.txt", "a") as f:
            f.write(f"{trainer.global_step} {ids}\n")


def recorded_batches(folder: Path, rank: int = 0) -> list[tuple[int, list[int]]]:
    """``(global step, ids)`` of each training batch process ``rank`` recorded (:class:`RecordImageIds`), in order."""
    path = Path(folder) / f"rank{rank}.txt"
    if not path.is_file():
        return []
    return [(step, ids) for step, *ids in (map(int, line.split()) for line in path.read_text().splitlines())]


class NanImagesAtStep(L.Callback):
    """Test-only: at optimizer step ``step``, the images of process ``rank``'s batch become NaN, so
    that one process alone sees a non-finite loss."""

    def __init__(self, step: int, rank: int = 0) -> None:
        self.step, self.rank = step, rank

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: dict, *args) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            batch["images"].fill_(float("nan"))


class RecordProductDtypes(L.Callback):
    """Writes to ``path`` the dtypes the model's linear layers produced in training steps (one per
    line): ``torch.bfloat16`` where bf16 autocast really ran."""

    def __init__(self, path: str) -> None:
        self.path, self.dtypes = path, set()

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        def record(module: torch.nn.Module, args: tuple, out: torch.Tensor) -> None:
            if module.training:
                self.dtypes.add(str(out.dtype))

        for module in pl_module.modules():
            if isinstance(module, torch.nn.Linear):
                module.register_forward_hook(record)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        with open(self.path, "w") as f:
            f.write("\n".join(sorted(self.dtypes)))


def write_vit(path: Path, transformers):
    """A tiny Hugging Face ViT (width 32, 8-px patches, 32 px) saved as in a Hub directory."""
    torch.manual_seed(0)
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                    intermediate_size=64, image_size=32, patch_size=8)  # fmt: skip
    vit = transformers.ViTModel(config)
    vit.save_pretrained(path)
    return vit


def write_gpt2_vocab(path: Path, texts: list[str], vocab_size: int = 300) -> int:
    """GPT-2's tokenizer files (vocab.json + merges.txt: byte-level BPE with <|endoftext|>)
    learned from ``texts`` into ``path``; returns the vocabulary size."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, trainers

    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts * 20, trainer=trainer)
    path.mkdir(parents=True, exist_ok=True)
    backend.model.save(str(path))
    return backend.get_vocab_size()


def write_gpt2(path: Path, transformers, texts: list[str]) -> Tokenizer:
    """A tiny GPT-2 (with cross-attention) and its vocab.json + merges.txt learned from ``texts``,
    as in a Hub directory."""
    path.mkdir(parents=True)
    vocab_size = write_gpt2_vocab(path, texts)
    config = transformers.GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=4,
                                     n_positions=16, add_cross_attention=True)  # fmt: skip
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    return Tokenizer.from_file(path)


# --- the command-line tests' shared run (fixture ``trained``) and what runs write ---------------

# the caption metric keys every command reports (INTERFACES.md)
CAPTION_METRICS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr")
# and on drawn scenes, the captions scored against the scene (relation_accuracy: when any relation is stated)
SCENE_METRICS = ("correctness", "relation_accuracy", "relations_stated")

# the shared run: 64 images x 5 captions in batches of 16 = 20 steps in its one epoch
TRAIN = ["data.batch_size=16", "task.lr=3e-3", "trainer.log_every_n_steps=1"]
STEPS_PER_EPOCH = 64 * 5 // 16


@dataclass
class Run:
    dir: Path
    metrics: dict[str, float]

    @property
    def last(self) -> Path:
        return self.dir / "checkpoints" / "last.ckpt"

    def summary(self) -> dict[str, Any]:
        return json.loads((self.dir / "metrics.json").read_text())


def csv_rows(run_dir: Path) -> list[dict[str, str]]:
    """The rows of the (only) CSVLogger metrics file of a run."""
    (path,) = run_dir.glob("csv/version_*/metrics.csv")
    with path.open() as f:
        return list(csv.DictReader(f))


def logged(rows: list[dict[str, str]], key: str) -> list[tuple[int, float]]:
    """(step, value) of every row of a CSV log where ``key`` was logged."""
    return [(int(r["step"]), float(r[key])) for r in rows if r.get(key)]


def assert_caption_metrics(metrics: dict[str, Any]) -> None:
    """Exactly the 7 caption metrics (plus the scene scores on shapes data), as finite floats."""
    assert sorted(set(metrics) - set(SCENE_METRICS)) == sorted(CAPTION_METRICS)
    for name, value in metrics.items():
        assert type(value) is float and math.isfinite(value), (name, value)
        assert 0.0 <= value <= {"CIDEr": 10.0, "relations_stated": math.inf}.get(name, 1.0), (name, value)


def table_row(stdout: str, metric: str) -> list[str]:
    """The cells of ``metric``'s row in a printed metrics table."""
    rows = [line.split() for line in stdout.splitlines() if line.split()[:1] == [metric]]
    assert len(rows) == 1, f"no single {metric} row in:\n{stdout}"
    return rows[0]


def copy_images(sources: list[Path], folder: Path, names: list[str]) -> None:
    """Copy images under new names (converting by extension, e.g. a .jpg from a PNG)."""
    folder.mkdir(parents=True, exist_ok=True)
    for src, name in zip(sources, names):
        Image.open(src).convert("RGB").save(folder / name)
