#!/usr/bin/env bash
# Every GPU check of mmtx in one call, for a machine with one CUDA GPU (docs/gpu.md):
#   1. correctness, in parallel (nothing timed yet): the GPU tests and every preset on a tiny
#      model in bf16 (trainer=gpu, resume from last.ckpt, ddp and fsdp on one device, fsdp with
#      activation checkpointing, compile=true, pretraining, VQA), mmtx-eval / mmtx-caption /
#      mmtx-vqa on the GPU checkpoints, which are also packed for a CPU to load;
#   2. timed, one at a time: scripts/bench.py against Hugging Face's model at ViT-B/16 size, the same
#      step alone at a larger batch, eager and compiled; the real training loop (mmtx-train) of the
#      ViT-B/16 captioner on in-memory shapes and on a folder of 640x480 JPEGs, and of a ViT-B-size
#      two-stream pretraining model, with images/s (Lightning's ThroughputMonitor) and the GPU's
#      utilisation (nvidia-smi) over each run;
#   3. the real loop against its step alone (scripts/bench_loop.py) for the captioner, two-stream
#      pretraining and VQA at ViT-B size, 224 px, batch 128 (GPU_CHECK_BEFORE=DIR: the same, first,
#      with the mmtx of another checkout, for a before/after in one run); the step's memory and time
#      with and without activation checkpointing at batch 256 and 512.
# Usage: bash scripts/gpu_check.sh OUT_DIR [STAGE ...]   (stages: env correct bench loops compile loopstep memory)
# Each stage has a time limit; logs go to OUT_DIR/logs (packed as OUT_DIR/logs.tgz after every
# stage), the benchmark's JSON lines to OUT_DIR/bench_*.json, a line per stage to OUT_DIR/summary.txt.
# Run from the repository root with mmtx importable (pip install -e ., or PYTHONPATH=.). On an offline
# machine without hydra-core, omegaconf, pycocoevalcap (+pycocotools), webdataset, braceexpand or Java,
# carry their wheels and a minimal Java runtime (`jlink --add-modules java.base,java.logging
# --strip-debug --no-header-files --no-man-pages --output jre`); pycocoevalcap's spice/ and METEOR's
# paraphrase table may be left behind to save 80 MB (METEOR is then not the official one).
set -uo pipefail
OUT=$(realpath -m "${1:?usage: gpu_check.sh OUT_DIR [STAGE ...]}")
shift
ALL="env correct bench loops compile loopstep memory"
STAGES=${*:-$ALL}
for stage in $STAGES; do
    [[ " $ALL " == *" $stage "* ]] || { echo "gpu_check.sh: no stage '$stage' (stages: $ALL)" >&2; exit 2; }
done
LOGS=$OUT/logs WORK=${GPU_CHECK_WORK:-/tmp/gpu-check}
mkdir -p "$LOGS" "$WORK"
rm -f "$OUT/.failed"
export PYTHONUNBUFFERED=1 WANDB_MODE=offline WANDB_SILENT=true MMTX_DATA_DIR=$WORK/data
T0=$SECONDS
PY=${PYTHON:-python3}
MT=("$PY" -m mmtx.cli.train)

note() { echo "[$((SECONDS - T0))s] $*" | tee -a "$OUT/summary.txt"; }
failed() { echo x >>"$OUT/.failed"; }  # a file, not a variable: runs in ( ... ) & subshells count too
pack() { tar czf "$OUT/logs.tgz" -C "$OUT" logs 2>/dev/null; }
# run NAME LIMIT CMD...: CMD under a time limit, its output in logs/NAME.log, its status noted
run() {
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    timeout -k 5 "$limit" "$@" >"$LOGS/$name.log" 2>&1
    rc=$?
    note "$name: rc=$rc in $((SECONDS - start))s$([ $rc = 124 ] && echo ' (time limit)')"
    [ $rc = 0 ] || { failed; tail -n 4 "$LOGS/$name.log" | sed 's/^/    /' | tee -a "$OUT/summary.txt"; }
    return $rc
}
wants() { [[ " $STAGES " == *" $1 "* ]]; }

TINY=(model.encoder.dim=32 model.encoder.depth=1 model.encoder.num_heads=2 model.decoder.dim=32
      model.decoder.depth=1 model.decoder.num_heads=2 data.num_train=64 data.num_val=16 data.image_size=32
      data.batch_size=16 trainer.enable_progress_bar=false debug=fast)
TINY_TS=(model.backbone.vision.dim=32 model.backbone.vision.depth=1 model.backbone.vision.num_heads=2
         model.backbone.text.dim=32 model.backbone.text.depth=1 model.backbone.text.num_heads=2
         model.backbone.joint_dim=32 data.num_train=64 data.num_val=16 data.image_size=32
         data.batch_size=16 trainer.enable_progress_bar=false debug=fast)

if wants env; then
    { nvidia-smi; "$PY" -c "import torch, lightning, torchvision; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'lightning', lightning.__version__, 'torchvision', torchvision.__version__, torch.cuda.get_device_name())"
      java -version; lscpu | grep -E 'Model name|^CPU\(s\)'; } >"$LOGS/env.log" 2>&1
    note "env: $(grep -E '^torch' "$LOGS/env.log")"
fi

if wants correct; then
    R=$WORK/runs
    # the captioner: train, resume, evaluate, caption (one chain); the other presets beside it
    ( run gpu_train 150 "${MT[@]}" "${TINY[@]}" trainer=gpu hydra.run.dir="$R/gpu" &&
      run gpu_resume 100 "${MT[@]}" "${TINY[@]}" trainer=gpu trainer.max_steps=9 ckpt_path="$R/gpu/checkpoints/last.ckpt" \
          hydra.run.dir="$R/gpu" &&
      run gpu_eval 100 "$PY" -m mmtx.cli.eval ckpt="$R/gpu/checkpoints/last.ckpt" trainer=gpu \
          output="$R/gpu/eval.json" predictions="$R/gpu/eval_predictions.json" &&
      run gpu_caption 60 "$PY" -m mmtx.cli.caption ckpt="$R/gpu/checkpoints/last.ckpt" device=cuda \
          "images=[$(ls "$WORK"/data/shapes-32px-*/val/*.png | head -n 2 | paste -sd, -)]" ) &
    ( run ddp1 150 "${MT[@]}" "${TINY[@]}" trainer=ddp trainer.devices=1 hydra.run.dir="$R/ddp" ) &
    ( run fsdp1_ckpting 150 "${MT[@]}" "${TINY[@]}" trainer=fsdp trainer.devices=1 \
          trainer.strategy.activation_checkpointing=true hydra.run.dir="$R/fsdp" &&
      run fsdp1_resume 100 "${MT[@]}" "${TINY[@]}" trainer=fsdp trainer.devices=1 trainer.max_steps=9 \
          trainer.strategy.activation_checkpointing=true ckpt_path="$R/fsdp/checkpoints/last.ckpt" hydra.run.dir="$R/fsdp" ) &
    ( run compile_true 150 "${MT[@]}" "${TINY[@]}" trainer=gpu compile=true hydra.run.dir="$R/compile" ) &
    ( run pretrain 150 "${MT[@]}" experiment=pretrain_shapes "${TINY_TS[@]}" trainer=gpu hydra.run.dir="$R/pretrain" ) &
    ( run vqa_train 150 "${MT[@]}" experiment=vqa_shapes "${TINY_TS[@]}" trainer=gpu hydra.run.dir="$R/vqa" &&
      run vqa_eval 100 "$PY" -m mmtx.cli.eval ckpt="$R/vqa/checkpoints/last.ckpt" trainer=gpu \
          output="$R/vqa/eval.json" predictions="$R/vqa/eval_predictions.json" &&
      run vqa_answer 60 "$PY" -m mmtx.cli.vqa ckpt="$R/vqa/checkpoints/last.ckpt" device=cuda \
          image="$(ls "$WORK"/data/shapes*vqa*/val/*.png 2>/dev/null | head -n 1)" "question='what colour is the circle?'" ) &
    ( run pytest_gpu 200 "$PY" -m pytest -q -p no:cacheprovider tests/test_presets.py -k gpu_presets ) &
    ( run pytest_fsdp_tuning 200 "$PY" -m pytest -q -p no:cacheprovider tests/test_freezing.py -k fsdp ) &
    # the timed loops' JPEGs, made now (640x480)
    ( run coco_jpegs 150 "$PY" -c "import sys; sys.path.insert(0, 'scripts'); from pathlib import Path
from bench_data import synthetic_coco; synthetic_coco(Path('$WORK/coco'), 1536)" ) &
    wait
    # GPU checkpoints for a CPU to load (tests/test_gpu_checkpoint.py holds one)
    tar czf "$OUT/gpu_checkpoints.tgz" -C "$R" gpu/checkpoints/last.ckpt gpu/tokenizer.json \
        vqa/checkpoints/last.ckpt pretrain/checkpoints/last.ckpt 2>/dev/null
    pack
fi

# a two-stream model with both streams ViT-B/16 size (the timed loops)
VIT_B=(model.backbone.vision.patch_size=16 model.backbone.vision.stem=patch model.backbone.vision.dim=768
       model.backbone.vision.depth=12 model.backbone.vision.num_heads=12 model.backbone.text.dim=768
       model.backbone.text.depth=12 model.backbone.text.num_heads=12 model.backbone.joint_dim=768
       model.backbone.co_layers=2)
BASE=(--image 224 --patch 16 --dim 768 --heads 12 --enc-layers 12 --dec-layers 12 --vocab 30522 --text-len 32
      --gen-batch 64 --new-tokens 32 --beams 4 --device cuda)
if wants bench; then
    # mmtx against Hugging Face's VisionEncoderDecoder, both precisions, + the bf16-vs-fp32 loss curves
    run bench_vs_ref 170 "$PY" scripts/bench.py "${BASE[@]}" --batch 128 --loss-curve 30
    grep '^{' "$LOGS/bench_vs_ref.log" >"$OUT/bench_vs_ref.json"
    # mmtx alone at a larger batch, bf16 (the MFU figure)
    run bench_b512 90 "$PY" scripts/bench.py "${BASE[@]}" --batch 512 --no-reference --precisions bf16 ||
        run bench_b256 90 "$PY" scripts/bench.py "${BASE[@]}" --batch 256 --no-reference --precisions bf16
    cat "$LOGS"/bench_b*.log | grep '^{' >"$OUT/bench_eager.json"
    pack
fi

# the real loop: mmtx-train for a fixed time, images/s logged by ThroughputMonitor, GPU use sampled
THROUGHPUT=(+callbacks.throughput._target_=lightning.pytorch.callbacks.ThroughputMonitor
            +callbacks.throughput.batch_size_fn._target_=hydra.utils.get_method
            +callbacks.throughput.batch_size_fn.path=mmtx.callbacks.images_in_batch
            +callbacks.throughput.window_size=20
            logger=csv +logger.csv.flush_logs_every_n_steps=10 trainer.log_every_n_steps=10
            trainer=gpu trainer.max_time=00:00:00:30 trainer.limit_val_batches=0 trainer.num_sanity_val_steps=0
            trainer.enable_progress_bar=false)
loop() {  # loop NAME LIMIT OVERRIDES...
    local name=$1 limit=$2
    shift 2
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 500 >"$LOGS/$name.gpu.csv" &
    local smi=$!
    run "$name" "$limit" "${MT[@]}" "${THROUGHPUT[@]}" hydra.run.dir="$WORK/loops/$name" "$@"
    kill $smi 2>/dev/null
    cp "$(ls -d "$WORK/loops/$name"/csv/version_* | sort -V | tail -n 1)/metrics.csv" "$LOGS/$name.metrics.csv" 2>/dev/null
    pack
}
if wants loops; then
    loop loop_shapes224 100 model=caption_base data.image_size=224 data.num_train=2048 data.num_val=64 \
        data.batch_size=128
    loop loop_coco_jpeg 90 model=caption_base data=coco data.train.annotations="$WORK/coco/captions.json" \
        data.train.images="$WORK/coco/images" data.val.annotations="$WORK/coco/captions.json" \
        data.val.images="$WORK/coco/images" data.batch_size=128 data.num_workers=12
    loop loop_pretrain224 90 experiment=pretrain_shapes data.image_size=224 data.num_train=2048 \
        data.num_val=64 data.batch_size=128 "${VIT_B[@]}"
fi
if wants compile; then
    run bench_compiled 150 "$PY" scripts/bench.py "${BASE[@]}" --batch "$(grep -q '"batch": 512' "$OUT/bench_eager.json" 2>/dev/null && echo 512 || echo 256)" \
        --no-reference --precisions bf16 --compile
    grep '^{' "$LOGS/bench_compiled.log" >"$OUT/bench_compiled.json"
    pack
fi
# the loop against its step alone: examples/s of each, GPU busy fraction, where the host waits
LOOP=(trainer=gpu logger=csv data.image_size=224 data.num_train=2048 data.num_val=64 data.batch_size=128)
loopstep() {  # loopstep NAME ROOT OVERRIDES...: scripts/bench_loop.py with the mmtx found in ROOT
    local name=$1 root=$2
    shift 2
    run "$name" 100 env PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" "$PY" "$root/scripts/bench_loop.py" \
        --warmup 10 --steps 30 --profile 5 -- "${LOOP[@]}" "$@" &&
        grep '^{' "$LOGS/$name.log" >>"$OUT/loopstep.json"
    pack
}
if wants loopstep; then
    for side in ${GPU_CHECK_BEFORE:+before} after; do
        root=$([ "$side" = before ] && echo "$GPU_CHECK_BEFORE" || pwd)
        [ "$side" = before ] && cp scripts/bench_loop.py "$root/scripts/"  # the same measurement of the earlier code
        loopstep "loopstep_caption_$side" "$root" model=caption_base
        loopstep "loopstep_pretrain_$side" "$root" experiment=pretrain_shapes "${VIT_B[@]}"
        loopstep "loopstep_vqa_$side" "$root" experiment=vqa_shapes "${VIT_B[@]}"
    done
fi
# memory and time of the ViT-B/16 captioner's step with and without activation checkpointing
if wants memory; then
    for batch in 256 512; do
        for ac in "" --activation-checkpointing; do
            run "memory_b${batch}${ac:+_ckpt}" 90 "$PY" scripts/bench.py "${BASE[@]}" --batch "$batch" --no-reference \
                --precisions bf16 $ac && grep '^{' "$LOGS/memory_b${batch}${ac:+_ckpt}.log" >>"$OUT/memory.json"
        done
    done
    pack
fi
failures=$(cat "$OUT/.failed" 2>/dev/null | wc -l)
note "done: $failures failed"
pack
[ "$failures" = 0 ]
