"""``mmtx-demo``: a local web page to try a checkpoint (Gradio, the extra ``mmtx[demo]``).

A captioner's page captions an uploaded image (greedy, beam search or sampling) and shows, for
the word picked, where in the image it was read from (`mmtx.attention_maps`); a VQA checkpoint's
page answers a typed question with the top answers and their scores. Gradio is the field's
convention for model demos (LAVIS, Hugging Face Spaces) and serves its page from the package
itself: nothing is fetched from the internet, and the page binds to 127.0.0.1 unless told
otherwise. Every failure a visitor can cause (a file that is not an image, a question left
empty) is a message on the page; the server goes on.

Uploads are untrusted: the file box takes the image formats mmtx reads (`UPLOAD_TYPES`), each
upload is read as training images are (`mmtx.data.images`: one of those formats, at most
``MAX_IMAGE_PIXELS`` pixels, both checked from the header before decoding), and Gradio deletes
the uploaded files an hour after they came (`KEEP_UPLOADS`), and all of them when the server stops.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
from omegaconf import DictConfig
from PIL import Image

from mmtx.attention_maps import caption_maps, overlay, question_maps
from mmtx.checkpoint import CheckpointError, load_task
from mmtx.commands.common import image_size
from mmtx.commands.vqa import model_inputs
from mmtx.data.images import IMAGE_FORMATS, MAX_IMAGE_PIXELS, ImageLoadError, read_image
from mmtx.data.transforms import build_resize, normalize_images
from mmtx.tasks.caption import CaptionTask
from mmtx.tasks.vqa import AnswerTask

DECODING = ("greedy", "beam search", "sampling")
BEAMS, TEMPERATURE, TOP_P = (1, 8), (0.1, 2.0), (0.1, 1.0)  # the sliders' ranges
# the file names the upload box takes: Pillow's for the formats mmtx reads ("MPO": phones' JPEGs)
UPLOAD_TYPES = sorted(ext for ext, fmt in Image.registered_extensions().items() if fmt in (*IMAGE_FORMATS, "MPO"))
KEEP_UPLOADS = (600, 3600)  # Gradio's delete_cache: every 10 minutes, delete uploads over an hour old


class Demo:
    """What the page calls: the checkpoint's task and how it reads an uploaded file."""

    def __init__(self, task: Any, max_pixels: int = MAX_IMAGE_PIXELS) -> None:
        self.task = task
        self.resize = build_resize(image_size(task))
        self.max_pixels = max_pixels

    def pixels(self, path: str | None) -> torch.Tensor:
        """The uploaded file as the model's uint8 (3, S, S) input; ImageLoadError if it is none,
        is gone (`KEEP_UPLOADS`), or is not an image `read_image` takes within ``max_pixels``."""
        if not path:
            raise ImageLoadError("(nothing)", "upload an image first")
        if not os.path.exists(path):
            raise ImageLoadError(path, "uploads are deleted after an hour: upload the image again")
        return self.resize(read_image(path, self.max_pixels))

    def decoding(self) -> dict[str, Any]:
        """The page's first decoding settings: the checkpoint's own, within the sliders' ranges
        (3 beams offered where it does not search with beams)."""
        own = self.task.generation
        first = "sampling" if own.do_sample else "beam search" if own.num_beams > 1 else "greedy"
        return {
            "decoding": first,
            "beams": min(own.num_beams, BEAMS[1]) if own.num_beams > 1 else 3,
            "temperature": min(max(own.temperature, TEMPERATURE[0]), TEMPERATURE[1]),
            "top_p": min(max(own.top_p, TOP_P[0]), TOP_P[1]),
        }

    @torch.no_grad()
    def caption(self, path: str | None, decoding: str, beams: int, temperature: float, top_p: float):
        """(status, caption, the words to pick from, the first word's heat map, every word's map)."""
        try:
            pixels = self.pixels(path)
        except ImageLoadError as err:
            return f"**Not an image we can read:** {err.reason}", "", _choices([]), None, []
        config = dataclasses.replace(
            self.task.generation,
            num_beams=int(beams) if decoding == "beam search" else 1,
            do_sample=decoding == "sampling",
            temperature=float(temperature),
            top_p=float(top_p),
        )
        images = normalize_images(pixels[None].to(self.task.device))
        ids = self.task.generate_ids(images, config)
        caption = self.task.tokenizer.decode_batch(ids.cpu())[0]
        words, maps = caption_maps(self.task, images, ids)[0]
        overlays = [_shown(overlay(pixels, m)) for m in maps]
        labels = [f"{k + 1}. {w}" for k, w in enumerate(words)]
        return "", caption, _choices(labels), overlays[0] if overlays else None, overlays

    @torch.no_grad()
    def answer(self, path: str | None, question: str) -> tuple[str, dict[str, float], Any]:
        """(status, {answer: score} of the top five, where the question looked in the image)."""
        if not question or not question.strip():
            return "**Type a question.**", {}, None
        try:
            pixels = self.pixels(path)
        except ImageLoadError as err:
            return f"**Not an image we can read:** {err.reason}", {}, None
        inputs = model_inputs(self.task, pixels[None], [question.strip()])
        top = self.task.answer(*inputs, k=5)[0]
        return "", dict(top), _shown(overlay(pixels, question_maps(self.task.model, *inputs)[0].cpu()))


def _shown(picture: Image.Image, side: int = 320) -> Image.Image:
    """A heat map large enough to see on the page (the model's images may be 64 px)."""
    return picture.resize((side, side), Image.Resampling.BICUBIC) if max(picture.size) < side else picture


def _choices(labels: list[str]) -> Any:
    import gradio as gr

    return gr.update(choices=labels, value=labels[0] if labels else None)


def build_page(demo: Demo) -> Any:
    """The Gradio page for ``demo``'s task."""
    import gradio as gr

    with gr.Blocks(title="mmtx demo", analytics_enabled=False, delete_cache=KEEP_UPLOADS) as page:
        gr.Markdown(f"## mmtx · {type(demo.task).__name__}")
        with gr.Row():
            with gr.Column():
                upload = gr.File(
                    label=f"Image ({', '.join(IMAGE_FORMATS)})",
                    file_types=UPLOAD_TYPES,
                    type="filepath",
                    elem_id="upload",
                )
                status = gr.Markdown(elem_id="status")
                if isinstance(demo.task, CaptionTask):
                    first = demo.decoding()
                    decoding = gr.Radio(list(DECODING), value=first["decoding"], label="Decoding")
                    beams = gr.Slider(*BEAMS, value=first["beams"], step=1, label="Beams (beam search)")
                    temperature = gr.Slider(*TEMPERATURE, value=first["temperature"], label="Temperature (sampling)")
                    top_p = gr.Slider(*TOP_P, value=first["top_p"], label="Top-p (sampling)")
                    run = gr.Button("Caption", variant="primary", elem_id="run")
                else:
                    question = gr.Textbox(label="Question", placeholder="what color is the circle?", elem_id="question")
                    run = gr.Button("Answer", variant="primary", elem_id="run")
            with gr.Column():
                if isinstance(demo.task, CaptionTask):
                    caption = gr.Textbox(label="Caption", interactive=False, elem_id="caption")
                    words = gr.Radio([], label="Pick a word: where it was read from", elem_id="words")
                    heat = gr.Image(label="Attention", type="pil", interactive=False, elem_id="heatmap")
                    overlays = gr.State([])
                    run.click(demo.caption, [upload, decoding, beams, temperature, top_p],
                              [status, caption, words, heat, overlays])  # fmt: skip
                    words.change(_pick, [words, overlays], heat)
                else:
                    answers = gr.Label(label="Top answers", num_top_classes=5, elem_id="answers")
                    heat = gr.Image(label="Where the question looked", type="pil", interactive=False, elem_id="heatmap")
                    run.click(demo.answer, [upload, question], [status, answers, heat])
    return page


def _pick(label: str | None, overlays: list) -> Any:
    if not label or not overlays:
        return None
    return overlays[min(int(label.split(".", 1)[0]) - 1, len(overlays) - 1)]


def run(cfg: DictConfig) -> None:
    """Serve the checkpoint's page on ``host``:``port`` until the process is stopped."""
    try:
        import gradio as gr
    except ImportError:
        raise CheckpointError("mmtx-demo needs Gradio: pip install 'mmtx[demo]'") from None
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    task = load_task(cfg.ckpt, map_location=cfg.device)
    if not isinstance(task, (CaptionTask, AnswerTask)):
        raise CheckpointError(
            f"{cfg.ckpt} is a {type(task).__name__} checkpoint: the demo takes a captioner or a VQA one"
        )
    page = build_page(Demo(task))
    print(f"mmtx-demo: {type(task).__name__} from {cfg.ckpt} on http://{cfg.host}:{cfg.port}", flush=True)
    theme = gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["monospace"])  # no web fonts to fetch
    page.queue(default_concurrency_limit=1).launch(
        server_name=cfg.host,
        server_port=cfg.port,
        max_file_size=f"{cfg.max_upload_mb}mb",
        theme=theme,
        show_error=True,
        quiet=True,
    )
