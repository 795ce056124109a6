"""VQA and pretraining end to end: soft targets, tiny training runs, init_from transfer, mmtx-vqa."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from mmtx.checkpoint import load_task, read_checkpoint
from mmtx.data.tokenizer import spellings
from mmtx.data.vqa import read_vqa
from mmtx.metrics.vqa import soft_scores, vqa_accuracy
from mmtx.tasks.vqa import soft_targets
from tests.helpers import TINY_TWO_STREAM, train_in_process

TINY_DATA = ["data.image_size=32", "data.num_train=48", "data.num_val=16", "data.num_workers=0", "data.batch_size=16"]
RUN = [
    "logger=csv",
    "trainer.max_epochs=1",
    "trainer.precision=32-true",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny pretraining run, and VQA runs from scratch and from its checkpoint (one epoch each)."""
    root = tmp_path_factory.mktemp("runs")
    data = [*TINY_DATA, f"paths.data_dir={root / 'data'}"]
    dirs = {name: root / name for name in ("pretrain", "vqa", "vqa_init", "caption_init")}
    train_in_process(
        [
            "experiment=pretrain_shapes",
            *TINY_TWO_STREAM,
            *data,
            *RUN,
            "task.retrieval_images=16",
            "task.objectives.mpm=1.0",  # every objective on: each loss is logged
            f"paths.output_dir={dirs['pretrain']}",
        ]
    )
    pre_ckpt = dirs["pretrain"] / "checkpoints" / "last.ckpt"
    train_in_process(
        [
            "experiment=vqa_shapes",
            *TINY_TWO_STREAM,
            *data,
            *RUN,
            "task.num_answers=50",
            f"paths.output_dir={dirs['vqa']}",
        ]
    )
    train_in_process(
        [
            "experiment=vqa_shapes",
            *TINY_TWO_STREAM,
            *data,
            *RUN,
            "task.num_answers=50",
            f"init_from={pre_ckpt}",
            "tokenizer.add_words=true",
            "trainer.max_steps=1",
            f"paths.output_dir={dirs['vqa_init']}",
        ]
    )
    train_in_process(
        [
            "model.encoder.dim=32",
            "model.encoder.depth=1",
            "model.encoder.num_heads=2",
            "model.encoder.patch_size=8",
            "model.decoder.dim=32",
            "model.decoder.depth=1",
            "model.decoder.num_heads=2",
            "model.encoder.pos_embed=learned",  # the vision stream's own: its table carries over too
            *data,
            *RUN,
            f"init_from={pre_ckpt}",
            "trainer.max_steps=1",
            "task.lr=1e-12",
            f"paths.output_dir={dirs['caption_init']}",
        ]
    )
    return dirs


def test_soft_targets_are_the_official_scores():
    answers = [["2"] * 7 + ["3"] * 2 + ["two"], ["yes"] * 10]
    targets = soft_targets(answers, {"2": 0, "3": 1, "yes": 2})
    scores = soft_scores(answers[0])
    assert targets[0].tolist() == pytest.approx([scores["2"], scores["3"], 0.0])
    assert targets[1].tolist() == [0.0, 0.0, 1.0]


def test_pretraining_run_reports_alignment_and_retrieval(runs):
    summary = json.loads((runs["pretrain"] / "metrics.json").read_text())
    assert set(summary["metrics"]) == {"itm_accuracy", "i2t_R@1", "i2t_R@5", "t2i_R@1", "t2i_R@5"}
    assert summary["baseline"]["itm_accuracy"] == 50.0
    assert summary["baseline"]["t2i_R@1"] == pytest.approx(100 / 16)
    rows = (runs["pretrain"] / "csv" / "version_0" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    for key in (
        "train/mlm_loss",
        "train/mpm_loss",
        "train/itm_loss",
        "train/itc_loss",
        "train/mlm_acc",
        "val/itm_accuracy",
    ):
        assert key in header


def test_vqa_run_reports_official_accuracy(runs):
    summary = json.loads((runs["vqa"] / "metrics.json").read_text())
    assert set(summary["metrics"]) == {"accuracy", "yes/no", "number", "other"}
    task = load_task(runs["vqa"] / "checkpoints" / "last.ckpt")
    assert 0 < len(task.answers) <= 50 and "yes" in task.answers


def test_init_from_loads_the_pretrained_weights(runs):
    pre = read_checkpoint(runs["pretrain"] / "checkpoints" / "last.ckpt")["state_dict"]
    vqa = load_task(runs["vqa_init"] / "checkpoints" / "last.ckpt")
    # one step of fine-tuning moves the weights a little; before it they were the pretrained ones
    name = "model.backbone.co_layers.0.text_cross.cross_attn.kv.weight"
    moved = (vqa.state_dict()[name] - pre[name]).abs().max()
    assert moved < 0.05 and not torch.equal(vqa.state_dict()[name], torch.zeros_like(pre[name]))
    # the pretraining run's tokenizer (its embeddings index it), plus (tokenizer.add_words) the
    # question words its captions never had, each with a row started as the mean of its old pieces'
    pre_tokenizer = load_task(runs["pretrain"] / "checkpoints" / "last.ckpt").tokenizer
    added = spellings(pre_tokenizer, vqa.tokenizer)
    assert {"what", "how", "?"} <= {vqa.tokenizer.backend.id_to_token(i) for i in added}
    embed, old_rows = (
        vqa.state_dict()["model.backbone.text.token_embed.weight"],
        pre["model.backbone.text.token_embed.weight"],
    )
    assert embed.shape[0] == vqa.tokenizer.vocab_size == old_rows.shape[0] + len(added)
    assert (embed[: len(old_rows)] - old_rows).abs().max() < 0.05
    what = vqa.tokenizer.backend.token_to_id("what")
    assert (embed[what] - old_rows[added[what]].mean(0)).abs().max() < 0.05
    # a captioner takes the vision stream as its image encoder (trained with lr ~ 0: unchanged)
    cap = load_task(runs["caption_init"] / "checkpoints" / "last.ckpt").state_dict()
    for key in ("encoder.blocks.0.attn.qkv.weight", "encoder.patch_embed.proj.weight", "encoder.pos_embed"):
        torch.testing.assert_close(
            cap["model." + key], pre["model.backbone.vision." + key.removeprefix("encoder.")], atol=1e-6, rtol=0
        )


@pytest.mark.slow
def test_mmtx_vqa_answers_one_image_and_a_file(cli, runs, tmp_path: Path):
    ckpt = runs["vqa"] / "checkpoints" / "last.ckpt"
    data_root = next((runs["vqa"].parent / "data").glob("shapes-vqa-*"))
    image = sorted((data_root / "val").glob("*.png"))[0]
    one = cli.run(
        "mmtx-vqa",
        f"ckpt={ckpt}",
        f"image={image}",
        "question=how many shapes are there?",
        "top_k=3",
        f"attention={tmp_path / 'maps'}",
        cwd=tmp_path,
    )
    *lines, written = one.stdout.strip().splitlines()
    assert written == f"attention map: {tmp_path / 'maps' / image.with_suffix('.png').name}"
    assert Image.open(tmp_path / "maps" / image.with_suffix(".png").name).size == (2 * 160, 160 + 18)  # image, map
    assert len(lines) == 3
    scores = [float(line.split("\t")[0]) for line in lines]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    out = tmp_path / "answers.json"
    cli.run(
        "mmtx-vqa",
        f"ckpt={ckpt}",
        f"questions={data_root / 'questions_val.json'}",
        f"images={data_root / 'val'}",
        f"predictions={out}",
        cwd=tmp_path,
    )
    predictions = json.loads(out.read_text())
    questions = read_vqa(data_root / "questions_val.json", None, data_root / "val")
    assert [p["question_id"] for p in predictions] == [q.question_id for q in questions]
    assert all(isinstance(p["answer"], str) and p["answer"] for p in predictions)
    wrong = cli.run(
        "mmtx-vqa",
        f"ckpt={runs['pretrain'] / 'checkpoints' / 'last.ckpt'}",
        f"image={image}",
        "question=what?",
        cwd=tmp_path,
        check=False,
    )
    assert wrong.returncode != 0 and "not a VQA one" in wrong.stderr


@pytest.mark.slow
@pytest.mark.parametrize("run", ["vqa", "pretrain"])
def test_eval_on_two_processes_equals_one_and_the_official_recomputation(cli, runs, tmp_path: Path, run: str):
    """VQA accuracy and pretraining alignment/retrieval are the same with 1 and 2 processes (16
    validation images: a question count that does not split evenly is padded and deduplicated);
    VQA's figures are what the official accuracy gives for the predictions file."""
    ckpt = runs[run] / "checkpoints" / "last.ckpt"
    results = {}
    for name, extra in (("one", []), ("two", ["trainer=ddp_cpu"])):
        out = tmp_path / name
        job = cli.run("mmtx-eval", f"ckpt={ckpt}", f"output={out}/metrics.json", f"predictions={out}/predictions.json",
                      "trainer.precision=32-true", *extra, cwd=tmp_path)  # fmt: skip
        assert ("MEMBER: 2/2" in job.stdout + job.stderr) == (name == "two")
        predictions = out / "predictions.json"  # none for pretraining: retrieval has no official results file
        results[name] = (json.loads((out / "metrics.json").read_text()),
                         json.loads(predictions.read_text()) if run == "vqa" else None)  # fmt: skip
    (m1, p1), (m2, p2) = results["one"], results["two"]
    assert m1 == m2 and m1
    if run == "vqa":
        assert sorted(p1, key=lambda p: p["question_id"]) == sorted(p2, key=lambda p: p["question_id"])
        data_root = next((runs["vqa"].parent / "data").glob("shapes-vqa-*"))
        records = read_vqa(data_root / "questions_val.json", data_root / "annotations_val.json", data_root / "val")
        assert sorted(p["question_id"] for p in p1) == [r.question_id for r in records]
        truth = {r.question_id: {"answers": list(r.answers), "answer_type": r.answer_type} for r in records}
        recomputed = vqa_accuracy({p["question_id"]: p["answer"] for p in p1}, truth)
        assert recomputed == pytest.approx({k: m1[k] for k in recomputed}, abs=1e-6)


def tiny_generator():
    from mmtx.models import CaptionDecoder, TextEncoder, VisionEncoder
    from mmtx.models.two_stream import TwoStreamModel
    from mmtx.models.vqa import VqaGenerator

    torch.manual_seed(0)
    backbone = TwoStreamModel(
        VisionEncoder(image_size=32, patch_size=8, dim=32, depth=1, num_heads=2),
        TextEncoder(40, dim=24, depth=1, num_heads=2, max_length=12),
        co_layers=1,
        joint_dim=32,
    )
    return VqaGenerator(backbone, CaptionDecoder(40, context_dim=32, dim=32, depth=1, num_heads=2, max_length=8))


def test_generative_vqa_ignores_question_padding_and_learns():
    from mmtx.generation import GenerationConfig, generate

    model = tiny_generator().eval()
    images = torch.randn(3, 3, 32, 32)
    question = torch.randint(7, 40, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[:, 6:] = False
    other = question.clone()
    other[:, 6:] = torch.randint(7, 40, (3, 3))  # different tokens where the mask says padding
    with torch.no_grad():
        for p in model.decoder.parameters():
            p.normal_(0, 0.3)
    outs = []
    for q in (question, other):
        context, context_mask = model.context(images, q, mask)
        for cache in (True, False):
            outs.append(
                generate(
                    model.decoder,
                    context,
                    context_mask=context_mask,
                    bos_id=1,
                    eos_id=2,
                    pad_id=0,
                    config=GenerationConfig(max_new_tokens=6, num_beams=2, use_cache=cache),
                )
            )
    assert all(torch.equal(outs[0], o) for o in outs[1:])

    model = tiny_generator().train()
    answers = torch.tensor([[1, 9, 2, 0], [1, 10, 11, 2], [1, 12, 2, 0]])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = model.loss(images, question, mask, answers, pad_id=0).item()
    for _ in range(30):
        loss = model.loss(images, question, mask, answers, pad_id=0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.3 * first


@pytest.mark.slow
def test_mmtx_eval_on_pretraining_and_vqa_checkpoints(cli, runs, tmp_path: Path):
    pre, vqa = (runs[name] / "checkpoints" / "last.ckpt" for name in ("pretrain", "vqa"))
    cli.run_many(
        ("mmtx-eval", f"ckpt={pre}", f"output={tmp_path / 'pre.json'}", f"predictions={tmp_path / 'pre_pred.json'}"),
        ("mmtx-eval", f"ckpt={vqa}", f"output={tmp_path / 'vqa.json'}", f"predictions={tmp_path / 'vqa_pred.json'}"),
        cwd=tmp_path,
    )
    pre_metrics = json.loads((tmp_path / "pre.json").read_text())
    assert set(pre_metrics) == {"itm_accuracy", "i2t_R@1", "i2t_R@5", "t2i_R@1", "t2i_R@5"}
    assert all(0 <= v <= 100 for v in pre_metrics.values())
    assert not (tmp_path / "pre_pred.json").exists()  # retrieval has no official results file
    vqa_metrics = json.loads((tmp_path / "vqa.json").read_text())
    assert set(vqa_metrics) == {"accuracy", "yes/no", "number", "other"}
    predictions = json.loads((tmp_path / "vqa_pred.json").read_text())
    val = load_task(vqa).data_config
    data_root = Path(val["root"])
    questions = read_vqa(data_root / "questions_val.json", None, data_root / "val")
    assert sorted(p["question_id"] for p in predictions) == sorted(q.question_id for q in questions)
    assert all(set(p) == {"question_id", "answer"} and isinstance(p["answer"], str) for p in predictions)


@pytest.mark.parametrize("pooling", ["product", "concat", "tokens", "max"])
def test_classifier_poolings_score_every_answer_and_learn(pooling: str) -> None:
    """Both heads give (B, A) logits, and a few steps on one batch lower the loss."""
    from mmtx.models import TextEncoder, VisionEncoder
    from mmtx.models.two_stream import TwoStreamModel
    from mmtx.models.vqa import VqaClassifier

    torch.manual_seed(0)
    backbone = TwoStreamModel(
        VisionEncoder(image_size=32, patch_size=8, dim=32, depth=1, num_heads=2),
        TextEncoder(vocab_size=30, dim=32, depth=1, num_heads=2, max_length=8),
        co_layers=1,
        joint_dim=24,
    )
    model = VqaClassifier(backbone, num_answers=7, pooling=pooling)
    images, ids, mask = torch.randn(4, 3, 32, 32), torch.randint(1, 30, (4, 8)), torch.ones(4, 8, dtype=torch.bool)
    targets = torch.zeros(4, 7)
    targets[torch.arange(4), torch.tensor([0, 3, 5, 6])] = 1.0
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = model.loss(model(images, ids, mask), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert model(images, ids, mask).shape == (4, 7)
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("head", ["classifier", "classifier-concat", "generator"])
@pytest.mark.parametrize("vision_reads_text", [False, True])
def test_questions_about_one_image_share_its_encoding(vision_reads_text: bool, head: str) -> None:
    """``image_index`` points each question to its image's row: each image encoded once (and, in
    one-way co-attention, its keys and values projected once) gives the same outputs and gradients
    as encoding each question's own copy."""
    from mmtx.models import TextEncoder, VisionEncoder
    from mmtx.models.decoder import CaptionDecoder
    from mmtx.models.two_stream import TwoStreamModel
    from mmtx.models.vqa import VqaClassifier, VqaGenerator

    torch.manual_seed(0)
    backbone = TwoStreamModel(
        VisionEncoder(image_size=32, patch_size=8, dim=32, depth=1, num_heads=2, stem="conv"),
        TextEncoder(vocab_size=30, dim=32, depth=1, num_heads=2, max_length=8),
        co_layers=1,
        joint_dim=24,
        vision_reads_text=vision_reads_text,
    )
    if head.startswith("classifier"):  # max: the image tokens' maximum; concat: pooled h_IMG
        pooling = "concat" if head.endswith("concat") else "max"
        model = VqaClassifier(backbone, num_answers=7, pooling=pooling).eval()  # BatchNorm: running statistics
        run = lambda images, index=None: model(images, ids, mask, index)  # noqa: E731
    else:
        decoder = CaptionDecoder(vocab_size=30, context_dim=32, dim=32, depth=1, num_heads=2, max_length=8)
        model = VqaGenerator(backbone, decoder).eval()
        answers = torch.randint(1, 30, (5, 4))
        run = lambda images, index=None: model.loss(images, ids, mask, answers, 0, index)  # noqa: E731
    two = torch.randn(2, 3, 32, 32)
    images = two[[0, 0, 1, 0, 1]]
    ids, mask = torch.randint(1, 30, (5, 8)), torch.ones(5, 8, dtype=torch.bool)
    mask[3, 5:] = False
    shared = run(two, torch.tensor([0, 0, 1, 0, 1]))
    shared.sum().backward()
    shared_grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    each = run(images)
    each.sum().backward()
    torch.testing.assert_close(shared, each, rtol=1e-5, atol=1e-5)
    assert sum(g is not None for g in shared_grads) > 20
    for a, p in zip(shared_grads, model.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-5)  # both None where unused


def test_collator_stacks_each_image_once_and_points_each_question_to_it() -> None:
    from mmtx.data.tokenizer import Tokenizer
    from mmtx.data.vqa.datamodule import VqaCollator

    tok = Tokenizer.train(["is there a circle", "how many shapes"])
    a, b = torch.zeros(3, 8, 8, dtype=torch.uint8), torch.ones(3, 8, 8, dtype=torch.uint8)
    examples = [
        {
            "image": img,
            "image_id": iid,
            "question": "is there a circle",
            "answers": ["yes"],
            "answer_type": "yes/no",
            "question_id": n,
        }
        for n, (iid, img) in enumerate([(7, a), (9, b), (7, a), (7, b), (9, b), (7, b)])
    ]  # the 4th and 6th: image 7 cropped otherwise (other pixels): a row of its own, shared by both
    batch = VqaCollator(tok, max_length=8)(examples)
    assert batch["image_index"].tolist() == [0, 1, 0, 2, 1, 2]
    assert torch.equal(batch["images"], torch.stack([a, b, b]))
    assert batch["input_ids"].shape[0] == 6


def test_softmax_loss_is_cross_entropy_against_the_normalised_scores() -> None:
    """loss=softmax: -sum(t / sum(t) * log softmax(z)) per question, a question without a
    known answer adds nothing, and the answer probabilities sum to one."""
    from mmtx.models import TextEncoder, VisionEncoder
    from mmtx.models.two_stream import TwoStreamModel
    from mmtx.models.vqa import VqaClassifier

    backbone = TwoStreamModel(
        VisionEncoder(image_size=32, patch_size=8, dim=32, depth=1, num_heads=2),
        TextEncoder(vocab_size=30, dim=32, depth=1, num_heads=2, max_length=8),
        co_layers=1,
    )
    model = VqaClassifier(backbone, num_answers=4, pooling="max", loss="softmax")
    logits = torch.tensor([[2.0, 0.0, -1.0, 0.5], [0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    targets = torch.tensor([[1.0, 0.3, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.6, 0.6]])
    log_p = logits.log_softmax(-1)
    expected = (-(targets[0] / 1.3 * log_p[0]).sum() - (0.5 * log_p[2, 2:]).sum()) / 3
    torch.testing.assert_close(model.loss(logits, targets), expected)
    torch.testing.assert_close(model.probabilities(logits).sum(-1), torch.ones(3))
    bce = VqaClassifier(backbone, num_answers=4, pooling="max")
    torch.testing.assert_close(bce.probabilities(logits), logits.sigmoid())
    with pytest.raises(ValueError, match="loss='ce' must be one of bce, softmax"):
        VqaClassifier(backbone, num_answers=4, loss="ce")


def test_unknown_pooling_is_refused() -> None:
    from mmtx.models import TextEncoder, VisionEncoder
    from mmtx.models.two_stream import TwoStreamModel
    from mmtx.models.vqa import VqaClassifier

    backbone = TwoStreamModel(
        VisionEncoder(image_size=32, patch_size=8, dim=32, depth=1, num_heads=2),
        TextEncoder(vocab_size=30, dim=32, depth=1, num_heads=2, max_length=8),
        co_layers=1,
    )
    with pytest.raises(ValueError, match="pooling='mean' must be one of product, concat, tokens, max"):
        VqaClassifier(backbone, num_answers=3, pooling="mean")
