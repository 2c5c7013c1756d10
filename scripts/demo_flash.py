"""`make demo`'s learnable task: prepare the flash videos and a cold-start model, then report before vs after.

    python scripts/demo_flash.py prepare --out outputs/demo_flash      # data, tiny model, SFT cold start
    accelerate launch ... -m video_grpo.grpo --config configs/grpo/demo_flash.yaml   # GRPO (make demo)
    python scripts/demo_flash.py report --out outputs/demo_flash --run_dir outputs/demo

Everything is generated offline (``video_grpo.synthetic.FlashTask``, ``video_grpo.tiny``), the same task and
cold start as ``python -m video_grpo.bench learning`` (docs/learning.md): 16-s videos whose upper half flashes
a named colour between S and E, with a clock drawn in the lower half; a short SFT on the annotated spans gives
a partial localiser, and GRPO starts from it. ``report`` prints R1@0.5 and mIoU before GRPO, after GRPO, after
GRPO with every frame black, and of the best fixed span, and draws timelines of a few test videos.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from video_grpo import learning_runs as runs
from video_grpo.learning import FULL
from video_grpo.synthetic import best_fixed_span, make_flash_split, temporal_iou

TRAIN, TEST, SFT_STEPS = 128, 48, 100


def prepare(out: Path) -> None:
    from video_grpo.data import build_dataset
    from video_grpo.tiny import build_tiny_model

    data = out / "data"
    make_flash_split(data, "train", TRAIN, seed=10, task=FULL.task)
    make_flash_split(data, "test", TEST, seed=11, task=FULL.task)
    train = build_dataset(data / "train.jsonl", sampling=runs.SAMPLING, prompt_template=runs.PROMPT)
    model = build_tiny_model(out / "tiny", **runs.MODEL_SIZE)
    with contextlib.redirect_stdout(sys.stderr):
        runs.sft(model, train, out / "sft", steps=SFT_STEPS)
    print(f"wrote {data} ({TRAIN} train, {TEST} test videos) and the cold-start model {out / 'sft'}")


def _write(records: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def report(out: Path, run_dir: Path) -> None:
    from video_grpo.data import build_dataset
    from video_grpo.plot import plot_timeline

    data = out / "data"
    test = build_dataset(data / "test.jsonl", sampling=runs.SAMPLING, prompt_template=runs.PROMPT,
                         replace_bad_samples=False)
    train_records = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
    test_records = [json.loads(line) for line in (data / "test.jsonl").read_text().splitlines()]
    fixed = best_fixed_span(train_records)
    fixed_ious = [temporal_iou(fixed, tuple(r["solution"])) for r in test_records]
    with contextlib.redirect_stdout(sys.stderr):
        rows = {"before GRPO (SFT cold start)": runs.test_metrics(out / "sft", test),
                "after GRPO": runs.test_metrics(run_dir, test),
                "after GRPO, frames blacked out": runs.test_metrics(run_dir, runs.with_transform(test, runs.BlankFrames))}
    rows[f"best fixed span {fixed[0]:g}-{fixed[1]:g} s"] = {
        "R1@0.5": 100 * sum(i >= 0.5 for i in fixed_ious) / len(fixed_ious), "mIoU": 100 * sum(fixed_ious) / len(fixed_ious)}
    print(f"\n=== learning on {len(test_records)} test videos (greedy answers) ===")
    print(f"{'':34s} {'R1@0.5':>7s} {'mIoU':>7s}")
    for name, metrics in rows.items():
        print(f"{name:34s} {metrics['R1@0.5']:7.1f} {metrics['mIoU']:7.1f}")
    for name, key in (("before", "before GRPO (SFT cold start)"), ("after", "after GRPO")):
        path = _write(rows[key]["records"], run_dir / f"eval_{name}" / "predictions.jsonl")
        print(f"wrote {plot_timeline(path, run_dir / f'timeline_{name}.png', 8)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["prepare", "report"])
    parser.add_argument("--out", type=Path, default=Path("outputs/demo_flash"))
    parser.add_argument("--run_dir", type=Path, default=Path("outputs/demo"))
    args = parser.parse_args()
    prepare(args.out) if args.command == "prepare" else report(args.out, args.run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
