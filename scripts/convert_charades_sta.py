"""Convert Charades-STA annotations to video_grpo's JSONL (one query per line).

Either the original text split plus the Charades CSV for durations::

    python scripts/convert_charades_sta.py --txt charades_sta_train.txt --csv Charades_v1_train.csv \\
        --out data/charades_sta/train.jsonl

or the TimeZero/VideoChat-R1 JSON ``{vid: {duration, timestamps, sentences}}``::

    python scripts/convert_charades_sta.py --json train.json --out data/charades_sta/train.jsonl

Policy, reported at the end: a span with start >= end is dropped; an end past the video's duration is
clamped to it (Charades-STA has many of those). Video paths are ``<vid><ext>``, relative to ``video_root``.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path


def from_txt(txt: Path, csv_path: Path) -> list[tuple[str, float, float, str, float]]:
    with open(csv_path, newline="", encoding="utf-8") as f:
        durations = {row["id"]: float(row["length"]) for row in csv.DictReader(f)}
    queries = []
    for line_no, line in enumerate(txt.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        head, sep, sentence = line.partition("##")
        parts = head.split()
        if not sep or len(parts) != 3:
            raise ValueError(f"{txt}:{line_no}: expected 'VID start end##sentence', got {line!r}")
        vid, start, end = parts[0], float(parts[1]), float(parts[2])
        if vid not in durations:
            raise ValueError(f"{txt}:{line_no}: video {vid} has no 'length' in {csv_path}")
        queries.append((vid, start, end, sentence.strip(), durations[vid]))
    return queries


def from_json(path: Path) -> list[tuple[str, float, float, str, float]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    queries = []
    for vid, entry in data.items():
        for (start, end), sentence in zip(entry["timestamps"], entry["sentences"], strict=True):
            queries.append((vid, float(start), float(end), sentence.strip(), float(entry["duration"])))
    return queries


def convert(queries, ext: str) -> tuple[list[dict], dict[str, int]]:
    records, counts = [], {"dropped_start_ge_end": 0, "clamped_end_to_duration": 0}
    for index, (vid, start, end, sentence, duration) in enumerate(queries):
        if start >= end:
            counts["dropped_start_ge_end"] += 1
            continue
        if end > duration:
            end = duration
            counts["clamped_end_to_duration"] += 1
            if start >= end:
                counts["dropped_start_ge_end"] += 1
                continue
        records.append({"id": f"{vid}_{index}", "video": f"{vid}{ext}", "duration": duration,
                        "solution": [start, end], "sentence": sentence})
    return records, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--txt", type=Path)
    parser.add_argument("--csv", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ext", default=".mp4")
    args = parser.parse_args()
    if args.json:
        queries = from_json(args.json)
    elif args.txt and args.csv:
        queries = from_txt(args.txt, args.csv)
    else:
        parser.error("give --json, or --txt together with --csv")
    records, counts = convert(queries, args.ext)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    videos = len({r["video"] for r in records})
    print(f"wrote {len(records)} queries over {videos} videos to {args.out}; {counts}")


if __name__ == "__main__":
    main()
