#!/usr/bin/env bash
# Step-matched learning screens on one GPU: many small `learning_curves.py` runs side by side.
#
# A CPU's 8-minute budget holds a known number of steps for each model size (measure it on that CPU:
# docs/learning.md, "Shallow towers"). On a GPU the same runs, given that many steps (trainer.max_steps, the
# schedule annealed to them) instead of minutes, tell in minutes what the CPU would take hours to
# screen: which sizes and settings learn most within the steps the CPU affords them. Run the winners
# on the CPU itself, for the time budget, before changing a default.
#
# Usage: bash scripts/gpu_step_screens.sh SPEC OUT_DIR [JOBS] [SECONDS]   (from any directory)
#   SPEC: one screen per line, "NAME [--tasks TASKS] overrides..." (learning_curves.py's tasks, caption
#   unless named; give each its trainer.max_steps=N, or TASK:trainer.max_steps=N for each task of a
#   chain such as pretrain,vqa_from_pretrain; `seed=S` picks the seed); lines starting with '#' are
#   comments. JOBS screens run at a time (default 8); none starts after SECONDS (default 420), and
#   RUN_LIMIT seconds (default 240) stop any one. Each screen's curves.json and logs go to
#   OUT_DIR/NAME; OUT_DIR/screens.tgz packs them all (no checkpoints). CURVES_ARGS adds options of
#   learning_curves.py (e.g. "--num-train 300"); SCREEN_ACCELERATOR=cpu runs the screens on the CPU
#   (to try a spec out).
set -uo pipefail
set -f  # a spec's overrides are split into words unquoted: no filename expansion of [a,b] or *
USAGE="usage: gpu_step_screens.sh SPEC OUT_DIR [JOBS] [SECONDS]"
SPEC=$(realpath "${1:?$USAGE}") || exit 2
OUT=$(realpath -m "${2:?$USAGE}")
JOBS=${3:-8} LIMIT=${4:-420}
cd "$(dirname "$(realpath "$0")")/.." || exit 2   # the checkout this script belongs to
mkdir -p "$OUT" "$OUT/.bin"
export PYTHONUNBUFFERED=1 WANDB_MODE=offline OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export MMTX_DATA_DIR=${MMTX_DATA_DIR:-$OUT/.data} PATH=$OUT/.bin:$PATH PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# learning_curves.py calls mmtx-train: the checkout's, installed or not
printf '#!/bin/sh\nexec %q -m mmtx.cli.train "$@"\n' "$(command -v python3)" >"$OUT/.bin/mmtx-train"
chmod +x "$OUT/.bin/mmtx-train"
# fp32, as on a CPU without native bf16; a step budget instead of the CPU preset's minutes
COMMON=(trainer.accelerator="${SCREEN_ACCELERATOR:-gpu}" trainer.precision=32-true trainer.max_time=null)
read -ra CURVES <<<"${CURVES_ARGS:-}"

screen() {  # NAME [--tasks TASKS] OVERRIDES...
    local name=$1 tasks=caption start=$SECONDS rc
    shift
    [ "${1:-}" = --tasks ] && { tasks=$2; shift 2; }
    timeout -k 5 "${RUN_LIMIT:-240}" python3 scripts/learning_curves.py --tasks "$tasks" --seeds 1 --only-variants \
        "${CURVES[@]}" --variant "$name=$*" --out "$OUT/$name" --set "${COMMON[@]}" </dev/null >"$OUT/$name.log" 2>&1
    rc=$?
    echo "[$SECONDS s] $name rc=$rc in $((SECONDS - start)) s: $(grep -h "^[a-z_]* $name:" "$OUT/$name.log" | tr '\n' ' ')"
    return $rc
}

# the spec's screens, read once: its lines less comments and blank lines
mapfile -t SCREENS < <(grep -Ev '^[[:space:]]*(#|$)' "$SPEC")

# one step of each task's first screen first, so that the screens share the data it generates instead
# of each making it
declare -A warmed
for line in "${SCREENS[@]}"; do
    read -r name first rest <<<"$line"
    if [ "$first" = --tasks ]; then read -r tasks rest <<<"$rest"; else tasks=caption rest="$first $rest"; fi
    [ -n "${warmed[$tasks]:-}" ] && continue
    warmed[$tasks]=1
    # shellcheck disable=SC2046
    screen "warm_${tasks//,/_}" --tasks "$tasks" $(tr ' ' '\n' <<<"$rest" | grep -v 'trainer.max_steps=') trainer.max_steps=1 \
        || { tail -n 20 "$OUT/warm_${tasks//,/_}.log"; exit 1; }
done
T0=$SECONDS
for line in "${SCREENS[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 1; done
    [ $((SECONDS - T0)) -lt "$LIMIT" ] || { echo "time up, not started: $line"; continue; }
    # shellcheck disable=SC2086
    screen $line &
done
wait
packed=$(mktemp) && tar czf "$packed" -C "$OUT" --exclude=.data --exclude=.bin --exclude=screens.tgz --exclude='*.ckpt' \
    --exclude=tokenizer.json . && mv "$packed" "$OUT/screens.tgz"
