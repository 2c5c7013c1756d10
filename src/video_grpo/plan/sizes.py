"""Token and row counts of one step, derived from a model's shape and a workload: what memory and compute both
walk over."""

from __future__ import annotations

from dataclasses import dataclass

from video_grpo.plan.model import ModelShape
from video_grpo.plan.workload import Workload

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class Sizes:
    """Token and row counts of one step, derived from the workload."""

    prompt: int
    answer: int
    patches: int  # vision patches of one video
    grid: tuple[int, int, int]
    loss_rows: int  # rows of the old/ref/loss forward (packed: one per prompt)
    loss_length: int  # their length
    loss_videos: int  # distinct videos of one micro-batch
    scored: int  # answer tokens scored per micro-batch
    generation_videos: int
    generation_rows: int


def step_sizes(shape: ModelShape, work: Workload) -> Sizes:
    merge = shape.merge
    if work.video_grid is not None:  # a measured step's own video
        grid = tuple(work.video_grid)
    else:
        per_side = max(1, round(work.frame_tokens**0.5))
        grid = (work.temporal_patches, per_side * merge, (work.frame_tokens // per_side) * merge)
    patches = grid[0] * grid[1] * grid[2]
    prompts = work.prompts_per_micro_batch
    answers = min(work.group_size, work.micro_batch_rows)  # answers of one prompt in a micro-batch
    if work.shared_prefix:
        rows, length = prompts, work.loss_length or work.prompt_tokens - 1 + answers * work.completion_tokens
    else:
        rows, length = work.micro_batch_rows, work.prompt_tokens + work.completion_tokens
    videos = prompts if work.encode_once else work.micro_batch_rows
    return Sizes(
        prompt=work.prompt_tokens,
        answer=work.completion_tokens,
        patches=patches,
        grid=grid,
        loss_rows=rows,
        loss_length=length,
        loss_videos=videos,
        scored=work.scored_tokens or work.micro_batch_rows * work.completion_tokens,
        generation_videos=work.prompts_per_generation,
        generation_rows=work.generation_rows,
    )
