"""TimeLens's difficulty sampling: draw training queries weighted towards those the starting model finds hard.

    weight(q) = exp(-((iou(q) - mean) / std)^2 / 2)  x  1 / (queries in q's IoU bin + 1e-6)

with 20 equal IoU bins over [0, 1], then ``target_size`` queries are drawn without replacement with
probability proportional to the weight (numpy ``Generator.choice``, seeded). The Gaussian (TimeLens: mean 0.05,
std 0.2) favours low IoU; the inverse bin density keeps a crowded bin from taking every draw, so the set still
spans the IoU range. Source: TencentARC/TimeLens ``training/data/grounding.py`` (``_filter_annos``, with
``fixed_gaussian_sampling``) and ``train_scripts/run_grpo_qwen25_vl_7b.sh`` (``--gaussian_filter_mean 0.05
--gaussian_filter_std 0.2 --target_size 2500 --seed 42``). Their IoU is that of the starting model's answer to
each query; ``curate`` uses the mean IoU over the k sampled answers (the same number at k = 1).

Their loader can also split queries into duration ranges (``filter_range``) with one target per range; the
released 7B script passes none, and this module draws over all queries at once.
"""

from __future__ import annotations

import numpy as np

GAUSSIAN_MEAN, GAUSSIAN_STD, IOU_BINS, TARGET_SIZE = 0.05, 0.2, 20, 2500


def gaussian_weights(ious, mean: float = GAUSSIAN_MEAN, std: float = GAUSSIAN_STD, bins: int = IOU_BINS):
    """Normalised draw probabilities (float64), one per IoU, in the IoUs' order."""
    if std <= 0:
        raise ValueError(f"gaussian std must be > 0, got {std}")
    iou = np.asarray(ious, dtype=np.float64)
    weights = np.exp(-0.5 * ((iou - mean) / std) ** 2)
    counts, edges = np.histogram(iou, bins=bins, range=(0.0, 1.0))
    index = np.clip(np.digitize(iou, bins=edges), 1, bins) - 1  # IoU 1.0 belongs to the last bin
    weights = weights / (counts[index] + 1e-6)
    return weights / weights.sum()


def gaussian_draw(
    ious,
    target_size: int = TARGET_SIZE,
    seed: int = 42,
    mean: float = GAUSSIAN_MEAN,
    std: float = GAUSSIAN_STD,
    bins: int = IOU_BINS,
) -> list[int]:
    """Indices of ``min(target_size, len(ious))`` queries drawn without replacement, sorted (file order)."""
    if target_size < 1:
        raise ValueError(f"target_size must be >= 1, got {target_size}")
    n = len(ious)
    if n == 0:
        return []
    p = gaussian_weights(ious, mean, std, bins)
    drawn = np.random.default_rng(seed).choice(n, size=min(target_size, n), replace=False, p=p)
    return sorted(int(i) for i in drawn)
