#!/usr/bin/env bash
# The GPU check of issue 13, one prepared script for one GPU (H100/H200 class), about 8 minutes:
#   bash benchmarks/gpu_scaling_check.sh
# 1. benchmarks/gpu_throughput.py: GPT-2 small, tuned Trainer vs FastTrainer with recipes/configs/gpt2_small.yaml
#    (tokens/s, MFU, peak memory) -> benchmarks/results/gpu_throughput_cuda.{json,md,png}
# 2. a short time-to-loss run of GPT-2 small (12 x 768, vocab 8192, 32 x 1024 tokens per step, 600 steps =
#    19.7M tokens, 1 seed): hf-tuned AdamW at GPT-3's 6e-4 against Muon at the gpt2_small recipe's 3e-3 (the
#    CPU ladder's trend at width 768), plus the Muon/AdamW step-time ratio -> benchmarks/results/scaling_gpu.*
# Each step has its own time limit, so one that hangs cannot eat the other's time.
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-benchmarks/results}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
timeout 200 python -m benchmarks.gpu_throughput --arms hf-tuned,fasttrain --steps 30 --warmup 10 --out-dir "$OUT"
echo "gpu_throughput exit $?"
timeout 280 python -m benchmarks.ladder size --sizes gpu-gpt2-12x768 --seeds 1 --max-extend 0 --step-time-steps 10 \
  --out "$OUT" --name scaling_gpu
echo "scaling_gpu exit $?"
