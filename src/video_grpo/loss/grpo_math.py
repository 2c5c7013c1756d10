"""The GRPO objective as small pure functions, so it can be read, printed and checked.

These are the formulas TRL 1.16's ``GRPOTrainer`` applies (and therefore ``VideoGRPOTrainer``, which does not
change the loss): ``tests/test_grpo_math.py`` checks that :func:`grpo_loss` equals the trainer's loss on the
same batch. ``python -m video_grpo.explain`` prints worked examples.

For one prompt, G answers get rewards r_1..r_G. Then, per answer i and completion token t:

- advantage      A_i = (r_i - mean(r)) / (std(r) + 1e-4)       (TRL: unbiased std, i.e. divide by G-1)
- ratio          rho_it = pi_theta(o_it) / pi_old(o_it)
- surrogate      s_it = min(rho_it * A_i, clip(rho_it, 1 - eps_low, 1 + eps_high) * A_i)
- KL (k3)        kl_it = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1     (>= 0 always)
- token loss     l_it = -s_it + beta * rho_it * kl_it   (the rho factor is TRL's default
                 ``use_bias_correction_kl=True``, which makes the KL gradient unbiased; without it, beta * kl_it)
- loss           per-sequence ("grpo"): mean_i( mean_t l_it );  per-token ("bnpo"): sum_it l_it / #tokens

Ground-truth-guided groups (TempSamp-R1) change only the advantage: see :func:`shaped_advantages`.
"""

from __future__ import annotations

import math

import torch

STD_EPS = 1e-4


def group_advantages(
    rewards: torch.Tensor, group_size: int, std: str = "unbiased", scale: bool = True, eps: float = STD_EPS
) -> torch.Tensor:
    """Advantages of consecutive groups of ``group_size`` rewards.

    ``std="unbiased"`` divides the variance by G-1 (TRL's ``torch.std``); ``"population"`` by G.
    ``scale=False`` returns ``r - mean(r)`` (TRL's ``scale_rewards="none"``).
    """
    if std not in ("unbiased", "population"):
        raise ValueError(f"std must be 'unbiased' or 'population', got {std!r}")
    grouped = rewards.view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if not scale:
        return centred.reshape(-1)
    spread = grouped.std(dim=1, keepdim=True, correction=1 if std == "unbiased" else 0)
    return (centred / (spread + eps)).reshape(-1)


def clip_ratio(ratio: torch.Tensor, epsilon_low: float, epsilon_high: float | None = None) -> torch.Tensor:
    """The ratio clipped to [1 - eps_low, 1 + eps_high] (eps_high defaults to eps_low)."""
    high = epsilon_low if epsilon_high is None else epsilon_high
    return ratio.clamp(1 - epsilon_low, 1 + high)


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, epsilon_low: float, epsilon_high: float | None = None
) -> torch.Tensor:
    """PPO's pessimistic objective min(rho * A, clip(rho) * A), elementwise."""
    return torch.minimum(ratio * advantages, clip_ratio(ratio, epsilon_low, epsilon_high) * advantages)


def k3_kl(per_token_logps: torch.Tensor, ref_per_token_logps: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi_theta || pi_ref): exp(d) - d - 1 with d = log pi_ref - log pi_theta.

    Written as expm1(d) - d, which equals TRL's ``exp(d) - d - 1`` up to rounding but cannot round below 0
    for tiny d (TRL's form gives -1.1e-16 at d = 3.7e-9)."""
    delta = ref_per_token_logps - per_token_logps
    return torch.expm1(delta) - delta


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, level: str = "sequence") -> torch.Tensor:
    """Reduce (B, T) token losses to a scalar: mean of per-sequence means, or mean over all tokens."""
    if level == "sequence":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if level == "token":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    raise ValueError(f"level must be 'sequence' or 'token', got {level!r}")


def grpo_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon_low: float = 0.2,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    ref_per_token_logps: torch.Tensor | None = None,
    level: str = "sequence",
    kl_ratio_correction: bool = True,
) -> torch.Tensor:
    """The loss TRL minimises for ``loss_type="grpo"`` (level "sequence") or ``"bnpo"`` (level "token").

    ``kl_ratio_correction`` mirrors GRPOConfig's ``use_bias_correction_kl`` (default True).
    """
    ratio = torch.exp(per_token_logps - old_per_token_logps)
    per_token = -clipped_surrogate(ratio, advantages.unsqueeze(1), epsilon_low, epsilon_high)
    if beta != 0.0:
        if ref_per_token_logps is None:
            raise ValueError("beta != 0 needs ref_per_token_logps")
        kl = k3_kl(per_token_logps, ref_per_token_logps)
        per_token = per_token + beta * (kl * ratio if kl_ratio_correction else kl)
    return aggregate(per_token, mask, level)


# -- TempSamp-R1: ground-truth-guided groups and their advantage shaping ----------------------------------

SHAPING_METHODS = ("none", "tempsamp")
# TempSamp-R1 (Li et al., NeurIPS 2025, arXiv 2509.18056), Sec. 3.2 below Eq. (4): tau = 0.8, alpha_1 = 0.01,
# alpha_2 = 1.
TEMPSAMP_TAU, TEMPSAMP_ALPHA1, TEMPSAMP_ALPHA2 = 0.8, 0.01, 1.0


def tempsamp_shape(
    rewards: torch.Tensor,
    tau: float = TEMPSAMP_TAU,
    alpha1: float = TEMPSAMP_ALPHA1,
    alpha2: float = TEMPSAMP_ALPHA2,
) -> torch.Tensor:
    """TempSamp-R1's non-linear reward shaping, Eq. (4) of arXiv 2509.18056, elementwise:

        r~ = tau + alpha1 * ln((r - tau) + 1)                          if r >= tau
        r~ = tau - (exp(alpha2 * (tau - r)) - 1) / (exp(alpha2) - 1)   if r <  tau

    with the paper's tau = 0.8, alpha1 = 0.01, alpha2 = 1. Above tau the logarithm squeezes near-perfect answers
    (IoU 0.8 -> 0.8, IoU 1.0 -> 0.8018); below it the exponential stretches the gaps between poor answers
    (slope 1/(e-1) = 0.58 just below tau, e^0.8/(e-1) = 1.30 at 0). The curve is continuous at tau, increasing
    and concave, which is what keeps one very good answer from dominating its group (see
    :func:`shaped_advantages`). NaN stays NaN. The constants are stated for a reward on the IoU scale [0, 1].
    """
    if not alpha2 > 0:
        raise ValueError(f"alpha2 must be > 0, got {alpha2}")
    above = tau + alpha1 * torch.log1p(rewards - tau)
    below = tau - torch.expm1(alpha2 * (tau - rewards)) / math.expm1(alpha2)
    return torch.where(rewards >= tau, above, below)


def shaped_advantages(
    rewards: torch.Tensor,
    group_size: int,
    guided_mask: torch.Tensor | None = None,
    method: str = "none",
    scale: str = "group",
    tau: float = TEMPSAMP_TAU,
    alpha1: float = TEMPSAMP_ALPHA1,
    alpha2: float = TEMPSAMP_ALPHA2,
    eps: float = STD_EPS,
) -> torch.Tensor:
    """(B,) advantages from (B,) rewards laid out as consecutive groups of ``group_size`` answers to one prompt.

    ``guided_mask`` (B,) bool marks the off-policy answer of each group (the annotated span written as an
    answer); at most one per group. It is checked but does not change the arithmetic: TempSamp-R1 normalises
    sampled and guided answers together, over the joint group (Eq. 2 of arXiv 2509.18056):

        A_i = (r_i - mean(r_1..r_{G-1} U r_G)) / std(r_1..r_{G-1} U r_G)

    ``method``:

    - ``"none"``: exactly TRL 1.16's ``sum_then_normalize`` advantages for ``scale`` = ``"group"`` (group
      mean, unbiased group std + 1e-4), ``"batch"`` (group mean, batch std) or ``"none"`` (centring only);
      a NaN reward (an unscorable answer) is left out of the statistics and gets advantage 0.
    - ``"tempsamp"``: the rewards first pass through :func:`tempsamp_shape` (Eq. 4), then the same steps.

    Why the shaping: with a guided answer at IoU 1 in the group, the group mean can exceed every sampled
    reward, and then every sampled answer, the good ones too, is pushed down (Sec. 3.2). Eq. 4 is increasing
    and concave, so it shrinks the gap between the guided answer and the best sampled one at least as much as
    the gaps below it: with the guided answer on top, every group in which plain GRPO leaves a sampled answer
    at advantage >= 0 keeps one after shaping, and some groups in which plain GRPO makes them all negative no
    longer do (``tests/test_shaping.py``; ``python -m video_grpo.explain``, example (d)). With rewards in [0, 1],
    when the best sampled answer reaches tau and another is at least 0.01 below tau, a sampled answer always keeps
    advantage >= 0 (the guided lead above tau is at most 0.01 ln 1.2 = 0.0018; the step from tau - 0.01 to tau is
    0.0058).
    Shaping cannot help a group whose sampled answers are all equal and below the guided one: the mean of
    any such group lies above them.

    The paper does not say whether Eq. 4 sees the IoU reward alone or the sum with the format reward; its
    constants (tau = 0.8 on IoU) fit a reward in [0, 1]. This function shapes whatever (B,) reward it is given,
    so a caller that sums IoU and format (max 2) and wants the paper's scale should shape the IoU column with
    :func:`tempsamp_shape`, add the other weighted rewards, and call this with ``method="none"``.
    ``method="tempsamp"`` without any guided row is allowed: it is then reward shaping alone.

    Other TempSamp-R1 variants (Sec. 3.2: reward downscaling, advantage anchoring with lambda_off = 1.2, Eq. 3)
    are not implemented; Table 4 of the paper finds Eq. 4 the best of the three.
    """
    if method not in SHAPING_METHODS:
        raise ValueError(f"method must be one of {SHAPING_METHODS}, got {method!r}")
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be (B,), got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"group_size {group_size} does not divide the {rewards.numel()} rewards")
    if guided_mask is not None:
        if guided_mask.shape != rewards.shape or guided_mask.dtype != torch.bool:
            raise ValueError(
                f"guided_mask must be a bool tensor of shape {tuple(rewards.shape)}, got "
                f"{guided_mask.dtype} {tuple(guided_mask.shape)}"
            )
        per_group = guided_mask.view(-1, group_size).sum(dim=1)
        if (per_group > 1).any():
            bad = int(torch.nonzero(per_group > 1)[0])
            raise ValueError(f"group {bad} has {int(per_group[bad])} guided answers; at most one per group")
    values = tempsamp_shape(rewards, tau, alpha1, alpha2) if method == "tempsamp" else rewards
    grouped = values.view(-1, group_size)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    advantages = grouped - mean
    if scale == "group":
        spread = _nanstd(grouped, dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(mean)
        advantages = advantages / (spread + eps)
    elif scale == "batch":
        spread = _nanstd(values) if values.numel() > 1 else torch.zeros(())
        advantages = advantages / (spread + eps)
    return torch.nan_to_num(advantages.reshape(-1), nan=0.0)


def _nanstd(values: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Unbiased std ignoring NaN, as ``trl.trainer.utils.nanstd``."""
    mean = torch.nanmean(values, dim=dim, keepdim=True)
    squares = torch.nanmean((values - mean) ** 2, dim=dim, keepdim=keepdim)
    count = (~torch.isnan(values)).sum(dim=dim, keepdim=keepdim)
    correction = torch.where(
        count > 1, count / (count - 1).clamp(min=1), torch.full_like(squares, float("nan"))
    )
    return (squares * correction).sqrt()
