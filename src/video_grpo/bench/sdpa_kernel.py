"""Which scaled-dot-product-attention kernel a packed forward + backward runs, and its peak memory, with
PyTorch's default choice vs the memory-efficient kernel forced (``python -m video_grpo.bench.shared_prefix
sdpa``, run by ``scripts/bench_gpu.sh``)."""

from __future__ import annotations

import contextlib

import torch

from video_grpo.bench.group_scoring import answer_logps, group_inputs
from video_grpo.bench.qwen_widths import build_model, model_config


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

    from video_grpo.runtime.live_memory import LiveBytes

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
