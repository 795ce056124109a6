"""Towers and the captioner: shapes, position interpolation, the loss."""

import pytest
import torch
import torch.nn.functional as F

from mmtx.models import CaptionDecoder, TextEncoder, VisionEncoder
from mmtx.nn.embeddings import resample_positions
from tests.helpers import tiny_captioner


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope"])
def test_vit_runs_at_other_image_sizes(pos):
    torch.manual_seed(0)
    vit = VisionEncoder(image_size=32, patch_size=8, dim=32, depth=1, num_heads=4, pos_embed=pos).eval()
    assert vit(torch.randn(2, 3, 32, 32)).shape == (2, 1 + 16, 32)
    assert vit(torch.randn(2, 3, 48, 64)).shape == (2, 1 + 6 * 8, 32)


def test_learned_positions_are_interpolated_bicubically():
    torch.manual_seed(0)
    vit = VisionEncoder(image_size=32, patch_size=8, dim=8, depth=1, num_heads=2)
    same = vit.positions((4, 4))
    torch.testing.assert_close(same, vit.pos_embed)  # trained size: the table itself
    big = vit.positions((6, 6))
    grid = vit.pos_embed[:, 1:].reshape(1, 4, 4, 8).permute(0, 3, 1, 2)
    want = F.interpolate(grid, size=(6, 6), mode="bicubic", align_corners=False)
    torch.testing.assert_close(big[:, 1:], want.permute(0, 2, 3, 1).reshape(1, 36, 8))
    torch.testing.assert_close(big[:, :1], vit.pos_embed[:, :1])  # CLS keeps its own vector


def test_interpolation_preserves_a_constant_table():
    pos = torch.full((1, 9, 4), 0.5)
    torch.testing.assert_close(resample_positions(pos, (3, 3), (5, 7)), torch.full((1, 35, 4), 0.5))


def test_patch_size_must_divide_image():
    vit = VisionEncoder(image_size=32, patch_size=8, dim=8, depth=1, num_heads=2)
    with pytest.raises(ValueError, match="patch_size=8"):
        vit(torch.randn(1, 3, 30, 32))
    with pytest.raises(ValueError, match="pos_embed='alibi'"):
        VisionEncoder(image_size=32, patch_size=8, dim=8, depth=1, num_heads=2, pos_embed="alibi")


def test_text_encoder_ignores_padding():
    torch.manual_seed(0)
    enc = TextEncoder(50, dim=32, depth=2, num_heads=4, max_length=16).eval()
    ids = torch.randint(3, 50, (1, 8))
    mask = torch.tensor([[1] * 5 + [0] * 3]).bool()
    other = ids.clone()
    other[:, 5:] = torch.randint(3, 50, (1, 3))
    torch.testing.assert_close(enc(ids, mask=mask)[:, :5], enc(other, mask=mask)[:, :5])


def test_decoder_is_causal():
    torch.manual_seed(0)
    dec = CaptionDecoder(50, context_dim=16, dim=32, depth=2, num_heads=4, max_length=16).eval()
    ctx = torch.randn(1, 5, 16)
    ids = torch.randint(3, 50, (1, 10))
    changed = ids.clone()
    changed[:, 6:] = torch.randint(3, 50, (1, 4))
    torch.testing.assert_close(dec(ids, ctx)[:, :6], dec(changed, ctx)[:, :6])


def test_tied_lm_head():
    dec = CaptionDecoder(50, context_dim=16, dim=32, depth=1, num_heads=4)
    assert dec.lm_head.weight is dec.body.token_embed.weight
    untied = CaptionDecoder(50, context_dim=16, dim=32, depth=1, num_heads=4, tie_embeddings=False)
    assert untied.lm_head.weight is not untied.body.token_embed.weight


def test_caption_loss_ignores_padding():
    model = tiny_captioner()
    images = torch.randn(2, 3, 32, 32)
    ids = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 9, 10, 2]])
    padded = torch.cat([ids, torch.zeros(2, 4, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model.loss(images, ids, pad_id=0), model.loss(images, padded, pad_id=0))
    # and equals the cross-entropy written out over the real targets
    logits = model(images, ids[:, :-1])
    want = -logits.log_softmax(-1).gather(2, ids[:, 1:, None]).mean()
    torch.testing.assert_close(model.loss(images, ids, pad_id=0), want)


def test_weighted_caption_loss_is_the_mean_over_the_targets_weights():
    model = tiny_captioner()
    images = torch.randn(2, 3, 32, 32)
    ids = torch.tensor([[1, 5, 6, 7, 2, 0], [1, 8, 6, 2, 0, 0]])
    weight = torch.ones(40)
    weight[6] = 4.0  # a word both captions hold
    logits = model(images, ids[:, :-1])
    targets = ids[:, 1:]
    token_losses = -logits.log_softmax(-1).gather(2, targets[..., None])[..., 0]
    w = weight[targets] * (targets != 0)
    want = (token_losses * w).sum() / w.sum()
    torch.testing.assert_close(model.loss(images, ids, pad_id=0, weight=weight), want)
    assert not torch.allclose(want, model.loss(images, ids, pad_id=0))


def test_training_lowers_the_loss():
    model = tiny_captioner(spread=0.02).train()
    images = torch.randn(4, 3, 32, 32)
    ids = torch.randint(3, 40, (4, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = model.loss(images, ids, 0).item()
    for _ in range(30):
        loss = model.loss(images, ids, 0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first


def test_conv_stem_gives_the_patch_grid_and_patch_stem_keeps_vit_weights() -> None:
    from mmtx.models import VisionEncoder

    torch.manual_seed(0)
    conv = VisionEncoder(image_size=32, patch_size=8, dim=32, depth=1, num_heads=2, stem="conv")
    plain = VisionEncoder(image_size=32, patch_size=8, dim=32, depth=1, num_heads=2)
    images = torch.randn(2, 3, 32, 32)
    assert conv(images).shape == plain(images).shape == (2, 1 + 16, 32)
    assert {k for k in plain.state_dict() if k.startswith("patch_embed.")} == {
        "patch_embed.proj.weight",
        "patch_embed.proj.bias",
    }
    stem = [type(m).__name__ for m in conv.patch_embed.stem]
    assert stem == ["Conv2d", "BatchNorm2d", "GELU"] * 3  # three 3x3 convolutions down to 8-px patches
    # He init + BatchNorm: the image reaches the transformer as strongly as through the linear patch map
    # (PyTorch's default conv init left a tenth of it, and the stem learnt shapes slower: docs/learning.md)
    strength = conv.patch_embed(images).std() / plain.patch_embed(images).std()
    assert 0.5 < strength.item() < 2.0
    with pytest.raises(ValueError, match="power-of-two patch_size, got patch_size=12"):
        VisionEncoder(image_size=36, patch_size=12, dim=32, depth=1, num_heads=2, stem="conv")
    with pytest.raises(ValueError, match="stem='resnet' must be one of patch, conv"):
        VisionEncoder(image_size=32, patch_size=8, dim=32, depth=1, num_heads=2, stem="resnet")


def test_group_norm_stem_sees_each_image_alone_and_batch_norm_does_not() -> None:
    """``stem_norm=group`` normalises each image by its own statistics: an image's tokens are the
    same alone and in any batch, in training and evaluation; BatchNorm's depend on the batch (why
    it differed between 1 and N processes) and, in training, on nothing else."""
    from mmtx.models import VisionEncoder

    images = torch.randn(4, 3, 32, 32)
    for norm, batch_independent in (("group", True), ("batch", False)):
        torch.manual_seed(0)
        encoder = VisionEncoder(image_size=32, patch_size=8, dim=32, depth=1, num_heads=2, stem="conv", stem_norm=norm)
        assert [type(m).__name__ for m in encoder.patch_embed.stem][1] == {
            "group": "GroupNorm",
            "batch": "BatchNorm2d",
        }[norm]
        together, alone = encoder(images), torch.cat([encoder(images[i : i + 1]) for i in range(4)])
        assert torch.allclose(together, alone, atol=1e-5) == batch_independent, norm
    torch.manual_seed(0)  # and GroupNorm has no running averages: evaluation computes what training does
    group = VisionEncoder(image_size=32, patch_size=8, dim=32, depth=1, num_heads=2, stem="conv", stem_norm="group")
    torch.testing.assert_close(group.eval()(images), group.train()(images))
    with pytest.raises(ValueError, match="stem_norm='instance' must be one of batch, group"):
        VisionEncoder(image_size=32, patch_size=8, dim=32, depth=1, num_heads=2, stem="conv", stem_norm="instance")


def test_stem_channels_set_each_conv_layer_and_wrong_counts_are_refused() -> None:
    """``stem_channels`` names each stride-2 layer's width; the 1x1 map takes the last of them.
    A list that does not match the layers the patch size needs is refused, naming the key."""
    from mmtx.models import VisionEncoder

    images = torch.randn(2, 3, 32, 32)
    default = VisionEncoder(image_size=32, patch_size=8, dim=32, depth=1, num_heads=2, stem="conv")
    assert [m.out_channels for m in default.patch_embed.stem if isinstance(m, torch.nn.Conv2d)] == [8, 8, 16]
    wide = VisionEncoder(
        image_size=32,
        patch_size=8,
        dim=32,
        depth=1,
        num_heads=2,
        stem="conv",
        stem_norm="group",
        stem_channels=[24, 40, 56],
    )
    convs = [m for m in wide.patch_embed.stem if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.stride) for c in convs] == [
        (3, 24, (2, 2)),
        (24, 40, (2, 2)),
        (40, 56, (2, 2)),
    ]
    assert wide.patch_embed.proj.in_channels == 56
    assert wide(images).shape == default(images).shape == (2, 1 + 16, 32)
    with pytest.raises(ValueError, match=r"stem_channels=\[8, 16, 32\] are the conv stem's; stem='patch' has none"):
        VisionEncoder(
            image_size=32, patch_size=8, dim=32, depth=1, num_heads=2, stem="patch", stem_channels=[8, 16, 32]
        )
    for bad in ([32, 64], [8, 16, 32, 64], [16, 0, 32], [16, True, 32], 64, "abc"):
        with pytest.raises(
            ValueError, match=r"^stem_channels takes 3 positive ints at patch_size=8 \(one per stride-2 layer\), got "
        ):
            VisionEncoder(image_size=32, patch_size=8, dim=32, depth=1, num_heads=2, stem="conv", stem_channels=bad)


def test_axial_attention_reads_along_rows_and_columns_only() -> None:
    torch.manual_seed(0)
    vit = VisionEncoder(image_size=32, patch_size=8, dim=16, depth=1, num_heads=4, attention="axial").eval()
    images = torch.randn(1, 3, 32, 48)  # a 4 x 6 grid: rows and columns of different lengths
    moved = images.clone()
    moved[..., 8:16, 24:32] += 1.0  # the patch at row 1, column 3 (the patch stem sees it alone)
    with torch.no_grad():
        before, after = vit(images)[0, 1:].reshape(4, 6, 16), vit(moved)[0, 1:].reshape(4, 6, 16)
    changed = (before - after).abs().amax(-1) > 1e-6  # (4, 6): which patches' tokens moved
    on_its_lines = torch.zeros(4, 6, dtype=torch.bool)
    on_its_lines[1, :] = on_its_lines[:, 3] = True
    assert torch.equal(changed, on_its_lines)  # one block: its row and its column, nothing else
    # the two-stream model's vision stream runs the same blocks with the same mask
    from mmtx.models.two_stream import TwoStreamModel

    backbone = TwoStreamModel(vit, TextEncoder(vocab_size=30, dim=16, depth=1, num_heads=2, max_length=8), joint_dim=16)
    with torch.no_grad():
        streamed = backbone.eval().encode_vision(images)[0]
        torch.testing.assert_close(vit.norm(streamed), vit(images))
        moved_stream = (streamed - backbone.encode_vision(moved)[0])[0, 1:].abs().amax(-1) > 1e-6
    assert torch.equal(moved_stream.reshape(4, 6), on_its_lines)
    # the same weights with every head reading everything: the whole image moves
    full = VisionEncoder(image_size=32, patch_size=8, dim=16, depth=1, num_heads=4)
    full.load_state_dict(vit.state_dict())
    with torch.no_grad():
        assert ((full.eval()(images) - full(moved))[0, 1:].abs().amax(-1) > 1e-6).all()


def test_axial_head_mask_splits_the_heads_between_rows_and_columns() -> None:
    from mmtx.models.vit import axial_head_mask

    mask = axial_head_mask((2, 3), num_heads=4)  # CLS, then (0,0) (0,1) (0,2) (1,0) (1,1) (1,2)
    assert mask.shape == (4, 7, 7) and mask[:, 0].all() and mask[:, :, 0].all()  # CLS reads and is read
    rows = torch.block_diag(torch.ones(3, 3), torch.ones(3, 3)).bool()
    columns = torch.eye(3).repeat(2, 2).bool()
    assert all(torch.equal(mask[h, 1:, 1:], rows) for h in (0, 1))
    assert all(torch.equal(mask[h, 1:, 1:], columns) for h in (2, 3))
    with pytest.raises(ValueError, match="attention='diagonal'"):
        VisionEncoder(image_size=32, patch_size=8, dim=8, depth=1, num_heads=2, attention="diagonal")
    with pytest.raises(ValueError, match="num_heads=1"):
        VisionEncoder(image_size=32, patch_size=8, dim=8, depth=1, num_heads=1, attention="axial")
