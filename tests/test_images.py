"""load_image: every PIL mode becomes upright 8-bit RGB, every broken file an ImageLoadError;
read_image: the same pixels as a tensor, by TorchCodec where it can; build_transforms: shape,
dtype, normalisation and the (absent) flip."""

from __future__ import annotations

import pickle
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from mmtx.data import images
from mmtx.data.images import ALPHA_BACKGROUND, ImageLoadError, load_image, read_image
from mmtx.data.transforms import IMAGENET_MEAN, IMAGENET_STD, build_transforms, random_shift


def _save(img: Image.Image, path: Path, **params) -> Path:
    img.save(path, **params)
    return path


def _pixels(path: Path) -> np.ndarray:
    img = load_image(path)
    assert img.mode == "RGB"
    return np.asarray(img).astype(int)


def test_grayscale_and_bilevel_become_gray_rgb(tmp_path: Path) -> None:
    gray = _pixels(_save(Image.new("L", (5, 4), 100), tmp_path / "l.png"))
    assert gray.shape == (4, 5, 3) and (gray == 100).all()

    bilevel = Image.new("1", (4, 4), 0)
    bilevel.putpixel((3, 0), 1)
    rgb = _pixels(_save(bilevel, tmp_path / "one.png"))
    assert (rgb[0, 3] == 255).all() and (rgb[0, 0] == 0).all()


def test_alpha_is_composited_on_the_background(tmp_path: Path) -> None:
    rgba = Image.new("RGBA", (2, 1))
    rgba.putpixel((0, 0), (0, 0, 255, 255))  # opaque blue stays blue
    rgba.putpixel((1, 0), (255, 0, 0, 0))  # fully transparent red shows the background
    rgb = _pixels(_save(rgba, tmp_path / "rgba.png"))
    assert tuple(rgb[0, 0]) == (0, 0, 255)
    assert tuple(rgb[0, 1]) == ALPHA_BACKGROUND

    la = Image.new("LA", (1, 1), (0, 128))  # black at half opacity over the background
    half = _pixels(_save(la, tmp_path / "la.png"))[0, 0]
    expected = np.array(ALPHA_BACKGROUND) * (255 - 128) / 255
    assert np.abs(half - expected).max() <= 1


def test_palette_transparency_is_honoured(tmp_path: Path) -> None:
    pal = Image.new("P", (2, 1), 0)
    pal.putpalette([0, 0, 0, 255, 0, 0] + [0] * (256 - 2) * 3)
    pal.putpixel((1, 0), 1)
    rgb = _pixels(_save(pal, tmp_path / "p.png", transparency=0))
    assert tuple(rgb[0, 0]) == ALPHA_BACKGROUND  # index 0 is transparent
    assert tuple(rgb[0, 1]) == (255, 0, 0)


def test_cmyk_converts_to_rgb(tmp_path: Path) -> None:
    cmyk = Image.new("CMYK", (1, 1), (0, 255, 255, 0))  # full magenta + yellow = red
    assert tuple(_pixels(_save(cmyk, tmp_path / "cmyk.tif"))[0, 0]) == (255, 0, 0)


@pytest.mark.parametrize(("suffix", "mode"), [(".png", "I;16"), (".tif", "I;16B")])
def test_16_bit_scales_by_bit_depth(tmp_path: Path, suffix: str, mode: str) -> None:
    img = Image.fromarray(np.array([[0, 257 * 128, 65535]], dtype=np.uint16)).convert("I").convert(mode)
    path = _save(img, tmp_path / f"deep{suffix}")
    with Image.open(path) as reopened:
        assert reopened.mode == mode
    assert _pixels(path)[0, :, 0].tolist() == [0, 128, 255]  # scaled, not clipped at 255


def test_32_bit_int_holding_16_bit_data_and_float(tmp_path: Path) -> None:
    ints = Image.fromarray(np.array([[0, 65535, 32896]], dtype=np.int32))
    assert _pixels(_save(ints, tmp_path / "i.tif"))[0, :, 0].tolist() == [0, 255, 128]

    floats = Image.fromarray(np.array([[0.0, 0.5, 1.0]], dtype=np.float32))
    assert _pixels(_save(floats, tmp_path / "f.tif"))[0, :, 0].tolist() == [0, 128, 255]


@pytest.mark.parametrize(
    ("orientation", "red_corner"),
    [(6, "top_right"), (8, "bottom_left")],  # 6: rotate 90 cw to display, 8: 90 ccw
)
def test_exif_orientation_is_applied(tmp_path: Path, orientation: int, red_corner: str) -> None:
    stored = Image.new("RGB", (40, 20), (0, 0, 255))
    stored.paste((255, 0, 0), (0, 0, 10, 10))  # red block in the stored top-left corner
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = _save(stored, tmp_path / "rotated.jpg", exif=exif, quality=95)

    img = load_image(path)
    assert img.size == (20, 40)  # width and height swapped
    corners = {"top_left": (2, 2), "top_right": (17, 2), "bottom_left": (2, 37), "bottom_right": (17, 37)}
    for name, xy in corners.items():
        r, g, b = img.getpixel(xy)
        is_red = r > 200 and b < 60
        assert is_red == (name == red_corner), (name, (r, g, b))


def test_missing_empty_truncated_and_non_image_files_name_the_path(tmp_path: Path) -> None:
    empty = tmp_path / "empty.png"
    empty.touch()
    text = tmp_path / "notes.jpg"
    text.write_text("these are not pixels\n")
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    full = _save(Image.fromarray(noise), tmp_path / "full.png").read_bytes()
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(full[: len(full) // 2])

    cases = {
        tmp_path / "missing.png": "No such file",
        empty: "empty",
        text: "cannot identify",
        truncated: "truncated",
        tmp_path: "not a regular file",
    }
    for path, reason in cases.items():
        with pytest.raises(ImageLoadError) as info:
            load_image(path)
        assert str(path) in str(info.value) and reason in str(info.value)
        assert info.value.path == path


def _every_kind_of_file(folder: Path) -> dict[str, tuple[Path, bool]]:
    """name: (file, whether TorchCodec decodes it) for the modes and formats users have."""
    rng = np.random.default_rng(1)
    noise = Image.fromarray(rng.integers(0, 256, (24, 36, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6
    alpha = noise.convert("RGBA")
    alpha.putalpha(Image.fromarray(rng.integers(0, 256, (24, 36), dtype=np.uint8)))
    palette = noise.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    palette.info["transparency"] = 3
    deep = Image.fromarray(rng.integers(0, 65536, (24, 36), dtype=np.uint16))
    rgb48 = folder / "g48.png"  # 16 bits per channel: Pillow cannot write it, so by hand
    rows = rng.integers(0, 65536, (24, 36, 3), dtype=np.uint16).astype(">u2")

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 36, 24, 16, 2, 0, 0, 0)
    pixels = zlib.compress(b"".join(b"\0" + row.tobytes() for row in rows))
    rgb48.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b""))
    return {
        "rgb jpeg, rotated": (_save(noise, folder / "a.jpg", exif=exif, quality=90), True),
        "gray jpeg": (_save(noise.convert("L"), folder / "b.jpg"), True),
        "rgb png": (_save(noise, folder / "c.png"), True),
        "gray png, rotated": (_save(noise.convert("L"), folder / "d.png", exif=exif), True),
        "rgba png": (_save(alpha, folder / "e.png"), False),
        "palette png with transparency": (_save(palette, folder / "f.png"), False),
        "16-bit png": (_save(deep, folder / "g.png"), False),
        "48-bit rgb png": (rgb48, False),
        "cmyk jpeg": (_save(noise.convert("CMYK"), folder / "h.jpg"), False),
        "webp": (_save(noise, folder / "i.webp"), False),
    }


def test_read_image_matches_load_image_decoding_photos_with_torchcodec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = _every_kind_of_file(tmp_path)
    expected = {
        name: torch.from_numpy(np.array(load_image(path))).permute(2, 0, 1) for name, (path, _) in files.items()
    }
    used_pillow = []
    monkeypatch.setattr(
        images, "load_image", lambda path, **limit: used_pillow.append(Path(path)) or load_image(path, **limit)
    )
    for name, (path, fast) in files.items():
        pixels = read_image(path)
        assert pixels.dtype == torch.uint8 and torch.equal(pixels, expected[name]), name
        assert (path not in used_pillow) == fast, name


def test_read_image_decodes_with_torchvision_where_torchcodec_cannot_load(tmp_path: Path) -> None:
    """GPU images often ship a torch that no TorchCodec release is built for: its import fails
    there, and torchvision.io's decoders give the same pixels (a process of its own, where the
    import is made to fail)."""
    files = _every_kind_of_file(tmp_path)
    for _name, (path, _) in files.items():
        torch.save(torch.from_numpy(np.array(load_image(path))).permute(2, 0, 1), tmp_path / f"{path.name}.pt")
    script = f"""
import sys, torch
from pathlib import Path
sys.modules["torchcodec"] = sys.modules["torchcodec.decoders"] = None  # import fails, as where no build matches
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from mmtx.data import images
assert any("TorchCodec cannot be loaded" in str(w.message) for w in caught), [str(w.message) for w in caught]
assert images.decode_image.__module__ == "mmtx.data.images", images.decode_image.__module__
for path in {[str(p) for p, _ in files.values()]!r}:
    assert torch.equal(images.read_image(Path(path)), torch.load(path + ".pt")), path
print("same pixels")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "same pixels" in proc.stdout, proc.stderr[-2000:]


def test_read_image_names_the_broken_file(tmp_path: Path) -> None:
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    whole = _save(Image.fromarray(noise), tmp_path / "whole.jpg", quality=90).read_bytes()
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(whole[: len(whole) // 2])  # the header is intact, half the data is gone
    text = tmp_path / "notes.png"
    text.write_text("these are not pixels\n")
    for path in (cut, text, tmp_path / "missing.jpg"):
        with pytest.raises(ImageLoadError) as info:
            read_image(path)
        assert info.value.path == path


def test_decompression_bomb_protection_stays_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _save(Image.new("RGB", (64, 64)), tmp_path / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 4096 px > 2 * limit: a bomb
    with pytest.raises(ImageLoadError, match="DecompressionBomb"):
        load_image(path)


def test_image_load_error_survives_pickling() -> None:
    # DataLoader workers pickle exceptions back to the main process.
    err = pickle.loads(pickle.dumps(ImageLoadError("/data/x.jpg", "file is empty")))
    assert str(err) == "cannot load image /data/x.jpg: file is empty" and err.reason == "file is empty"


def test_transforms_shape_dtype_and_normalisation() -> None:
    transform = build_transforms(32, train=False)
    mean_color = tuple(round(m * 255) for m in IMAGENET_MEAN)
    out = transform(Image.new("RGB", (50, 30), mean_color))
    assert out.shape == (3, 32, 32) and out.dtype == torch.float32
    assert out.abs().max() < 0.02  # the mean colour normalises to ~0

    white = transform(Image.new("RGB", (50, 30), (255, 255, 255)))
    expected = [(1 - m) / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD)]
    assert torch.allclose(white.mean(dim=(1, 2)), torch.tensor(expected), atol=1e-4)


def test_train_transforms_crop_randomly_and_never_flip() -> None:
    gradient = np.tile(np.linspace(0, 255, 48, dtype=np.uint8), (48, 1))
    img = Image.fromarray(np.stack([gradient] * 3, axis=-1))  # dark left, bright right

    plain = build_transforms(24, train=True)
    assert not any(isinstance(t, v2.RandomHorizontalFlip) for t in plain.transforms)
    assert torch.equal(plain(img), build_transforms(24, train=False)(img))  # no crop_scale: deterministic

    cropping = build_transforms(24, train=True, crop_scale=(0.3, 0.6), mean=(0.5,) * 3, std=(0.5,) * 3)
    torch.manual_seed(0)
    first = torch.stack([cropping(img) for _ in range(8)])
    torch.manual_seed(0)
    again = torch.stack([cropping(img) for _ in range(8)])
    assert first.shape == (8, 3, 24, 24) and torch.equal(first, again)
    assert not torch.equal(first[0], first[1])  # crops differ
    assert (first[:, 0, :, -1] >= first[:, 0, :, 0]).all()  # left stays darker than right: no flip


def test_random_shift_moves_each_image_by_its_own_offset() -> None:
    """One bright pixel per image: it reappears moved by at most ``max_px`` each way, by offsets
    that differ between the images of a batch, the border filled with the edge's own pixels."""
    images = torch.zeros(32, 3, 16, 16)
    images[:, :, 8, 5] = 1.0
    assert random_shift(images, 0) is images
    torch.manual_seed(0)
    shifted = random_shift(images, 3)
    assert shifted.shape == images.shape and torch.equal(shifted[:, 0], shifted[:, 2])  # channels move together
    where = shifted[:, 0].flatten(1).argmax(dim=1)
    dy, dx = where // 16 - 8, where % 16 - 5
    assert (shifted.flatten(1).sum(dim=1) == 3).all()  # the pixel is moved, never lost or doubled
    assert dy.abs().max() <= 3 and dx.abs().max() <= 3 and len(set(zip(dy.tolist(), dx.tolist()))) > 8
    ramp = torch.linspace(0, 1, 16).expand(1, 3, 16, 16)  # dark left, bright right
    moved = random_shift(ramp.repeat(8, 1, 1, 1), 2)
    assert (moved[:, :, :, 1:] >= moved[:, :, :, :-1]).all()  # left stays left: a shift, never a flip


def test_seeded_shifts_follow_each_image_not_its_batch() -> None:
    """With a seed per image, an image moves by the same offset whichever batch (or process) it
    is in and whatever was drawn before; other seeds move it otherwise."""
    images = torch.rand(6, 3, 16, 16)
    seeds = [11, 12, 13, 14, 15, 16]
    whole = random_shift(images, 3, seeds)
    torch.manual_seed(1)
    halves = torch.cat([random_shift(images[:3], 3, seeds[:3]), random_shift(images[3:], 3, seeds[3:])])
    assert torch.equal(whole, halves)
    assert not torch.equal(whole, random_shift(images, 3, [s + 100 for s in seeds]))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(image_size=0),
        dict(image_size=8, std=(0.0, 1.0, 1.0)),
        dict(image_size=8, mean=(0.5,)),
        dict(image_size=8, crop_scale=(0.0, 1.0)),
        dict(image_size=8, crop_scale=(0.9, 0.5)),
    ],
)
def test_transforms_reject_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        build_transforms(train=True, **kwargs)
