"""Ground-truth-guided groups (TempSamp-R1, Li et al., NeurIPS 2025, arXiv 2509.18056).

With ``gt_guidance``, each group of G answers to one query holds G-1 answers sampled from the policy and one
off-policy answer: the annotated span written with ``answer_template``. It is the last answer of its group,
counted over the whole gathered batch (a group may span two ranks), and it goes through the same reward,
log-probability and loss computations as the sampled ones; only its tokens come from the annotation.

``advantage_shaping: tempsamp`` reshapes the accuracy reward (the first entry of ``reward_funcs``, an IoU in
every shipped recipe) with the paper's Eq. 4 (:func:`video_grpo.loss.grpo_math.tempsamp_shape`) before TRL's group
normalisation; the other rewards (format ...) are added unshaped with their weights. Without it the guided
answer's IoU of 1 lifts the group mean above every sampled answer, good ones included.
"""

from __future__ import annotations

import pyarrow.compute as pc
import torch

from video_grpo.loss.grpo_math import TEMPSAMP_TAU, shaped_advantages, tempsamp_shape
from video_grpo.rewards.answers import ANSWER_DECIMALS, render_solution


def guided_mask(process_index: int, local_rows: int, group_size: int) -> list[bool]:
    """Which of this rank's rows carry the guided answer: the last of each group in the gathered batch, whose
    rows are the ranks' rows in rank order (TRL's layout)."""
    start = process_index * local_rows
    return [(start + i) % group_size == group_size - 1 for i in range(local_rows)]


def guided_completion_ids(
    tokenizer, row: dict, template: str, eos_token_id: int, decimals: int = ANSWER_DECIMALS
) -> list[int]:
    """The guided answer's tokens: the row's annotated span in ``template``, then end-of-turn, as a sampled answer
    would end. The span has ``decimals`` places, by default ``ANSWER_DECIMALS``, the cold start's precision: the
    guided answer is then one the policy could have sampled, not a digit pattern it never writes."""
    text = render_solution(template, row["solution"], row.get("sentence", ""), decimals=decimals)
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [eos_token_id]


def check_guided_template(template: str, dataset, where: dict[str | None, str]) -> None:
    """Refuse, before the model loads, a one-span ``answer_template`` ({start}/{end}) over training data with
    multi-span queries: the guided answer must write every annotated span, and ``answers.render_solution`` would
    otherwise raise inside the first generation that draws such a query. ``where`` describes the file a row comes
    from, keyed by the row's ``data_source`` (None for a single ``train_file``). Reads the Arrow columns only."""
    if "{start}" not in template and "{end}" not in template:
        return
    table = dataset.data
    solutions = table.column("solution")
    if not hasattr(solutions.type, "value_type") or not hasattr(solutions.type.value_type, "value_type"):
        return  # every solution is one [s, e]
    lengths = pc.list_value_length(solutions)
    first = pc.index(pc.greater(lengths, 1), True).as_py()
    if first < 0:
        return
    query_id = table.column("id")[first].as_py()
    source = table.column("data_source")[first].as_py() if "data_source" in table.column_names else None
    raise ValueError(
        f"gt_guidance: answer_template {template!r} writes one span ({{start}}/{{end}}), but {where[source]} has "
        f"queries with several spans (the first: {query_id}, {lengths[first].as_py()} spans), and the guided answer "
        "must write all of them. Set answer_template to one with {spans} (every span as [[S, E], ...]), e.g. "
        "video_grpo.rewards.answers.JSON_ANSWER_TEMPLATE, or set gt_guidance: false."
    )


def group_advantages(
    rewards_per_func: torch.Tensor,
    weights: torch.Tensor,
    group_size: int,
    guided: torch.Tensor,
    shaping: str,
    scale: str,
    tau: float = TEMPSAMP_TAU,
    miss_below: float | None = None,
) -> torch.Tensor:
    """(B,) advantages for the gathered batch: TRL's ``sum_then_normalize`` with the accuracy reward (column 0)
    reshaped by Eq. 4 (threshold ``tau``) when ``shaping`` is ``"tempsamp"``. An answer no reward function could
    score gets 0.

    ``miss_below``: guide only the groups whose sampled answers all miss, i.e. all have an accuracy reward below
    it. In every other group the guided answer is left out of the group's statistics and gets advantage 0, so
    that group is plain GRPO over its sampled answers. ``None`` (the default, TempSamp-R1) guides every group."""
    rewards = rewards_per_func.clone()
    if shaping == "tempsamp":
        rewards[:, 0] = tempsamp_shape(rewards[:, 0], tau=tau)
    total = (rewards * weights.to(rewards.device).unsqueeze(0)).nansum(dim=1)
    total[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    if miss_below is not None:
        guided = guided.to(total.device)
        accuracy = rewards_per_func[:, 0].masked_fill(guided, float("-inf")).nan_to_num(nan=float("-inf"))
        hit = (accuracy.view(-1, group_size) >= miss_below).any(dim=1, keepdim=True).expand(-1, group_size)
        total[guided & hit.reshape(-1)] = torch.nan
    return shaped_advantages(total, group_size, guided_mask=guided, method="none", scale=scale)
