"""The real training entry point, launched by ``accelerate launch tests/launch_probe.py --config ...``, with
probes that only observe. Each rank writes ``<output_dir>/probe.rank<R>.json``:

- ``rows_compared`` / ``rows_differing``: every row of every forward after generation (old policy, reference,
  loss) against the 3-D positions generation gave the same prompt;
- ``generation_seconds`` / ``later_seconds``: the ``second_per_grid_ts`` values (and dtypes) each side got;
- ``encoder_runs`` / ``generation_batches``: vision-tower forwards (policy and reference) and generation batches,
  during training and during evaluation;
- ``eval_metrics``: what ``evaluate()`` returned (eval_strategy steps runs it during training too);
- ``shared_prefix``: whether the trainer packed rows by prompt, and the token positions the packed forwards
  carried against what the plain forwards would have (``video_grpo.inputs.prefix``);
- ``weight_pointers``: for each generation call, the data pointers of the language model's weights as generation
  sees them (ZeRO-3 gathers them for it: do they keep their addresses, as CUDA graphs would need?);
- ``decode``: the compiled decoder's counts (``video_grpo.rollout.decode``), when ``decode_compile`` is on.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import torch
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen

import video_grpo.grpo as entry
from video_grpo.rollout import prefill

RECORD: dict = {
    "rows_compared": 0,
    "rows_differing": 0,
    "generation_seconds": [],
    "later_seconds": [],
    "dtypes": Counter(),
    "encoder_runs": Counter(),
    "generation_batches": Counter(),
    "eval_metrics": [],
    "weight_pointers": [],
}
STATE = {"in_generation": False, "phase": "train"}
GENERATED: dict[tuple, torch.Tensor] = {}  # prompt ids -> their positions at generation

rope_index = qwen.Qwen2_5_VLModel.get_rope_index  # whatever the package installed


def spy_rope_index(self, input_ids, *args, **kwargs):
    positions, deltas = rope_index(self, input_ids, *args, **kwargs)
    mask = kwargs.get("attention_mask")
    seconds = kwargs.get("second_per_grid_ts")
    side = "generation" if STATE["in_generation"] else "later"
    if seconds is not None:
        RECORD[f"{side}_seconds"] += seconds.double().tolist()
        RECORD["dtypes"][f"{side}:second_per_grid_ts:{seconds.dtype}"] += 1
    for row in range(input_ids.shape[0]):
        keep = mask[row].bool() if mask is not None else torch.ones_like(input_ids[row], dtype=torch.bool)
        ids, row_positions = tuple(input_ids[row][keep].tolist()), positions[:, row, keep].cpu()
        if STATE["in_generation"]:
            GENERATED[ids] = row_positions
            continue
        prompt = next((p for p in GENERATED if ids[: len(p)] == p), None)
        if prompt is not None:
            RECORD["rows_compared"] += 1
            RECORD["rows_differing"] += int(
                not torch.equal(row_positions[:, : len(prompt)], GENERATED[prompt])
            )
    return positions, deltas


prepare_positions = qwen.Qwen2_5_VLForConditionalGeneration._prepare_position_ids_for_generation


def spy_generation_positions(self, *args, **kwargs):
    STATE["in_generation"] = True
    try:
        return prepare_positions(self, *args, **kwargs)
    finally:
        STATE["in_generation"] = False


one_prefill = prefill.generate


def spy_one_prefill(*args, **kwargs):
    """With shared_prefix, generation's positions come from one prefill per prompt (video_grpo.rollout.prefill)."""
    language = prefill.language_backbone(args[0]).language_model
    RECORD["weight_pointers"].append([p.data_ptr() for p in language.parameters()])
    STATE["in_generation"] = True
    try:
        return one_prefill(*args, **kwargs)
    finally:
        STATE["in_generation"] = False


qwen.Qwen2_5_VLModel.get_rope_index = spy_rope_index
qwen.Qwen2_5_VLForConditionalGeneration._prepare_position_ids_for_generation = spy_generation_positions
prefill.generate = spy_one_prefill


class ProbeTrainer(entry.VideoGRPOTrainer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        towers = [self.model.model.visual] + (
            [self.ref_model.model.visual] if self.ref_model is not None else []
        )
        for tower in towers:
            tower.register_forward_hook(
                lambda module, args, output: RECORD["encoder_runs"].update([STATE["phase"]])
            )
        RECORD["dtypes"][f"vision_tower:{next(self.model.model.visual.parameters()).dtype}"] += 1

    def _generate_and_score_completions(self, inputs):
        RECORD["generation_batches"][STATE["phase"]] += 1
        return super()._generate_and_score_completions(inputs)

    def evaluate(self, *args, **kwargs):
        STATE["phase"] = "eval"
        try:
            metrics = super().evaluate(*args, **kwargs)
        finally:
            STATE["phase"] = "train"
        RECORD["eval_metrics"].append(metrics)
        return metrics

    def train(self, *args, **kwargs):
        result = super().train(*args, **kwargs)
        RECORD["shared_prefix"] = {
            "on": self.shared_prefix,
            "plain_positions": self.prefix_positions[0],
            "packed_positions": self.prefix_positions[1],
        }
        if self.decoder is not None:
            stats = self.decoder.stats
            RECORD["decode"] = {
                "graphs": stats.graphs,
                "compiled_steps": stats.compiled_steps,
                "calls": stats.calls,
                "fallbacks": stats.fallbacks,
                "cuda_graphs": self.decoder.settings.cuda_graphs,
            }
        out = Path(self.args.output_dir) / f"probe.rank{self.accelerator.process_index}.json"
        out.write_text(json.dumps(RECORD, default=dict))
        return result


entry.VideoGRPOTrainer = ProbeTrainer

if __name__ == "__main__":
    from launch_entry import record_end  # this script's folder is on the path
    from video_grpo.runtime.distributed import exit_process

    script_args, training_args, model_args = entry.parse_args(sys.argv[1:])
    record_end(Path(training_args.output_dir), entry.main(script_args, training_args, model_args))
    exit_process(0)
