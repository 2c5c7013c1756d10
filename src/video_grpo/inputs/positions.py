"""Qwen2.5-VL's 3-D (time, height, width) positions, laid out as Qwen's reference implementation does.

The rule (Qwen's original code, and vLLM): text tokens take consecutive positions, the same on all three
axes. A vision block that starts at position ``s`` gives its token at temporal patch ``k``, row ``i``,
column ``j`` the positions ``(s + floor(k * second_per_grid_ts * tokens_per_second), s + i, s + j)`` (an
image's ``k`` is its patch index, without the time scale). The text after a block starts at the block's
largest position over the three axes, plus one.

transformers 5.23-5.24 instead advance the text after a block by ``max(h, w) / 2``
(huggingface/transformers#45381): after a 60-frame clip whose time positions run 16...132, the instruction
starts at 30, inside the clip's time range. A pretrained Qwen2.5-VL learned the reference layout, and
generation, the loss and evaluation must all use the same one, so :func:`install` replaces
``Qwen2_5_VLModel.get_rope_index`` for every model in the process (training, reference, SFT, evaluation).
Decoded tokens continue from the ``rope_deltas`` this returns, so they follow the same layout.
"""

from __future__ import annotations

import itertools

import torch

TEXT, IMAGE, VIDEO = 0, 1, 2  # mm_token_type_ids values


def vision_block_positions(start: int, grid_thw, spatial_merge: int, time_step: float) -> torch.Tensor:
    """(3, tokens) positions of one image or video block that starts at ``start``.

    ``time_step`` is the temporal position step per temporal patch (``second_per_grid_ts *
    tokens_per_second`` for a video, 1 for an image); it is applied in float64 and floored, so a step of
    0.99955 * 2 gives 0, 1, 3, 5, ... and never the 0, 2, 4, ... of a value rounded to 1.0."""
    t, h, w = (int(v) for v in grid_thw)
    h, w = h // spatial_merge, w // spatial_merge
    temporal = torch.floor(torch.arange(t, dtype=torch.float64) * time_step).long()
    grid = torch.stack(torch.meshgrid(temporal, torch.arange(h), torch.arange(w), indexing="ij"))
    return grid.reshape(3, -1) + start


def reference_rope_index(
    self,
    input_ids: torch.LongTensor,
    mm_token_type_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    second_per_grid_ts: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for ``Qwen2_5_VLModel.get_rope_index``: ``(positions (3, B, L), rope_deltas (B, 1))``."""
    merge = self.config.vision_config.spatial_merge_size
    tokens_per_second = self.config.vision_config.tokens_per_second
    grids = {
        IMAGE: iter(image_grid_thw.tolist() if image_grid_thw is not None else []),
        VIDEO: iter(video_grid_thw.tolist() if video_grid_thw is not None else []),
    }
    seconds = iter(second_per_grid_ts.tolist() if second_per_grid_ts is not None else [])
    partial = None  # (grid, time step, patches left) of a video split into one block per temporal patch
    positions = torch.zeros(3, *input_ids.shape, dtype=input_ids.dtype, device=input_ids.device)
    deltas = []
    for row in range(input_ids.shape[0]):
        keep = (
            attention_mask[row].bool()
            if attention_mask is not None
            else torch.ones_like(input_ids[row], dtype=torch.bool)
        )
        types = mm_token_type_ids[row][keep].tolist()
        pieces, next_position = [], 0
        for kind, run in itertools.groupby(types):
            length = len(list(run))
            if kind == TEXT:
                pieces.append(torch.arange(length).expand(3, -1) + next_position)
            elif kind == VIDEO and partial is not None:
                partial = _next_patches(partial, length, merge, row)
                pieces.append(vision_block_positions(next_position, partial[0], merge, partial[1]))
                partial = partial[2]
            else:
                try:
                    grid = next(grids[kind])
                except StopIteration:
                    raise ValueError(
                        f"row {row} has more {'video' if kind == VIDEO else 'image'} blocks than "
                        f"{'video' if kind == VIDEO else 'image'}_grid_thw has rows"
                    ) from None
                step = tokens_per_second * next(seconds, 1.0) if kind == VIDEO else 1.0
                t, h, w = (int(v) for v in grid)
                if kind == VIDEO and length < t * h * w // merge**2:  # textual timestamps between its patches
                    block, step, partial = _next_patches(((t, h, w), step, t), length, merge, row)
                    pieces.append(vision_block_positions(next_position, block, merge, step))
                else:
                    pieces.append(vision_block_positions(next_position, grid, merge, step))
            next_position = int(pieces[-1].max()) + 1
        if partial is not None:
            raise ValueError(f"row {row}: a video's last {partial[2]} temporal patches have no tokens")
        row_positions = torch.cat(pieces, dim=1) if pieces else torch.zeros(3, 0, dtype=torch.long)
        positions[:, row, keep] = row_positions.to(positions.device, positions.dtype)
        deltas.append(next_position - int(keep.sum()))
    return positions, torch.tensor(deltas, device=input_ids.device).unsqueeze(1)


def _next_patches(state, length: int, merge: int, row: int):
    """For a video whose temporal patches are separate blocks (text between them, as with
    ``frame_timestamps_in_text``): ``(grid of this block, time step, state for the next block or None)``. A block
    of m patches is laid out as an (m, h, w) grid starting where it starts, as Qwen3-VL's one-patch grids are."""
    (t, h, w), step, left = state
    per_patch = h * w // merge**2
    if length % per_patch or length // per_patch > left:
        raise ValueError(
            f"row {row}: a video block of {length} tokens is not a whole number of its {per_patch}-token "
            f"patches ({left} left)"
        )
    patches = length // per_patch
    rest = left - patches
    return (patches, h, w), step, ((t, h, w), step, rest) if rest else None


def install() -> None:
    """Make every Qwen2.5-VL model in this process use the reference layout (idempotent)."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    Qwen2_5_VLModel.get_rope_index = reference_rope_index
