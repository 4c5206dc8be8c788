#!/usr/bin/env bash
# The GPU run procedure, on the lent GPU machine, from the repository root (docs/gpu.md):
#
#   bash scripts/gpu/run_on_gpu.sh STAGE...
#
#   receive  move the kit chunks that came with this command (build/gpu-kit/, carried) into $KIT/chunks and
#            list, against the manifest, the chunks still missing there
#   install  check every chunk against the manifest (sha256), join them into kit.tar, check its sha256,
#            unpack it, pip install --no-index --no-deps --target $KIT/site, convert the GGUF model once
#            into $MARTI_MODEL_CACHE; log in $OUT/install.log
#   check    python3 tests/gpu/check_gpu.py: $OUT/check_gpu.json and $OUT/check_gpu.log
#   bench    marti bench engine (benchmarks/engine.py) with $BENCH_ARGS: generated tokens/s of the hf, hf_static and
#            compiled hf_static engines against float32 generate at batch 1, 8 and 64 on SmolLM2-135M; $OUT/engine.json, $OUT/engine.log and,
#            with nvidia-smi, $OUT/gpu_util_bench.csv
#   train    marti train $CONFIG (the GPU main job, its own wall-time budget) under `timeout -s TERM`
#            (SIGTERM: the job finishes its step, checkpoints and writes its report), nvidia-smi logging every
#            5 s; copies report.md, metrics.jsonl, eval.jsonl, gpu_util.csv and train.log into $OUT
#   all      receive install check bench train
#
# Environment:
#   KIT              default /tmp/marti-gpu-kit: outside the working copy, kept while the machine stays held
#   CARRIED          where the carried chunks arrive (default build/gpu-kit in the working copy)
#   OUT              where results go (the device tool sets it; default /tmp/marti-gpu-out)
#   CONFIG           default examples/resource_allocation_gpu.yaml
#   RUN_DIR          default /tmp/marti-gpu-run; each train stage writes a new <config name>-<time> folder there
#   TRAIN_TIMEOUT_S  default 540 (then SIGTERM; SIGKILL 30 s later): ends inside a 600 s command
#   TRAIN_ARGS       extra marti train arguments, e.g. "--set budget.max_wall_time_s=300"
#   CHECK_ARGS       extra check_gpu.py arguments, e.g. "--only hf --only worker"
#   BENCH_ARGS       the engine bench's arguments (default "--device cuda --dtype bfloat16 --compiled
#                    --batches 1,8,64 --repeats 3"); --json $OUT/engine.json is always added
#   PYTHON           default python3: the machine's Python 3.12 with torch and transformers
# Every stage after install puts "$ROOT:$KIT/site" first on PYTHONPATH, so every process (driver, Ray workers,
# services) runs the working tree that came with the command, with the kit's packages over the machine's.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
KIT="${KIT:-/tmp/marti-gpu-kit}"
OUT="${OUT:-/tmp/marti-gpu-out}"
CONFIG="${CONFIG:-examples/resource_allocation_gpu.yaml}"
RUN_DIR="${RUN_DIR:-/tmp/marti-gpu-run}"
TRAIN_TIMEOUT_S="${TRAIN_TIMEOUT_S:-540}"
TRAIN_ARGS="${TRAIN_ARGS:-}"
CHECK_ARGS="${CHECK_ARGS:-}"
BENCH_ARGS="${BENCH_ARGS:---device cuda --dtype bfloat16 --compiled --batches 1,8,64 --repeats 3}"
PYTHON="${PYTHON:-python3}"
CARRIED="${CARRIED:-$ROOT/build/gpu-kit}"
CHUNKS="$KIT/chunks"
MANIFEST="$CHUNKS/manifest.json"
SITE="$KIT/site"
export MARTI_MODEL_CACHE="${MARTI_MODEL_CACHE:-$KIT/models}"
# USE_HUB_KERNELS=NO: transformers >= 5.2x swaps layers for Hub kernels by default, which fails offline
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 USE_HUB_KERNELS=NO PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0

log() { printf '[run_on_gpu %(%H:%M:%S)T] %s\n' -1 "$*"; }
die() { log "error: $*" >&2; exit 1; }
chunker() { "$PYTHON" "$ROOT/scripts/gpu/kit_chunks.py" "$@"; }

use_site() {
  [[ -f "$SITE/.installed" ]] || die "the kit is not installed in $SITE: run the install stage first"
  export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
}

stage_receive() {
  mkdir -p "$CHUNKS"
  local moved=0 f
  if [[ -d "$CARRIED" ]]; then
    for f in "$CARRIED"/manifest.json "$CARRIED"/*.part[0-9]*; do
      [[ -f "$f" ]] || continue
      mv -f "$f" "$CHUNKS/" && moved=$((moved + 1))
    done
  fi
  log "received $moved file(s) into $CHUNKS"
  [[ -f "$MANIFEST" ]] || die "no manifest.json in $CHUNKS: carry build/gpu-kit/manifest.json"
  chunker verify "$MANIFEST" "$CHUNKS" || log "chunks still missing or damaged (listed above)"
}

stage_install() {
  mkdir -p "$OUT"
  {
    [[ -f "$MANIFEST" ]] || die "no manifest.json in $CHUNKS: run the receive stage first"
    local sum
    sum="$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["sha256"])' "$MANIFEST")"
    if [[ -f "$SITE/.installed" && "$(cat "$SITE/.installed")" == "$sum" ]]; then
      log "kit $sum already installed in $SITE"
    else
      chunker join "$MANIFEST" "$CHUNKS" "$KIT/kit.tar"
      rm -rf "$KIT/unpacked" "$SITE"
      mkdir -p "$KIT/unpacked"
      tar -xf "$KIT/kit.tar" -C "$KIT/unpacked"
      rm -f "$KIT/kit.tar"
      log "installing $(ls "$KIT"/unpacked/kit/wheels/*.whl | wc -l) wheels into $SITE"
      "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
        "$KIT"/unpacked/kit/wheels/*.whl
      echo "$sum" >"$SITE/.installed"
    fi
    use_site
    "$PYTHON" - <<'EOF'
import importlib, time
for name in ("torch", "transformers", "marti", "ray", "peft", "gguf", "deepspeed"):
    try:
        print(f"{name} {getattr(importlib.import_module(name), '__version__', '?')}", flush=True)
    except Exception as exc:  # deepspeed is needed by check_gpu.py's ZeRO check only
        print(f"{name}: import failed: {type(exc).__name__}: {exc}", flush=True)
        if name != "deepspeed":
            raise
import torch
from services.trainer.models.loading import load_model
t = time.perf_counter()
load_model("smollm2-135m-instruct")  # converts the GGUF once into $MARTI_MODEL_CACHE
print(f"cuda available: {torch.cuda.is_available()}; model ready in {time.perf_counter() - t:.1f} s", flush=True)
EOF
  } 2>&1 | tee "$OUT/install.log"
}

stage_check() {
  use_site
  mkdir -p "$OUT"
  local rc=0
  # shellcheck disable=SC2086  # CHECK_ARGS holds several flags
  OUT="$OUT" "$PYTHON" "$ROOT/tests/gpu/check_gpu.py" $CHECK_ARGS 2>&1 | tee "$OUT/check_gpu.log" || rc=$?
  log "check_gpu.py exit status $rc"
}

# GPU utilisation and memory every 5 s into $1 while a stage runs (nothing without nvidia-smi); sets SMI_PID.
start_smi() {
  SMI_PID=""
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 >"$1" &
    SMI_PID=$!
  fi
}

stop_smi() { [[ -n "$SMI_PID" ]] && kill "$SMI_PID" 2>/dev/null || true; }

stage_bench() {
  use_site
  mkdir -p "$OUT"
  local rc=0
  start_smi "$OUT/gpu_util_bench.csv"
  # shellcheck disable=SC2086  # BENCH_ARGS holds several arguments
  (cd "$ROOT" && "$PYTHON" -m benchmarks.engine $BENCH_ARGS --json "$OUT/engine.json") 2>&1 \
    | tee "$OUT/engine.log" || rc=$?
  stop_smi
  log "engine bench exit status $rc"
  return "$rc"
}

stage_train() {
  use_site
  mkdir -p "$OUT" "$RUN_DIR"
  local run rc=0
  run="$RUN_DIR/$(basename "$CONFIG" .yaml)-$(date +%Y%m%d-%H%M%S)"
  start_smi "$OUT/gpu_util.csv"
  log "marti train $CONFIG -> $run (stopped with SIGTERM after ${TRAIN_TIMEOUT_S}s)"
  # shellcheck disable=SC2086  # TRAIN_ARGS holds several arguments
  # --foreground: the signal goes to marti train alone, which then stops its Ray actors and services itself
  (cd "$ROOT" && timeout --foreground -s TERM -k 30 "$TRAIN_TIMEOUT_S" \
    "$PYTHON" -m marti.command.main train "$CONFIG" --no-progress --set "output.dir=$run" $TRAIN_ARGS) \
    >"$OUT/train.log" 2>&1 || rc=$?
  stop_smi
  log "marti train exit status $rc"
  tail -n 20 "$OUT/train.log"
  local f
  for f in report.md metrics.jsonl eval.jsonl; do
    if [[ -f "$run/$f" ]]; then cp "$run/$f" "$OUT/"; else log "missing: $run/$f"; fi
  done
  return "$rc"
}

[[ $# -gt 0 ]] || { sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2; }
stages=("$@")
[[ "${stages[*]}" == "all" ]] && stages=(receive install check bench train)
for stage in "${stages[@]}"; do
  case "$stage" in
    receive | install | check | bench | train) log "stage $stage"; "stage_$stage" ;;
    *) die "unknown stage $stage (receive, install, check, bench, train, all)" ;;
  esac
done
