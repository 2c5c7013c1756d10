"""Benchmark of the shared prompt (:mod:`video_grpo.prefix`, :mod:`video_grpo.prefill`): one group of G answers
to one video prompt, scored plain (G rows, each with the prompt) and packed (one row), side by side.

Called by ``python -m video_grpo.bench perf`` (rows ``lm_positions_per_forward``, ``train_step_time_shared_prefix``,
``peak_memory_shared_prefix``, ``generation_time_shared_prefill``, ``shared_prefix_scaling``) and, on a GPU, by
``scripts/bench_gpu.sh`` (``python -m video_grpo.bench.shared_prefix gpu``). Needs torch, transformers and ``src/``.

- **Model.** Qwen2.5-VL at the published 3B (or 7B) widths, read from ``../shared/reference/qwen2_5_vl`` when
  it is there (the literals below otherwise), random weights, depth cut in the real model's proportion (36 text
  to 32 vision layers, so 1 + 1). The scaling table uses narrower layers, ``--quick`` tiny ones and a small
  vocabulary (seconds per side).
- **Input.** A real clip of ``data_samples`` sampled to 16 frames sized for the visual-token count, through the
  real processor and chat template when ``../shared/reference/qwen2_5_vl`` has them (else a synthetic prompt of
  the same layout); G answers of random tokens with lengths spread over 32-128.
- **Step.** The same scoring as the trainer's forwards: per-token log-probs of the answer tokens only, through
  TRL's fused chunked LM head (without TRL, e.g. on a bare GPU machine, the same positions with materialised
  logits), loss = their mean, backward. The vision tower runs once per video on both
  sides (``video_grpo.encoder``), so the difference is the language model's prompt copies.
- **Time.** Each side runs two steps; the faster counts (both are in the JSON line's ``*_step_seconds``).
- **Memory.** Each side runs in a fresh process, measured on its first step. Before the step the weights and their gradients are resident;
  the row reports the peak of the resident set during forward + backward minus what was resident before (CPU,
  sampled every 2 ms), or ``max_memory_allocated`` minus the allocation before (CUDA).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
REFERENCE = REPO.parent / "shared" / "reference" / "qwen2_5_vl"
SAMPLE_VIDEO_INDEX = 0

# Qwen2.5-VL-3B-Instruct and -7B-Instruct hub config.json values that set the compute (the files in REFERENCE
# are read instead whenever they are present).
QWEN_VISION = {
    "depth": 32,
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31],
    "tokens_per_second": 2,
}
QWEN_TOKENS = {
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
# placeholder and special ids inside a 4,096-token vocabulary (the small-vocabulary widths, synthetic prompts)
SMALL_VOCAB_TOKENS = {
    "image_token_id": 4090,
    "video_token_id": 4091,
    "vision_start_token_id": 4092,
    "vision_end_token_id": 4093,
    "bos_token_id": 4094,
    "eos_token_id": 4095,
}
WIDTHS = {
    "3b": {
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "rope_theta": 1000000.0,
    },
    "7b": {
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "rope_theta": 1000000.0,
    },
    # narrower layers for --quick and the scaling table (same head size and MLP proportion as 3B)
    "narrow": {
        "hidden_size": 512,
        "intermediate_size": 2752,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "rope_theta": 1000000.0,
        "vision": {"hidden_size": 320, "intermediate_size": 855, "num_heads": 4},
    },
    # --quick: seconds per side, a synthetic prompt in a small vocabulary
    "quick": {
        "hidden_size": 128,
        "intermediate_size": 688,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": 4096,
        "tie_word_embeddings": True,
        "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]},
        "rope_theta": 1000000.0,
        "vision": {"hidden_size": 64, "intermediate_size": 171, "num_heads": 2},
        "tokens": SMALL_VOCAB_TOKENS,
    },
}
# the scaling table: "narrow" with a small vocabulary, so that the LM head (the same on both sides) does not
# dominate a 1-layer model's step and hide how the prompt's share grows (a synthetic prompt)
WIDTHS["scaling"] = {**WIDTHS["narrow"], "vocab_size": 4096, "tokens": SMALL_VOCAB_TOKENS}
REFERENCE_FILES = {"3b": REFERENCE / "3B" / "config.json", "7b": REFERENCE / "config.json"}


def published_config(widths: str, reference: bool = True) -> tuple[dict, str]:
    """Qwen2.5-VL config.json values at ``widths``, full depth, and where they came from: the file in
    ``REFERENCE`` when ``reference`` and it is present, else the literals above. The one source of the 3B and 7B
    widths for this module, ``scripts/bench_gpu.py`` and ``tests/test_real_widths.py``."""
    source = REFERENCE_FILES.get(widths)
    if reference and source is not None and source.is_file():
        values = json.loads(source.read_text())
        values.pop("architectures", None)
        return values, str(source.relative_to(REPO.parent))
    spec = dict(WIDTHS[widths])
    vision = {**QWEN_VISION, **spec.pop("vision", {}), "out_hidden_size": spec["hidden_size"]}
    values = {
        **QWEN_TOKENS,
        **spec.pop("tokens", {}),
        **spec,
        "model_type": "qwen2_5_vl",
        "vision_config": vision,
    }
    return values, "literal" if widths in REFERENCE_FILES else f"{widths} (narrower than 3B)"


def model_config(widths: str, text_layers: int = 1, vision_layers: int = 1):
    """A Qwen2.5-VL config at ``widths`` with the depth cut to ``text_layers`` + ``vision_layers``."""
    from transformers import Qwen2_5_VLConfig

    values, origin = published_config(widths)
    values["num_hidden_layers"] = text_layers
    values["vision_config"] = {
        **values["vision_config"],
        "depth": vision_layers,
        "fullatt_block_indexes": [vision_layers - 1],
    }
    config = Qwen2_5_VLConfig(**values)
    config._attn_implementation = "sdpa"
    return config, origin


def build_model(config, device: str = "cpu", dtype: torch.dtype = torch.float32):
    from transformers import Qwen2_5_VLForConditionalGeneration

    from video_grpo import positions
    from video_grpo.encoder import install

    positions.install()
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=dtype).to(device)
    install(model)  # the vision tower runs once per video on both sides
    try:  # the trainer's scoring: TRL's fused, chunked LM head (never the full logits)
        from trl.trainer.utils import add_fused_lm_head
    except ImportError:
        model.fused_head = False
    else:
        add_fused_lm_head(model)
        model.fused_head = True
    return model


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

        from video_grpo.data import build_dataset
        from video_grpo.families import QWEN2_5_VL
        from video_grpo.processing import encode_rows
        from video_grpo.video import SamplingConfig

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
    from video_grpo.prefix import pack_rows
    from video_grpo.processing import video_kwargs

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


class PeakMemory:
    """Memory a block adds at its peak over what was resident when it started (CUDA: allocated; CPU: RSS)."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.added_mb = 0.0

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.before = torch.cuda.memory_allocated()
        else:
            self.before = self.peak = self._rss()
            self.running = True
            self.thread = threading.Thread(target=self._poll, daemon=True)
            self.thread.start()
        return self

    def _poll(self) -> None:
        while self.running:
            self.peak = max(self.peak, self._rss())
            time.sleep(0.002)

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.added_mb = (torch.cuda.max_memory_allocated() - self.before) / 2**20
        else:
            self.running = False
            self.thread.join()
            self.added_mb = (max(self.peak, self._rss()) - self.before) / 2**20


def train_step(setting: dict) -> dict:
    """One side's loss forward + backward in this process; ``setting`` as :func:`run_side` passes it."""
    device, dtype = setting.get("device", "cpu"), getattr(torch, setting.get("dtype", "float32"))
    config, origin = model_config(
        setting["widths"], setting.get("text_layers", 1), setting.get("vision_layers", 1)
    )
    model = build_model(config, device, dtype)
    batch = group_inputs(config, setting["visual_tokens"], setting["G"], device=device)
    for parameter in model.parameters():  # gradients are resident before the step, as in training
        parameter.grad = torch.zeros_like(parameter)
    timings, memory = [], None
    for _ in range(2):  # memory from the first step; time: the faster of the two (this machine is shared)
        with PeakMemory(device) as step_memory:
            started = time.perf_counter()
            logps, positions = answer_logps(model, batch, setting["shared"])
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
        "config": origin,
        "prompt_source": batch["prompt_source"],
    }


def run_side(setting: dict) -> dict:
    """:func:`train_step` in a fresh process, so each side's memory starts from the same state."""
    code = f"import json; from video_grpo.bench.shared_prefix import train_step; print(json.dumps(train_step({setting!r})))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"shared_prefix side {setting} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def train_rows(
    emit, widths: str, visual_tokens: int, group_size: int, device: str = "cpu", dtype: str = "float32"
) -> None:
    setting = {
        "widths": widths,
        "visual_tokens": visual_tokens,
        "G": group_size,
        "device": device,
        "dtype": dtype,
    }
    shared, plain = run_side({**setting, "shared": True}), run_side({**setting, "shared": False})
    prompt, answers = plain["prompt_tokens"], plain["answers"]
    ideal = (prompt + sum(answers)) / (group_size * (prompt + max(answers)))
    common = {
        "model": f"Qwen2.5-VL {widths} widths, 1 text + 1 vision layer, random weights",
        "config": plain["config"],
        "prompt": plain["prompt_source"],
        "prompt_tokens": prompt,
        "visual_tokens": plain["visual_tokens"],
        "G": group_size,
        "answer_tokens": answers,
        "device": device,
        "dtype": dtype,
        "ours_setting": "shared_prefix",
        "baseline_setting": "plain (G rows)",
    }
    emit(
        "lm_positions_per_forward",
        shared["positions"],
        plain["positions"],
        "token positions",
        ideal=round(ideal, 4),
        goal="ratio within 5% of ideal",
        **common,
    )
    emit(
        "train_step_time_shared_prefix",
        shared["seconds"],
        plain["seconds"],
        "s per loss forward+backward",
        goal="ratio <= 0.35",
        ours_step_seconds=shared["step_seconds"],
        baseline_step_seconds=plain["step_seconds"],
        ours_samples_per_s=round(group_size / shared["seconds"], 3),
        baseline_samples_per_s=round(group_size / plain["seconds"], 3),
        **common,
    )
    emit(
        "peak_memory_shared_prefix",
        shared["peak_added_mb"],
        plain["peak_added_mb"],
        "MB added by forward+backward",
        goal="ratio <= 0.4",
        **common,
    )


def generation_row(
    emit,
    widths: str,
    visual_tokens: int,
    group_size: int,
    new_tokens: int = 64,
    device: str = "cpu",
    dtype: str = "float32",
) -> None:
    """``generate`` of G answers to one prompt: one prefill per row (plain) vs one per prompt."""
    from video_grpo import prefill
    from video_grpo.processing import video_kwargs

    config, origin = model_config(widths)
    model = build_model(config, device, getattr(torch, dtype)).eval()
    batch = group_inputs(config, visual_tokens, group_size, device=device)
    prompt = batch["input_ids"][:, : batch["prompt_tokens"]]
    inputs = {
        "input_ids": prompt,
        "attention_mask": torch.ones_like(prompt),
        **video_kwargs(batch["video_rows"], slice(None), prompt, config.video_token_id),
    }
    kwargs = {
        "max_new_tokens": new_tokens,
        "min_new_tokens": new_tokens,
        "do_sample": False,
        "pad_token_id": 0,
        "eos_token_id": config.get_text_config().eos_token_id,
    }
    with torch.no_grad():  # warm-up: one short generate on each path
        model.generate(**inputs, **{**kwargs, "max_new_tokens": 2, "min_new_tokens": 2})
        prefill.generate(model, **inputs, **{**kwargs, "max_new_tokens": 2, "min_new_tokens": 2})
    seconds, outputs = {}, {}
    for name in ("plain", "shared"):
        started = time.perf_counter()
        with torch.no_grad():
            outputs[name] = (
                prefill.generate(model, **inputs, **kwargs)
                if name == "shared"
                else model.generate(**inputs, **kwargs)
            )
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds[name] = time.perf_counter() - started
    emit(
        "generation_time_shared_prefill",
        seconds["shared"],
        seconds["plain"],
        "s per generate",
        model=f"Qwen2.5-VL {widths} widths, 1 text + 1 vision layer, random weights",
        config=origin,
        prompt_tokens=batch["prompt_tokens"],
        G=group_size,
        new_tokens=new_tokens,
        device=device,
        dtype=dtype,
        same_tokens=bool(torch.equal(outputs["plain"], outputs["shared"])),
        goal="ratio <= 0.4",
    )


def scaling_rows(emit, visual_tokens=(1024, 2048, 4096), group_sizes=(4, 8, 16)) -> None:
    """The train-step ratio over prompt length and G, on the narrower model, in this process."""
    config, origin = model_config("scaling")
    model = build_model(config)
    for tokens in visual_tokens:
        for group_size in group_sizes:
            batch = group_inputs(config, tokens, group_size)
            seconds = {True: float("inf"), False: float("inf")}
            for shared in (True, False, True, False):  # the faster of two steps per side
                model.zero_grad(set_to_none=True)
                started = time.perf_counter()
                logps, _ = answer_logps(model, batch, shared)
                (-logps.mean()).backward()
                seconds[shared] = min(seconds[shared], time.perf_counter() - started)
            emit(
                "shared_prefix_scaling",
                seconds[True],
                seconds[False],
                "s per loss forward+backward",
                visual_tokens=batch["visual_tokens"],
                prompt_tokens=batch["prompt_tokens"],
                G=group_size,
                model="512 wide, 4,096-token vocabulary, 1 text + 1 vision layer",
                config=origin,
            )


def attention_kernels(model, batch: dict) -> list[str]:
    """The scaled-dot-product-attention operators a packed forward ran (flash, efficient, or the math kernel that
    materialises every (rows, heads, L, L) score matrix)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as trace:
        answer_logps(model, batch, shared=True)
    return sorted({event.name for event in trace.events() if "scaled_dot_product" in event.name})


def sdpa_kernel_rows(
    emit, widths: str, visual_tokens: int, group_size: int, device: str = "cuda", dtype: str = "bfloat16"
) -> None:
    """One packed loss forward + backward (1 + 1 layers), with PyTorch's choice of SDPA kernel and with the
    memory-efficient kernel forced: which kernel each runs, and each one's peak memory. The packed mask is a
    custom 4-D mask, which flash attention does not take; a fall-back to the math kernel would hold the full
    score matrix per layer."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from video_grpo.live_memory import LiveBytes

    config, origin = model_config(widths)
    model = build_model(config, device, getattr(torch, dtype))
    batch = group_inputs(config, visual_tokens, group_size, device=device)
    results = {}
    for name, backends in (("default", None), ("efficient", [SDPBackend.EFFICIENT_ATTENTION])):
        choice = sdpa_kernel(backends) if backends else contextlib.nullcontext()
        model.zero_grad(set_to_none=True)
        try:
            with choice:
                kernels = attention_kernels(model, batch)
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    before = torch.cuda.memory_allocated()
                    (-answer_logps(model, batch, shared=True)[0].mean()).backward()
                    torch.cuda.synchronize()
                    peak_gb = (torch.cuda.max_memory_allocated() - before) / 2**30
                else:
                    with LiveBytes() as live:
                        (-answer_logps(model, batch, shared=True)[0].mean()).backward()
                    peak_gb = live.peak / 2**30
            results[name] = {"kernels": kernels, "peak_gb": round(peak_gb, 3)}
        except RuntimeError as err:  # e.g. no efficient kernel for this device or mask
            results[name] = {"error": str(err).splitlines()[0][:200]}
    emit(
        "packed_attention_kernel_peak_memory",
        results["efficient"].get("peak_gb"),
        results["default"].get("peak_gb"),
        "GB added by one packed forward+backward",
        ours_setting="SDPBackend.EFFICIENT_ATTENTION only",
        baseline_setting="PyTorch's default choice",
        kernels=results,
        model=f"Qwen2.5-VL {widths} widths, 1 text + 1 vision layer, random weights",
        config=origin,
        prompt_tokens=batch["prompt_tokens"],
        visual_tokens=batch["visual_tokens"],
        G=group_size,
        device=device,
        dtype=dtype,
    )


def perf_rows(emit, quick: bool) -> None:
    """The rows ``python -m video_grpo.bench perf`` prints for the shared prompt."""
    if quick:
        train_rows(emit, "quick", 512, 8)
        generation_row(emit, "quick", 512, 8, new_tokens=16)
        return
    train_rows(emit, "3b", 2048, 8)
    generation_row(emit, "3b", 2048, 8)
    scaling_rows(emit)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m video_grpo.bench.shared_prefix",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "command",
        choices=["gpu", "sdpa"],
        help="gpu: the train and generation rows on one device; sdpa: which attention kernel a packed forward "
        "runs, and its peak memory, default choice vs the memory-efficient kernel",
    )
    parser.add_argument("--widths", choices=list(WIDTHS), default="3b")
    parser.add_argument("--visual_tokens", type=int, default=2048)
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args(argv)

    def emit(name, ours, baseline, unit, **extra):
        print(
            json.dumps(
                {
                    "name": name,
                    "ours": ours,
                    "baseline": baseline,
                    "ratio": ours / baseline if ours is not None and baseline else None,
                    "unit": unit,
                    **extra,
                }
            ),
            flush=True,
        )

    if args.command == "sdpa":
        sdpa_kernel_rows(emit, args.widths, args.visual_tokens, args.G, args.device, args.dtype)
        return 0
    train_rows(emit, args.widths, args.visual_tokens, args.G, args.device, args.dtype)
    generation_row(emit, args.widths, args.visual_tokens, args.G, device=args.device, dtype=args.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
