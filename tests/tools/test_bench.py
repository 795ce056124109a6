"""scripts/bench.py and its parts (bench_models, bench_hardware): sizes, FLOPs, one tiny end-to-end run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
SCRIPT = SCRIPTS / "bench.py"
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


@pytest.fixture(scope="module")
def bench():
    """The script's models and measures (scripts/bench_models.py, scripts/bench_hardware.py) in one namespace."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        import bench_hardware
        import bench_models

        yield SimpleNamespace(**{**vars(bench_hardware), **vars(bench_models)})
    finally:
        sys.path.remove(str(SCRIPTS))
        for name in ("bench_hardware", "bench_models"):
            sys.modules.pop(name, None)


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="the reference needs transformers")
def test_comparison_size_matches_the_reference_within_3_percent(bench):
    cfg = bench.BenchConfig()  # the size: 224 px, /16, width 384, 6+6 layers, 8192 words
    ours, ref = n_params(bench.build_mmtx(cfg)), n_params(bench.build_reference(cfg))
    assert 28e6 < ours < 29e6
    assert abs(ours / ref - 1) < 0.03


def test_analytic_flops_agree_with_flop_counter(bench):
    cfg = bench.BenchConfig(
        image=32, patch=8, dim=64, heads=2, enc_layers=2, dec_layers=2, vocab=128, text_len=9, batch=3
    )
    torch.manual_seed(0)
    model = bench.build_mmtx(cfg)
    images = torch.randn(cfg.batch, 3, cfg.image, cfg.image)
    ids = torch.randint(3, cfg.vocab, (cfg.batch, cfg.text_len))

    def step() -> None:
        bench.caption_loss(model(images, ids[:, :-1]), ids[:, 1:]).backward()

    analytic = sum(bench.analytic_train_flops(cfg).values())
    counted = bench.counted_flops(step)
    # The counter skips the patch embedding's input gradient (images need none): 1/3 of its FLOPs.
    # It counts flash attention's backward as 5 products (the scores are recomputed), not 4: half
    # the scores' forward FLOPs more.
    parts = bench.analytic_train_flops(cfg)
    scores_forward = sum(v for k, v in parts.items() if k.endswith("_scores")) / 3
    assert counted == pytest.approx(analytic - parts["patch_embed"] / 3 + scores_forward / 2, rel=1e-9)


def test_decode_floor_is_memory_bound_for_greedy_and_grows_with_rows(bench):
    cfg = bench.BenchConfig()
    greedy = bench.decode_step_floor_ms(cfg, rows=16, bandwidth_gbs=30.0, peak_gflops=180.0)
    beams = bench.decode_step_floor_ms(cfg, rows=64, bandwidth_gbs=30.0, peak_gflops=180.0)
    # 14 d^2 per layer x 6 + the 8192 x 384 head, and 16 images' K/V of 197 tokens x 6 layers, in fp32
    weights = 6 * 14 * 384**2 + 8192 * 384
    cross_kv = 16 * 197 * 2 * 384 * 6
    assert greedy >= 1e3 * 4 * (weights + cross_kv) / 30e9
    assert beams > greedy


def test_bench_script_runs_and_prints_every_field(tmp_path):
    tiny = [
        "--image",
        "32",
        "--patch",
        "16",
        "--dim",
        "32",
        "--heads",
        "2",
        "--enc-layers",
        "1",
        "--dec-layers",
        "1",
        "--vocab",
        "64",
        "--text-len",
        "6",
        "--batch",
        "2",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--gen-batch",
        "2",
        "--new-tokens",
        "4",
        "--beams",
        "2",
        "--loss-curve",
        "2",
        "--profile",
        "2",
    ]
    proc = subprocess.run([sys.executable, str(SCRIPT), *tiny], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout  # one JSON line; progress went to stderr
    r = json.loads(lines[0])
    interface = [
        "params",
        "train_step_ms",
        "train_step_ms_bf16",
        "greedy_tokens_per_s",
        "beam_tokens_per_s",
        "greedy_tokens_per_s_bf16",
        "beam_tokens_per_s_bf16",
        "peak_rss_mb",
    ]
    measured = [
        "train_images_per_s",
        "train_images_per_s_bf16",
        "matmul_peak_gflops_fp32",
        "matmul_peak_gflops_bf16",
        "encode_ms",
        "memory_bandwidth_gbs",
    ]
    rates = ["train_gflops", "mfu_fp32", "mfu_bf16", "greedy_step_floor_ms", "beam_step_floor_ms"]
    for key in interface + measured:
        assert isinstance(r[key], (int, float)) and r[key] > 0, key
    for key in rates:  # rounded: a tiny model may round to 0
        assert isinstance(r[key], (int, float)) and r[key] >= 0, key
    # generation minus encoding: a difference of medians, which noise can tip at this tiny size
    for key in ("greedy_step_ms", "beam_step_ms"):
        assert isinstance(r[key], (int, float)), key
    assert r["greedy_step_floor_fraction"] is None or r["greedy_step_floor_fraction"] >= 0
    assert r["loss_curve_steps"] == 2
    # the profiled steps: the operators' own time, split by kind, within the steps' wall clock
    kinds = r["profile_ms_by_kind"]
    assert kinds["matmul"] > 0 and kinds["optimizer"] > 0 and r["profile_step_ms"] > 0
    assert 0 < r["profile_busy"] <= 1.05, r["profile_busy"]
    assert abs(sum(kinds.values()) - r["profile_busy"] * r["profile_step_ms"]) < 0.05 * r["profile_step_ms"]
    assert r["profile_top"] and all(ms > 0 for _, ms in r["profile_top"])
    if HAS_TRANSFORMERS:
        for key in (
            "ref_params",
            "ref_train_step_ms",
            "ref_greedy_tokens_per_s",
            "ref_encode_ms",
            "speedup_train_fp32",
            "speedup_beam_fp32",
            "params_ratio",
        ):
            assert r[key] > 0, key


def test_kernels_are_told_apart_by_name(bench):
    names = {  # as the profiler names them: CUDA kernels from cuBLAS, cuDNN, Triton; CPU operators
        "nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN": "matmul",
        "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_bf16_128x256_64x3_nt_align2>": "matmul",
        "aten::addmm": "matmul",
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64": "attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
        "void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(void const*, void const*)": "attention",
        "void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>": "optimizer",
        "aten::_fused_adamw_": "optimizer",
        "triton_poi_fused_gelu_gelu_backward_view_31": "other",
        "void at::native::vectorized_layer_norm_kernel<float, float, false>": "other",
        "aten::add_": "other",
    }
    assert {name: bench.kernel_kind(name) for name in names} == names


def test_bench_rejects_bad_sizes():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--image", "30"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "--image divisible by --patch" in proc.stderr


def test_bench_measures_only_the_precisions_asked_for():
    tiny = [
        "--image",
        "32",
        "--patch",
        "16",
        "--dim",
        "32",
        "--heads",
        "2",
        "--enc-layers",
        "1",
        "--dec-layers",
        "1",
        "--vocab",
        "64",
        "--text-len",
        "6",
        "--batch",
        "2",
        "--steps",
        "1",
        "--warmup",
        "1",
        "--gen-batch",
        "2",
        "--new-tokens",
        "4",
        "--beams",
        "2",
        "--no-reference",
        "--precisions",
        "bf16",
    ]
    proc = subprocess.run([sys.executable, str(SCRIPT), *tiny], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["precisions"] == ["bf16"] and r["train_step_ms_bf16"] > 0 and r["beam_tokens_per_s_bf16"] > 0
    assert not any(key in r for key in ("train_step_ms", "greedy_tokens_per_s", "mfu_fp32", "greedy_step_floor_ms"))
    bad = subprocess.run([sys.executable, str(SCRIPT), "--precisions", "fp16"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--precisions" in bad.stderr


def test_activation_checkpointing_recomputes_every_block_to_the_same_gradients(bench):
    """--activation-checkpointing: mmtx's model computes the same loss and gradients, while its
    blocks' activations are no longer kept for the backward pass."""
    cfg = dict(image=32, patch=8, dim=32, heads=2, enc_layers=2, dec_layers=2, vocab=50, text_len=8)
    models = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        models.append(bench.build_mmtx(bench.BenchConfig(**cfg, activation_checkpointing=checkpointing)).train())
    images, ids = torch.randn(2, 3, 32, 32), torch.randint(3, 50, (2, 8))
    saved = []
    for model in models:
        kept: list[int] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.numel()) or t, lambda t: t):
            loss = bench.caption_loss(model(images, ids[:, :-1]), ids[:, 1:])
        loss.backward()
        saved.append(sum(kept))
    plain, checkpointed = models
    for (name, p), q in zip(plain.named_parameters(), checkpointed.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert saved[1] < saved[0] / 2
