"""FLOPs and bytes moved per optimizer step, by phase, and the time they take on a named GPU.

FLOPs count what ``torch.utils.flop_counter.FlopCounterMode`` counts (matrix products, convolutions and
attention at 2 FLOPs per multiply-add; attention over its full score matrix, as the kernels compute it): the
linear layers' sizes come from the model itself (:mod:`video_grpo.plan.model`'s meta model), attention from the
sequence lengths. Decoding is counted per token; its time is set by the bytes it reads (weights and KV cache), at
an efficiency that depends on how the run decodes (:func:`video_grpo.plan.workload.decode_path`).

Times assume efficiencies, stated in the output: a plan says which phase dominates, not a benchmark result.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

from video_grpo.plan import cache
from video_grpo.plan.layers import vision_chunks
from video_grpo.plan.model import ModelShape, meta_model
from video_grpo.plan.sizes import DTYPE_BYTES, step_sizes
from video_grpo.plan.workload import Workload, decode_path

# Dense bf16 tensor FLOP/s (no sparsity), memory bandwidth and memory as sold. Sources: NVIDIA datasheets, as
# collected in docs/planning.md.
GPUS = {
    "h100-80gb": {"name": "H100 SXM 80GB", "tflops": 989.4, "tb_per_s": 3.35, "memory_gb": 80},
    "h200-141gb": {"name": "H200 SXM 141GB", "tflops": 989.5, "tb_per_s": 4.8, "memory_gb": 141},
    "a100-80gb": {"name": "A100 SXM 80GB", "tflops": 312.0, "tb_per_s": 2.039, "memory_gb": 80},
    "a100-40gb": {"name": "A100 SXM 40GB", "tflops": 312.0, "tb_per_s": 1.555, "memory_gb": 40},
    "l40s-48gb": {"name": "L40S 48GB", "tflops": 362.05, "tb_per_s": 0.864, "memory_gb": 48},
    "a40-48gb": {"name": "A40 48GB", "tflops": 149.7, "tb_per_s": 0.696, "memory_gb": 48},
    "rtx4090-24gb": {"name": "RTX 4090 24GB", "tflops": 165.2, "tb_per_s": 1.008, "memory_gb": 24},
}
# Assumed shares of the peak. Training kernels at 40% of peak FLOP/s (the middle of the 30-50% usually reported for
# transformer training). Decoding, by path (none measured on a GPU yet; scripts/bench_gpu.sh measures them):
# - eager: 20%. HF's eager step launches a kernel per op, about 1,460 for the 3B (40 per layer, counted on CPU);
#   at ~8 us of host time each that is ~12 ms against the ~2.3 ms its bytes take on an H100 at G = 8.
# - compiled: 45%. Inductor fuses a layer's ~40 ops into ~12 kernels, still launched one by one from the host
#   (under ZeRO-3, where CUDA graphs cannot be used): about 3.5x fewer launches, comparable to the byte time.
# - compiled with CUDA graphs: 60%, the project's goal for that path (>= 60% of the bandwidth limit on an H200);
#   serving engines report 60-85%.
COMPUTE_EFFICIENCY = 0.40
DECODE_BANDWIDTH_EFFICIENCY = {"eager": 0.20, "compiled": 0.45, "compiled_cuda_graphs": 0.60}


@dataclass(frozen=True)
class LinearSizes:
    """Multiply-adds per token of the linear layers (sum of in x out), by part of the model."""

    text_layer: dict[str, int]  # per decoder layer, by layer type
    text_layer_last: dict[str, int]  # its last linear layer (the MLP's output projection)
    vision_block: int
    vision_block_last: int
    merger: int  # per merged (language-model) token
    deepstack_merger: int  # one DeepStack merger, per merged token
    patch_embed: int  # per patch
    head: int  # hidden x vocabulary


@functools.lru_cache(maxsize=16)
def linear_sizes(shape: ModelShape) -> LinearSizes:
    """The model's :class:`LinearSizes`, measured on its meta model once per model (:mod:`video_grpo.plan.cache`)."""
    return LinearSizes(
        **cache.cached(cache.shape_key(shape), "linear_sizes", lambda: asdict(measure_linear(shape)))
    )


def measure_linear(shape: ModelShape) -> LinearSizes:
    import torch

    model = meta_model(shape.config)

    def macs(module) -> int:
        return sum(m.in_features * m.out_features for m in module.modules() if isinstance(m, torch.nn.Linear))

    def last(module) -> int:
        linear = [m for m in module.modules() if isinstance(m, torch.nn.Linear)][-1]
        return linear.in_features * linear.out_features

    layers = model.model.language_model.layers
    per_kind: dict[str, int] = {}
    last_by_kind: dict[str, int] = {}
    for kind, layer in zip(shape.text_layers, layers, strict=True):
        per_kind.setdefault(kind, macs(layer))
        last_by_kind.setdefault(kind, last(layer))
    visual = model.model.visual
    deepstack = getattr(visual, "deepstack_merger_list", None)
    conv = visual.patch_embed.proj
    return LinearSizes(
        text_layer=per_kind,
        text_layer_last=last_by_kind,
        vision_block=macs(visual.blocks[0]),
        vision_block_last=last(visual.blocks[0]),
        merger=macs(visual.merger),
        deepstack_merger=macs(deepstack[0]) if deepstack else 0,
        patch_embed=conv.weight.numel(),
        head=shape.hidden * shape.vocab,
    )


def attention_flops(heads: int, head_dim: int, sequences: list[int], backward: bool = False) -> int:
    """FLOPs of scaled-dot-product attention over these sequence lengths (queries = keys), FlopCounterMode's way:
    2 FLOPs per multiply-add, the full score matrix; backward counts 2.5x forward's two products."""
    forward = sum(4 * heads * s * s * head_dim for s in sequences)
    return forward * 5 // 2 if backward else forward


def vision_chunk_lengths(shape: ModelShape, grid: tuple[int, int, int], windowed: bool) -> list[int]:
    """The lengths of a vision block's attention chunks (:func:`video_grpo.plan.layers.vision_chunks`), kept per
    model and grid (:mod:`video_grpo.plan.cache`)."""

    def lengths() -> list[int]:
        cu = vision_chunks(shape, grid, windowed).tolist()
        return [b - a for a, b in zip(cu[:-1], cu[1:], strict=True)]

    return cache.cached(
        cache.shape_key(shape), cache.entry_name("vision_chunk_lengths", grid, windowed), lengths
    )


@dataclass
class ComputePlan:
    flops: dict[str, int]  # by phase
    decode_bytes: int  # bytes read while decoding (weights and KV cache, every token)
    decode_flops: int  # the decoding part of generation's FLOPs
    decode_path: str = "eager"  # how it decodes (video_grpo.plan.workload.decode_path): sets the efficiency

    def seconds_on(self, gpu: dict) -> dict[str, float]:
        """Seconds per phase on ``gpu`` (a :data:`GPUS` entry) at the assumed efficiencies; decoding takes the
        longer of its FLOPs and its bytes."""
        peak = gpu["tflops"] * 1e12 * COMPUTE_EFFICIENCY
        bandwidth = gpu["tb_per_s"] * 1e12 * DECODE_BANDWIDTH_EFFICIENCY[self.decode_path]
        seconds = {phase: flops / peak for phase, flops in self.flops.items()}
        prefill = self.flops["generation"] - self.decode_flops
        seconds["generation"] = prefill / peak + max(self.decode_flops / peak, self.decode_bytes / bandwidth)
        return seconds


def plan_compute(shape: ModelShape, work: Workload, device: str = "cuda") -> ComputePlan:
    """FLOPs per optimizer step and phase for one GPU (its share of the step: ``gradient_accumulation``
    micro-batches and the generation batches they need)."""
    sizes = step_sizes(shape, work)
    lin = linear_sizes(shape)
    b = DTYPE_BYTES[work.dtype]
    heads, d = shape.heads, shape.head_dim
    attention_layers = sum(1 for kind in shape.text_layers if kind != "linear_attention")
    vheads, vd = shape.vision_heads, shape.vision_hidden // shape.vision_heads
    patches, tokens_per_video = sizes.patches, sizes.patches // shape.merge**2
    text_macs = sum(lin.text_layer[kind] for kind in shape.text_layers)

    def vision(videos: int, backward: bool) -> int:
        linear = patches * (lin.patch_embed + shape.vision_depth * lin.vision_block)
        linear += tokens_per_video * (lin.merger + shape.deepstack_levels * lin.deepstack_merger)
        windowed = vision_chunk_lengths(shape, sizes.grid, True) if shape.windowed_blocks else []
        frames = vision_chunk_lengths(shape, sizes.grid, False)
        full = shape.vision_depth - shape.windowed_blocks
        attention = full * attention_flops(vheads, vd, frames) + shape.windowed_blocks * attention_flops(
            vheads, vd, windowed
        )
        flops = 2 * linear + attention
        if (
            backward
        ):  # input and weight gradients of the linear layers; the patch embedding's input needs none
            flops += 2 * 2 * linear - 2 * patches * lin.patch_embed + attention * 5 // 2
        return videos * flops

    def layers(rows: int, length: int, backward: bool, trains: bool) -> int:
        linear = 2 * rows * length * text_macs
        attention = attention_layers * attention_flops(heads, d, [length] * rows)
        if not backward:
            return linear + attention
        return (2 + int(trains)) * linear + attention * 7 // 2  # forward, input gradients, weight gradients

    def head(rows: int, length: int, scored: int, backward: bool, trains: bool) -> int:
        """TRL's fused head: the projection; its backward projects again, then the hidden states' and (when it
        trains) the projection's gradients. Answer positions only with Triton; every position on the CPU."""
        tokens = scored if device != "cpu" else rows * length
        return 2 * tokens * lin.head * (1 + (2 + int(trains) if backward else 0))

    def text(rows: int, length: int, scored: int, backward: bool, trains: bool) -> int:
        return layers(rows, length, backward, trains) + head(rows, length, scored, backward, trains)

    generation_batches = max(1, work.gradient_accumulation * work.micro_batch_rows // work.generation_rows)
    videos = sizes.generation_videos
    path = decode_path(work, device)
    one_prefill = work.shared_prefix or path != "eager"  # the prompt without its last token into a cache
    if one_prefill:  # each prompt once with shared_prefix, else every row (the compiled path's copy source)
        prefill = layers(
            videos if work.shared_prefix else sizes.generation_rows, sizes.prompt - 1, False, False
        )
    else:  # every row, and the logits of its last token
        prefill = (
            layers(sizes.generation_rows, sizes.prompt, False, False) + 2 * sizes.generation_rows * lin.head
        )
    rows = sizes.generation_rows
    decode, decode_bytes = 0, 0
    steps = sizes.answer if one_prefill else sizes.answer - 1
    context = sizes.prompt - 1 if one_prefill else sizes.prompt
    for step in range(steps):
        # a static cache is attended over its whole length every step (masked), a dynamic one over what it holds
        length = work.decode_cache_tokens if path != "eager" else context + step + 1
        decode += 2 * rows * (text_macs + lin.head) + attention_layers * 4 * rows * heads * length * d
        decode_bytes += shape.params * b + rows * length * shape.kv_bytes_per_token(b)
    generation = vision(videos, False) + prefill + decode
    tower_trains = work.training == "full"
    trains = work.training != "lora"
    forward = text(sizes.loss_rows, sizes.loss_length, sizes.scored, False, False)
    forward += 0 if (not tower_trains and work.encode_once) else vision(sizes.loss_videos, False)
    passes = int(work.old_policy_pass) + int(bool(work.beta))
    loss = text(sizes.loss_rows, sizes.loss_length, sizes.scored, True, trains)
    loss += vision(sizes.loss_videos, True) if tower_trains else 0
    if work.gradient_checkpointing:  # each layer's forward runs again in backward (not the LM head's) ...
        tokens = sizes.loss_rows * sizes.loss_length
        last = sum(lin.text_layer_last[kind] for kind in shape.text_layers)
        # ... up to the last tensor backward needs: its output projection is not recomputed (torch's
        # non-reentrant checkpoint stops early)
        loss += layers(sizes.loss_rows, sizes.loss_length, False, False) - 2 * tokens * last
        if tower_trains:
            blocks = patches * shape.vision_depth * (lin.vision_block - lin.vision_block_last)
            frames = vision_chunk_lengths(shape, sizes.grid, False)
            windows = vision_chunk_lengths(shape, sizes.grid, True) if shape.windowed_blocks else []
            attention = (shape.vision_depth - shape.windowed_blocks) * attention_flops(vheads, vd, frames)
            attention += shape.windowed_blocks * attention_flops(vheads, vd, windows)
            loss += sizes.loss_videos * (2 * blocks + attention)
    micro_batches = work.gradient_accumulation
    flops = {
        "generation": generation * generation_batches,
        "old_and_reference": forward * passes * micro_batches,
        "loss": loss * micro_batches,
        "optimizer": 0,
    }
    return ComputePlan(
        flops, decode_bytes * generation_batches, decode_flops=decode * generation_batches, decode_path=path
    )
