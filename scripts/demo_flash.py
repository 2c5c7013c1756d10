"""`make demo`'s learnable task: prepare the flash videos and a cold-start model, then report before vs after.

    python scripts/demo_flash.py prepare --out outputs/demo_flash      # data, tiny model, SFT cold start
    accelerate launch ... -m video_grpo.grpo --config configs/grpo/demo_flash.yaml   # GRPO (make demo)
    python scripts/demo_flash.py report --out outputs/demo_flash --run_dir outputs/demo

Everything is generated offline (``video_grpo.toys.synthetic.FlashTask``, ``video_grpo.toys.tiny``), the same task and
cold start as ``python -m video_grpo.bench learning`` (docs/learning.md): 16-s videos whose upper half flashes
a named colour between S and E, with a clock drawn in the lower half; a short SFT on the annotated spans gives
a partial localiser, and GRPO starts from it. ``report`` prints R1@0.5 and mIoU before GRPO, after GRPO, after
GRPO with every frame black, and of the best fixed span (per metric, picked on the test videos: an upper bound for
any video-blind fixed answer), and draws timelines of a few test videos.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

from video_grpo.bench import learning_runs as runs
from video_grpo.bench.learning_runs import FULL
from video_grpo.data.annotations import write_jsonl
from video_grpo.toys.synthetic import best_fixed_span, make_flash_split, temporal_iou

TRAIN, TEST, SFT_STEPS = 128, 128, 100


def split_seeds(seed: int) -> tuple[int, int]:
    """The training and test splits' generator seeds for the demo's ``seed`` (0 gives the benchmark's 10 and 11)."""
    return 10 + 2 * seed, 11 + 2 * seed


def prepare(out: Path, seed: int) -> None:
    from video_grpo.toys.tiny import build_tiny_model

    started = time.perf_counter()
    data = out / "data"
    train_seed, test_seed = split_seeds(seed)
    make_flash_split(data, "train", TRAIN, seed=train_seed, task=FULL.task)
    make_flash_split(data, "test", TEST, seed=test_seed, task=FULL.task)
    made = time.perf_counter()
    train = runs.task_dataset(data / "train.jsonl")
    model = build_tiny_model(out / "tiny", seed=seed, **runs.MODEL_SIZE)
    with contextlib.redirect_stdout(sys.stderr):
        runs.sft(model, train, out / "sft", steps=SFT_STEPS, seed=seed)
    print(
        f"seed {seed}: wrote {data} ({TRAIN} train, {TEST} test videos, {made - started:.0f} s) and the "
        f"cold-start model {out / 'sft'} ({SFT_STEPS} SFT steps, {time.perf_counter() - made:.0f} s)"
    )


def _write(records: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(path, records)
    return path


def report(out: Path, run_dir: Path) -> None:
    from video_grpo.plot import plot_timeline

    started = time.perf_counter()
    data = out / "data"
    test = runs.task_dataset(data / "test.jsonl", replace_bad_samples=False)
    test_records = [json.loads(line) for line in (data / "test.jsonl").read_text().splitlines()]
    truths = [tuple(r["solution"]) for r in test_records]
    # The reference a video-blind answer cannot beat: the best one span for each metric, picked on the test videos
    # themselves (an oracle, so an upper bound for any fixed answer there).
    fixed_miou, fixed_r1 = best_fixed_span(test_records), best_fixed_span(test_records, threshold=0.5)
    with contextlib.redirect_stdout(sys.stderr):
        rows = {
            "before GRPO (SFT cold start)": runs.test_metrics(out / "sft", test),
            "after GRPO": runs.test_metrics(run_dir, test),
            "after GRPO, frames blacked out": runs.test_metrics(
                run_dir, runs.with_transform(test, runs.BlankFrames)
            ),
        }
    rows["best fixed span (oracle, per metric)"] = {
        "R1@0.5": 100 * sum(temporal_iou(fixed_r1, t) >= 0.5 for t in truths) / len(truths),
        "mIoU": 100 * sum(temporal_iou(fixed_miou, t) for t in truths) / len(truths),
    }
    print(f"\n=== learning on {len(test_records)} test videos (greedy answers) ===")
    print(f"{'':38s} {'R1@0.5':>7s} {'mIoU':>7s}")
    for name, metrics in rows.items():
        print(f"{name:38s} {metrics['R1@0.5']:7.1f} {metrics['mIoU']:7.1f}")
    print(
        f"(the best fixed spans on these videos: {fixed_r1[0]:g}-{fixed_r1[1]:g} s for R1@0.5, "
        f"{fixed_miou[0]:g}-{fixed_miou[1]:g} s for mIoU)"
    )
    before, after, blank = (
        rows[k] for k in ("before GRPO (SFT cold start)", "after GRPO", "after GRPO, frames blacked out")
    )
    fixed = rows["best fixed span (oracle, per metric)"]
    print(
        f"after - before: {after['mIoU'] - before['mIoU']:+.1f} mIoU, {after['R1@0.5'] - before['R1@0.5']:+.1f} "
        f"R1@0.5; black frames at or below the best fixed span: "
        f"{blank['mIoU'] <= fixed['mIoU'] and blank['R1@0.5'] <= fixed['R1@0.5']}"
    )
    for name, key in (("before", "before GRPO (SFT cold start)"), ("after", "after GRPO")):
        path = _write(rows[key]["records"], run_dir / f"eval_{name}" / "predictions.jsonl")
        print(f"wrote {plot_timeline(path, run_dir / f'timeline_{name}.png', 8)}")
    print(f"(3 greedy evaluations in {time.perf_counter() - started:.0f} s)")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["prepare", "report"])
    parser.add_argument("--out", type=Path, default=Path("outputs/demo_flash"))
    parser.add_argument("--run_dir", type=Path, default=Path("outputs/demo"))
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="prepare: picks the videos, the tiny model's initial weights and the SFT order",
    )
    args = parser.parse_args()
    prepare(args.out, args.seed) if args.command == "prepare" else report(args.out, args.run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
