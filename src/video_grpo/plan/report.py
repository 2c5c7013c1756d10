"""The planner's printed report: memory by phase and category, the verdict, changes that fit, time per phase."""

from __future__ import annotations

from video_grpo.plan.compute import COMPUTE_EFFICIENCY, DECODE_BANDWIDTH_EFFICIENCY
from video_grpo.plan.fitting import suggestions
from video_grpo.plan.memory import CATEGORIES
from video_grpo.plan.recipe import GB, Plan

DECODE_PATH_NAMES = {
    "eager": "eager",
    "compiled": "compiled step, no CUDA graphs",
    "compiled_cuda_graphs": "compiled step with CUDA graphs",
}


def report(plan: Plan) -> str:
    work, memory = plan.work, plan.memory
    lines = [
        f"model: {plan.shape.family.name}, {plan.shape.params / 1e9:.2f}B parameters "
        f"(vision {plan.shape.vision_params / 1e9:.2f}B); training: {work.training}, {work.dtype}, "
        f"ZeRO-{work.zero_stage} on {work.num_processes} process(es)"
        + (", optimizer offloaded" if work.offload_optimizer else ""),
        f"per GPU and step: {work.generation_rows} rows generated ({work.group_size} per prompt), micro-batches of "
        f"{work.micro_batch_rows}; a prompt of {work.prompt_tokens} tokens ({work.visual_tokens} visual, worst case; "
        f"text: {work.sources.get('text_tokens', 'not recorded')}), answers of "
        f"{work.completion_tokens}; shared prompt {'on' if work.shared_prefix else 'off'}, "
        f"checkpointing {'on' if work.gradient_checkpointing else 'off'}, beta {work.beta:g}; "
        f"decoding: {DECODE_PATH_NAMES[plan.decode_path]}",
        "",
        "memory per GPU (GB), at each phase's peak:",
        "  " + f"{'':<22}" + "".join(f"{name[:12]:>13}" for name in memory.phases),
    ]
    for category in CATEGORIES:
        values = [memory.phases[name].by_category.get(category, 0) / GB for name in memory.phases]
        if any(values):
            lines.append("  " + f"{category:<22}" + "".join(f"{v:13.2f}" for v in values))
    lines.append("  " + f"{'total':<22}" + "".join(f"{p.peak / GB:13.2f}" for p in memory.phases.values()))
    if memory.host_bytes:
        lines.append(f"  host RAM per process for offloaded states: {memory.host_bytes / GB:.1f} GB")
    lines += ["", plan.summary()]
    if plan.fits is False:
        found = suggestions(plan)
        if found:
            lines.append("changes that fit, cheapest first:")
            lines += [f"  - {change}: peak {peak / GB:.1f} GB" for change, peak in found]
        else:
            lines.append("no single change or combination tried here fits; plan a larger GPU")
    lines += ["", "compute per optimizer step (this GPU's share):"]
    for phase, flops in plan.flops.items():
        seconds = f"  {plan.seconds[phase]:8.2f} s" if plan.seconds else ""
        lines.append(f"  {phase:<22}{flops / 1e12:12.1f} TFLOP{seconds}")
    if plan.seconds:
        lines.append(
            f"  times at {COMPUTE_EFFICIENCY:.0%} of {plan.gpu['name']}'s peak bf16 FLOP/s, decoding "
            f"({DECODE_PATH_NAMES[plan.decode_path]}) at {DECODE_BANDWIDTH_EFFICIENCY[plan.decode_path]:.0%} of its "
            "memory bandwidth (assumed, not measured)"
        )
    return "\n".join(lines)
