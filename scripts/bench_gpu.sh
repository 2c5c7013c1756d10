#!/usr/bin/env bash
# GPU benchmark of random-weight, full-size Qwen2.5-VL-3B at real video sizes (no download):
# training forward+backward, vision encoder per row (plain TRL) vs once per video (video_grpo).
# Prints JSON lines; see docs/performance.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
# 2 fps x 16 s = 32 frames at 448x448: 4096 visual tokens per video, as in the Charades recipes' upper range
$PY scripts/bench_gpu.py --frames 32 --height 448 --width 448 --G 8 --prompts 1 --completion 128 --steps 3 "$@"
# a longer clip at lower resolution: 64 frames of 336x336
$PY scripts/bench_gpu.py --frames 64 --height 336 --width 336 --G 8 --prompts 1 --completion 128 --steps 3 "$@"
