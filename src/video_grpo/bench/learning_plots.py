"""The learning benchmark's figure: reward curves of ours vs plain TRL, and the test mIoU bars with the
black-frame control (docs/learning.png)."""

from __future__ import annotations

from pathlib import Path


def _smooth(values: list[float], window: int = 5) -> list[float]:
    return [
        sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
        for i in range(len(values))
    ]


def plot_learning(curves: dict, output: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    key = "rewards/iou_reward/mean"
    for name, label, colour in (
        ("ours", "VideoGRPOTrainer", "tab:blue"),
        ("plain", "TRL GRPOTrainer", "tab:red"),
    ):
        history = curves[name]
        steps = [e["step"] for e in history]
        values = [float(e[key]) for e in history]
        left.plot(steps, values, color=colour, alpha=0.25)
        left.plot(steps, _smooth(values), color=colour, label=f"{label} (5-step mean)")
    guided = [e for e in curves["guided"] if "guidance/sampled_accuracy_reward" in e]
    if guided:
        left.plot(
            [e["step"] for e in guided],
            _smooth([float(e["guidance/sampled_accuracy_reward"]) for e in guided]),
            color="tab:green",
            linestyle="--",
            label="guided + tempsamp, sampled answers",
        )
    left.set(xlabel="GRPO step", ylabel="mean IoU reward (training samples)", title="training reward")
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    bars = [
        ("start (SFT)", curves["before"]["mIoU"], "tab:gray"),
        ("ours", curves["after"]["mIoU"], "tab:blue"),
        ("ours, black\nframes", curves["blank"]["mIoU"], "tab:cyan"),
        ("plain TRL", curves["plain_after"]["mIoU"], "tab:red"),
        ("best fixed\nspan", curves["fixed_miou"], "tab:olive"),
    ]
    right.bar(range(len(bars)), [b[1] for b in bars], color=[b[2] for b in bars])
    right.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
    for i, (_, value, _) in enumerate(bars):
        right.text(i, value + 0.5, f"{value:.1f}", ha="center", fontsize=8)
    right.set(ylabel="test mIoU (%)", title="test split, greedy")
    right.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output
