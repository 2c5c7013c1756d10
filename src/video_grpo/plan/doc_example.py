"""docs/planning.md's worked example of auto-fit, made from the plans and the fit the command prints.

The prose around the numbers tells what auto-fit did (which change, why the cheaper one did not fit, what stops
another recipe); each such statement is checked against the result here, and a result it no longer describes
stops the generator with what to rewrite, rather than printing new numbers in an old story.
"""

from __future__ import annotations

from video_grpo.plan.autofit import FitResult, apply_kinds
from video_grpo.plan.compute import GPUS
from video_grpo.plan.doc_tables import PHASE_NAMES, DocPlans, FitFunction, breakdown, gb, join_words, wrap
from video_grpo.plan.fitting import fitting_combinations
from video_grpo.plan.recipe import GB, make_plan
from video_grpo.plan.workload import recipe_values

EXAMPLE = ("qwen2_5_vl_7b_charades", "a100-40gb")  # a recipe auto-fit changes on a card, and the card
MICRO_BATCH = ("tempsamp_r1_qwen2_5_vl_7b_charades", "a100-40gb")  # one it fits by a smaller micro-batch too
STOPS = ("time_r1_qwen2_5_vl_7b_charades", "rtx4090-24gb")  # one whose loss keeps its micro-batch: it stops
KIND_NAMES = {
    "checkpointing": "checkpointing",
    "micro-batch": "a smaller micro-batch",
    "zero3": "ZeRO-3",
    "gpus": "more GPUs",
    "offload": "offload",
    "no-gather": "layer-by-layer gathering",
    "frozen": "a frozen tower",
    "lora": "LoRA",
    "tokens": "fewer visual tokens",
}


def require(condition: bool, statement: str) -> None:
    if not condition:
        raise RuntimeError(
            f"the auto-fit worked example says {statement}, which the planner no longer gives; rewrite its prose "
            "in video_grpo/plan/doc_example.py"
        )


def fitted(plans: DocPlans, fit: FitFunction, stem: str, gpu: str) -> FitResult:
    return fit(plans.on(stem, gpu), str(plans.path(stem)))


def auto_fit_example(plans: DocPlans, fit: FitFunction) -> str:
    stem, gpu = EXAMPLE
    result = fitted(plans, fit, stem, gpu)
    before, after = result.before, result.after
    work, memory = before.work, before.memory
    usable = before.usable_bytes / GB
    require(not before.fits and after is not None, f"{stem} does not fit {gpu} and auto-fit makes it fit")
    require(result.fields == {"ds3_gather_for_generation": False}, "auto-fit gathers layer by layer")
    decoding = result.as_json()["decode_path"]
    require(decoding == {"before": "compiled", "after": "eager"}, "generation then decodes eagerly")
    require(work.gradient_checkpointing, "checkpointing is already on")
    halved_work, _ = apply_kinds(work, ["micro-batch"]) or (None, None)
    require(halved_work is not None, "the micro-batch can be halved")
    halved = make_plan(before.shape, halved_work, before.gpu)
    require(not halved.fits, "halving the micro-batch does not fit")
    generation_kept = halved.memory.phases["generation"].peak == memory.phases["generation"].peak
    require(generation_kept and memory.peak_phase == "generation", "the halved micro-batch leaves generation")
    options = {kinds: peak for kinds, _, peak in fitting_combinations(before)}
    require(("offload",) in options, "the planner lists offload")
    ranked = list(options)
    require(ranked.index(("offload",)) < ranked.index(("no-gather",)), "offload ranks before layer-by-layer")
    others = ", ".join(
        f"{PHASE_NAMES[name].replace(' + ', ' and ')} {phase.peak / GB:.2f} GB"
        for name, phase in memory.phases.items()
        if name != memory.peak_phase
    )
    rows, accumulation = halved_work.micro_batch_rows, halved_work.gradient_accumulation
    config = f"configs/grpo/{stem}.yaml"
    launch = plans.launch(stem)
    lines = [
        wrap(
            f"A worked example: `{stem}` on {work.num_processes} {before.gpu['name']} cards, "
            f"ZeRO-{work.zero_stage}, whose plan peaks in {memory.peak_phase} at {memory.peak / GB:.2f} GB against "
            f"{usable:.2f} GB usable:"
        ),
        "",
        "```bash",
        f"python -m video_grpo.plan --config {config} \\",
        f"    --accelerate_config {launch} --gpu {gpu} --auto_fit",
        "```",
        "",
        "```",
        result.summary(),
        "```",
        "",
        wrap(
            f"- **Before:** {memory.peak / GB:.2f} GB in {memory.peak_phase} ({breakdown(before, digits=2)}); "
            f"{others}."
        ),
        wrap(
            f"- **What auto-fit changed:** checkpointing is already on; halving the micro-batch ({rows} x "
            f"{accumulation}, `steps_per_generation` {halved_work.generation_rows // rows}) leaves generation at "
            f"{halved.memory.phases['generation'].peak / GB:.2f} GB, since the generation batch is kept, and the "
            f"loss phase at {halved.memory.phases['loss'].peak / GB:.2f} GB: it does not fit. Layer-by-layer "
            "gathering does: `ds3_gather_for_generation: true -> false`, and generation then decodes eagerly: "
            "compiled decoding is off (`decode_path`: `compiled -> eager` in `auto_fit.json`, and the log says so)."
        ),
        wrap(
            f"- **After:** {after.memory.peak / GB:.2f} GB, now in the {PHASE_NAMES[after.memory.peak_phase]} "
            f"phase (generation {after.memory.phases['generation'].peak / GB:.2f} GB). The launch is unchanged: "
            f"`accelerate launch --config_file {launch} -m video_grpo.grpo --config {config} --auto_fit true` "
            "applies it on the cards and writes `auto_fit.json` with these numbers. (Not run here: no GPU. The "
            "preview above and `auto_fit.json` come from the same function.)"
        ),
        "",
        wrap(
            f"The planner ranks optimizer offload (`configs/accelerate/zero3_offload.yaml`, "
            f"{gb(options[('offload',)])}) before layer-by-layer gathering; it needs another launch, so auto-fit "
            f"does not take it, and `python -m video_grpo.plan` lists it. {other_recipes(plans, fit)}"
        ),
    ]
    return "\n".join(lines)


def other_recipes(plans: DocPlans, fit: FitFunction) -> str:
    """The same card's other outcome (a smaller micro-batch, with layer-by-layer gathering besides), and a recipe
    that stops on a smaller card."""
    stem, gpu = MICRO_BATCH
    smaller = fitted(plans, fit, stem, gpu)
    require(smaller.after is not None, f"{stem} fits {gpu}")
    micro_batch = {"per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation"}
    require(
        set(smaller.fields) == micro_batch | {"ds3_gather_for_generation"},
        f"{stem} fits by a smaller micro-batch and layer-by-layer gathering",
    )
    halved_work, _ = apply_kinds(smaller.before.work, ["micro-batch"]) or (None, None)
    require(halved_work is not None, f"{stem}'s micro-batch can be halved")
    halved = make_plan(smaller.before.shape, halved_work, smaller.before.gpu)
    require(
        not halved.fits and halved.memory.peak_phase == "generation",
        f"halving {stem}'s micro-batch alone leaves generation over the card",
    )
    fields = ", ".join(
        f"{name}: {str(value).lower() if isinstance(value, bool) else value}"
        for name, value in smaller.fields.items()
    )
    text = (
        f"On the same card, `{stem}` ({smaller.before.memory.peak / GB:.2f} GB, in the "
        f"{PHASE_NAMES[smaller.before.memory.peak_phase]} phase) gets a smaller micro-batch as well: halving it "
        f"alone leaves generation at {halved.memory.phases['generation'].peak / GB:.2f} GB, so auto-fit also "
        f"gathers layer by layer: `{fields}` ({smaller.after.memory.peak / GB:.2f} GB)."
    )
    stem, gpu = STOPS
    stopped = fitted(plans, fit, stem, gpu)
    require(stopped.after is None, f"{stem} stops on {gpu}")
    require(
        any("micro-batch" in reason for reason in stopped.excluded), f"{stem}'s micro-batch is left alone"
    )
    combinations = fitting_combinations(stopped.before, limit=8)
    require(
        [change for _, change, _ in combinations] == [change for change, _, _ in stopped.elsewhere],
        "the stop message lists the planner's combinations",
    )
    listed = [
        f"{' + '.join(KIND_NAMES[k] for k in kinds)} ({gb(peak, 2)}, "
        + ("keeps the mathematics, another launch)" if keeps else "changes the mathematics of a step)")
        for (kinds, _, peak), (_, _, keeps) in zip(combinations, stopped.elsewhere, strict=True)
    ]
    loss = recipe_values(plans.path(stem))["loss_type"]
    return (
        f"{text} On a {GPUS[gpu]['memory_gb']:g} GB card (`{gpu}`), `{stem}` (`loss_type: {loss}`) stops: its micro-batch is left alone, and the message "
        f"lists {join_words(listed)}."
    )
