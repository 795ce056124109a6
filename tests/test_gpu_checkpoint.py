"""A checkpoint written on a GPU loads, captions and trains on in a CPU-only process.

``tests/data/caption_tiny_h200_bf16.ckpt`` is the tiny captioner that ``scripts/gpu_check.sh``
trained on an NVIDIA H200 (``trainer=gpu``: bf16-mixed, CUDA tensors in the file), taken from that
run unchanged; plain ``torch.load`` refuses it without a GPU. The captions below are what
``mmtx-caption device=cuda`` wrote there for the first two validation scenes of the same data.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from mmtx.checkpoint import load_task, read_checkpoint
from mmtx.data.synthetic import ShapesCaptions
from tests.helpers import recorded_batches, train_in_process

GPU_CKPT = Path(__file__).parent / "data" / "caption_tiny_h200_bf16.ckpt"
GPU_CAPTION = "a " + " ".join(["big"] * 22)  # what the barely trained model wrote for both scenes on the GPU
# the overrides the checkpoint was trained with (scripts/gpu_check.sh, TINY)
TINY = [
    "model.encoder.dim=32",
    "model.encoder.depth=1",
    "model.encoder.num_heads=2",
    "model.decoder.dim=32",
    "model.decoder.depth=1",
    "model.decoder.num_heads=2",
    "data.num_train=64",
    "data.num_val=16",
    "data.image_size=32",
    "data.batch_size=16",
    "trainer.enable_progress_bar=false",
    "debug=fast",
]


def test_the_gpu_checkpoint_holds_cuda_tensors() -> None:
    if torch.cuda.is_available():
        pytest.skip("needs a machine without a GPU")
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(GPU_CKPT, weights_only=False)  # what mmtx must not do
    assert read_checkpoint(GPU_CKPT)["global_step"] == 6


def test_a_gpu_checkpoint_captions_on_the_cpu_as_it_did_on_the_gpu(tmp_path: Path, cli) -> None:
    ShapesCaptions(root=tmp_path / "shapes", num_train=64, num_val=16, seed=0, image_size=32).prepare_data()
    scenes = [tmp_path / "shapes" / "val" / f"1000000{i}.png" for i in (1, 2)]
    result = cli.run(
        "mmtx-caption", f"ckpt={GPU_CKPT}", "device=cpu", f"images=[{scenes[0]},{scenes[1]}]", cwd=tmp_path
    )
    lines = [line.split("\t") for line in result.stdout.strip().splitlines()]
    assert [Path(p) for p, _ in lines] == scenes and [c for _, c in lines] == [GPU_CAPTION] * 2
    assert next(load_task(GPU_CKPT).parameters()).device.type == "cpu"


def test_a_gpu_run_resumes_on_the_cpu(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    ckpt = run / "checkpoints" / "last.ckpt"
    ckpt.write_bytes(GPU_CKPT.read_bytes())
    # written before the conv stem's GroupNorm, the sinusoidal positions and the read of places became
    # the defaults: a resume takes the checkpoint's model settings (refused otherwise, naming the key)
    metrics = train_in_process(
        [
            *TINY,
            "model.encoder.stem_norm=batch",
            "model.encoder.pos_embed=learned",
            "model.decoder.read_where=false",
            "trainer=cpu",
            "trainer.max_epochs=3",
            "trainer.max_steps=10",
            f"paths.data_dir={tmp_path / 'data'}",
            f"paths.output_dir={run}",
            f"ckpt_path={ckpt}",
            "+callbacks.ids._target_=tests.helpers.RecordImageIds",
            f"+callbacks.ids.path={run / 'ids'}",
        ]
    )
    assert metrics and all(math.isfinite(v) for v in metrics.values())
    assert read_checkpoint(ckpt)["global_step"] == 10
    assert [step for step, _ in recorded_batches(run / "ids")] == [6, 7, 8, 9]  # 6 steps on the GPU, 4 more here
