"""``data=webdataset`` and ``mmtx-shards``: tar shards as img2dataset writes them, read by random
access; bad samples named by shard and key; written from your own pairs, trained on, evaluated."""

from __future__ import annotations

import gzip
import io
import json
import signal
from pathlib import Path

import pytest
import torch
from PIL import Image
from webdataset import TarWriter

from mmtx.data.annotations import AnnotationError
from mmtx.data.images import read_image
from mmtx.data.sampling import ShardedBatchSampler
from mmtx.data.shards import ShardCaptions, read_shards, read_vqa_shards, shard_paths
from mmtx.data.synthetic.shapes_vqa import generate_shapes_vqa
from mmtx.data.tokenizer import Tokenizer
from mmtx.data.vqa import read_vqa
from tests.conftest import TINY_MODEL
from tests.helpers import TINY_TWO_STREAM
from tests.test_pairs import ROWS, write_images, write_jsonl

COLOURS = ["red", "blue", "green", "yellow", "purple", "orange"]


def encoded(colour: str, fmt: str = "JPEG", size: tuple[int, int] = (40, 32)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format=fmt)
    return out.getvalue()


def write_shard(path: Path, samples: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with TarWriter(str(path)) as sink:
        for sample in samples:
            sink.write(sample)
    return path


def img2dataset_shards(root: Path) -> list[Path]:
    """Two shards in img2dataset's layout, with the three ways a sample gives its caption."""
    first = [{"__key__": f"0000{k}", "jpg": encoded(c), "txt": f"a {c} square"} for k, c in enumerate(COLOURS[:3])]
    second = [
        {"__key__": "00010", "png": encoded("yellow", "PNG"), "json": {"caption": "a yellow  square"}},
        {"__key__": "00011", "webp": encoded("purple", "WEBP"), "txt": "ignored",
         "json": {"captions": ["a purple square", "purple all over"]}},
    ]  # fmt: skip
    return [write_shard(root / "00000.tar", first), write_shard(root / "00001.tar", second)]


def test_img2dataset_shards_are_indexed_and_read_by_random_access(tmp_path: Path) -> None:
    shards = img2dataset_shards(tmp_path / "shards")
    assert shard_paths(str(tmp_path / "shards" / "{00000..00001}.tar")) == shards
    records = read_shards(str(tmp_path / "shards" / "{00000..00001}.tar"))
    assert [r.captions for r in records] == [
        ("a red square",), ("a blue square",), ("a green square",), ("a yellow square",),
        ("a purple square", "purple all over"),  # a captions list: all the references
    ]  # fmt: skip
    assert [r.image_id for r in records] == [0, 1, 2, 3, 4]  # no image_id in their .json: positions
    assert [str(r.path).rsplit(":", 1)[1] for r in records] == [
        "00000.jpg",
        "00001.jpg",
        "00002.jpg",
        "00010.png",
        "00011.webp",
    ]
    for record, colour in zip(records, COLOURS):
        expected = read_image(_file(tmp_path, colour))
        assert torch.equal(read_image(record.path), expected)  # the member's bytes, decoded as a file's
    assert read_shards([str(shards[1]), str(shards[0])])[0].captions == ("a yellow square",)  # a list, in order


def _file(root: Path, colour: str) -> Path:
    fmt = {"yellow": "PNG", "purple": "WEBP"}.get(colour, "JPEG")
    path = root / f"{colour}.{fmt.lower()}"
    path.write_bytes(encoded(colour, fmt))
    return path


def test_bad_samples_are_named_by_shard_and_key_or_left_out(tmp_path: Path) -> None:
    good = {"__key__": "a0", "jpg": encoded("red"), "txt": "a red square"}
    shard = write_shard(tmp_path / "s" / "00000.tar", [
        good, {"__key__": "a1", "jpg": encoded("blue")},  # no caption
        {"__key__": "a2", "txt": "no image here"}, {"__key__": "a3", "jpg": encoded("green"), "json": b"{not json"},
    ])  # fmt: skip
    cut = write_shard(tmp_path / "s" / "00001.tar", [{**good, "__key__": "b0"}, {**good, "__key__": "b1"}])
    data = cut.read_bytes()
    cut.write_bytes(data[: len(data) // 2 + 200])  # cut short inside its second sample
    zipped = tmp_path / "s" / "00002.tar"
    zipped.write_bytes(gzip.compress(write_shard(tmp_path / "plain.tar", [good]).read_bytes()))
    spec = str(tmp_path / "s" / "{00000..00003}.tar")

    skipped: list[str] = []
    records = read_shards(spec, skipped=skipped)
    assert [str(r.path).rsplit(":", 1)[1] for r in records] == ["a0.jpg", "b0.jpg"]  # what is readable
    expected = [f"{shard}: a1: no caption", f"{shard}: a2: no image", f"{shard}: a3.json: not JSON",
                f"{cut}: unreadable after", f"{zipped}: unreadable after 0 samples (not an uncompressed tar file)",
                f"{tmp_path / 's' / '00003.tar'}: shard not found"]  # fmt: skip
    assert len(skipped) == len(expected)
    for problem, start in zip(skipped, expected):
        assert problem.startswith(start), problem
    with pytest.raises(AnnotationError, match="6 bad entries") as info:
        read_shards(spec)
    assert f"{shard}: a1: no caption" in str(info.value)


def test_every_sample_is_seen_once_per_epoch_by_any_number_of_processes(tmp_path: Path) -> None:
    """Shards do not divide among the processes here (3 shards of 5, 4 and 3 samples, 2 processes):
    sampling is per sample, so each is read once, and the order does not depend on the shards."""
    sizes = (5, 4, 3)
    for s, size in enumerate(sizes):
        write_shard(
            tmp_path / f"{s:05d}.tar",
            [{"__key__": f"{s}{k:02d}", "jpg": encoded("red"), "txt": f"sample {s} {k}"} for k in range(size)],
        )
    module = ShardCaptions(
        train={"shards": str(tmp_path / "{00000..00002}.tar")},
        image_size=32,
        batch_size=2,
        num_workers=0,
        in_memory=False,
        tokenizer=Tokenizer.train(["sample 0 1 2 3"], vocab_size=40),
    )
    module.setup("fit")
    dataset = module.datasets["train"]
    seen = []
    for rank in range(2):
        sampler = ShardedBatchSampler(len(dataset), 2, shuffle=True, drop_last=True, seed=0, rank=rank, world_size=2)
        seen += [dataset.example(i, dataset.record(i), None)["caption"] for batch in sampler for i, _ in batch]
    assert len(seen) == len(set(seen)) == 12  # 3 global batches of 2 x 2: every sample once
    single = ShardedBatchSampler(len(dataset), 4, shuffle=True, drop_last=True, seed=0)
    assert sorted(
        dataset.example(i, dataset.record(i), None)["caption"] for batch in single for i, _ in batch
    ) == sorted(seen)


def test_a_corrupt_image_inside_a_shard_is_named_by_shard_and_key(tmp_path: Path) -> None:
    broken = encoded("red")[:60] + b"\0" * 200  # a JPEG header, then nothing
    shard = write_shard(tmp_path / "00000.tar", [
        {"__key__": f"k{k}", "jpg": broken if k == 2 else encoded("blue"), "txt": f"sample {k}"} for k in range(4)
    ])  # fmt: skip
    tokenizer = Tokenizer.train(["sample 0 1 2 3"], vocab_size=40)
    module = ShardCaptions(train={"shards": str(shard)}, image_size=32, batch_size=4, num_workers=0,
                           in_memory=False, on_bad_image="skip", tokenizer=tokenizer)  # fmt: skip
    module.setup("fit")
    batch = next(iter(module.train_dataloader()))
    assert len(batch["images"]) == 4  # the bad image's place taken by another's
    assert [(d.split, d.kind, d.what) for d in module.report.items] == [("train", "decode", f"{shard}:k2.jpg")]
    strict = ShardCaptions(train={"shards": str(shard)}, image_size=32, batch_size=4, num_workers=0,
                           in_memory=False, tokenizer=tokenizer)  # fmt: skip
    strict.setup("fit")
    with pytest.raises(Exception, match=f"{shard}:k2.jpg"):
        next(iter(strict.train_dataloader()))


def test_shards_written_from_pairs_train_and_evaluate_end_to_end(cli, tmp_path: Path) -> None:
    write_images(tmp_path / "photos")
    train = write_jsonl(tmp_path / "train.jsonl", [{"image": i, "caption": c} for i, c in ROWS * 3])
    val = write_jsonl(tmp_path / "val.jsonl", [{"image": i, "caption": c} for i, c in ROWS])
    out = tmp_path / "shards"
    args = ("mmtx-shards", "data=pairs", f"data.train.file={train}", f"data.train.images={tmp_path / 'photos'}",
            f"data.val.file={val}", f"data.val.images={tmp_path / 'photos'}", f"out={out}", "shard_size=2",
            "image_size=24")  # fmt: skip
    result = cli.run(*args, cwd=tmp_path)
    assert "train: 3 samples in 2 shard(s)" in result.stdout and "val: 3 samples in 2 shard(s)" in result.stdout
    listing = json.loads((out / "shards.json").read_text())
    assert listing["splits"]["train"] == {"shards": ["train-00000.tar", "train-00001.tar"], "samples": 3}
    records = read_shards(f"{out / 'shards.json'}:val")
    assert [(r.image_id, r.captions) for r in records] == [
        (1, ("a red ball", "a red circle on grey")),
        (2, ("a blue box",)),
        (3, ("a green ball",)),
    ]
    assert min(read_image(records[0].path).shape[1:]) == 24  # re-encoded at image_size (shorter side)

    (out / "val-00001.tar").unlink()  # as if interrupted: a second run writes only what is missing
    again = cli.run(*args, cwd=tmp_path)
    assert "val: 3 samples in 2 shard(s)" in again.stdout and (out / "val-00001.tar").exists()
    other = cli.run(*args[:-1], "image_size=32", cwd=tmp_path, check=False)
    assert other.returncode == 1 and "holds shards written with other settings" in other.stderr

    cli.run(
        "mmtx-train",
        "data=webdataset",
        f"data.train.shards={out / 'shards.json'}:train",
        f"data.val.shards={out / 'shards.json'}:val",
        "data.image_size=32",
        "data.batch_size=2",
        *TINY_MODEL,
        "trainer.max_steps=3",
        "trainer.enable_progress_bar=false",
        "logger=none",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    result = cli.run("mmtx-eval", f"ckpt={tmp_path / 'run' / 'checkpoints' / 'last.ckpt'}", cwd=tmp_path)
    assert "CIDEr" in result.stdout and "(3 examples)" in result.stdout, result.stdout
    predictions = json.loads((tmp_path / "predictions.json").read_text())
    assert sorted(p["image_id"] for p in predictions) == [1, 2, 3]  # the pairs' ids, kept in the .json


def test_vqa_shards_from_vqa_v2_files_train_and_evaluate_end_to_end(cli, tmp_path: Path) -> None:
    files = generate_shapes_vqa(tmp_path / "vqa", num_train=12, num_val=4, image_size=32, seed=1, questions_per_image=3)
    keys = {"questions": 0, "annotations": 1, "images": 2}
    data = [f"data.{split}.{key}={files[split][k]}" for split in ("train", "val") for key, k in keys.items()]
    out = tmp_path / "shards"
    result = cli.run("mmtx-shards", "data=vqa", *data, f"out={out}", "shard_size=5", "image_size=32", cwd=tmp_path)
    assert "train: 12 samples in 3 shard(s)" in result.stdout and "data=webdataset_vqa" in result.stdout
    for split in ("train", "val"):  # every question, with its answers and types, under its image
        written = read_vqa_shards(f"{out / 'shards.json'}:{split}")
        expected = read_vqa(*files[split])
        fields = lambda r: (r.question_id, r.image_id, r.question, r.answers, r.answer_type, r.question_type)  # noqa: E731
        assert sorted(map(fields, written)) == sorted(map(fields, expected))
        originals = {e.image_id: read_image(e.path).float() for e in expected}
        distance = {i: (read_image(written[0].path).float() - o).abs().mean() for i, o in originals.items()}
        assert min(distance, key=distance.get) == written[0].image_id  # its own image, re-encoded as a JPEG

    run = tmp_path / "run"
    cli.run(
        "mmtx-train",
        "task=vqa",
        "data=webdataset_vqa",
        f"data.train.shards={out / 'shards.json'}:train",
        f"data.val.shards={out / 'shards.json'}:val",
        "data.image_size=32",
        "data.batch_size=6",
        *TINY_TWO_STREAM,
        "task.num_answers=20",
        "trainer.max_steps=3",
        "trainer.enable_progress_bar=false",
        "logger=none",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
    )
    result = cli.run("mmtx-eval", f"ckpt={run / 'checkpoints' / 'last.ckpt'}", cwd=tmp_path)
    assert "accuracy" in result.stdout and "(12 examples)" in result.stdout, result.stdout
    predictions = json.loads((tmp_path / "predictions.json").read_text())
    assert sorted(p["question_id"] for p in predictions) == sorted(r.question_id for r in read_vqa(*files["val"]))


def test_bad_vqa_samples_are_named_by_shard_and_key_or_left_out(tmp_path: Path) -> None:
    question = {
        "question_id": 1,
        "question": "what colour is the ball?",
        "answers": ["red"] * 10,
        "answer_type": "other",
    }
    shard = write_shard(tmp_path / "vqa-0.tar", [
        {"__key__": "good", "jpg": encoded("red"), "json": {"image_id": 7, "questions": [question]}},
        {"__key__": "noquestions", "jpg": encoded("blue"), "json": {"image_id": 8, "questions": []}},
        {"__key__": "noanswers", "jpg": encoded("blue"), "json": {"image_id": 9, "questions": [{**question, "question_id": 2, "answers": []}]}},
        {"__key__": "again", "jpg": encoded("green"), "json": {"image_id": 10, "questions": [question]}},
    ])  # fmt: skip
    with pytest.raises(AnnotationError) as err:
        read_vqa_shards(shard)
    message = str(err.value)
    assert "3 bad entries" in message
    assert f"{shard}: noquestions.json: questions: expected a non-empty list" in message
    assert f"{shard}: noanswers.json: questions[0].answers: expected a non-empty list of answer strings" in message
    assert f"{shard}: again.json: questions[0].question_id: duplicate question id 1" in message
    skipped: list[str] = []
    records = read_vqa_shards(shard, skipped=skipped)
    assert [(r.question_id, r.image_id, r.answers) for r in records] == [(1, 7, ("red",) * 10)] and len(skipped) == 3


def write_test_shards(root: Path, count: int = 150, per_shard: int = 40, bad: tuple[int, ...] = (17, 63, 101)) -> str:
    """``count`` samples (two captions and an ``image_id`` each) in shards of ``per_shard``; the
    samples ``bad`` have no caption. Returns the brace pattern naming the shards."""
    shards = -(-count // per_shard)
    for s in range(shards):
        samples = []
        for k in range(s * per_shard, min(count, (s + 1) * per_shard)):
            colour = COLOURS[k % len(COLOURS)]
            sample = {"__key__": f"{k:06d}", "jpg": encoded(colour)}
            if k not in bad:
                sample["json"] = {"image_id": k, "captions": [f"a {colour} square", f"{colour} all over"]}
            samples.append(sample)
        write_shard(root / f"{s:05d}.tar", samples)
    return str(root / f"{{00000..{shards - 1:05d}}}.tar")


def steps_read(folder: Path) -> dict[int, list[int]]:
    """``{global step: image ids}`` of every process's batches (tests.helpers.RecordImageIds);
    a step read again after a resume counts once, as read last."""
    steps: dict[int, list[int]] = {}
    for rank in sorted(folder.glob("rank*.txt")):
        per_rank: dict[int, list[int]] = {}
        for line in rank.read_text().splitlines():
            step, *ids = map(int, line.split())
            per_rank[step] = ids
        for step, ids in per_rank.items():
            steps.setdefault(step, []).extend(ids)
    return steps


@pytest.mark.slow
@pytest.mark.parametrize("task", ["caption", "pretrain"])
def test_one_and_two_processes_and_a_resumed_run_read_the_same_samples(
    cli, task: str, tmp_path: Path, repo_on_path
) -> None:
    """A brace pattern, quoted for Hydra as a user types it; 150 samples in 4 shards (of 40, 40, 40 and 30: they do not divide among 2 processes), 3 of
    them without a caption (left out): in one epoch, 1 process with batch 16 and 2 with batch 8
    read the same samples, each image once per caption; a run killed mid-epoch and resumed
    from its last checkpoint reads, step by step, what the uninterrupted run read, the resumed
    process from the checkpoint's step on only."""
    from tests.helpers import TINY_TWO_STREAM

    spec = write_test_shards(tmp_path / "shards")
    model = TINY_MODEL if task == "caption" else ["task=pretrain", *TINY_TWO_STREAM]
    common = [
        "data=webdataset", f"data.train.shards='{spec}'", f"data.val.shards='{spec}'", "data.on_bad_annotation=skip",
        "data.image_size=32", "data.num_workers=0", "data.batch_size=32", *model, "logger=none", "trainer.max_epochs=1",
        "trainer.limit_val_batches=0", "trainer.enable_progress_bar=false", "callbacks.step_checkpoint.every_n_train_steps=3",
        "+callbacks.ids._target_=tests.helpers.RecordImageIds",
    ]  # fmt: skip

    def run(name: str, *extra: str, ids: str = "ids") -> tuple:
        return (
            "mmtx-train",
            *common,
            f"+callbacks.ids.path={tmp_path / name / ids}",
            f"hydra.run.dir={tmp_path / name}",
            *extra,
        )

    kill = ("+callbacks.fault._target_=tests.helpers.SignalAtStep", "+callbacks.fault.step=7")
    one, two, *killed = cli.run_many(
        run("one", "data.batch_size=16"),
        run("two", "data.batch_size=8", "trainer=ddp_cpu", "trainer.devices=2"),
        *([run("killed", "data.batch_size=16", *kill)] if task == "caption" else []),  # resumed below
        cwd=tmp_path,
        check=False,
    )
    assert one.returncode == 0, cli.describe(one)
    assert two.returncode == 0, cli.describe(two)
    whole = steps_read(tmp_path / "one" / "ids")
    assert len(whole) == 147 * 2 // 16  # 18 full batches of the 294 (image, caption) pairs
    ids = sorted(i for batch in whole.values() for i in batch)
    assert not {17, 63, 101} & set(ids) and len(ids) == 288 and max(ids.count(i) for i in ids) == 2

    if task == "caption":  # killed after step 7, resumed from last.ckpt (step 6)
        assert killed[0].returncode == -signal.SIGKILL, cli.describe(killed[0])
        cli.run(*run("killed", "data.batch_size=16", f"ckpt_path={tmp_path / 'killed' / 'checkpoints' / 'last.ckpt'}",
                     ids="ids-resumed"), cwd=tmp_path)  # fmt: skip
        resumed = steps_read(tmp_path / "killed" / "ids-resumed")
        assert sorted(resumed) == list(range(6, len(whole)))  # the resumed process: from step 6 on only
        assert {**steps_read(tmp_path / "killed" / "ids"), **resumed} == whole

    ddp = steps_read(tmp_path / "two" / "ids")
    assert {step: sorted(batch) for step, batch in ddp.items()} == {
        step: sorted(batch) for step, batch in whole.items()
    }


def test_mmtx_shards_refuses_a_config_without_files_or_out_before_writing(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir

    from mmtx.cli.common import CONFIG_DIR
    from mmtx.commands.shards import write
    from mmtx.config_check import ConfigError

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        no_out = compose(config_name="shards", overrides=["data=pairs", "shard_size=0"])
        no_files = compose(config_name="shards", overrides=["data=pairs", f"out={tmp_path / 'out'}"])
    with pytest.raises(ConfigError) as info:
        write(no_out)
    assert "out is not set" in str(info.value) and "shard_size=0 must be a positive integer" in str(info.value)
    with pytest.raises(ConfigError, match="names no split's files"):
        write(no_files)
    assert not (tmp_path / "out").exists()  # nothing written
