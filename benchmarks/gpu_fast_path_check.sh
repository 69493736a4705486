#!/usr/bin/env bash
# The GPU fast-path check: one prepared script for one H100/H200-class GPU, at most 8 minutes (time limits below).
#   bash benchmarks/gpu_fast_path_check.sh             # on the GPU: results in benchmarks/results/
#   bash benchmarks/gpu_fast_path_check.sh --dry-run   # the same three steps on CPU with tiny models, into a temp dir
# Needs only torch and transformers (+ accelerate) beside this checkout: synthetic tokens, no downloads.
# 1. python -m benchmarks.gpu_throughput --arms fast-path (GPT-2 small, 32 x 1024 tokens, bf16): tokens/s, MFU,
#    peak memory, compiles (most compiles of one function, and graphs in all) and host reads per step for the
#    Trainer's defaults, the Trainer with compile (hf-tuned), FastTrainer with recipes/configs/gpt2_small.yaml as
#    shipped, and the recipe with one part changed: no guard, no run record, token-counted schedule, EMA,
#    Newton-Schulz matrix by matrix, LoRA adapters (r=16, needs peft) -> gpu_fast_path.{json,md,png} (<= 270 s)
# 2. python -m benchmarks.muon_step: Muon's step on GPT-2 small's 48 matrices, per-matrix vs batched
#    Newton-Schulz (step time, kernel launches) -> muon_step_cuda.{json,md}                        (<= 45 s)
# 3. time to loss at equal tokens, GPT-2 small, 600 steps: hf-tuned AdamW vs Muon (benchmarks/ladder.py's
#    size rung gpu-gpt2-12x768) -> time_to_loss_gpu.*                                           (<= 165 s)
# Each step has its own time limit; results are written as they come, so a step cut short leaves what it measured.
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "${1:-}" = "--dry-run" ]; then
  OUT="${OUT:-$(mktemp -d)}"
  echo "dry run on CPU with tiny models, results in $OUT"
  timeout 2400 python -m benchmarks.gpu_throughput --device cpu --tiny --arms fast-path --steps 2 --warmup 2 \
    --out-dir "$OUT" --name gpu_fast_path
  echo "gpu_throughput exit $?"
  timeout 600 python -m benchmarks.muon_step --device cpu --models 2x64 --repeats 1 --out "$OUT/muon_step_cpu"
  echo "muon_step exit $?"
  timeout 900 python -m benchmarks.ladder size --quick --sizes quick-a --seeds 1 --max-extend 0 --step-time-steps 0 \
    --out "$OUT" --name time_to_loss_gpu
  echo "time_to_loss exit $?"
  exit 0
fi
OUT="${OUT:-benchmarks/results}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
timeout 270 python -m benchmarks.gpu_throughput --arms fast-path --steps 20 --warmup 8 --out-dir "$OUT" \
  --name gpu_fast_path
echo "gpu_throughput exit $?"
case "$OUT" in /*) ABS_OUT="$OUT" ;; *) ABS_OUT="$PWD/$OUT" ;; esac
mkdir -p "$ABS_OUT"
timeout 45 python -m benchmarks.muon_step --models 12x768 --repeats 10 --out "$ABS_OUT/muon_step_cuda"
echo "muon_step exit $?"
timeout 165 python -m benchmarks.ladder size --sizes gpu-gpt2-12x768 --seeds 1 --max-extend 0 --step-time-steps 0 \
  --out "$OUT" --name time_to_loss_gpu
echo "time_to_loss exit $?"
