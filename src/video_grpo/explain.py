"""Print worked GRPO examples, computed by :mod:`video_grpo.loss.grpo_math` and :mod:`video_grpo.data.sample_weights` (the
trainer's own formulas).

python -m video_grpo.explain
"""

from __future__ import annotations

import math

import torch

from video_grpo.data.sample_weights import mean_reward_weights
from video_grpo.loss.grpo_math import (
    TEMPSAMP_ALPHA1,
    TEMPSAMP_ALPHA2,
    TEMPSAMP_TAU,
    clip_ratio,
    group_advantages,
    k3_kl,
    shaped_advantages,
    tempsamp_shape,
)


def _fmt(values) -> str:
    return "[" + ", ".join(f"{v:+.4f}" for v in values) + "]"


def example_a() -> list[str]:
    rewards = torch.tensor([0.6, 0.9, 0.1, 0.4])
    ratios = torch.tensor([1.3, 1.1, 0.8, 1.2])
    eps, beta = 0.2, 0.01
    lines = [
        "(a) One group of 4 answers, eps = 0.2, beta = 0.01.",
        f"    rewards {[round(r, 4) for r in rewards.tolist()]}, ratios pi_theta/pi_old "
        f"{[round(r, 4) for r in ratios.tolist()]}",
        f"    mean reward = {rewards.mean():.4f}",
        "    Advantages without std scaling (scale_rewards='none'): A_i = r_i - mean",
    ]
    adv = group_advantages(rewards, 4, scale=False)
    lines.append(f"    A = {_fmt(adv)}")
    clipped = clip_ratio(ratios, eps)
    # Reference = the old policy here, so pi_ref / pi_theta = 1 / ratio.
    kl = k3_kl(torch.log(ratios), torch.zeros(4))
    objective = []
    for i in range(4):
        unclipped_term, clipped_term = ratios[i] * adv[i], clipped[i] * adv[i]
        surrogate = min(unclipped_term, clipped_term)
        objective.append(surrogate - beta * kl[i])
        lines.append(
            f"    output {i + 1}: rho*A = {ratios[i]:.2f}*{adv[i]:+.2f} = {unclipped_term:+.4f}; "
            f"clip(rho)*A = {clipped[i]:.2f}*{adv[i]:+.2f} = {clipped_term:+.4f}; min = {surrogate:+.4f}; "
            f"KL = 1/{ratios[i]:.2f} + ln {ratios[i]:.2f} - 1 = {kl[i]:.4f}; "
            f"objective = {surrogate:+.4f} - {beta}*{kl[i]:.4f} = {objective[-1]:+.4f}"
        )
    batch = sum(objective) / 4
    corrected = (
        sum(min(ratios[i] * adv[i], clipped[i] * adv[i]) - beta * ratios[i] * kl[i] for i in range(4)) / 4
    )
    lines += [
        f"    batch objective = mean = {batch:+.4f}   (loss = {-batch:+.4f})",
        "    TRL 1.16 by default (use_bias_correction_kl=True) weights each KL term by rho: "
        f"batch objective = {corrected:+.4f}",
        "    The KL estimator x - ln x - 1 (x = pi_ref/pi_theta) is >= 0 for every x > 0: it is 0 only at x = 1.",
        "    With scale_rewards='group' (TRL's default) the same steps apply to A_i / (std + 1e-4):",
        f"    A = {_fmt(group_advantages(rewards, 4))}",
    ]
    return lines


def example_b() -> list[str]:
    rewards = torch.tensor([0.0, 1.6, 5.4, 8.8])
    mean = rewards.mean().item()
    deviations = rewards - mean
    ss = float((deviations**2).sum())
    lines = [
        "(b) Advantages for rewards [0.0, 1.6, 5.4, 8.8] under both std conventions.",
        f"    mean = {mean:.4f}; deviations = {_fmt(deviations)}; sum of squares = {ss:.4f}",
    ]
    for name, divisor in (("unbiased", 3), ("population", 4)):
        std = math.sqrt(ss / divisor)
        adv = group_advantages(rewards, 4, std=name)
        lines.append(
            f"    {name:>10} std = sqrt({ss:.4f}/{divisor}) = {std:.4f}; A = dev/(std+1e-4) = {_fmt(adv)}"
            + ("   <- TRL" if name == "unbiased" else "")
        )
    return lines


def example_c() -> list[str]:
    ratios = torch.tensor([0.85, 0.90, 1.15, 1.25])
    eps = 0.2
    clipped = clip_ratio(ratios, eps)
    lines = [
        "(c) Clipping with eps = 0.2 (range [0.8, 1.2]); objective min(rho*A, clip(rho)*A):",
        "     rho   clip(rho)   A=+1: objective (grad?)   A=-1: objective (grad?)",
    ]
    for r, c in zip(ratios.tolist(), clipped.tolist(), strict=True):
        pos = min(r, c)
        neg = min(-r, -c)
        pos_grad = "yes" if pos == r else "no, clipped"
        neg_grad = "yes" if neg == -r else "no, clipped"
        lines.append(
            f"    {r:.2f}     {c:.2f}      {pos:+.2f} ({pos_grad:<11})        {neg:+.2f} ({neg_grad})"
        )
    lines.append(
        "    Only ratio 1.25 with A > 0 is clipped: the update already moved that answer up by more than eps."
    )
    return lines


def example_d() -> list[str]:
    rewards = torch.tensor([0.30, 0.50, 0.55, 1.00])
    guided = torch.tensor([False, False, False, True])
    tau, a1, a2 = TEMPSAMP_TAU, TEMPSAMP_ALPHA1, TEMPSAMP_ALPHA2
    plain = shaped_advantages(rewards, 4, guided, method="none")
    shaped = tempsamp_shape(rewards)
    tempsamp = shaped_advantages(rewards, 4, guided, method="tempsamp")
    lines = [
        "(d) One guided group (TempSamp-R1, arXiv 2509.18056): 3 sampled answers and the annotated span written",
        "    as the 4th answer. Rewards are IoU: sampled [0.30, 0.50, 0.55], guided 1.00.",
        f"    Plain GRPO (Eq. 2): mean = {rewards.mean():.4f}; A = {_fmt(plain)}",
        "    The guided answer lifts the mean above every sampled reward: all three sampled answers are pushed down.",
        f"    Shaped first (Eq. 4, tau = {tau}, alpha1 = {a1}, alpha2 = {a2:g}):",
    ]
    for r, value in zip(rewards.tolist(), shaped.tolist(), strict=True):
        if r >= tau:
            lines.append(f"      r = {r:.2f} >= tau: {tau} + {a1}*ln({r:.2f} - {tau} + 1) = {value:.4f}")
        else:
            lines.append(
                f"      r = {r:.2f} <  tau: {tau} - (e^({a2:g}*({tau} - {r:.2f})) - 1)/(e^{a2:g} - 1) = "
                f"{tau} - {math.expm1(a2 * (tau - r)):.4f}/{math.expm1(a2):.4f} = {value:.4f}"
            )
    lines += [
        f"    mean = {shaped.mean():.4f}; A = {_fmt(tempsamp)}",
        "    The best sampled answer (0.55) now has a positive advantage; the guided answer still leads the group.",
    ]
    return lines


def _plain(values, places: int = 4) -> str:
    return "[" + ", ".join(f"{v:.{places}f}" for v in values) + "]"


def first_half_chances(p: list[float]) -> list[float]:
    """Each query's chance to be among the first half of an epoch's weighted order without replacement (every
    order enumerated, each with its successive-draw probability): the share of it a run stopping there sees."""
    from itertools import permutations

    n, chances = len(p), [0.0] * len(p)
    for order in permutations(range(n)):
        chance, left = 1.0, 1.0
        for index in order:
            chance *= p[index] / left
            left -= p[index]
        for index in order[: n // 2]:
            chances[index] += chance
    return chances


def example_e() -> list[str]:
    means = [0.05, 0.30, 0.50, 0.85]
    power = 2
    weights = [(1 - m + 1e-8) ** power for m in means]
    p = mean_reward_weights(means, power)
    n = len(means)
    half = first_half_chances(p.tolist())
    return [
        f"(e) TimeLens2's draw weights, sample_weight_mean_power = {power}: {n} training queries whose starting model's",
        f"    mean tIoU over its k sampled answers (curate's mean_iou) is {_plain(means, 2)}.",
        f"    weight = (1 - mean + 1e-8)^{power} = {_plain(weights)}; sum = {sum(weights):.4f}",
        f"    p = weight / sum = {_plain(p)}   (TRL's shuffled pass: {1 / n:.4f} each)",
        "    Each epoch orders the queries by weight, without replacement: the first is drawn with probability p, each",
        "    next one from those left in proportion to their weights. Every query still comes once an epoch, with its G",
        "    answers, rewards, advantages and loss as before; the weight moves the hard ones early, and a run that stops",
        f"    mid-epoch trains mostly on those. Chance to be among the first {n // 2} of {n}: {_plain(half)}",
        f"    (uniform: 0.5000 each). The query at mean tIoU {means[0]} is drawn first {p[0] / p[-1]:.1f} times as often as the one",
        f"    at {means[-1]}; the relative weight logged for a drawn query is N p: x N p = {_plain(p * n)}.",
        "    A group whose rewards are all equal still has zero advantages (no policy-gradient term), wherever it comes.",
    ]


def explain() -> str:
    blocks = (example_a(), example_b(), example_c(), example_d(), example_e())
    return "\n\n".join("\n".join(block) for block in blocks)


def main() -> None:
    print(explain())


if __name__ == "__main__":
    main()
