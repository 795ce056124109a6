"""Two-stream model and pretraining: co-attention masks, each objective, masking rates, retrieval."""

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from mmtx.metrics.retrieval import retrieval_recall
from mmtx.models import TextEncoder, VisionEncoder
from mmtx.models.decoder import CaptionDecoder
from mmtx.models.global_batch import GlobalBatch
from mmtx.models.masking import IGNORE, mask_patches, mask_tokens
from mmtx.models.patch_targets import MeanColor, NormalizedPixels, patchify
from mmtx.models.pretraining import Objectives, TwoStreamPretrainer, pick_negatives
from mmtx.models.pretraining_losses import contrastive_loss
from mmtx.models.two_stream import TwoStreamModel
from mmtx.nn import CoAttentionLayer

SPECIAL = list(range(7))  # [PAD] [BOS] [EOS] [UNK] [MASK] [CLS] [SEP]
MASK = 4


def tiny_pretrainer(
    pos: str = "learned", seed: int = 0, caption: bool = False, itc_pool: str = "cls"
) -> TwoStreamPretrainer:
    torch.manual_seed(seed)
    vision = VisionEncoder(image_size=32, patch_size=8, dim=48, depth=1, num_heads=4, pos_embed=pos)
    text = TextEncoder(60, dim=32, depth=2, num_heads=4, max_length=16, pos_embed=pos)
    decoder = functools.partial(CaptionDecoder, dim=32, depth=1, num_heads=4, max_length=16) if caption else None
    return TwoStreamPretrainer(
        TwoStreamModel(vision, text, co_layers=2, joint_dim=40),
        mask_id=MASK,
        special_ids=SPECIAL,
        caption_decoder=decoder,
        itc_pool=itc_pool,
    )


def draws(seed: int) -> GlobalBatch:
    """One process's random draws from a seeded generator."""
    return GlobalBatch(generator=torch.Generator().manual_seed(seed))


def batch(B=6, T=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(7, 60, (B, T), generator=g)
    ids[:, 0] = 1
    mask = torch.ones(B, T, dtype=torch.bool)
    for i in range(B):  # ragged captions: [BOS] words [EOS] [PAD]...
        n = 5 + i % 4
        ids[i, n] = 2
        ids[i, n + 1 :] = 0
        mask[i, n + 1 :] = False
    return torch.randn(B, 3, 32, 32, generator=g), ids, mask


def test_co_attention_layer_shapes_and_widths():
    layer = CoAttentionLayer(vision_dim=48, text_dim=32, vision_heads=4, text_heads=2).eval()
    v, t = torch.randn(2, 17, 48), torch.randn(2, 9, 32)
    v2, t2 = layer(v, t, torch.ones(2, 9, dtype=torch.bool))
    assert v2.shape == v.shape and t2.shape == t.shape
    assert not hasattr(layer.vision_cross, "attn") and layer.vision_cross.cross_attn is not None


def test_one_way_co_attention_lets_only_the_text_read_the_image():
    """vision_reads_text=False: the image tokens are each image's own, whatever the question;
    the question still reads the image."""
    layer = CoAttentionLayer(vision_dim=48, text_dim=32, vision_heads=4, text_heads=2, vision_reads_text=False)
    assert layer.vision_cross is None and layer.vision_self is None
    v, t, mask = torch.randn(2, 17, 48), torch.randn(2, 9, 32), torch.ones(2, 9, dtype=torch.bool)
    v2, t2 = layer.eval()(v, t, mask)
    assert v2 is v and t2.shape == t.shape

    torch.manual_seed(0)
    model = TwoStreamModel(
        VisionEncoder(image_size=32, patch_size=8, dim=48, depth=1, num_heads=4),
        TextEncoder(vocab_size=60, dim=32, depth=1, num_heads=2, max_length=16),
        co_layers=2,
        joint_dim=40,
        vision_reads_text=False,
    ).eval()
    images, ids, mask = batch()
    out = model(images, ids, mask)
    other_text = model(images, ids.roll(1, 0), mask.roll(1, 0))
    other_image = model(images.roll(1, 0), ids, mask)
    torch.testing.assert_close(out.vision, other_text.vision)  # the image tokens ignore the question
    assert not torch.allclose(out.text, other_image.text)  # the question reads the image


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_text_padding_does_not_leak_into_either_stream(pos):
    model = tiny_pretrainer(pos).eval().backbone
    images, ids, mask = batch()
    out = model(images, ids, mask)
    garbage = ids.clone()
    garbage[~mask] = torch.randint(7, 60, (int((~mask).sum()),))  # different tokens at padded positions
    out2 = model(images, garbage, mask)
    torch.testing.assert_close(out.vision, out2.vision)
    torch.testing.assert_close(out.text[mask], out2.text[mask])
    torch.testing.assert_close(out.pooled, out2.pooled)


def test_streams_really_exchange_information():
    model = tiny_pretrainer().eval().backbone
    images, ids, mask = batch()
    out = model(images, ids, mask)
    other_text = model(images, ids.roll(1, 0), mask.roll(1, 0))
    assert not torch.allclose(out.vision, other_text.vision)  # vision output depends on the text


def test_every_objective_gives_a_finite_loss_and_can_be_switched_off():
    model = tiny_pretrainer()
    images, ids, mask = batch()
    out = model(images, ids, mask, torch.arange(6), Objectives(itc=1.0), draws(0))
    for key in ("mlm_loss", "mpm_loss", "itm_loss", "itc_loss"):
        assert torch.isfinite(out[key]) and out[key] > 0
    assert out["mlm_loss"].item() == pytest.approx(math.log(60), rel=0.25)  # near-uniform at first
    assert out["itm_loss"].item() == pytest.approx(math.log(2), rel=0.1)
    total = out["mlm_loss"] + out["mpm_loss"] + out["itm_loss"] + out["itc_loss"]
    torch.testing.assert_close(out["loss"], total)
    only = model(images, ids, mask, torch.arange(6), Objectives(mlm=0, mpm=0, itm=2.0), draws(0))
    assert set(only) == {"itm_loss", "itm_acc", "loss"}
    torch.testing.assert_close(only["loss"], 2 * only["itm_loss"])
    with pytest.raises(ValueError, match=r"every loss weight \(mlm, mpm, itm, itc, caption\) is 0"):
        Objectives(mlm=0, mpm=0, itm=0, itc=0)
    with pytest.raises(ValueError, match="mask_prob=1.5"):
        Objectives(mask_prob=1.5)


def test_caption_objective_writes_the_unmasked_caption_from_vision_stream():
    model = tiny_pretrainer(caption=True).eval()
    images, ids, mask = batch()
    obj = Objectives(mlm=1.0, mpm=0, itm=0, caption=1.0)
    out = model(images, ids, mask, torch.arange(6), obj, draws(0))
    assert out["caption_loss"].item() == pytest.approx(math.log(60), rel=0.25)  # near-uniform at first
    torch.testing.assert_close(out["loss"], out["mlm_loss"] + out["caption_loss"])
    # the decoder's teacher-forced loss on the real tokens, reading the vision stream's own output
    vision, _ = model.backbone.encode_vision(images)
    logits = model.caption_decoder(ids[:, :-1], vision)
    targets = ids[:, 1:].masked_fill(~mask[:, 1:], IGNORE)  # padding is not predicted
    torch.testing.assert_close(out["caption_loss"], F.cross_entropy(logits.flatten(0, 1), targets.flatten()))
    # whatever words MLM masks, the caption written is the unmasked one
    other = model(images, ids, mask, torch.arange(6), obj, draws(1))
    assert other["mlm_loss"].item() != out["mlm_loss"].item()
    torch.testing.assert_close(other["caption_loss"], out["caption_loss"])
    # and it depends on the image
    flipped = model(images.flip(-1), ids, mask, torch.arange(6), obj, draws(0))
    assert flipped["caption_loss"].item() != out["caption_loss"].item()


def test_the_caption_head_is_built_only_with_a_decoder_and_trains():
    assert tiny_pretrainer().caption_decoder is None  # ViLBERT's heads by default
    with pytest.raises(ValueError, match="caption objective needs a caption_decoder"):
        TwoStreamPretrainer(tiny_pretrainer().backbone, heads=["caption"])
    model = tiny_pretrainer(caption=True).train()
    images, ids, mask = batch()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    obj = Objectives(mlm=0, mpm=0, itm=0, caption=1.0)
    losses = []
    for _ in range(30):
        out = model(images, ids, mask, torch.arange(6), obj)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        losses.append(out["loss"].item())
    assert sum(losses[-3:]) < 0.6 * sum(losses[:3])


def test_pretraining_lowers_the_loss():
    model = tiny_pretrainer().train()
    images, ids, mask = batch()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    obj = Objectives(itc=1.0)
    losses = []
    for step in range(80):
        out = model(images, ids, mask, torch.arange(6), obj, draws(step % 4))
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        losses.append(out["loss"].item())
    assert sum(losses[-4:]) < 0.6 * sum(losses[:4])


def test_token_masking_rates_follow_bert():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(7, 1000, (400, 50), generator=g)
    maskable = torch.ones_like(ids, dtype=torch.bool)
    maskable[:, :2] = False  # e.g. [BOS] and padding are never picked
    inputs, labels = mask_tokens(ids, maskable, MASK, 1000, 0.15, draws(0), SPECIAL)
    picked = labels != IGNORE
    assert not picked[:, :2].any()
    assert picked[:, 2:].float().mean().item() == pytest.approx(0.15, abs=0.01)
    assert torch.equal(labels[picked], ids[picked])
    to_mask = (inputs[picked] == MASK).float().mean().item()
    kept = (inputs[picked] == ids[picked]).float().mean().item()
    assert to_mask == pytest.approx(0.8, abs=0.02)
    assert kept == pytest.approx(0.1, abs=0.02)  # 10% kept (+ the rare random draw of the same id)
    assert not torch.isin(inputs[picked & (inputs != MASK)], torch.tensor(SPECIAL)).any()
    assert torch.equal(inputs[~picked], ids[~picked])


def test_patch_masking_rates():
    picked, replaced = mask_patches(500, 64, 0.15, 0.9, draws(0))
    assert picked.float().mean().item() == pytest.approx(0.15, abs=0.01)
    assert picked.any(1).all()  # every image predicts something
    assert not (replaced & ~picked).any()
    assert (replaced[picked]).float().mean().item() == pytest.approx(0.9, abs=0.02)


def test_masked_patches_get_the_mask_embedding():
    model = tiny_pretrainer().eval().backbone
    images = torch.randn(2, 3, 32, 32)
    masked = torch.zeros(2, 16, dtype=torch.bool)
    masked[0, 3] = True
    x, _ = model.vision.embed(images, masked, model.mask_token)
    clean, _ = model.vision.embed(images)
    pos = model.vision.positions((4, 4))
    torch.testing.assert_close(x[0, 1 + 3], model.mask_token + pos[0, 1 + 3])
    torch.testing.assert_close(x[1], clean[1])


def test_patch_targets():
    images = torch.randn(2, 3, 16, 16)
    patches = patchify(images, 8)
    assert patches.shape == (2, 4, 192)
    torch.testing.assert_close(patches[0, 1], images[0, :, :8, 8:].permute(1, 2, 0).reshape(-1))
    target = NormalizedPixels(8)(images)
    torch.testing.assert_close(target.mean(-1), torch.zeros(2, 4), atol=1e-5, rtol=0)
    assert MeanColor(8)(images).shape == (2, 4, 3)


def test_negatives_never_come_from_the_same_image():
    image_ids = torch.tensor([0, 0, 1, 2, 3, 3])
    same = image_ids[:, None] == image_ids[None, :]
    g = draws(0)
    for _ in range(50):
        index = pick_negatives(same, 0.5, None, g)
        swapped = index != torch.arange(6)
        assert (image_ids[index][swapped] != image_ids[swapped]).all()
    # hard negatives follow the similarity: row 2 is always paired with its most similar other text
    sim = torch.zeros(6, 6)
    sim[2, 4] = 50.0
    index = pick_negatives(same, 1.0, sim, g)
    assert index[2] == 4


def test_contrastive_loss_matches_cross_entropy_with_one_positive_each():
    sim = torch.randn(5, 5)
    eye = torch.eye(5, dtype=torch.bool)
    want = (
        torch.nn.functional.cross_entropy(sim, torch.arange(5))
        + torch.nn.functional.cross_entropy(sim.T, torch.arange(5))
    ) / 2
    torch.testing.assert_close(contrastive_loss(sim, eye), want)


def test_itc_similarity_reads_cls_tokens_or_the_mean_of_real_tokens():
    cls_model = tiny_pretrainer().eval()
    mean_model = tiny_pretrainer(itc_pool="mean").eval()  # the same seed: the same weights
    assert all(torch.equal(a, b) for a, b in zip(cls_model.state_dict().values(), mean_model.state_dict().values()))
    images, ids, mask = batch()
    u = cls_model.backbone.unimodal(images, ids, mask)
    vision, text = cls_model.backbone.vision.norm(u.vision), cls_model.backbone.text.norm(u.text)

    def similarity(v, t):
        v, t = F.normalize(cls_model.itc_vision(v), dim=-1), F.normalize(cls_model.itc_text(t), dim=-1)
        return cls_model.logit_scale.exp() * v @ t.T

    torch.testing.assert_close(cls_model.itc_similarity(u), similarity(vision[:, 0], text[:, 0]))
    text_mean = torch.stack([text[i, mask[i]].mean(0) for i in range(len(ids))])  # padding left out
    want = similarity(vision[:, 1:].mean(1), text_mean)  # the patches, not the CLS token
    torch.testing.assert_close(mean_model.itc_similarity(u), want)
    assert not torch.allclose(want, cls_model.itc_similarity(u))


def test_itc_pool_must_be_known():
    with pytest.raises(ValueError, match="itc_pool='max' must be one of cls, mean"):
        TwoStreamPretrainer(tiny_pretrainer().backbone, itc_pool="max")


def test_retrieval_recall_on_a_hand_made_case():
    # 3 images; texts 0,1 describe image 0, text 2 image 1, text 3 image 2
    scores = torch.tensor(
        [
            [0.1, 0.9, 0.5, -0.1],  # image 0: best text is 1 (true) -> rank 0
            [0.8, 0.0, 0.7, 0.1],  # image 1: text 0 beats its true text 2 -> rank 1
            [0.3, 0.2, 0.1, 0.0],  # image 2: its text 3 is last -> rank 3
        ]
    )
    text_image = torch.tensor([0, 0, 1, 2])
    r = retrieval_recall(scores, text_image, ks=(1, 2))
    assert r["i2t_R@1"] == pytest.approx(100 / 3)
    assert r["i2t_R@2"] == pytest.approx(200 / 3)
    # text->image: text 0's image 0 (0.1) is below images 1 and 2 (rank 2); text 1 -> image 0 best;
    # text 2 -> image 1 best; text 3's image 2 (0.0) is below image 1 (0.1) only (rank 1)
    assert r["t2i_R@1"] == pytest.approx(50.0)
    assert r["t2i_R@2"] == pytest.approx(75.0)
    # ties count against the model: constant scores retrieve nothing
    assert retrieval_recall(torch.zeros(3, 4), text_image, ks=(1,))["i2t_R@1"] == 0.0


def test_retrieval_scores_rerank_only_changes_the_top_candidates():
    model = tiny_pretrainer().eval()
    images, ids, mask = batch()
    u = model.backbone.unimodal(images, ids, mask)
    full, _ = model.retrieval_scores(u, rerank=None)
    i2t, t2i = model.retrieval_scores(u, rerank=3)
    sim = model.itc_similarity(u)
    top = sim.topk(3, dim=1).indices
    # within each image's top-3 by similarity, the reranked order is the alignment head's order
    for i in range(6):
        assert torch.equal(i2t[i, top[i]].argsort(), full[i, top[i]].argsort())
        others = torch.ones(6, dtype=torch.bool)
        others[top[i]] = False
        assert i2t[i, top[i]].min() > i2t[i, others].max()
