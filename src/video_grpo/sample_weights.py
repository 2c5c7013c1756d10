"""TimeLens2's draw weights: train more often on the queries the starting model gets wrong.

    weight(q) = (1 - mean_iou(q) + 1e-8) ** power,        p(q) = weight(q) / (sum of all weights)

``mean_iou(q)`` is the mean tIoU of the starting (SFT) model's k sampled answers to query q, measured once,
offline, before GRPO (here ``python -m video_grpo.curate``, its ``per_query.jsonl``), clipped to [0, 1]. With
the option on, each generation batch's prompts are drawn with probability p, with replacement, instead of
TRL's shuffled pass; each drawn prompt still gets its G answers, and rewards, advantages and the loss are
computed as before. The weight changes how often a query is trained on, not how much one step on it counts:
over many steps a query's share of the summed loss goes from 1/N (N queries) to p(q), a factor N p(q).

Why: a query the model already solves (mean tIoU near 1) gives GRPO little to learn from; power 2 makes a
query at mean tIoU 0.1 drawn (0.9 / 0.2)^2 = 20.25 times as often as one at 0.8, without dropping any query
(unlike ``curate``'s band, which removes them).

Source (read, not copied): MCG-NJU/TimeLens2 ``grpo/timelens/rewards/sampling.py`` (``build_sample_weights``:
``(std + eps)^std_power * (1 - mean + eps)^mean_power``, eps 1e-8, mean clipped to [0, 1], divided by the sum
over all training queries); ``grpo/timelens/data/dataset.py`` (``HybridDataset`` computes them once, over every
source, as "sampling weights"); ``grpo/scripts/train_grpo_{4b,8b}.sh`` (``SAMPLE_WEIGHT_STD_POWER=0``,
``SAMPLE_WEIGHT_MEAN_POWER=2``, ``SAMPLE_WEIGHT_MEAN_SPEC=tiou``: the mean is over the tIoU reward alone, not
the training reward twass1 + tiou + parse_penalty). The released std power is 0, which makes the std factor 1;
it is not implemented here. The trainer file that consumes their weights was not in the copy of the repository we could
read, so the draw itself (with replacement, N draws an epoch, one seeded generator shared by every rank) is ours.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch.utils.data import Sampler

EPS = 1e-8  # TimeLens2's: a query every answer of which was exact keeps a tiny, nonzero weight


def mean_reward_weights(mean_rewards: Sequence[float], power: float) -> torch.Tensor:
    """Draw probabilities (float64, summing to 1), one per query, from each query's mean reward."""
    if not mean_rewards:
        raise ValueError("mean_reward_weights: no queries")
    means = torch.tensor(mean_rewards, dtype=torch.float64).clamp(0.0, 1.0)
    weights = (1.0 - means + EPS) ** power
    return weights / weights.sum()


def read_mean_rewards(path: str | Path, field: str = "mean_iou") -> dict[str, float]:
    """``id -> field`` from a per-query JSONL (curate's ``per_query.jsonl``). Errors name the file, line and the
    recipe field to fix."""
    from video_grpo.annotations import iter_jsonl_objects

    means: dict[str, float] = {}
    for _, where, record in iter_jsonl_objects(path, ValueError):
        if "id" not in record:
            raise ValueError(f"sample_weight_file: {where} has no 'id'; one line per query with its id")
        if field not in record:
            raise ValueError(
                f"sample_weight_field: {field!r} is not a field of {where} (it has {sorted(record)}); set "
                "sample_weight_field to the one holding each query's mean reward (curate writes mean_iou)"
            )
        value = record[field]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"sample_weight_field: {where}: {field} must be a finite number, got {value!r}")
        means[str(record["id"])] = float(value)
    if not means:
        raise ValueError(f"sample_weight_file: {path} holds no queries")
    return means


def draw_weights(ids: Sequence[str], path: str | Path, field: str, power: float) -> torch.Tensor:
    """The draw probability of each training row (``ids`` in dataset order) from the per-query file."""
    means = read_mean_rewards(path, field)
    missing = [i for i in ids if str(i) not in means]
    if missing:
        raise ValueError(
            f"sample_weight_file: {len(missing)} of {len(ids)} training queries have no entry in {path} "
            f"(first: {missing[:5]}); run curate on the same train_file (python -m video_grpo.curate) so that "
            "every query has its mean IoU"
        )
    return mean_reward_weights([means[str(i)] for i in ids], power)


def relative_weights(probabilities: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
    """N p(q) for each row index (NaN for -1, a row of unknown index): 1 is what a uniform draw gives."""
    index = torch.tensor(rows, dtype=torch.long)
    values = probabilities[index.clamp(min=0)] * len(probabilities)
    return torch.where(index >= 0, values, torch.full_like(values, float("nan")))


class WeightedRepeatSampler(Sampler[int]):
    """TRL's ``RepeatSampler`` layout with weighted draws in place of its shuffled pass.

    ``batch_size`` prompts are drawn (with replacement, probability ``probabilities``) per chunk; each is yielded
    ``mini_repeat_count`` (G) times in a row and the chunk ``repeat_count`` times, so a group's G rows stay
    together and reused generations line up, as in TRL. The generator is seeded once, so every rank draws the
    same sequence and takes its own slice of it (Accelerate shards the batches), as with TRL's sampler."""

    def __init__(
        self,
        probabilities: torch.Tensor,
        mini_repeat_count: int,
        batch_size: int = 1,
        repeat_count: int = 1,
        seed: int | None = None,
    ) -> None:
        self.probabilities = probabilities.double()
        self.num_samples = len(probabilities)
        self.mini_repeat_count = mini_repeat_count
        self.batch_size = batch_size
        self.repeat_count = repeat_count
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)

    def __iter__(self) -> Iterator[int]:
        # N draws an epoch, in whole chunks only (TRL drops the rest)
        chunks = self.num_samples // self.batch_size
        drawn = torch.multinomial(
            self.probabilities, chunks * self.batch_size, replacement=True, generator=self.generator
        ).tolist()
        for start in range(0, len(drawn), self.batch_size):
            chunk = drawn[start : start + self.batch_size]
            for _ in range(self.repeat_count):
                for index in chunk:
                    for _ in range(self.mini_repeat_count):
                        yield index

    def __len__(self) -> int:
        draws = (self.num_samples // self.batch_size) * self.batch_size
        return draws * self.mini_repeat_count * self.repeat_count
