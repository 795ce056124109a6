"""``mmtx-demo`` in a real browser: the page it serves for a tiny checkpoint, driven by headless
Chromium (Debian's package; .ci/run installs it): an image gets a caption and a heat map, a text
file and a file over the upload limit get a message, and the server stays up."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from PIL import Image

from tests.bad_inputs import write_tiny_checkpoint
from tests.conftest import free_ports

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def repeating_checkpoint(path: Path, word: str = "red") -> Path:
    """A tiny captioner that writes ``word`` at every step (its last norm emits the word's
    embedding, which the tied output layer scores highest): a caption to read off the page."""
    import torch

    from mmtx.data.tokenizer import Tokenizer

    ckpt = torch.load(write_tiny_checkpoint(path), weights_only=True)
    tokenizer = Tokenizer.from_str(ckpt["hyper_parameters"]["tokenizer"])
    state = ckpt["state_dict"]
    state["model.decoder.body.norm.weight"].zero_()
    state["model.decoder.body.norm.bias"].copy_(
        1000 * state["model.decoder.body.token_embed.weight"][tokenizer.backend.token_to_id(word)]
    )
    torch.save(ckpt, path)
    return path


def wait_for(url: str, proc: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"mmtx-demo exited with {proc.returncode}:\n{proc.stdout.read()}")  # type: ignore[union-attr]
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"mmtx-demo did not serve {url} within {seconds:.0f} s")


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install chromium), as .ci/run installs it")
def test_demo_page_captions_and_maps_an_upload_and_refuses_text_or_too_big(cli, tmp_path: Path) -> None:
    pytest.importorskip("gradio", reason="pip install 'mmtx[demo]'")
    sync_api = pytest.importorskip("playwright.sync_api")
    ckpt = repeating_checkpoint(tmp_path / "last.ckpt")
    image, text, disguised = tmp_path / "photo.png", tmp_path / "notes.txt", tmp_path / "notes.png"
    Image.new("RGB", (48, 40), "red").save(image)
    text.write_text("not an image")
    disguised.write_text("not an image either")
    port = free_ports(1)[0]
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "NO_PROXY": "127.0.0.1,localhost"}
    big = tmp_path / "big.png"
    big.write_bytes(os.urandom(1_500_000))
    proc = subprocess.Popen([cli.script("mmtx-demo"), f"ckpt={ckpt}", f"port={port}", "max_upload_mb=1"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        wait_for(f"http://127.0.0.1:{port}/", proc)
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1100, "height": 800})
            requested: list[str] = []
            page.on("request", lambda request: requested.append(request.url))
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_selector("#run", timeout=60_000)  # the app has rendered
            page.locator("#upload input[type=file]").set_input_files(str(image))
            sync_api.expect(page.locator("#upload")).to_contain_text(
                re.compile(r"photo\s*\.png"), timeout=30_000
            )  # uploaded
            page.click("#run")
            caption = page.locator("#caption textarea")
            sync_api.expect(caption).to_have_value(re.compile(r"^red( red)*$"), timeout=60_000)
            sync_api.expect(page.locator("#heatmap img")).to_be_visible(timeout=30_000)
            assert page.locator("#words input[type=radio]").count() >= 1  # a word to pick per token
            page.screenshot(path=str(tmp_path / "demo-caption.png"), full_page=True)

            page.goto(f"http://127.0.0.1:{port}/")  # a fresh page: the file box holds the image now
            page.wait_for_selector("#run", timeout=60_000)
            page.locator("#upload input[type=file]").set_input_files(str(text))  # not a type the box takes
            sync_api.expect(page.locator("body")).to_contain_text("Invalid file type", timeout=30_000)
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_selector("#run", timeout=60_000)
            page.locator("#upload input[type=file]").set_input_files(str(disguised))  # a text file named as an image
            sync_api.expect(page.locator("#upload")).to_contain_text(re.compile(r"notes\s*\.png"), timeout=30_000)
            page.click("#run")
            sync_api.expect(page.locator("#status")).to_contain_text("Not an image we can read", timeout=30_000)
            page.screenshot(path=str(tmp_path / "demo-refused.png"), full_page=True)

            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_selector("#run", timeout=60_000)
            page.locator("#upload input[type=file]").set_input_files(str(big))  # over max_upload_mb=1
            sync_api.expect(page.locator("body")).to_contain_text("exceed the maximum allowed size", timeout=30_000)
            browser.close()
        assert proc.poll() is None  # the server is still up
        elsewhere = [u for u in requested if not u.startswith((f"http://127.0.0.1:{port}/", "data:", "blob:"))]
        assert not elsewhere, elsewhere  # the page needs nothing from the internet (no CDN, no web fonts)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    shots = os.environ.get("MMTX_DEMO_SCREENSHOTS")  # keep the screenshots, e.g. for the README
    if shots:
        for name in ("demo-caption.png", "demo-refused.png"):
            shutil.copy(tmp_path / name, Path(shots) / name)


def test_vqa_page_answers_with_scores_and_a_map_and_names_what_it_refuses(tmp_path: Path) -> None:
    """The VQA page's handler (what the Answer button calls), without a browser."""
    from omegaconf import OmegaConf

    from mmtx.commands.demo import Demo
    from mmtx.data.tokenizer import Tokenizer
    from mmtx.tasks.vqa import VqaTask
    from tests.helpers import TINY_TWO_STREAM, compose_train

    cfg = compose_train(["task=vqa", *TINY_TWO_STREAM, "data.image_size=32", "paths.output_dir=/unused"])
    tokenizer = Tokenizer.train(["what color is the circle", "how many shapes"], vocab_size=60)
    task = VqaTask(OmegaConf.to_container(cfg.model, resolve=True), tokenizer.to_str(), answers=["red", "blue", "2"],
                   data_config={"image_size": 32}).eval()  # fmt: skip
    demo = Demo(task)
    image, text = tmp_path / "a.png", tmp_path / "notes.txt"
    Image.new("RGB", (40, 40), "red").save(image)
    text.write_text("not an image")
    status, answers, heat = demo.answer(str(image), "what color is the circle?")
    assert status == "" and sorted(answers) == ["2", "blue", "red"] and all(0 <= p <= 1 for p in answers.values())
    assert heat.size == (320, 320)  # the question's map over the image, large enough to see
    assert demo.answer(str(image), "   ") == ("**Type a question.**", {}, None)
    status, answers, heat = demo.answer(str(text), "what color?")
    assert status.startswith("**Not an image we can read:**") and answers == {} and heat is None


@pytest.mark.parametrize(
    ("generation", "first"),
    [({}, ("greedy", 3, 1.0, 1.0)), ({"num_beams": 5}, ("beam search", 5, 1.0, 1.0)),
     ({"num_beams": 12}, ("beam search", 8, 1.0, 1.0)),
     ({"do_sample": True, "temperature": 0.7, "top_p": 0.8}, ("sampling", 3, 0.7, 0.8))],
)  # fmt: skip
def test_the_caption_page_opens_on_the_checkpoints_own_decoding(generation: dict, first: tuple) -> None:
    gr = pytest.importorskip("gradio", reason="pip install 'mmtx[demo]'")
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from mmtx.commands.demo import Demo, build_page
    from mmtx.data.tokenizer import Tokenizer
    from tests.helpers import compose_train

    cfg = compose_train(["data.image_size=32", "paths.output_dir=/unused"])
    tokenizer = Tokenizer.train(["a red circle", "a blue square"], vocab_size=60)
    task = instantiate(cfg.task, model=OmegaConf.to_container(cfg.model, resolve=True), tokenizer=tokenizer.to_str(),
                       generation=generation, _recursive_=False, _convert_="all")  # fmt: skip
    controls = {block.label: block.value for block in build_page(Demo(task)).blocks.values()
                if isinstance(block, gr.Radio | gr.Slider)}  # fmt: skip
    labels = ["Decoding", "Beams (beam search)", "Temperature (sampling)", "Top-p (sampling)"]
    assert tuple(controls[label] for label in labels) == first
