"""One group of G answers to one video prompt, and its scoring: per-token log-probs of the answer tokens, plain
(G rows, each with the prompt) or packed (one row), as the trainer's forwards score them."""

from __future__ import annotations

import time

import torch

from video_grpo.bench.peak_memory import PeakMemory
from video_grpo.bench.qwen_widths import QWEN_TOKENS, REFERENCE, REPO

SAMPLE_VIDEO_INDEX = 0


def group_inputs(
    config, visual_tokens: int, group_size: int, shortest: int = 32, longest: int = 128, device: str = "cpu"
) -> dict:
    """One prompt with its video and ``group_size`` answers (lengths spread over shortest..longest)."""
    prompt_ids, video = _prompt(config, visual_tokens)
    lengths = torch.linspace(shortest, longest, group_size).round().long().tolist()
    generator = torch.Generator().manual_seed(0)
    width = max(lengths)
    completion = torch.randint(
        100, min(30000, config.get_text_config().vocab_size - 100), (group_size, width), generator=generator
    )
    completion_mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    prompt = torch.tensor(prompt_ids)[None].repeat(group_size, 1)
    input_ids = torch.cat([prompt, completion * completion_mask], dim=1)
    attention_mask = torch.cat([torch.ones_like(prompt), completion_mask], dim=1)
    rows = {
        "video_pixels": [video["pixels"]] * group_size,
        "video_grid_thw": video["grid"].repeat(group_size, 1),
        "second_per_grid_ts": video["seconds"].repeat(group_size),
    }
    return {
        "input_ids": input_ids.to(device),
        "attention_mask": attention_mask.to(device),
        "completion_length": width,
        "video_rows": rows,
        "prompt_tokens": len(prompt_ids),
        "answers": lengths,
        "visual_tokens": int(video["grid"].prod()) // 4,
        "prompt_source": video["source"],
    }


def _prompt(config, visual_tokens: int) -> tuple[list[int], dict]:
    """Prompt ids and video inputs: the real processor on a sample clip when the reference files are here."""
    if (REFERENCE / "vocab.json").is_file() and config.video_token_id == QWEN_TOKENS["video_token_id"]:
        from transformers import AutoProcessor

        from video_grpo.data.dataset import build_dataset
        from video_grpo.data.video import SamplingConfig
        from video_grpo.inputs.families import QWEN2_5_VL
        from video_grpo.inputs.processing import encode_rows

        area = visual_tokens // 8 * 28 * 28  # 16 frames = 8 frame pairs
        sampling = SamplingConfig(
            fps=8.0,
            min_frames=16,
            max_frames=16,
            min_pixels=area,
            max_pixels=area,
            max_tokens=visual_tokens + 512,
        )
        row = build_dataset(REPO / "data_samples" / "train.jsonl", sampling=sampling)[SAMPLE_VIDEO_INDEX]
        encoded = encode_rows(AutoProcessor.from_pretrained(REFERENCE), [row], QWEN2_5_VL)
        return encoded["prompt_ids"][0], {
            "pixels": encoded["video_pixels"][0],
            "grid": encoded["video_grid_thw"],
            "seconds": encoded["second_per_grid_ts"],
            "source": "real processor, data_samples clip",
        }
    side = round((visual_tokens / 8) ** 0.5)
    grid = torch.tensor([[8, 2 * side, 2 * side]])
    ids = [100] * 40 + [config.vision_start_token_id] + [config.video_token_id] * (8 * side * side)
    ids += [config.vision_end_token_id] + [101] * 60
    pixels = torch.randn(int(grid.prod()), 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(0))
    return ids, {"pixels": pixels, "grid": grid, "seconds": torch.tensor([1.0]), "source": "synthetic"}


def answer_logps(model, batch: dict, shared: bool) -> tuple[torch.Tensor, int]:
    """Per-token log-probs of the answer tokens (the trainer's scoring: LM head on scored positions only), and
    the token positions the language model's layers carried."""
    from video_grpo.inputs.prefix import forkable_state, pack_rows
    from video_grpo.inputs.processing import video_kwargs

    ids, mask, width = batch["input_ids"], batch["attention_mask"], batch["completion_length"]
    config = model.config
    if shared:
        packed = pack_rows(
            ids,
            mask,
            width,
            batch["video_rows"],
            slice(None),
            model.model.get_rope_index,
            config.video_token_id,
            0,
            fork_state=forkable_state(config),  # Qwen3.5: its Gated DeltaNet state forked after the prompt
        )
        inputs, labels = packed.model_inputs, packed.shift_labels
    else:
        inputs = {
            "input_ids": ids,
            "attention_mask": mask,
            **video_kwargs(batch["video_rows"], slice(None), ids, config.video_token_id),
        }
        labels = ids.masked_fill(mask == 0, -100)
        labels[:, :-width] = -100
        labels = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)  # next-token labels
    scored = labels != -100
    if getattr(model, "fused_head", False):  # TRL's chunked head, as the trainer scores
        import trl.trainer.utils as trl_utils

        # On GPUs TRL scores only the labelled positions; on CPU it scores every position (fixed tile shapes),
        # which would charge the plain side for its prompt copies twice. Score as on a GPU, on both sides.
        use_triton, trl_utils._use_triton = trl_utils._use_triton, lambda device: True
        try:
            logps = model(**inputs, shift_labels=labels, fused_lm_head=True).log_probs[scored]
        finally:
            trl_utils._use_triton = use_triton
    else:  # torch + transformers only: the same positions, logits materialised
        hidden = model.model(**inputs, use_cache=False).last_hidden_state
        logits = model.lm_head(hidden[scored]).float()
        logps = torch.log_softmax(logits, -1).gather(-1, labels[scored][:, None]).squeeze(-1)
    return logps, int(inputs["input_ids"].numel())


def timed_group_step(model, batch: dict, shared: bool, device: str = "cpu", steps: int = 2) -> dict:
    """``steps`` loss forward + backward passes of ``batch`` (loss = the answer tokens' mean log-prob), with the
    gradients resident before the first, as in training. Memory is the first step's added peak; time the faster
    step (this machine is shared)."""
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    timings, memory, positions = [], None, 0
    for _ in range(steps):
        with PeakMemory(device) as step_memory:
            started = time.perf_counter()
            logps, positions = answer_logps(model, batch, shared)
            (-logps.mean()).backward()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            timings.append(time.perf_counter() - started)
        memory = memory or step_memory
        del logps
    return {
        "seconds": min(timings),
        "step_seconds": timings,
        "peak_added_mb": memory.added_mb,
        "positions": positions,
        "prompt_tokens": batch["prompt_tokens"],
        "answers": batch["answers"],
        "visual_tokens": batch["visual_tokens"],
    }
