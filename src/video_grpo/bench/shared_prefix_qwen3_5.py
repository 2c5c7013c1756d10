"""Benchmark of the shared prompt on Qwen3.5 (:mod:`video_grpo.inputs.state_fork`): one group of G answers to one video
prompt, scored plain (G rows) and packed (one row, the Gated DeltaNet state forked after the prompt).

Called by ``python -m video_grpo.bench perf`` (rows ``lm_positions_per_forward_qwen3_5``,
``train_step_time_shared_prefix_qwen3_5``, ``peak_memory_shared_prefix_qwen3_5``) and, on a GPU, as
``python -m video_grpo.bench.shared_prefix_qwen3_5`` (all three at the 4B widths).

- **Model.** ``configs/models/qwen3_5_4b.json`` (Qwen3.5-4B's widths; its README says where they come from),
  random weights, depth cut to one full-attention block of the text model (3 Gated DeltaNet layers + 1
  full-attention layer) and 1 vision block. ``narrow``: the same layer pattern, 128 wide, a 4,096-token
  vocabulary; ``bench perf`` times it on the CPU (the token positions it reports at the 4B widths).
- **Input.** A synthetic prompt laid out as the Qwen3.5 processor writes a video: 40 text tokens, then per
  temporal patch 8 "<t seconds>" tokens and its visual tokens between ``vision_start`` / ``vision_end``, then 60
  text tokens; G answers of random tokens with lengths spread over 32-128.
- **Step, time, memory.** As :mod:`video_grpo.bench.shared_prefix`: TRL's fused LM head on the answer tokens,
  loss = their mean, backward; each side in a fresh process; time the faster of two steps, memory the first
  step's peak over what was resident (weights and gradients).
"""

from __future__ import annotations

import json

import torch

from video_grpo.bench.group_scoring import timed_group_step
from video_grpo.bench.peak_memory import in_fresh_process
from video_grpo.bench.qwen_widths import REPO, scoring_model

PUBLISHED = REPO / "configs" / "models" / "qwen3_5_4b.json"
NARROW_TEXT = {  # "narrow": the same layer pattern, small enough for a CPU's memory (the plain side of the 4B
    # widths at 2,048 visual tokens and G = 8 holds about 20 GB of activations in the Gated DeltaNet layers)
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "vocab_size": 4096,
}
NARROW_TOKENS = {"image_token_id": 4090, "video_token_id": 4091, "vision_start_token_id": 4092}
NARROW_TOKENS["vision_end_token_id"] = 4093
TEMPORAL_PATCHES = 8
TIME_TOKENS = 8  # "<t 1.5 seconds>" before each temporal patch


def model_config(widths: str = "4b", linear_layers: int = 3, vision_layers: int = 1):
    """Qwen3.5 at ``widths`` ("4b": the published file; "narrow") with ``linear_layers`` Gated DeltaNet
    layers and one full-attention layer, and ``vision_layers`` vision blocks."""
    from transformers import Qwen3_5Config

    values = json.loads(PUBLISHED.read_text())
    values.pop("architectures", None)
    text = values["text_config"]
    if widths == "narrow":
        text.update(NARROW_TEXT)
        values.update(NARROW_TOKENS)
        values["vision_config"].update(
            hidden_size=64, intermediate_size=171, num_heads=2, out_hidden_size=128
        )
    text["layer_types"] = ["linear_attention"] * linear_layers + ["full_attention"]
    text["num_hidden_layers"] = linear_layers + 1
    values["vision_config"]["depth"] = vision_layers
    config = Qwen3_5Config(**values)
    config._attn_implementation = "sdpa"
    return config, "configs/models/qwen3_5_4b.json" + (" (narrowed)" if widths == "narrow" else "")


def build_model(config, device: str = "cpu", dtype: torch.dtype = torch.float32):
    from transformers import Qwen3_5ForConditionalGeneration

    return scoring_model(Qwen3_5ForConditionalGeneration, config, device, dtype)


def group_inputs(config, visual_tokens: int, group_size: int, device: str = "cpu") -> dict:
    """One synthetic Qwen3.5 video prompt of about ``visual_tokens`` visual tokens and G answers (32-128)."""
    side = round((visual_tokens / TEMPORAL_PATCHES) ** 0.5)
    grid = torch.tensor([[TEMPORAL_PATCHES, 2 * side, 2 * side]])
    ids = [100] * 40
    for _ in range(TEMPORAL_PATCHES):
        ids += [101] * TIME_TOKENS + [config.vision_start_token_id]
        ids += [config.video_token_id] * (side * side) + [config.vision_end_token_id]
    ids += [102] * 60
    vision = config.vision_config
    width = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    pixels = torch.randn(int(grid.prod()), width, generator=torch.Generator().manual_seed(0))
    lengths = torch.linspace(32, 128, group_size).round().long().tolist()
    longest = max(lengths)
    completion = torch.randint(
        200, config.get_text_config().vocab_size - 200, (group_size, longest), generator=torch.Generator()
    )
    completion_mask = (torch.arange(longest)[None] < torch.tensor(lengths)[:, None]).long()
    prompt = torch.tensor(ids)[None].repeat(group_size, 1)
    return {
        "input_ids": torch.cat([prompt, completion * completion_mask], dim=1).to(device),
        "attention_mask": torch.cat([torch.ones_like(prompt), completion_mask], dim=1).to(device),
        "completion_length": longest,
        "video_rows": {"video_pixels": [pixels] * group_size, "video_grid_thw": grid.repeat(group_size, 1)},
        "prompt_tokens": len(ids),
        "answers": lengths,
        "visual_tokens": TEMPORAL_PATCHES * side * side,
    }


def packed_positions(widths: str = "4b", visual_tokens: int = 2048, group_size: int = 8) -> dict:
    """Token positions of the packed and the plain loss forward, and the ideal ratio, from the packing alone: the
    model is built on the ``meta`` device (no weights), only its ``get_rope_index`` runs. So the count at the
    published widths needs no memory for a forward."""
    from transformers import Qwen3_5ForConditionalGeneration

    from video_grpo.inputs.prefix import forkable_state, pack_rows

    config, origin = model_config(widths)
    with torch.device("meta"):
        model = Qwen3_5ForConditionalGeneration._from_config(config)
    batch = group_inputs(config, visual_tokens, group_size)
    packed = pack_rows(
        batch["input_ids"],
        batch["attention_mask"],
        batch["completion_length"],
        batch["video_rows"],
        slice(None),
        model.model.get_rope_index,
        config.video_token_id,
        0,
        fork_state=forkable_state(config),
    )
    prompt, answers = batch["prompt_tokens"], batch["answers"]
    return {
        "packed": packed.packed_positions,
        "plain": packed.plain_positions,
        "ideal": (prompt + sum(answers)) / (group_size * (prompt + max(answers))),
        "forked": "state_fork" in packed.model_inputs,
        "prompt_tokens": prompt,
        "answers": answers,
        "visual_tokens": batch["visual_tokens"],
        "config": origin,
    }


def positions_row(emit, widths: str = "4b", visual_tokens: int = 2048, group_size: int = 8) -> None:
    """``lm_positions_per_forward_qwen3_5`` at ``widths`` without running the model (see :func:`packed_positions`)."""
    counted = packed_positions(widths, visual_tokens, group_size)
    emit(
        "lm_positions_per_forward_qwen3_5",
        counted["packed"],
        counted["plain"],
        "token positions",
        ideal=round(counted["ideal"], 4),
        goal="ratio within 5% of ideal",
        model=f"Qwen3.5 {widths} widths, 3 Gated DeltaNet + 1 full-attention text layers (positions only)",
        config=counted["config"],
        prompt="synthetic (Qwen3.5 video layout)",
        prompt_tokens=counted["prompt_tokens"],
        visual_tokens=counted["visual_tokens"],
        G=group_size,
        answer_tokens=counted["answers"],
        state_forked=counted["forked"],
    )


def train_step(setting: dict) -> dict:
    """One side's loss forward + backward in this process."""
    device, dtype = setting.get("device", "cpu"), getattr(torch, setting.get("dtype", "float32"))
    config, origin = model_config(setting["widths"])
    model = build_model(config, device, dtype)
    batch = group_inputs(config, setting["visual_tokens"], setting["G"], device=device)
    step = timed_group_step(model, batch, setting["shared"], device, setting.get("steps", 2))
    return {**step, "config": origin}


def train_rows(emit, widths: str, visual_tokens: int, group_size: int, steps: int = 2, **device) -> None:
    """Loss forward+backward time and its added peak memory, shared vs plain, each side in a fresh process."""
    setting = {"widths": widths, "visual_tokens": visual_tokens, "G": group_size, "steps": steps, **device}
    shared, plain = (
        in_fresh_process(
            "video_grpo.bench.shared_prefix_qwen3_5", "train_step", {**setting, "shared": is_shared}
        )
        for is_shared in (True, False)
    )
    common = {
        "model": f"Qwen3.5 {widths} widths, 3 Gated DeltaNet + 1 full-attention text layers, 1 vision block, "
        "random weights",
        "config": plain["config"],
        "prompt": "synthetic (Qwen3.5 video layout)",
        "prompt_tokens": plain["prompt_tokens"],
        "visual_tokens": plain["visual_tokens"],
        "G": group_size,
        "answer_tokens": plain["answers"],
        "ours_positions": shared["positions"],
        "baseline_positions": plain["positions"],
        "ours_setting": "shared_prefix (state forked)",
        "baseline_setting": "plain (G rows)",
        **device,
    }
    emit(
        "train_step_time_shared_prefix_qwen3_5",
        shared["seconds"],
        plain["seconds"],
        "s per loss forward+backward",
        ours_step_seconds=shared["step_seconds"],
        baseline_step_seconds=plain["step_seconds"],
        **common,
    )
    emit(
        "peak_memory_shared_prefix_qwen3_5",
        shared["peak_added_mb"],
        plain["peak_added_mb"],
        "MB added by forward+backward",
        **common,
    )


def perf_rows(emit, quick: bool) -> None:
    """The rows ``python -m video_grpo.bench perf`` prints for Qwen3.5: positions at the 4B widths (no forward
    needed), time and memory on the narrow model (the 4B widths' plain side does not fit a CPU machine's memory;
    ``python -m video_grpo.bench.shared_prefix_qwen3_5`` runs them on a GPU)."""
    visual_tokens = 512 if quick else 2048
    positions_row(emit, "narrow" if quick else "4b", visual_tokens, 8)
    train_rows(emit, "narrow", visual_tokens, 8, steps=2)


def main(argv: list[str] | None = None) -> int:
    import argparse

    from video_grpo.bench.emit import emit

    parser = argparse.ArgumentParser(
        prog="python -m video_grpo.bench.shared_prefix_qwen3_5",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--widths", choices=["4b", "narrow"], default="4b")
    parser.add_argument("--visual_tokens", type=int, default=2048)
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args(argv)
    positions_row(emit, args.widths, args.visual_tokens, args.G)
    train_rows(emit, args.widths, args.visual_tokens, args.G, device=args.device, dtype=args.dtype)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
