"""mmtx-eval end to end on the shared trained captioner: the official metrics and prediction files
on the data it was trained on, on official COCO and on Karpathy-split files, and one-line errors
for a checkpoint whose data is not here or whose data module this mmtx lacks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from mmtx.checkpoint import DATA_KEY
from mmtx.metrics.caption import caption_metrics
from tests.helpers import SCENE_METRICS, Run, assert_caption_metrics, compose_train, copy_images, table_row


@pytest.fixture(scope="module")
def evals(cli, trained: Run, val_records, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """mmtx-eval on the shared checkpoint: on the data it was trained on (the default), on a small
    official-COCO file and on a Karpathy-split file, both over copies of shapes images. Run at
    once: they are mostly start-up and Java time."""
    root = tmp_path_factory.mktemp("evals")
    recs = val_records[:7]

    coco_ids = [42, 7, 123456]  # not the shapes ids: predictions must carry the file's ids
    names = [f"COCO_val2014_{i:012d}.{ext}" for i, ext in zip(coco_ids, ("png", "jpg", "png"))]
    copy_images([r.path for r in recs[:3]], root / "val2014", names)
    (root / "captions_val.json").write_text(json.dumps({
        "info": {}, "licenses": [],
        "images": [{"id": i, "file_name": n, "width": 32, "height": 32} for i, n in zip(coco_ids, names)],
        "annotations": [
            {"id": 10 * i + j, "image_id": i, "caption": c}
            for i, r in zip(coco_ids, recs) for j, c in enumerate(r.captions)
        ],
    }))  # fmt: skip

    # Karpathy: train/restval/val/test images in one file, each at images/filepath/filename
    splits = ["train", "restval", "val", "test", "test", "val", "test"]
    cocoids = [900 + k for k in range(len(recs))]
    entries = []
    for k, (rec, split, cocoid) in enumerate(zip(recs, splits, cocoids)):
        copy_images([rec.path], root / "karpathy" / "val2014", [f"img_{k}.png"])
        entries.append({
            "filepath": "val2014", "filename": f"img_{k}.png", "imgid": k, "cocoid": cocoid, "split": split,
            "sentids": list(range(5 * k, 5 * k + len(rec.captions))),
            "sentences": [{"raw": c, "tokens": c.split(), "imgid": k} for c in rec.captions],
        })  # fmt: skip
    (root / "dataset_coco.json").write_text(json.dumps({"dataset": "coco", "images": entries}))

    ckpt = f"ckpt={trained.last}"
    shapes, coco, karpathy = cli.run_many(
        # output folders that do not exist yet are made (the results are not lost at the end)
        # at the precision the run was trained and validated at (the CPU preset's is bf16 where the CPU has it)
        ("mmtx-eval", ckpt, "trainer.precision=32-true", "output=shapes/metrics.json", "predictions=shapes/predictions.json"),
        ("mmtx-eval", ckpt, "data=coco", f"data.val.annotations={root / 'captions_val.json'}",
         f"data.val.images={root / 'val2014'}", "data.num_workers=0",
         "output=coco/metrics.json", "predictions=coco/predictions.json"),
        ("mmtx-eval", ckpt, "data=karpathy", f"data.annotations={root / 'dataset_coco.json'}",
         f"data.images={root / 'karpathy'}", "data.num_workers=0", "split=test",
         "output=karpathy/metrics.json", "predictions=karpathy/predictions.json"),
        cwd=root, check=False,
    )  # fmt: skip
    return {
        "root": root, "results": {"shapes": shapes, "coco": coco, "karpathy": karpathy},
        "ids": {"coco": coco_ids, "karpathy": [i for i, s in zip(cocoids, splits) if s == "test"]},
    }  # fmt: skip


def eval_outputs(cli, evals: dict[str, Any], source: str) -> tuple[Any, dict[str, float], list[dict]]:
    """The finished mmtx-eval run on ``source``: its process, metrics and predictions."""
    result = evals["results"][source]
    assert result.returncode == 0, cli.describe(result)
    folder = evals["root"] / source
    metrics = json.loads((folder / "metrics.json").read_text())
    return result, metrics, json.loads((folder / "predictions.json").read_text())


@pytest.mark.slow
def test_mmtx_eval_writes_official_formats(cli, evals: dict[str, Any], trained: Run, val_records) -> None:
    result, metrics, predictions = eval_outputs(cli, evals, "shapes")
    assert_caption_metrics(metrics)
    assert table_row(result.stdout, "CIDEr") == ["CIDEr", f"{metrics['CIDEr']:.4f}"]

    assert isinstance(predictions, list)
    for p in predictions:
        assert set(p) == {"image_id", "caption"}
        assert type(p["image_id"]) is int and isinstance(p["caption"], str) and p["caption"].strip()
    ids = [p["image_id"] for p in predictions]
    assert sorted(ids) == sorted(r.image_id for r in val_records) and len(set(ids)) == len(ids)

    # the numbers are the official metrics of the written predictions ...
    references = {r.image_id: list(r.captions) for r in val_records}
    recomputed = caption_metrics({p["image_id"]: p["caption"] for p in predictions}, references)
    assert {k: metrics[k] for k in recomputed} == pytest.approx(recomputed, rel=1e-9, abs=1e-12)
    # shapes data: captions checked against the scene
    assert {"correctness", "relations_stated"} <= set(metrics) - set(recomputed) <= set(SCENE_METRICS)
    # ... and the ones training reported for the same (final) weights
    assert metrics == pytest.approx(trained.metrics, rel=1e-6, abs=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("source", ["coco", "karpathy"])
def test_mmtx_eval_on_other_data(cli, evals: dict[str, Any], source: str) -> None:
    result, metrics, predictions = eval_outputs(cli, evals, source)
    assert_caption_metrics(metrics)
    assert table_row(result.stdout, "CIDEr") == ["CIDEr", f"{metrics['CIDEr']:.4f}"]
    assert [p["image_id"] for p in predictions] == sorted(evals["ids"][source])
    assert all(set(p) == {"image_id", "caption"} and p["caption"].strip() for p in predictions)


def test_checkpoints_record_absolute_data_paths_and_eval_names_missing(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run started with ``data.val.annotations=mydata/x.json`` records where that is, so the
    checkpoint evaluates from any directory; files gone since are named, with how to give others."""
    from omegaconf import OmegaConf

    from mmtx.commands.common import absolute_data_paths
    from tests.bad_inputs import write_tiny_checkpoint

    monkeypatch.chdir(tmp_path)
    cfg = compose_train(
        [
            "data=coco",
            "data.max_length=24",
            *(f"data.{s}.{f}=mydata/{s}_{f}" for s in ("train", "val") for f in ("annotations", "images")),
        ]
    )  # fmt: skip (24: the tiny model's)
    absolute_data_paths(cfg.data)
    assert cfg.data.val.annotations == str(tmp_path / "mydata" / "val_annotations")
    assert cfg.data.train.images == str(tmp_path / "mydata" / "train_images")

    ckpt = write_tiny_checkpoint(tmp_path / "run" / "last.ckpt")
    contents = torch.load(ckpt, weights_only=True)
    torch.save({**contents, DATA_KEY: OmegaConf.to_container(cfg.data, resolve=True)}, ckpt)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = cli.run("mmtx-eval", f"ckpt={ckpt}", cwd=elsewhere, check=False)
    assert result.returncode == 1, cli.describe(result)
    assert result.stderr.strip() == (
        f"mmtx: {ckpt} was trained on data files that are not here (annotations={tmp_path}/mydata/val_annotations, "
        f"images={tmp_path}/mydata/val_images); give the data to evaluate on, e.g. data=coco "
        "data.val.annotations=FILE data.val.images=DIR"
    )


def test_unknown_data_module_in_a_checkpoint_is_named_with_the_override(cli, tmp_path: Path) -> None:
    """A checkpoint from before a data module moved (say ``mmtx.data.datamodule.CocoCaptions``):
    one line naming it and the data to give, not a traceback."""
    from tests.bad_inputs import write_tiny_checkpoint

    ckpt = write_tiny_checkpoint(tmp_path / "old.ckpt")
    contents = torch.load(ckpt, weights_only=True)
    old = {"_target_": "mmtx.data.datamodule.CocoCaptions", "image_size": 32, "val": None}
    torch.save({**contents, DATA_KEY: old}, ckpt)
    result = cli.run("mmtx-eval", f"ckpt={ckpt}", cwd=tmp_path, check=False)
    assert result.returncode == 1, cli.describe(result)
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and message.startswith(
        f"mmtx: {ckpt} records a data module this mmtx cannot build"
    )
    assert "mmtx.data.datamodule.CocoCaptions" in message and "data=coco data.val.annotations=FILE" in message
