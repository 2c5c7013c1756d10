"""TimeLens2's draw weights: put the queries the starting model gets wrong early in each epoch's order.

    weight(q) = (1 - mean_iou(q) + 1e-8) ** power,        p(q) = weight(q) / (sum of all weights)

``mean_iou(q)`` is the mean tIoU of the starting (SFT) model's k sampled answers to query q, measured once,
offline, before GRPO (here ``python -m video_grpo.curate``, its ``per_query.jsonl``), clipped to [0, 1]. A query
with fewer than 2 answers there (``k`` < 2), or with no line at all, counts as mean 0, the largest weight, as
TimeLens2 counts a query without at least two rollouts.

The draw. Each epoch, the N training rows are put in a weighted order without replacement (TimeLens2's
``torch.multinomial(p, N, replacement=False)``): the first row is drawn with probability p, the next from the rest
in proportion to their p, and so on. The order is then cut into generation batches of prompts in TRL's layout
(the last, incomplete batch dropped; each prompt G times in a row, the batch repeated for reused generations),
and rewards, advantages and the loss are computed as before. So every query is still trained on once per epoch;
what the weight changes is *when*: a run that stops long before the epoch ends, as TimeLens2's does (a few hundred
steps of 8 prompts over their whole data), trains mostly on the hard queries. The
metric ``sample_weight/relative_weight`` is the mean N p(q) of a batch's drawn prompts: above 1 early in an
epoch, below 1 late, 1 on average over a whole one.

Why: a query the model already solves (mean tIoU near 1) gives GRPO little to learn from; power 2 makes a
query at mean tIoU 0.1 (0.9 / 0.2)^2 = 20.25 times as likely as one at 0.8 to be drawn next, without dropping any
query (unlike ``curate``'s band, which removes them).

Every rank makes the same order (one generator seeded with the run's seed) and Accelerate gives each its slice,
as with TRL's sampler. Epoch e's order is the (e + 1)-th multinomial call of a generator seeded once, as in
TimeLens2, where one process iterates the sampler epoch after epoch; here it is recomputed from (seed, e) when the
trainer names the epoch (``set_epoch``, :class:`SamplerEpoch`), so a run resumed in epoch e continues epoch e's
order, transformers skipping the batches already trained, instead of replaying epoch 0's.

Source (read, not copied): MCG-NJU/TimeLens2 ``grpo/timelens/rewards/sampling.py`` (``build_sample_weights``:
``(std + eps)^std_power * (1 - mean + eps)^mean_power``, eps 1e-8, mean clipped to [0, 1], mean 0 for fewer than
2 rollouts, divided by the sum over all training queries); ``grpo/timelens/data/dataset.py`` (``HybridDataset``
computes them once, over every source); ``grpo/timelens/trainer.py`` at commit 2eb53e2 (``RepeatSampler`` with
``weights``: the multinomial order of all N rows without replacement from a generator seeded once, then TRL's
chunks); ``grpo/scripts/train_grpo_{4b,8b}.sh`` (``SAMPLE_WEIGHT_STD_POWER=0``, ``SAMPLE_WEIGHT_MEAN_POWER=2``,
``SAMPLE_WEIGHT_MEAN_SPEC=tiou``: the mean is over the tIoU reward alone). The released std power is 0, which makes
the std factor 1; it is not implemented here. The weights are rounded as TimeLens2 rounds them (normalised in
float32, renormalised in float64 for the draw): kept in float64 throughout, a few rows of a long order move (0.15%
of 193K rows, in a check with random weights).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch.utils.data import Sampler
from transformers import TrainerCallback

EPS = 1e-8  # TimeLens2's: a query every answer of which was exact keeps a tiny, nonzero weight
MIN_ANSWERS = 2  # TimeLens2's: with fewer rollouts a query's mean counts as 0

logger = logging.getLogger(__name__)


def mean_reward_weights(mean_rewards: Sequence[float], power: float) -> torch.Tensor:
    """Draw probabilities (float64, summing to 1), one per query, from each query's mean reward, rounded as
    TimeLens2 rounds them: the weights in float64, normalised in float32, then renormalised in float64 for the
    draw. The same probabilities give the same order from the same generator state as theirs."""
    if not mean_rewards:
        raise ValueError("mean_reward_weights: no queries")
    means = torch.tensor(mean_rewards, dtype=torch.float64).clamp(0.0, 1.0)
    weights = (1.0 - means + EPS) ** power
    if not (weights > 0).all():  # an order of all N rows needs every weight > 0
        raise ValueError(
            f"sample_weight_mean_power: {power} makes the weight of a solved query (1e-8^{power}) underflow to 0; "
            "use a smaller power (TimeLens2: 2)"
        )
    single = weights.float()
    single = (single / single.sum()).double()
    return single / single.sum()


def read_mean_rewards(path: str | Path, field: str = "mean_iou") -> dict[str, float]:
    """``id -> field`` from a per-query JSONL (curate's ``per_query.jsonl``); a line whose ``k`` (answers scored) is
    below 2 gives 0, as TimeLens2 counts a query with fewer than two rollouts. Errors name the file, line and the
    recipe field to fix."""
    from video_grpo.data.annotations import iter_jsonl_objects

    means: dict[str, float] = {}
    for _, where, record in iter_jsonl_objects(path, ValueError):
        if "id" not in record:
            raise ValueError(f"sample_weight_file: {where} has no 'id'; one line per query with its id")
        if field not in record:
            raise ValueError(
                f"sample_weight_field: {field!r} is not a field of {where} (it has {sorted(record)}); set "
                "sample_weight_field to the one holding each query's mean reward (curate writes mean_iou)"
            )
        value, answers = record[field], record.get("k")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"sample_weight_field: {where}: {field} must be a finite number, got {value!r}")
        if answers is not None and (isinstance(answers, bool) or not isinstance(answers, int) or answers < 0):
            raise ValueError(f"sample_weight_file: {where}: k must be a count of answers, got {answers!r}")
        means[str(record["id"])] = 0.0 if answers is not None and answers < MIN_ANSWERS else float(value)
    if not means:
        raise ValueError(f"sample_weight_file: {path} holds no queries")
    return means


def draw_weights(ids: Sequence[str], path: str | Path, field: str, power: float) -> torch.Tensor:
    """The draw probability of each training row (``ids`` in dataset order) from the per-query file. A row without
    a line there counts as mean 0 (the largest weight; one warning gives the count); none at all is an error, as
    that is almost surely another data set's file."""
    means = read_mean_rewards(path, field)
    missing = [i for i in ids if str(i) not in means]
    if len(missing) == len(ids):
        raise ValueError(
            f"sample_weight_file: none of the {len(ids)} training queries (first: {list(ids[:3])}) has an entry in "
            f"{path} (its first: {list(means)[:3]}); run curate on this recipe's training data (python -m "
            "video_grpo.curate --config <recipe>) so that the ids match"
        )
    if missing:
        logger.warning(
            f"sample_weight_file: {len(missing)} of {len(ids)} training queries have no entry in {path} (first: "
            f"{missing[:5]}); they count as mean {field} 0, the largest weight, as TimeLens2 counts a query without "
            "rollouts"
        )
    return mean_reward_weights([means.get(str(i), 0.0) for i in ids], power)


def relative_weights(probabilities: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
    """N p(q) for each row index (NaN for -1, a row of unknown index): 1 is what a uniform draw gives."""
    index = torch.tensor(rows, dtype=torch.long)
    values = probabilities[index.clamp(min=0)] * len(probabilities)
    return torch.where(index >= 0, values, torch.full_like(values, float("nan")))


class WeightedRepeatSampler(Sampler[int]):
    """TRL's ``RepeatSampler`` layout over TimeLens2's weighted order of all rows, one order per epoch.

    Each epoch the N rows are ordered by ``torch.multinomial(probabilities, N, replacement=False)``; the order is
    cut into chunks of ``batch_size`` prompts (an incomplete last chunk dropped), each prompt yielded
    ``mini_repeat_count`` (G) times in a row and each chunk ``repeat_count`` times, so a group's G rows stay
    together and reused generations line up, as in TRL. Epoch e's order is the (e + 1)-th draw of a generator
    seeded with ``seed``: the same on every rank, and the same after a resume as in the uninterrupted run, as
    long as the trainer names the epoch (:meth:`set_epoch`; without it, each iteration is the next epoch)."""

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
        # Unseeded: one random seed, drawn here (TRL leaves its generator unseeded then; the trainer always seeds)
        self.seed = int(torch.randint(0, 2**62, ())) if seed is None else seed
        self.epoch = 0
        self._generator: torch.Generator | None = None
        self._next_epoch = 0  # the epoch whose order the generator's next draw is

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration orders (transformers and :class:`SamplerEpoch` call it before each)."""
        self.epoch = epoch

    def order(self, epoch: int) -> list[int]:
        """Epoch ``epoch``'s order of the row indices: the generator's draws are replayed from the seed when an
        earlier epoch is asked for (a fresh process resuming asks for its epoch first)."""
        if self._generator is None or self._next_epoch > epoch:
            self._generator = torch.Generator()
            self._generator.manual_seed(self.seed)
            self._next_epoch = 0
        while True:
            drawn = torch.multinomial(
                self.probabilities, self.num_samples, replacement=False, generator=self._generator
            )
            self._next_epoch += 1
            if self._next_epoch > epoch:
                return drawn.tolist()

    def __iter__(self) -> Iterator[int]:
        ordered = self.order(self.epoch)
        self.epoch += 1  # an iteration nobody names is the next epoch, as with a generator seeded once
        chunks = len(ordered) // self.batch_size  # whole chunks only (TRL drops the rest)
        for start in range(0, chunks * self.batch_size, self.batch_size):
            chunk = ordered[start : start + self.batch_size]
            for _ in range(self.repeat_count):
                for index in chunk:
                    for _ in range(self.mini_repeat_count):
                        yield index

    def __len__(self) -> int:
        draws = (self.num_samples // self.batch_size) * self.batch_size
        return draws * self.mini_repeat_count * self.repeat_count


class SamplerEpoch(TrainerCallback):
    """Names each epoch to the weighted sampler before the trainer iterates it. transformers' own ``set_epoch``
    call does not reach a sampler under Accelerate's batch-skipping wrapper in a multi-process resume
    (``SkipBatchSampler`` around ``BatchSamplerShard``), so a resumed run would otherwise order its epoch as the
    first. The epoch is the whole part of ``state.epoch``: the loop's epoch at its start, also after a resume."""

    def __init__(self) -> None:
        self.sampler: WeightedRepeatSampler | None = None

    def on_epoch_begin(self, args, state, control, **kwargs) -> None:
        if self.sampler is not None:
            self.sampler.set_epoch(int(math.floor(state.epoch or 0)))
