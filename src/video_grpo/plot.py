"""Pictures of a run and of its predictions, as PNG.

    python -m video_grpo.plot train --run_dir outputs/demo [--output train.png]
    python -m video_grpo.plot timeline --predictions outputs/demo/eval/predictions.jsonl [--num 12]

``train`` reads the newest ``trainer_state.json`` in the run directory or its ``checkpoint-*`` folders, so it
also works while a run is still going.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def latest_state(run_dir: Path) -> Path:
    candidates = [run_dir / "trainer_state.json", *run_dir.glob("checkpoint-*/trainer_state.json")]
    existing = [p for p in candidates if p.is_file()]
    if not existing:
        raise FileNotFoundError(f"no trainer_state.json in {run_dir} or its checkpoint-* folders")
    return max(existing, key=lambda p: (json.loads(p.read_text()).get("global_step", 0), p.stat().st_mtime))


def plot_train(run_dir: Path, output: Path) -> Path:
    history = json.loads(latest_state(run_dir).read_text())["log_history"]
    steps = [e for e in history if "step" in e and "loss" in e]
    reward_keys = sorted({k for e in steps for k in e if k.startswith("rewards/") and k.endswith("/mean")})
    panels = [
        ("reward", ["reward"] + reward_keys),
        ("KL", ["kl"]),
        ("completion length", ["completions/mean_length"]),
        ("learning rate", ["learning_rate"]),
    ]
    panels = [(title, [k for k in keys if any(k in e for e in steps)]) for title, keys in panels]
    panels = [(title, keys) for title, keys in panels if keys]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.4 * len(panels)), sharex=True, squeeze=False)
    for ax, (title, keys) in zip(axes[:, 0], panels, strict=True):
        for key in keys:
            xs = [e["step"] for e in steps if key in e]
            ys = [float(e[key]) for e in steps if key in e]
            ax.plot(xs, ys, marker=".", label=key.removeprefix("rewards/").removesuffix("/mean"))
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
        if len(keys) > 1:
            ax.legend(fontsize=7, loc="best")
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(f"{run_dir} ({len(steps)} logged steps)", fontsize=9)
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


def plot_timeline(predictions: Path, output: Path, num: int = 12) -> Path:
    from video_grpo.evaluate import read_predictions

    records = read_predictions(predictions)[:num]
    if not records:
        raise ValueError(f"{predictions} has no predictions")
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(records) + 1.2))
    for row, record in enumerate(records):
        y = len(records) - row
        ax.plot([0, record["duration"]], [y, y], color="0.85", linewidth=8, solid_capstyle="butt")
        truth = record["solution"] if isinstance(record["solution"][0], list) else [record["solution"]]
        for start, end in truth:
            ax.plot([start, end], [y + 0.12, y + 0.12], color="tab:green", linewidth=5, solid_capstyle="butt")
        span = record.get("span")
        spans = (span if isinstance(span[0], list) else [span]) if span else []  # `set` scoring: every span
        for start, end in spans:
            ax.plot(
                [start, end], [y - 0.12, y - 0.12], color="tab:orange", linewidth=5, solid_capstyle="butt"
            )
        label = f"IoU {record['iou']:.2f}" if span else "no span"
        ax.text(record["duration"] + 0.5, y, label, va="center", fontsize=8)
    ax.set_yticks([len(records) - i for i in range(len(records))])
    ax.set_yticklabels([f"{r['id']}: {r['sentence'][:40]}" for r in records], fontsize=7)
    ax.set_xlabel("seconds")
    ax.plot([], [], color="tab:green", linewidth=5, label="true span")
    ax.plot([], [], color="tab:orange", linewidth=5, label="predicted span")
    ax.legend(fontsize=8, loc="upper right", bbox_to_anchor=(1, 1.15), ncol=2)
    ax.set_xlim(0, max(r["duration"] for r in records) * 1.15)
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m video_grpo.plot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="reward, per-reward means, KL, completion length, learning rate")
    train.add_argument("--run_dir", type=Path, required=True)
    train.add_argument("--output", type=Path)
    timeline = sub.add_parser("timeline", help="true and predicted spans per query")
    timeline.add_argument("--predictions", type=Path, required=True)
    timeline.add_argument("--num", type=int, default=12)
    timeline.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    if args.command == "train":
        path = plot_train(args.run_dir, args.output or args.run_dir / "train_curves.png")
    else:
        path = plot_timeline(
            args.predictions, args.output or args.predictions.with_name("timeline.png"), args.num
        )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
