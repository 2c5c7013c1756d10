"""Summarise a demo run: rewards, whether groups carried a learning signal, and how much the weights moved.

Exits non-zero when the run could not have learned anything (every group had equal rewards, or the vision
tower did not change), so `make demo` cannot quietly succeed at teaching nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from transformers import AutoModelForImageTextToText


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def relative_change(initial: dict, trained: dict, select) -> float:
    names = [n for n in initial if select(n)]
    diff = sum(float((trained[n].float() - initial[n].float()).norm() ** 2) for n in names) ** 0.5
    base = sum(float(initial[n].float().norm() ** 2) for n in names) ** 0.5
    return diff / base if base else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run_dir", type=Path, required=True)
    parser.add_argument("--initial_model", type=Path, required=True)
    args = parser.parse_args()

    history = json.loads((args.run_dir / "trainer_state.json").read_text())["log_history"]
    steps = [entry for entry in history if "reward" in entry]
    if not steps:
        print(f"no training steps logged in {args.run_dir}/trainer_state.json", file=sys.stderr)
        return 1

    def series(key: str) -> list[float]:
        return [float(entry[key]) for entry in steps if key in entry]

    initial = AutoModelForImageTextToText.from_pretrained(args.initial_model).state_dict()
    trained = AutoModelForImageTextToText.from_pretrained(args.run_dir).state_dict()
    vision_change = relative_change(initial, trained, lambda n: ".visual." in n)
    language_change = relative_change(initial, trained, lambda n: ".visual." not in n)
    zero_std = series("frac_reward_zero_std")

    print(f"\n=== demo summary ({len(steps)} GRPO steps, {args.run_dir}) ===")
    print(f"mean IoU reward           : {mean(series('rewards/iou_reward/mean')):.4f}")
    print(f"mean format reward        : {mean(series('rewards/format_reward/mean')):.4f}")
    soft = series("rewards/format_soft_reward/mean")
    if soft:  # only when the recipe uses format_soft
        print(
            f"mean format_soft reward   : {mean(soft):.4f}  (first step {soft[0]:.3f}, last {soft[-1]:.3f})"
        )
    print(
        f"frac_reward_zero_std      : mean {mean(zero_std):.3f}, min {min(zero_std):.3f}  (< 1: groups had reward variance)"
    )
    print(
        f"weight change ||dW||/||W||: vision tower {vision_change:.2e}, language model {language_change:.2e}"
    )

    ok = True
    if min(zero_std) >= 1.0:
        print("FAIL: every group had identical rewards, so every advantage was 0 and nothing was learned.")
        ok = False
    if not vision_change > 0:
        print("FAIL: the vision tower did not change; video did not reach the loss.")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
