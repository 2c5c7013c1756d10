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
"""

from __future__ import annotations

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
