"""Self-critical training: the CIDEr-D reward, the baselines, the sampled-caption mask, and runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pycocoevalcap.cider.cider import Cider

from mmtx.checkpoint import read_checkpoint
from mmtx.metrics.cider_reward import CorpusCider, words
from mmtx.tasks.scst import Scst, baseline_rewards, until_eos
from tests.helpers import csv_rows, logged

REFERENCES = [
    ["a red square left of a blue circle", "the red box is left of the blue ball"],
    ["a small green triangle", "one green triangle on a dark background"],
    ["two big yellow boxes", "a pair of large yellow squares"],
    ["a purple circle above a white square", "the purple ball is above the white box"],
]
CAPTIONS = ["a red square left of a circle", "a green triangle", "a yellow box", "a white square"]


def test_the_reward_is_pycocoevalcaps_cider_d_when_the_corpus_is_the_scored_set() -> None:
    gts = {i: [words(r) for r in refs] for i, refs in enumerate(REFERENCES)}
    res = {i: [words(c)] for i, c in enumerate(CAPTIONS)}
    _, expected = Cider().compute_score(gts, res)
    assert CorpusCider(REFERENCES)(CAPTIONS, REFERENCES) == pytest.approx(list(expected), abs=1e-12)


def test_a_few_captions_are_scored_with_the_whole_corpus_idf() -> None:
    """Scoring two captions gives what scoring all four gives them: the idf is the corpus's."""
    reward = CorpusCider(REFERENCES)
    assert reward(CAPTIONS[:2], REFERENCES[:2]) == pytest.approx(reward(CAPTIONS, REFERENCES)[:2], abs=1e-12)
    assert (
        reward(["the red box is left of the blue ball"], REFERENCES[:1])[0]
        > reward(["a yellow box"], REFERENCES[:1])[0]
    )


def test_baselines_and_the_mask_of_a_sampled_caption() -> None:
    rewards = torch.tensor([1.0, 2.0, 3.0, 10.0, 20.0, 30.0])  # 2 images x 3 samples
    assert baseline_rewards(rewards, 3).tolist() == [2.5, 2.0, 1.5, 25.0, 20.0, 15.0]
    assert baseline_rewards(rewards, 3, torch.tensor([4.0, 5.0])).tolist() == [4.0] * 3 + [5.0] * 3
    tokens = torch.tensor([[5, 6, 2, 0, 0], [5, 2, 2, 0, 0], [7, 8, 9, 9, 9]])  # EOS = 2, pad = 0
    assert until_eos(tokens, 2).tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]


@pytest.mark.parametrize(
    ("settings", "message"),
    [({"samples": 0}, "scst.samples=0"), ({"baseline": "max"}, "scst.baseline='max'"),
     ({"samples": 1}, "scst.samples=1 leaves no other samples"), ({"temperature": 0}, "scst.temperature=0")],
)  # fmt: skip
def test_bad_settings_are_refused_naming_the_key(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Scst(**settings)


@pytest.mark.slow
@pytest.mark.parametrize("baseline", ["mean", "greedy"])
def test_mmtx_train_task_caption_scst_from_a_cross_entropy_run(
    cli, tiny: list[str], trained, tmp_path: Path, baseline: str
) -> None:
    """From the shared cross-entropy run, on two processes: the reward and its baseline are
    logged every step, the weights move, and the mean baseline is the reward's mean."""
    run = cli.run(
        "mmtx-train", *tiny, "task=caption_scst", f"task.scst.baseline={baseline}", "task.scst.samples=3",
        f"init_from={trained.last}", "trainer.max_epochs=null", "trainer.max_steps=3", "trainer=ddp_cpu",
        "logger=csv", "trainer.log_every_n_steps=1", "task.lr=1e-3", f"trainer.limit_val_batches={1 if baseline == 'mean' else 0}",  # one validates on 2 processes
        f"hydra.run.dir={tmp_path / 'scst'}",
        cwd=tmp_path,
    )  # fmt: skip
    assert "MEMBER: 2/2" in run.stdout + run.stderr
    rows = csv_rows(tmp_path / "scst")
    reward, base = logged(rows, "train/reward"), logged(rows, "train/baseline")
    assert len(reward) == len(base) == 3 and all(r >= 0 for _, r in reward)
    if baseline == "mean":  # the mean of the others' rewards, averaged over the samples: the mean reward
        assert all(abs(r - b) < 1e-5 for (_, r), (_, b) in zip(reward, base))
    start = read_checkpoint(trained.last)["state_dict"]
    end = read_checkpoint(tmp_path / "scst" / "checkpoints" / "last.ckpt")["state_dict"]
    assert any(not torch.equal(start[k], end[k]) for k in start if k.startswith("model.decoder."))


def test_the_reward_stores_no_ngram_of_the_captions_it_scores_and_takes_any_batch() -> None:
    reward = CorpusCider(REFERENCES[:2])
    size = len(reward.document_frequency)
    many = CAPTIONS * 3  # more captions than the corpus has images: scored in chunks of its size
    scores = reward(many + ["zebra unicorn never seen"], [REFERENCES[0]] * (len(many) + 1))
    assert len(reward.document_frequency) == size
    alone = [reward([c], [REFERENCES[0]])[0] for c in many]
    assert scores[:-1] == pytest.approx(alone, abs=1e-12)


def test_sample_log_probs_are_those_of_the_distribution_sampled_from() -> None:
    """One teacher-forced pass equals step-by-step decoding's log-probabilities, with the ids
    decoding never emits excluded and the temperature applied; 0 (not NaN) after [EOS]."""
    from mmtx.generation import never_generated
    from mmtx.models.decoder import CaptionDecoder
    from mmtx.tasks.scst import sample_log_probs

    torch.manual_seed(0)
    decoder = CaptionDecoder(vocab_size=12, context_dim=8, dim=16, depth=1, num_heads=2, max_length=8, pad_id=0)
    context = torch.randn(2, 3, 8)
    bos, eos, pad = 1, 2, 0
    sampled = torch.tensor([[5, 7, 2, 0, 0], [6, 6, 9, 4, 3]])
    logp = sample_log_probs(decoder, context, sampled, bos_id=bos, eos_id=eos, pad_id=pad, temperature=0.7)
    banned = never_generated(bos, eos, pad)
    for row in range(2):
        tokens = [bos]
        for t in range(5):
            if row == 0 and t > 2:
                assert logp[row, t] == 0
                continue
            logits = decoder(torch.tensor([tokens]), context[row : row + 1])[0, -1] / 0.7
            logits[banned] = -float("inf")
            expected = logits.log_softmax(-1)[sampled[row, t]]
            assert abs(logp[row, t].item() - expected.item()) < 1e-5
            tokens.append(int(sampled[row, t]))
    assert torch.isfinite(logp).all()
    (logp.sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in decoder.parameters() if p.grad is not None)
