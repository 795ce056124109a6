"""Image files as an attacker would write them: more pixels than the limit (by one row, by a
forged header, by a GIF frame larger than its screen) and formats mmtx does not read (PostScript,
PDF, XBM, ICO, ...) dressed as ``.png`` or ``.jpg``. Each is refused from its header, with one line
naming the file, by every reader (Pillow's, TorchCodec's, the pre-flight check, a tar member), by
the data module under ``data.max_image_pixels``, and by the demo's upload box; nothing is decoded."""

from __future__ import annotations

import functools
import io
import json
import os
import struct
import subprocess
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from PIL import EpsImagePlugin, Image, ImageFile

from mmtx.data import images
from mmtx.data.bad_data import BadDataError
from mmtx.data.captions import CocoCaptions
from mmtx.data.images import (
    IMAGE_FORMATS,
    MAX_IMAGE_PIXELS,
    FileSlice,
    ImageLoadError,
    check_image,
    load_image,
    read_image,
    scan_images,
)
from mmtx.data.tokenizer import Tokenizer

NOT_RASTER = "not a raster image mmtx reads (JPEG, PNG, WEBP, GIF, BMP, TIFF)"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _gray_png(width: int, height: int, pixels: bool = True) -> bytes:
    """A valid 8-bit grayscale PNG of one colour (TorchCodec's kind of file: its fast path), written
    row by row so that a 90-megapixel one costs 0.3 s and 90 KB; ``pixels=False``: the header alone."""
    squeeze = zlib.compressobj(9)
    row = bytes(width + 1)  # filter byte + a row of black
    data = b"".join(squeeze.compress(row) for _ in range(height)) + squeeze.flush() if pixels else b""
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", data) + _chunk(b"IEND", b"")


def _save(img: Image.Image, path: Path, **params) -> Path:
    img.save(path, **params)
    return path


def _in_a_shard(tmp_path: Path, data: bytes, name: str) -> FileSlice:
    """``data`` as a member of a larger file, between other bytes, as a tar shard holds it."""
    shard = tmp_path / "shard.tar"
    before = b"\0" * 512
    shard.write_bytes(before + data + b"\0" * 1024)
    return FileSlice(shard, len(before), len(data), name)


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What got decoded: Pillow's decoders (``ImageFile.load``) and TorchCodec's, each call listed
    and refused, so that a refusal after the decode could not pass as one before it."""
    calls: list[str] = []

    def pillow(self: ImageFile.ImageFile, *args, **kwargs):
        calls.append(f"Pillow decoded {self.format} {self.size}")
        raise AssertionError("decoded")

    def torchcodec(source, *args, **kwargs):
        calls.append("TorchCodec decoded")
        raise AssertionError("decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", pillow)
    monkeypatch.setattr(images, "decode_image", torchcodec)
    return calls


def _refusals(source: Path | FileSlice, max_pixels: int) -> Iterator[tuple[str, str]]:
    """(reader, its one-line refusal) from every reader that takes ``source``."""
    readers: dict[str, Callable] = {"load_image": load_image, "read_image": read_image}
    for name, read in readers.items():
        with pytest.raises(ImageLoadError) as info:
            read(source, max_pixels=max_pixels)
        assert info.value.path == Path(str(source)), name
        yield name, str(info.value)
    if isinstance(source, Path):
        reason = check_image(source, max_pixels=max_pixels)
        assert reason is not None
        yield "check_image", f"cannot load image {source}: {reason}"
        assert scan_images([source], max_pixels=max_pixels) == {source: reason}


# --- the pixel limit ----------------------------------------------------------------------------


def test_one_row_over_the_limit_is_refused_by_every_reader_before_decoding(tmp_path: Path, decoded: list[str]) -> None:
    png = _save(Image.new("RGB", (101, 100), "red"), tmp_path / "wide.png")  # 10,100 pixels
    member = _in_a_shard(tmp_path, png.read_bytes(), "k1.png")
    for source in (png, member):
        for reader, message in _refusals(source, max_pixels=10_000):
            assert (
                message
                == f"cannot load image {source}: 101x100 = 10,100 pixels, over the limit of 10,000 (data.max_image_pixels)"
            ), reader
    assert decoded == []


def test_an_image_exactly_at_the_limit_is_read_by_every_reader(tmp_path: Path) -> None:
    png = _save(Image.new("RGB", (100, 100), "red"), tmp_path / "square.png")  # 10,000 pixels
    jpeg = _save(Image.new("RGB", (100, 100), "red"), tmp_path / "square.jpg")  # TorchCodec's fast path
    for path in (png, jpeg):
        assert load_image(path, max_pixels=10_000).size == (100, 100)
        assert read_image(path, max_pixels=10_000).shape == (3, 100, 100)
        assert check_image(path, max_pixels=10_000) is None
    member = _in_a_shard(tmp_path, png.read_bytes(), "k1.png")
    assert load_image(member, max_pixels=10_000).size == (100, 100)
    assert read_image(member, max_pixels=10_000).shape == (3, 100, 100)


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An 88 KB PNG of 10000x9000 = 90,000,000 pixels: just over Pillow's default limit, where
    Pillow itself only warns and decodes 270 MB of RGB."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.png"
    path.write_bytes(_gray_png(10_000, 9_000))
    assert path.stat().st_size < 200_000 and MAX_IMAGE_PIXELS < 90_000_000 < 2 * MAX_IMAGE_PIXELS
    return path


def test_a_png_just_over_the_limit_is_refused_with_no_warning_or_decode(
    bomb: Path, tmp_path: Path, decoded: list[str]
) -> None:
    member = _in_a_shard(tmp_path, bomb.read_bytes(), "k1.png")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        found = [
            (reader, message) for source in (bomb, member) for reader, message in _refusals(source, MAX_IMAGE_PIXELS)
        ]
        took = time.perf_counter() - start
    for reader, message in found:
        assert message.endswith(
            ": 10000x9000 = 90,000,000 pixels, over the limit of 89,478,485 (data.max_image_pixels)"
        ), reader
    assert not [str(w.message) for w in caught if issubclass(w.category, Image.DecompressionBombWarning)]
    assert decoded == [] and took < 1.0, took  # headers only: a decode alone takes a quarter of a second


def test_default_limit_is_pillows_and_pillows_setting_is_left_alone(bomb: Path) -> None:
    assert MAX_IMAGE_PIXELS == 89_478_485 and Image.MAX_IMAGE_PIXELS == 89_478_485
    assert load_image.__defaults__ == read_image.__defaults__ == check_image.__defaults__ == (MAX_IMAGE_PIXELS,)
    # a higher limit lets the 90-megapixel PNG through its header (the check only verifies checksums),
    # with neither Pillow's warning nor a change to Pillow's own setting
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert check_image(bomb, max_pixels=90_000_000) is None
    assert not [str(w.message) for w in caught if issubclass(w.category, Image.DecompressionBombWarning)]
    assert Image.MAX_IMAGE_PIXELS == 89_478_485


def test_a_header_far_over_the_limit_is_refused_with_its_size(tmp_path: Path, decoded: list[str]) -> None:
    huge = tmp_path / "huge.png"
    huge.write_bytes(_gray_png(20_000, 20_000, pixels=False))  # over twice Pillow's limit: Pillow refuses it too
    for reader, message in _refusals(huge, MAX_IMAGE_PIXELS):
        assert (
            message
            == f"cannot load image {huge}: 400,000,000 pixels, over the limit of 89,478,485 (data.max_image_pixels)"
        ), reader
    assert decoded == []


def test_a_gif_frame_larger_than_its_screen_counts_at_its_real_size(tmp_path: Path, decoded: list[str]) -> None:
    out = io.BytesIO()
    Image.new("L", (200, 100), 7).save(out, format="GIF")
    gif = bytearray(out.getvalue())
    gif[6:10] = struct.pack("<HH", 10, 10)  # the logical screen claims 10x10 = 100 pixels
    path = tmp_path / "small.gif"
    path.write_bytes(bytes(gif))
    for reader, message in _refusals(path, max_pixels=10_000):
        assert "200x100 = 20,000 pixels, over the limit of 10,000" in message, reader
    assert decoded == []


# --- the format allow-list ----------------------------------------------------------------------

EPS = b"""%!PS-Adobe-3.0 EPSF-3.0
%%BoundingBox: 0 0 16 16
%%EndComments
newpath 0 0 moveto 16 16 lineto stroke
showpage
%%EOF
"""


def _other_formats(folder: Path) -> dict[str, Path]:
    """Files of formats Pillow has plugins for but mmtx does not read, each named as a photo."""
    files = {"PostScript as .png": folder / "x.png"}
    files["PostScript as .png"].write_bytes(EPS)
    made = {"PDF": ("doc.jpg", "RGB"), "XBM": ("bits.png", "1"), "ICO": ("icon.png", "RGB"),
            "ICNS": ("apple.jpg", "RGB"), "EPS": ("pillow-eps.jpg", "RGB"), "TGA": ("targa.png", "RGB"),
            "PPM": ("netpbm.jpg", "RGB"), "PCX": ("paint.png", "RGB"), "SGI": ("sgi.jpg", "RGB")}  # fmt: skip
    for fmt, (name, mode) in made.items():
        files[f"{fmt} as {Path(name).suffix}"] = _save(Image.new(mode, (16, 16)), folder / name, format=fmt)
    return files


@pytest.fixture
def no_other_plugin(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every Pillow plugin outside `IMAGE_FORMATS`, and Ghostscript, made a canary: listed if tried."""
    tried: list[str] = []
    Image.init()
    for fmt, (factory, accept) in list(Image.OPEN.items()):
        if fmt not in IMAGE_FORMATS:

            def canary(fp, filename=None, fmt=fmt, factory=factory):
                tried.append(fmt)
                return factory(fp, filename)

            monkeypatch.setitem(Image.OPEN, fmt, (canary, accept))

    def ghostscript(*args, **kwargs):
        tried.append("Ghostscript")
        raise AssertionError("Ghostscript ran")

    monkeypatch.setattr(EpsImagePlugin, "gs_binary", "gs")  # as where Ghostscript is installed
    monkeypatch.setattr(EpsImagePlugin, "Ghostscript", ghostscript)
    monkeypatch.setattr(subprocess, "check_call", ghostscript)
    monkeypatch.setattr(subprocess, "Popen", ghostscript)
    return tried


def test_other_formats_named_as_photos_are_refused_without_trying_plugins(
    tmp_path: Path, no_other_plugin: list[str], decoded: list[str]
) -> None:
    for what, path in _other_formats(tmp_path).items():
        member = _in_a_shard(tmp_path, path.read_bytes(), path.name)
        for source in (path, member):
            for reader, message in _refusals(source, MAX_IMAGE_PIXELS):
                assert message == f"cannot load image {source}: {NOT_RASTER}: cannot identify its format", (
                    what,
                    reader,
                )
                assert "\n" not in message
    assert no_other_plugin == [] and decoded == []


def test_every_allowed_format_and_phone_jpegs_are_read(tmp_path: Path) -> None:
    picture = Image.new("RGB", (12, 8), (200, 30, 10))
    names = {"JPEG": "a.jpg", "PNG": "a.png", "WEBP": "a.webp", "GIF": "a.gif", "BMP": "a.bmp", "TIFF": "a.tif"}
    assert set(names) == set(IMAGE_FORMATS)
    phone = _save(picture, tmp_path / "phone.jpg", format="MPO", save_all=True, append_images=[picture])
    with Image.open(phone) as opened:
        assert opened.format == "MPO"  # a multi-picture JPEG, as phones write them
    for path in [*(_save(picture, tmp_path / name) for name in names.values()), phone]:
        assert check_image(path) is None, path
        assert load_image(path).size == (12, 8) and read_image(path).shape == (3, 8, 12), path


# --- the data module ----------------------------------------------------------------------------


def _coco_with_a_wide_image(tmp_path: Path) -> dict[str, str]:
    """Four 8x8 images (64 pixels) and one 11x10 (110 pixels), two captions each."""
    folder = tmp_path / "images"
    folder.mkdir()
    sizes = {k: (8, 8) for k in range(1, 5)} | {5: (11, 10)}
    for k, size in sizes.items():
        _save(Image.new("RGB", size, "red"), folder / f"{k}.png")
    document = {"images": [{"id": k, "file_name": f"{k}.png"} for k in sizes],
                "annotations": [{"id": 10 * k + j, "image_id": k, "caption": f"a red square {j}"}
                                for k in sizes for j in range(2)]}  # fmt: skip
    (tmp_path / "captions.json").write_text(json.dumps(document))
    return {"annotations": str(tmp_path / "captions.json"), "images": str(folder)}


def test_max_image_pixels_makes_a_larger_image_a_bad_image_in_the_scan(tmp_path: Path) -> None:
    files = _coco_with_a_wide_image(tmp_path)
    wide = Path(files["images"]) / "5.png"
    reason = "11x10 = 110 pixels, over the limit of 100 (data.max_image_pixels)"
    with pytest.raises(BadDataError) as info:
        CocoCaptions(train=files, max_image_pixels=100).records("train")
    assert f"{wide}: {reason}" in str(info.value)
    module = CocoCaptions(train=files, max_image_pixels=100, on_bad_image="skip")
    assert sorted(r.image_id for r in module.records("train")) == [1, 2, 3, 4]
    assert [(d.kind, d.what, d.reason) for d in module.report.items] == [("image", str(wide), reason)]
    assert len(CocoCaptions(train=files).records("train")) == 5  # within the default limit: read
    with pytest.raises(ValueError, match=r"^max_image_pixels=0 must be a positive integer"):
        CocoCaptions(train=files, max_image_pixels=0)


@pytest.mark.parametrize("in_memory", [False, True])
def test_max_image_pixels_reaches_the_loader_and_the_in_memory_images(tmp_path: Path, in_memory: bool) -> None:
    files = _coco_with_a_wide_image(tmp_path)
    module = CocoCaptions(train=files, max_image_pixels=100, on_bad_image="skip", image_size=8, batch_size=2,
                          num_workers=0, in_memory=in_memory, tokenizer=functools.partial(Tokenizer.train, vocab_size=60))  # fmt: skip
    module.records("train")  # the scan leaves 5.png out
    grown = Path(files["images"]) / "1.png"
    _save(Image.new("RGB", (10, 11), "red"), grown)  # replaced after the scan by one over the limit
    module.on_bad_image = "error"
    with pytest.raises(ImageLoadError) as info:
        list(module.train_dataloader())
    assert info.value.path == grown and "10x11 = 110 pixels, over the limit of 100 (data.max_image_pixels)" in str(
        info.value
    )


def test_the_configs_give_the_data_modules_max_image_pixels(tmp_path: Path) -> None:
    from hydra.utils import instantiate

    from tests.helpers import compose_train

    files = _coco_with_a_wide_image(tmp_path)
    split = [f"data.train.{key}={value}" for key, value in files.items()]
    cfg = compose_train(["data=coco", *split, "data.max_image_pixels=100", "paths.output_dir=/unused"])
    module = instantiate(cfg.data)
    assert module.max_image_pixels == 100
    assert compose_train(["data=shapes", "paths.output_dir=/unused"]).data.max_image_pixels == MAX_IMAGE_PIXELS


# --- the demo's uploads -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vqa_task():
    from omegaconf import OmegaConf

    from mmtx.tasks.vqa import VqaTask
    from tests.helpers import TINY_TWO_STREAM, compose_train

    cfg = compose_train(["task=vqa", *TINY_TWO_STREAM, "data.image_size=32", "paths.output_dir=/unused"])
    tokenizer = Tokenizer.train(["what color is the circle", "how many shapes"], vocab_size=60)
    return VqaTask(OmegaConf.to_container(cfg.model, resolve=True), tokenizer.to_str(), answers=["red", "blue", "2"],
                   data_config={"image_size": 32}).eval()  # fmt: skip


def test_demo_upload_box_takes_images_only_and_gradio_deletes_the_uploads(vqa_task, tmp_path: Path) -> None:
    gr = pytest.importorskip("gradio", reason="pip install 'mmtx[demo]'")
    from gradio.data_classes import FileData
    from gradio.route_utils import delete_files_created_by_app

    from mmtx.commands.demo import KEEP_UPLOADS, Demo, build_page

    page = build_page(Demo(vqa_task))
    (upload,) = [b for b in page.blocks.values() if getattr(b, "elem_id", None) == "upload"]
    assert isinstance(upload, gr.File) and upload.type == "filepath"
    upload.GRADIO_CACHE = str(tmp_path)  # where preprocess leaves a temporary file of its own
    assert {".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"} <= set(upload.file_types)
    assert not {".pdf", ".eps", ".ps", ".svg", ".xbm", ".ico", ".icns", ".txt"} & set(upload.file_types)
    for name in ("notes.txt", "drawing.eps", "doc.pdf", "icon.svg"):  # refused by Gradio, whatever the browser sends
        (tmp_path / name).write_bytes(EPS)
        with pytest.raises(gr.Error, match="Invalid file type"):
            upload.preprocess(FileData(path=str(tmp_path / name), orig_name=name))
    assert upload.preprocess(FileData(path=str(tmp_path / "a.PNG"), orig_name="a.PNG")) == str(tmp_path / "a.PNG")

    frequency, age = page.delete_cache
    assert (frequency, age) == KEEP_UPLOADS and 0 < frequency <= age <= 24 * 3600
    uploaded = tmp_path / "uploaded.png"
    uploaded.write_bytes(b"\x89PNG")
    page.upload_file_set.add(str(uploaded))  # as Gradio's upload route records a file
    delete_files_created_by_app(page, age)
    assert uploaded.exists()  # younger than the age: kept for the next click
    delete_files_created_by_app(page, None)  # as when the server stops
    assert not uploaded.exists()


def test_demo_refuses_too_big_or_other_format_uploads_before_decoding(
    vqa_task, bomb: Path, tmp_path: Path, decoded: list[str], no_other_plugin: list[str]
) -> None:
    from mmtx.commands.demo import Demo

    wide = _save(Image.new("RGB", (101, 100), "red"), tmp_path / "wide.png")
    postscript = tmp_path / "x.png"
    postscript.write_bytes(EPS)
    cases = [
        (
            Demo(vqa_task, max_pixels=10_000),
            wide,
            "101x100 = 10,100 pixels, over the limit of 10,000 (data.max_image_pixels)",
        ),
        (Demo(vqa_task), bomb, "10000x9000 = 90,000,000 pixels, over the limit of 89,478,485 (data.max_image_pixels)"),
        (Demo(vqa_task), postscript, f"{NOT_RASTER}: cannot identify its format"),
        (Demo(vqa_task), tmp_path / "gone.png", "uploads are deleted after an hour: upload the image again"),
    ]
    for demo, path, reason in cases:
        assert demo.answer(str(path), "what color?") == (f"**Not an image we can read:** {reason}", {}, None), path
    assert decoded == [] and no_other_plugin == []


def test_the_demo_reads_an_upload_within_the_limit(vqa_task, tmp_path: Path) -> None:
    from mmtx.commands.demo import Demo

    square = _save(Image.new("RGB", (100, 100), "red"), tmp_path / "square.png")
    status, answers, heat = Demo(vqa_task, max_pixels=10_000).answer(str(square), "what color?")
    assert status == "" and sorted(answers) == ["2", "blue", "red"] and heat is not None
    assert isinstance(Demo(vqa_task).pixels(str(square)), torch.Tensor)


def test_a_file_with_more_bytes_than_its_pixels_can_take_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small image followed by gigabytes (a sparse file here): refused by its size before it is
    read into memory, through every reader and as a shard member (whose header gives its size)."""
    from mmtx.data.images import max_file_bytes

    path = tmp_path / "padded.png"
    Image.new("RGB", (8, 8), "red").save(path)
    os.truncate(path, max_file_bytes(100) + 1)  # trailing zeros that take no disk
    for read in (load_image, read_image):
        with pytest.raises(ImageLoadError, match=r"bytes, more than an image of up to 100 pixels"):
            read(path, max_pixels=100)
    assert "more than an image of up to 100 pixels" in (check_image(path, max_pixels=100) or "")
    assert read_image(path).shape == (3, 8, 8)  # the default limit allows those bytes

    def never(self: FileSlice) -> bytes:
        raise AssertionError("the member was read")

    monkeypatch.setattr(FileSlice, "read_bytes", never)
    member = FileSlice(path, 0, max_file_bytes(100) + 1, "KEY.png")
    with pytest.raises(ImageLoadError, match="more than an image of up to 100 pixels"):
        read_image(member, max_pixels=100)
