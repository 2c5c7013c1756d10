"""The learning benchmark's curation row: does difficulty curation give GRPO more signal per step?

A GRPO group whose G rewards are (almost) equal has (almost) zero advantages, so its rows teach nothing. Curation
(:mod:`video_grpo.curate`) drops the queries the starting model always misses or already solves, before training.
It can only help on a pool that holds such queries, so the row trains on one, as a real grounding set does:

- ``event``: the benchmark's 128 training queries (the flash, annotated where it happens);
- ``whole``: the screen is lit for the whole video, annotated ``[0, 16]``. The starting model has seen such
  videos, so it answers them exactly every time: queries it always solves (every reward in the group about 1);
- ``mislabelled``: a flash annotated with a span of the same length elsewhere, as a wrong annotation in a real
  dataset: a model that looks is never rewarded (every reward in the group 0).

The row's start is the benchmark's cold start after a further short SFT on the ``event`` and ``whole`` videos
(the ``mislabelled`` ones are not shown to it). From that start: curate the pool with ``curate``'s rule (4 samples
per query, keep mean IoU in ``BAND``), then GRPO for the same number of steps on the curated queries and on the
whole pool, and report the mean within-group std of the IoU reward (``curation_signal``), the share of flat
groups (std < ``FLAT_STD``), and each run's test mIoU.

``python -m video_grpo.bench.curation`` runs this row alone (about 1 minute on 2 idle cores); ``bench learning``
runs it with the rest.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

from video_grpo.bench import learning_runs as runs

FLAT_STD = 0.05  # a group whose IoU rewards spread less than this gives GRPO (almost) no signal
BAND = (0.05, 0.95)  # curate's rule: keep a query whose mean sampled IoU lies in [low, high]
KINDS = ("event", "whole", "mislabelled")
STATUSES = ("kept", "too_easy", "too_hard")  # curate's verdicts within the band (no cap here)


@dataclass(frozen=True)
class CurationBudget:
    """Sizes of the curation row: ``extra`` videos of each added kind (generator seeds ``pool_seed`` and
    ``pool_seed + 1``), the further SFT, the samples per query the band is computed from, and the GRPO steps each
    side runs (trainer seed ``grpo_seed``)."""

    extra: int = 32
    pool_seed: int = 12
    grpo_seed: int = 0
    start_sft_steps: int = 60
    samples: int = 4
    steps: int = 20


def make_pool(data: Path, train_records: list[dict], task, extra: int, seed: int) -> dict[str, list[dict]]:
    """Write the ``whole`` and ``mislabelled`` videos next to the training ones, and ``pool.jsonl`` (every kind)
    and ``curation_sft.jsonl`` (``event`` and ``whole``). Returns the records by kind."""
    from video_grpo.data.annotations import write_jsonl
    from video_grpo.toys.synthetic import make_flash_split

    kinds = {
        "event": train_records,
        "whole": make_flash_split(data, "whole", extra, seed=seed, task=task, kind="whole"),
        "mislabelled": make_flash_split(
            data, "mislabelled", extra, seed=seed + 1, task=task, kind="mislabelled"
        ),
    }
    write_jsonl(data / "pool.jsonl", [r for kind in KINDS for r in kinds[kind]])
    write_jsonl(data / "curation_sft.jsonl", kinds["event"] + kinds["whole"])
    return kinds


def sampled_stats(model_dir: Path, dataset, samples: int, band: tuple[float, float]) -> list[dict]:
    """``video_grpo.curate``'s statistics and status for every query of ``dataset``, from ``samples`` answers of
    ``model_dir`` each at the GRPO temperature, in the dataset's order."""
    from video_grpo.curate import assign_status, query_stats

    records = runs.answers(
        model_dir, dataset, do_sample=True, temperature=runs.GRPO_SETTINGS["temperature"], repeats=samples
    )
    queries: dict[str, dict] = {}
    for record in records:
        queries.setdefault(record["id"], {"id": record["id"], "solution": record["solution"], "outputs": []})
        queries[record["id"]]["outputs"].append(record["output"])
    return assign_status([query_stats(q) for q in queries.values()], *band)


def run_curation(
    work: Path,
    data: Path,
    train_records: list[dict],
    task,
    start: Path,
    test,
    emit,
    budget: CurationBudget = CurationBudget(),
    rollouts: dict[str, list[dict]] | None = None,
) -> dict:
    """The curation row from the benchmark's cold start ``start`` (see the module docstring); emits and returns
    ``curation_signal``. ``rollouts``: if given, each GRPO run's sampled groups go in it under ``curated`` and
    ``whole`` (for :mod:`video_grpo.bench.twass_rows`)."""

    def dataset(name: str):
        return runs.task_dataset(data / f"{name}.jsonl")

    kinds = make_pool(data, train_records, task, budget.extra, budget.pool_seed)
    kind_of = {r["id"]: kind for kind in KINDS for r in kinds[kind]}
    pool = dataset("pool")
    spread: dict[str, list[float]] = {"curated": [], "whole": []}
    with contextlib.redirect_stdout(sys.stderr):
        curation_start = runs.sft(
            start, dataset("curation_sft"), work / "curation_start", budget.start_sft_steps
        )
        stats = sampled_stats(curation_start, pool, budget.samples, BAND)
        kept_ids = {s["id"] for s in stats if s["status"] == "kept"}
        pool_ids = list(kind_of)  # pool.jsonl's order
        kept = [i for i, query_id in enumerate(pool_ids) if query_id in kept_ids]
        for name, rows in (("curated", pool.select(kept)), ("whole", pool)):
            runs.grpo(
                curation_start,
                rows,
                work / name,
                budget.steps,
                group_stds=spread[name],
                seed=budget.grpo_seed,
                rollouts=None if rollouts is None else rollouts.setdefault(name, []),
            )
        test_miou = {name: runs.test_metrics(work / name, test)["mIoU"] for name in spread}
        start_miou = runs.test_metrics(curation_start, test)["mIoU"]
    by_kind = {}
    for kind in KINDS:
        of_kind = [s for s in stats if kind_of[s["id"]] == kind]
        by_kind[kind] = {status: sum(s["status"] == status for s in of_kind) for status in STATUSES}
        by_kind[kind]["mean_iou"] = round(sum(s["mean_iou"] for s in of_kind) / len(of_kind), 3)
    mean_std = {name: sum(v) / len(v) for name, v in spread.items()}
    flat = {name: sum(x < FLAT_STD for x in v) / len(v) for name, v in spread.items()}
    return emit(
        "curation_signal",
        mean_std["curated"],
        mean_std["whole"],
        "mean within-group std of the IoU reward over GRPO steps: curated vs whole pool",
        flat_groups_curated=round(flat["curated"], 4),
        flat_groups_whole=round(flat["whole"], 4),
        flat_ratio=round(flat["curated"] / flat["whole"], 4) if flat["whole"] else None,
        flat_below=FLAT_STD,
        test_miou_curated=round(test_miou["curated"], 3),
        test_miou_whole=round(test_miou["whole"], 3),
        test_miou_start=round(start_miou, 3),
        kept=len(kept),
        of=len(pool),
        band=list(BAND),
        by_kind=by_kind,
        steps=budget.steps,
        pool_seed=budget.pool_seed,
        grpo_seed=budget.grpo_seed,
        groups=len(spread["whole"]),
        goal="ratio >= 1.2 (or flat_ratio <= 0.8)",
    )


def main() -> int:
    import argparse
    import tempfile

    import torch
    from transformers.utils import logging as hf_logging

    from video_grpo.bench.emit import emit
    from video_grpo.bench.learning_runs import FULL, cold_start
    from video_grpo.toys.synthetic import make_flash_split

    parser = argparse.ArgumentParser(
        description="The learning benchmark's curation_signal row alone, from its cold start "
        "(about 1 minute on 2 idle cores)."
    )
    parser.add_argument(
        "--work_dir", default=None, help="keep the videos and checkpoints here (default: a temp dir)"
    )
    parser.add_argument("--pool_seed", type=int, default=12, help="generator seed of the added videos")
    parser.add_argument(
        "--grpo_seed", type=int, default=0, help="the GRPO trainer's seed (prompt order, sampling)"
    )
    args = parser.parse_args()
    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    with contextlib.ExitStack() as stack:
        work = Path(args.work_dir or stack.enter_context(tempfile.TemporaryDirectory()))
        data, train_records, start = cold_start(work, FULL)
        make_flash_split(data, "test", FULL.test, seed=11, task=FULL.task)
        budget = CurationBudget(pool_seed=args.pool_seed, grpo_seed=args.grpo_seed)
        test = runs.task_dataset(data / "test.jsonl")
        run_curation(work, data, train_records, FULL.task, start, test, emit, budget)
    return 0


if __name__ == "__main__":
    sys.exit(main())
