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

import hydra
from omegaconf import DictConfig

from mmtx.cli.common import CONFIG_DIR, check_override_keys, friendly_errors


@check_override_keys("demo")
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="demo")
@friendly_errors
def main(cfg: DictConfig) -> None:
    from mmtx.commands.demo import run  # torch and Lightning load once the command line is read

    return run(cfg)


if __name__ == "__main__":
    main()
