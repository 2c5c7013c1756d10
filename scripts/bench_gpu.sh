#!/usr/bin/env bash
# GPU benchmarks of random-weight Qwen2.5-VL at real widths and video sizes (no download). Prints JSON lines;
# see docs/performance.md. Needs torch, transformers and src/ (trl, when installed, supplies the fused LM head).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
# 1. The vision encoder per row (plain TRL) vs once per video, full-depth 3B; each side's peak GPU memory is printed
# beside video_grpo.plan's prediction for the same step (rows gpu_peak_memory_vs_plan_once / _plain).
# 2 fps x 16 s = 32 frames at 448x448: 4096 visual tokens per video, as in the Charades recipes' upper range
$PY scripts/bench_gpu.py --frames 32 --height 448 --width 448 --G 8 --prompts 1 --completion 128 --steps 3 "$@"
# a longer clip at lower resolution: 64 frames of 336x336
$PY scripts/bench_gpu.py --frames 64 --height 336 --width 336 --G 8 --prompts 1 --completion 128 --steps 3 "$@"
# 2. The shared prompt: one group's loss forward+backward and generate, plain (G rows) vs shared_prefix, at 3B
# and 7B widths (1 text + 1 vision layer), about 2,000 visual tokens, G = 8, answers of 32-128 tokens.
for widths in 3b 7b; do
  $PY -m video_grpo.bench.shared_prefix gpu --widths "$widths" --visual_tokens 2048 --G 8 --device cuda --dtype bfloat16
done
# 3. Which SDPA kernel a packed forward+backward runs at 7B widths (1 + 1 layers, 4,000 visual tokens, G = 8,
# bf16), and its peak memory: PyTorch's default choice vs the memory-efficient kernel forced (a fall-back to the
# math kernel would hold every layer's full score matrix).
$PY -m video_grpo.bench.shared_prefix sdpa --widths 7b --visual_tokens 4000 --G 8 --device cuda --dtype bfloat16
# 4. Decoding: tokens/s of one prompt answered G = 8 times, eager (today's path) against the compiled step without
# and with CUDA graphs (decode_compile, decode_cuda_graphs), random-weight 3B and 7B at full depth in bf16; each side
# also as a share of the bandwidth limit, (weights + KV bytes per step) / bandwidth. Set TB_PER_S to the card's HBM
# bandwidth (H200 4.8, H100 3.35). Goal on an H200: with CUDA graphs >= 60% of the limit and >= 2.5x eager.
for widths in 3b 7b; do
  $PY -m video_grpo.bench.decode_step gpu --widths "$widths" --G 8 --device cuda --dtype bfloat16 --tb_per_s "${TB_PER_S:-4.8}"
done
