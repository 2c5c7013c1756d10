"""Benchmarks. Each prints one JSON line per measurement, both sides measured in the same run:
``{"name", "ours", "baseline", "ratio", "unit", ...}``.

    python -m video_grpo.bench perf [--quick]

- ``vision_rows_per_step``: encoder input rows in one training step (G = 8, beta = 0.04), encoding each
  video once vs the plain per-row path; trainable and frozen vision tower.
- ``step_time``: seconds per training step, same comparison, on a small model whose vision tower is a
  sizeable share of the forward (the share is printed as ``encoder_share``); 6 steps (``--quick``: 1).
- ``cache_bytes_per_sample``: bytes of one frame-cache entry in the jpeg format vs raw (with the GB that
  1,000 such videos take in each).
- ``sample_prep_cache_vs_decode``: milliseconds to prepare one sample from the frame cache vs decoding it; one
  row per cache format (``format``).
- ``cache_fidelity``: PSNR of the jpeg entry's frames against the decoded ones, at the default quality (and,
  in ``by_quality``, at 80/90/95), vs torchvision's own ``encode_jpeg`` (colour at half resolution).
- ``data_wait_fraction``: share of training time spent waiting for the next batch, with
  ``dataloader_num_workers=2`` vs 0.
- ``peak_memory_lora_beta``: peak RSS of a LoRA run with beta = 0.04 vs beta = 0 on a ~108M-parameter
  model (the reference is the base with the adapter off, not a copy); ``--quick``: 2-frame prompts.
- ``lm_positions_per_forward``, ``train_step_time_shared_prefix``, ``peak_memory_shared_prefix``,
  ``generation_time_shared_prefill``, and (full run only) ``shared_prefix_scaling``,
  ``train_step_time_shared_prefix_full_depth`` and ``peak_memory_shared_prefix_full_depth``: one group's prompt
  through the language model once vs G times; see :mod:`video_grpo.bench.shared_prefix`.
- ``lm_positions_per_forward_qwen3_5`` (at Qwen3.5-4B's widths; ``--quick``: narrow),
  ``train_step_time_shared_prefix_qwen3_5`` and ``peak_memory_shared_prefix_qwen3_5`` (narrow): the same on
  Qwen3.5, whose Gated DeltaNet state is forked after the prompt; see :mod:`video_grpo.bench.shared_prefix_qwen3_5`.
- ``decode_step_time_compiled_vs_eager`` and ``decode_compile_time``: one decode step of ``generate`` through the
  compiled step and static cache (``decode_compile``) vs today's eager path, per-step medians with the compile
  excluded, 64 wide x 36 text layers (the dispatch-bound regime of a GPU at G = 8; ``--quick``: 4 layers, the
  ``aot_eager`` backend, for the code path only); and the compile's own seconds. See
  :mod:`video_grpo.bench.decode_step`.
- ``encoder_time_scaling`` (full run only): vision-encoder forward+backward time for one video shown to G
  rows, once vs per row, over G, frame count and frame size.

Timings on a shared 2-core machine are noisy; ratios of two sides measured back to back are the
meaningful numbers.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from video_grpo.bench.data_wait import data_wait
from video_grpo.bench.emit import emit
from video_grpo.bench.encode_once import encoder_scaling, step_time, vision_rows_per_step
from video_grpo.bench.frame_cache_rows import sample_prep
from video_grpo.bench.lora_memory import peak_memory
from video_grpo.bench.peak_memory import fresh_processes


def perf(quick: bool) -> None:
    from transformers.utils import logging as hf_logging

    from video_grpo.toys.tiny import build_tiny_model

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    # --quick forks its fresh-process sides from one preloaded server (the imports paid once, not per side); the full
    # run starts a new interpreter per side, as its published numbers were measured (peak_memory.in_fresh_process)
    with tempfile.TemporaryDirectory() as tmp, fresh_processes("forkserver" if quick else "spawn"):
        work = Path(tmp)
        model_dir = build_tiny_model(work / "tiny")
        vision_rows_per_step(model_dir, work)
        step_time(work, steps=1 if quick else 6)
        sample_prep(work, repeats=3 if quick else 10, preset="superfast" if quick else None)
        data_wait(model_dir, work, steps=8 if quick else 24)
        peak_memory(work, quick)
        if not quick:
            encoder_scaling(model_dir)
        from video_grpo.bench.shared_prefix import perf_rows

        perf_rows(emit, quick)  # the shared prompt: lm_positions_per_forward ... shared_prefix_scaling
        from video_grpo.bench import shared_prefix_qwen3_5

        shared_prefix_qwen3_5.perf_rows(emit, quick)  # the same on Qwen3.5, its Gated DeltaNet state forked
        from video_grpo.bench import decode_step

        decode_step.perf_rows(emit, quick)  # the compiled decode step against eager decoding
