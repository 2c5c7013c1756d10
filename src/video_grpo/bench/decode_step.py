"""Benchmark of the compiled decode step (:mod:`video_grpo.rollout.decode`): one decode step of ``generate``, eager (today's
one-prefill path, a dynamic cache) against compiled (the static cache, inductor), on the same rows.

Called by ``python -m video_grpo.bench perf`` (rows ``decode_step_time_compiled_vs_eager`` and
``decode_compile_time``), and by ``scripts/bench_gpu.sh`` for decode tokens/s at full depth on a GPU
(``python -m video_grpo.bench.decode_step gpu --widths 3b|7b``: rows ``decode_tokens_per_s``, one per compiled path
against eager, each side also as a share of the bandwidth limit, (weights + KV bytes per step) / bandwidth).

- **Model.** Qwen2.5-VL, random weights: on CPU 64 wide with the 3B's 36 text layers and a 4,096-token vocabulary.
  That is the regime a GPU decodes in at G = 8: the per-op dispatch (about 40 ops a layer), not the arithmetic,
  sets the step time, which is what compiling removes (CUDA graphs remove the launches too). At 3B widths a CPU
  is compute-bound and compiling does not help there; that is not what a GPU sees.
- **Input.** One synthetic video prompt (a 4-token video, 64 tokens in all) answered G = 8 times, greedily, a
  fixed number of new tokens (EOS suppressed).
- **Time.** A logits processor stamps the clock once per generated token: the gaps are whole decode steps (the
  forward, the sampler, ``generate``'s bookkeeping). The row is each side's median gap, over several calls, after
  one untimed call per side; the compiled side's first call (tracing and code generation) is the compile time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from video_grpo.bench.emit import emit
from video_grpo.bench.qwen_widths import SMALL_VOCAB_TOKENS, published_config
from video_grpo.rollout.decode import cache_length

OVERHEAD_WIDTHS = {  # 64 wide, the 3B's 36 text layers, a small vocabulary: dispatch-bound, as a GPU at G = 8
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 36,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 4096,
    "tie_word_embeddings": True,
    "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    "rope_theta": 1000000.0,
}


class StepClock:
    """A logits processor that records the time each decode step reaches the sampler."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def __call__(self, input_ids, scores):
        self.stamps.append(time.perf_counter())
        return scores

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.stamps, self.stamps[1:], strict=False)]


def overhead_model(text_layers: int = 36, device: str = "cpu", dtype=torch.float32):
    """The CPU row's model: Qwen2.5-VL 64 wide, ``text_layers`` deep, a 1-layer vision tower."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    values, _ = published_config("3b", reference=False)
    values.update(OVERHEAD_WIDTHS, **SMALL_VOCAB_TOKENS, num_hidden_layers=text_layers)
    values["vision_config"] = {
        **values["vision_config"],
        "depth": 1,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 64,
        "fullatt_block_indexes": [0],
    }
    config = Qwen2_5_VLConfig(**values)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=dtype).to(device).eval()


def video_prompt(config, rows: int, text_tokens: int, grid=(1, 4, 4), device: str = "cpu") -> dict:
    """``prefill.generate`` inputs: one prompt (text, a small video, text) repeated ``rows`` times."""
    thw = torch.tensor([grid])
    video_tokens = int(thw.prod()) // 4
    ids = [7] * (text_tokens // 2) + [config.vision_start_token_id] + [config.video_token_id] * video_tokens
    ids += [config.vision_end_token_id] + [8] * (text_tokens - text_tokens // 2)
    input_ids = torch.tensor([ids] * rows, device=device)
    patch_values = 3 * 2 * config.vision_config.patch_size**2
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "pixel_values_videos": torch.randn(int(thw.prod()), patch_values, device=device),
        "video_index": torch.zeros(rows, dtype=torch.long, device=device),
        "video_grid_thw": thw.repeat(rows, 1).to(device),
        "second_per_grid_ts": torch.ones(rows, device=device),
        "mm_token_type_ids": (input_ids == config.video_token_id).long() * 2,
    }


def timed_generate(
    model, inputs: dict, new_tokens: int, decoder=None
) -> tuple[float, list[float], torch.Tensor]:
    """(wall seconds, per-step gaps, output) of one greedy ``prefill.generate`` call."""
    from transformers import LogitsProcessorList

    from video_grpo.rollout import prefill

    clock = StepClock()
    eos = model.config.text_config.eos_token_id
    started = time.perf_counter()
    output = prefill.generate(
        model,
        **inputs,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,  # every call decodes the same number of steps
        do_sample=False,
        pad_token_id=eos,
        eos_token_id=eos,
        logits_processor=LogitsProcessorList([clock]),
        decoder=decoder,
    )
    if inputs["input_ids"].is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - started, clock.gaps(), output


def compare(model, inputs: dict, new_tokens: int, calls: int, settings) -> dict:
    """Both sides on the same rows: median step seconds, the compiled side's compile seconds, same tokens."""
    from video_grpo.rollout.decode import CompiledDecoder

    decoder = CompiledDecoder(rows=inputs["input_ids"].shape[0], settings=settings)
    timed_generate(model, inputs, new_tokens)  # untimed: allocator and thread pools warm
    eager_gaps, compiled_gaps, eager_walls, compiled_walls = [], [], [], []
    first_wall, _, first = timed_generate(model, inputs, new_tokens, decoder)  # traces and compiles
    for _ in range(calls):
        wall, gaps, eager = timed_generate(model, inputs, new_tokens)
        eager_gaps += gaps
        eager_walls.append(wall)
        wall, gaps, compiled = timed_generate(model, inputs, new_tokens, decoder)
        compiled_gaps += gaps
        compiled_walls.append(wall)
    return {
        "eager_step": statistics.median(eager_gaps),
        "compiled_step": statistics.median(compiled_gaps),
        "compile_seconds": first_wall - statistics.median(compiled_walls),
        "eager_call": statistics.median(eager_walls),
        "compiled_call": statistics.median(compiled_walls),
        "same_tokens": bool(torch.equal(first, eager) and torch.equal(compiled, eager)),
        "graphs": decoder.stats.graphs,
        "compiled_steps": decoder.stats.compiled_steps,
        "cuda_graph_skips": decoder.stats.cuda_graph_skips,
    }


def perf_rows(emit, quick: bool) -> None:
    """``decode_step_time_compiled_vs_eager`` and ``decode_compile_time`` on CPU (see the module doc). ``quick``:
    4 text layers and the ``aot_eager`` backend (seconds, the same code path; its ratio says nothing of speed)."""
    from video_grpo.rollout.decode import DecodeSettings

    layers, backend = (4, "aot_eager") if quick else (36, "inductor")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core per side, as a GPU's single launch stream: the dispatch cost shows
    try:
        model = overhead_model(layers)
        inputs = video_prompt(model.config, rows=8, text_tokens=60)
        result = compare(
            model,
            inputs,
            new_tokens=12 if quick else 32,
            calls=2 if quick else 5,
            settings=DecodeSettings(backend),
        )
    finally:
        torch.set_num_threads(threads)
    common = {
        "model": f"Qwen2.5-VL 64 wide, {layers} text layers, 4,096-token vocabulary, random weights",
        "G": 8,
        "prompt_tokens": inputs["input_ids"].shape[1],
        "device": "cpu",
        "threads": 1,
        "backend": backend,
    }
    emit(
        "decode_step_time_compiled_vs_eager",
        result["compiled_step"] * 1000,
        result["eager_step"] * 1000,
        "ms per decode step (median)",
        **common,
        same_tokens=result["same_tokens"],
        compiled_steps=result["compiled_steps"],
        graphs=result["graphs"],
        goal="ratio <= 0.6 (36 layers, inductor)",
    )
    emit(
        "decode_compile_time",
        result["compile_seconds"],
        None,
        "s to trace and compile the step (first call minus a warm one)",
        **common,
    )


def bandwidth_limit_seconds(
    model, rows: int, cache_positions: int, dtype_bytes: int, tb_per_s: float
) -> float:
    """Seconds one decode step needs at least: the weights and the KV cache read once, at the HBM bandwidth."""
    text = model.config.text_config
    kv_per_token = (
        text.num_hidden_layers * 2 * text.num_key_value_heads * (text.hidden_size // text.num_attention_heads)
    )
    weights = sum(p.numel() for p in model.parameters()) * dtype_bytes
    return (weights + rows * cache_positions * kv_per_token * dtype_bytes) / (tb_per_s * 1e12)


def gpu_rows(
    widths: str,
    rows: int,
    new_tokens: int,
    tb_per_s: float,
    calls: int,
    device: str,
    dtype: str,
    layers: int | None = None,
) -> bool:
    """``decode_tokens_per_s`` at full depth: eager, compiled, compiled with CUDA graphs, on one prompt answered
    ``rows`` times; each as tokens/s and as a share of the bandwidth limit (weights + KV bytes per step). Returns
    False when the CUDA-graph row did not run as CUDA graphs (inductor skipped them): that row then measures
    something else, and the script fails."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from video_grpo.rollout.decode import DecodeSettings

    values, origin = published_config(widths)
    if layers is not None:  # a smoke run of the code path (full depth is the measurement)
        values["num_hidden_layers"] = layers
        values["vision_config"] = {**values["vision_config"], "depth": layers, "fullatt_block_indexes": [0]}
    config = Qwen2_5_VLConfig(**values)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = (
        Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=getattr(torch, dtype)).to(device).eval()
    )
    grid = (16, 16, 16) if layers is None else (1, 4, 4)
    inputs = video_prompt(model.config, rows=rows, text_tokens=200, grid=grid, device=device)
    settings = {
        "compiled": DecodeSettings("inductor"),
        "compiled_cuda_graphs": DecodeSettings("inductor", cuda_graphs=True),
    }
    timed_generate(model, inputs, new_tokens)  # untimed warm-up
    eager = statistics.median(g for _ in range(calls) for g in timed_generate(model, inputs, new_tokens)[1])
    graphs_ran = True
    for path, setting in settings.items():
        result = compare(model, inputs, new_tokens, calls, setting)
        width = inputs["input_ids"].shape[1]
        cache = cache_length(width + new_tokens)
        limit = bandwidth_limit_seconds(
            model, rows, cache, torch.finfo(getattr(torch, dtype)).bits // 8, tb_per_s
        )
        emit(
            "decode_tokens_per_s",
            rows / result["compiled_step"],
            rows / eager,
            "generated tokens/s (all rows)",
            path=path,
            widths=widths,
            config=origin,
            G=rows,
            prompt_tokens=width,
            dtype=dtype,
            device=torch.cuda.get_device_name() if device.startswith("cuda") else device,
            bandwidth_tb_per_s=tb_per_s,
            ours_share_of_bandwidth_limit=limit / result["compiled_step"],
            baseline_share_of_bandwidth_limit=limit / eager,
            compile_seconds=result["compile_seconds"],
            same_tokens=result["same_tokens"],
            cuda_graph_skips=result["cuda_graph_skips"],
            goal="compiled_cuda_graphs: share >= 0.6 and ratio >= 2.5 (H200), and no CUDA graph skipped",
        )
        if setting.cuda_graphs and result["cuda_graph_skips"]:
            print(
                f"{path}: inductor skipped CUDA graphs {result['cuda_graph_skips']} times (TORCH_LOGS=perf_hints)"
            )
            graphs_ran = False
    return graphs_ran


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m video_grpo.bench.decode_step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "mode", choices=["cpu", "gpu"], help="cpu: the perf rows; gpu: tokens/s at full depth"
    )
    parser.add_argument("--quick", action="store_true", help="cpu: 4 layers and aot_eager (seconds)")
    parser.add_argument("--widths", default="3b", help="gpu: 3b or 7b, full depth, random weights")
    parser.add_argument("--G", type=int, default=8, help="gpu: rows answering the one prompt")
    parser.add_argument("--new_tokens", type=int, default=128)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument(
        "--tb_per_s", type=float, default=4.8, help="gpu: HBM bandwidth (H200 4.8, H100 3.35)"
    )
    parser.add_argument(
        "--layers", type=int, help="gpu: cut the depth (a smoke run; the default is full depth)"
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args(argv)
    if args.mode == "cpu":
        perf_rows(emit, args.quick)
    elif not gpu_rows(
        args.widths,
        args.G,
        args.new_tokens,
        args.tb_per_s,
        args.calls,
        args.device,
        args.dtype,
        args.layers,
    ):
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
