"""Make the synthetic grounding videos in ``data_samples/`` (see ``video_grpo.toys.synthetic``).

python scripts/make_samples.py --out data_samples --train 16 --test 8
"""

from __future__ import annotations

import argparse
from pathlib import Path

from video_grpo.toys.synthetic import make_split


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("data_samples"))
    parser.add_argument("--train", type=int, default=16)
    parser.add_argument("--test", type=int, default=8)
    parser.add_argument("--min_duration", type=float, default=10)
    parser.add_argument("--max_duration", type=float, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    make_split(args.out, "train", args.train, args.seed, args.min_duration, args.max_duration)
    make_split(args.out, "test", args.test, args.seed + 1, args.min_duration, args.max_duration)
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"wrote {args.train} train and {args.test} test samples to {args.out} ({size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
