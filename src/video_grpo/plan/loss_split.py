"""Whether TRL 1.16's optimizer step depends on how a generation batch is split into micro-batches.

Auto-fit's ``micro-batch`` change halves the micro-batch and doubles the accumulation and ``steps_per_generation``:
the generation batch and the optimizer batch (rows per micro-batch x micro-batches per step) stay. Read from
``GRPOTrainer._compute_loss`` (TRL 1.16): every term before the normaliser is a row's own (the clipped or gated
ratio, sapo's gate, cispo's clamp, vespo's per-row Gamma weight, the KL term, the off-policy mask) and the
advantages come from the whole generation batch, so the step depends on the split only through what a micro-batch's loss is
divided by, and through whatever is computed over a micro-batch's tokens as a whole:

- the normaliser, per ``loss_type`` (:data:`EXACT_NORMALISERS`, :data:`SPLIT_NORMALISERS`);
- the entropy bonus (``entropy_coef != 0`` or ``use_adaptive_entropy``): a mean over each micro-batch's own tokens,
  divided by the accumulation, whatever the loss;
- ``top_entropy_quantile < 1``: the entropy threshold is a quantile of each micro-batch's tokens.

(The MoE router's auxiliary loss is per micro-batch too; the families video_grpo supports are dense.)
tests/test_auto_fit_math.py trains every loss both ways through TRL's own loss and checks that the cases
:func:`micro_batch_refusal` accepts are the ones whose gradients agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

# What each loss divides a micro-batch's summed token loss by, when that does not depend on the split
EXACT_NORMALISERS = {
    "grpo": "each row's mean token loss, divided by rows x accumulation",
    "dr_grpo": "rows x max_completion_length x accumulation",
    "dapo": "the generation batch's token count x accumulation / steps_per_generation (the two double together)",
    "cispo": "dapo's: the generation batch's token count x accumulation / steps_per_generation",
    "sapo": "grpo's: each row's mean token loss, divided by rows x accumulation",
    "luspo": "each row's summed token loss, averaged over rows and divided by the accumulation (at either "
    "importance_sampling_level; TRL only warns when it is not 'sequence')",
    "vespo": "dapo's: the generation batch's token count x accumulation / steps_per_generation",
}
# Losses whose normaliser is the micro-batch's own, with the reason another split changes the step
SPLIT_NORMALISERS = {
    "bnpo": "divides each micro-batch's summed token loss by that micro-batch's own token count, so another split "
    "weighs the tokens differently",
}
MICRO_BATCH_EXACT_LOSSES = tuple(EXACT_NORMALISERS)
TRL_LOSSES = (*EXACT_NORMALISERS, *SPLIT_NORMALISERS)  # every loss_type GRPOConfig accepts in TRL 1.16


@dataclass(frozen=True)
class LossSettings:
    """The ``GRPOConfig`` fields that decide whether a step depends on the micro-batch split (TRL's defaults)."""

    loss_type: str = "dapo"
    top_entropy_quantile: float = 1.0
    entropy_coef: float = 0.0
    use_adaptive_entropy: bool = False

    @classmethod
    def of(cls, source: Any) -> LossSettings:
        """From a ``GRPOConfig`` (or any object with those attributes) or a recipe's values (a mapping); a field
        it lacks keeps TRL's default."""
        if isinstance(source, Mapping):
            return cls(**{f.name: source.get(f.name, f.default) for f in fields(cls)})
        return cls(**{f.name: getattr(source, f.name, f.default) for f in fields(cls)})


def micro_batch_refusal(settings: LossSettings | str) -> str | None:
    """Why another micro-batch split would change this run's optimizer step; None when it would not (to
    floating-point rounding). ``settings``: a :class:`LossSettings`, or a loss type alone with TRL's defaults."""
    if isinstance(settings, str):
        settings = LossSettings(loss_type=settings)
    reasons = []
    exact = ", ".join(MICRO_BATCH_EXACT_LOSSES)
    loss = settings.loss_type
    if loss in SPLIT_NORMALISERS:
        reasons.append(f"loss_type {loss!r} {SPLIT_NORMALISERS[loss]} (the micro-batch is free for {exact})")
    elif loss not in EXACT_NORMALISERS:
        reasons.append(
            f"loss_type {loss!r} is none of TRL 1.16's losses ({', '.join(TRL_LOSSES)}): its normaliser is unknown"
        )
    if settings.entropy_coef != 0.0 or settings.use_adaptive_entropy:
        which = (
            "use_adaptive_entropy: true"
            if settings.use_adaptive_entropy
            else f"entropy_coef {settings.entropy_coef}"
        )
        reasons.append(
            f"the entropy bonus ({which}) is TRL's mean entropy over each micro-batch's own tokens, so another "
            "split weighs the tokens differently"
        )
    if settings.top_entropy_quantile < 1.0:
        reasons.append(
            f"top_entropy_quantile {settings.top_entropy_quantile} keeps a quantile of each micro-batch's tokens "
            "by entropy, so another split keeps other tokens"
        )
    return "; ".join(reasons) or None
