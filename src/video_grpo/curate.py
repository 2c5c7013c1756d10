"""Difficulty curation: keep the training queries the starting model neither always misses nor already solves.

    # sample k answers per query with the starting model, then curate (sharded: accelerate launch ... -m)
    python -m video_grpo.curate --model_name_or_path Qwen/Qwen2.5-VL-7B-Instruct \\
        --config configs/grpo/qwen2_5_vl_7b_charades.yaml --num_samples 8 --output_dir outputs/curate
    # or curate sampled predictions you already have (evaluate run's format, k lines per id)
    python -m video_grpo.curate --predictions samples.jsonl --output_dir outputs/curate --video_root data/videos

A query whose k sampled answers all miss (mean IoU ~ 0) gives GRPO no signal, and neither does one the model
already solves every time (mean IoU ~ 1): every answer in its group gets about the same reward. Time-R1
(arXiv 2503.13377v2) builds its RL set (TimeRFT) from the base model's IoU for this reason.

For each query the IoU of every answer is computed with ``evaluate``'s rules (span from the last ``<answer>``
block, else the last ``S to E`` in the text; a parse failure is IoU 0; a query with several true windows
takes its best; with ``--span_scoring set``, every answered span against every true span, TimeLens2's tIoU, the
answer read as the ``--config`` recipe's ``tiou`` reward reads it, ``--reader`` to override), then
its mean and population std over the k answers. A query is kept when
``min_iou <= mean <= max_iou``; below is "too hard", above is "too easy". With ``--max_queries N`` and more
than N in the band, the N whose mean is closest to ``--target_iou`` (default 0.5) are kept, ties broken by id;
the rest are "capped". The curated file keeps the queries in their original order.

``--rule gaussian`` is TimeLens's rule instead of the band (:mod:`video_grpo.data.difficulty_draw`): ``--target_size``
queries (TimeLens: 2500) are drawn without replacement, seeded by ``--seed``, with weight Gaussian(mean IoU;
``--gaussian_mean`` 0.05, ``--gaussian_std`` 0.2) x the inverse density of 20 IoU bins. Drawn queries are
"kept", the others "not_drawn"; the outputs are the same.

Outputs in ``--output_dir D``:

- ``D/per_query.jsonl``: ``id``, ``k``, ``mean_iou``, ``std_iou``, ``ious``, ``parse_failures``,
  ``status`` (kept, too_hard, too_easy, capped), per query;
- ``D/curated.jsonl``: the kept queries in our annotation JSONL (``id``, ``video``, ``duration``, ``solution``,
  ``sentence``), ready to be a ``train_file``;
- ``D/mean_iou_hist.png``: the histogram of per-query mean IoU, by status;
- ``D/summary.json``: the counts, the band and the ``video_root`` to train with;
- in sampling mode also ``D/samples.jsonl``: every sampled answer (``evaluate run``'s fields plus ``sample``).

Video paths. ``video`` in ``curated.jsonl`` is written relative to a video root, so the file trains with
``train_file: D/curated.jsonl`` and ``video_root:`` that root. The root is ``--video_root`` if given, else the
recipe's ``video_root`` (``--config``), else, when sampling, the folder of the annotation file that was
sampled (the loader's own default for it), else the deepest folder holding every video. Using the same
recipe with ``--train_file D/curated.jsonl`` therefore works whenever the recipe sets ``video_root``. A video
outside the root is an error; a relative ``video`` in a predictions file is kept as it is.

A recipe with ``train_sources`` (:mod:`video_grpo.data.sources`) is sampled over every source, each query with its
source's prompt, and ids are ``<source>/<id>`` as training reads them, so ``per_query.jsonl`` serves as that recipe's
``sample_weight_file`` as it is. ``curated.jsonl`` is then one file in our format: training on it uses one
prompt template for all its queries (the sources' own templates are not carried over).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from video_grpo.data.annotations import iter_jsonl_objects, write_jsonl
from video_grpo.evaluate import SET_READERS, SPAN_SCORINGS, score_output
from video_grpo.rollout.decode import add_decode_arguments
from video_grpo.runtime.distributed import end_run, exit_process, process_state

STATUSES = ("kept", "too_hard", "too_easy", "capped", "not_drawn")
RULES = ("band", "gaussian")
QUERY_FIELDS = ("video", "duration", "solution", "sentence")


class PredictionsError(ValueError):
    """A malformed sampled-predictions file; the message names the file and line."""


# -- reading sampled predictions -----------------------------------------------------------------------------


def _check_solution(solution, where: str) -> None:
    from video_grpo.data.annotations import AnnotationError, _as_spans

    try:
        _as_spans(solution, where)
    except AnnotationError as err:
        raise PredictionsError(str(err)) from None


def read_samples(path: str | Path) -> list[dict]:
    """Queries in first-seen order, each ``{id, video, duration, solution, sentence, outputs, lines}``.

    Every line needs ``id``, ``output`` (text or null), ``video``, ``duration``, ``solution`` and ``sentence``;
    the lines of one id must agree on the last four. Errors name ``file:line``."""
    queries: dict[str, dict] = {}
    for line_no, where, record in iter_jsonl_objects(path, PredictionsError):
        missing = [k for k in ("id", "output", *QUERY_FIELDS) if k not in record]
        if missing:
            raise PredictionsError(
                f"{where}: missing {missing}; each line needs id, output, video, duration, "
                "solution, sentence (the fields `python -m video_grpo.evaluate run` writes)"
            )
        if not isinstance(record["id"], str | int) or isinstance(record["id"], bool):
            raise PredictionsError(f"{where}: id must be a string or an integer, got {record['id']!r}")
        if record["output"] is not None and not isinstance(record["output"], str):
            raise PredictionsError(
                f"{where}: output must be a string or null, got {type(record['output']).__name__}"
            )
        duration = record["duration"]
        if (
            isinstance(duration, bool)
            or not isinstance(duration, int | float)
            or not (math.isfinite(duration) and duration > 0)
        ):
            raise PredictionsError(f"{where}: duration must be a number > 0, got {duration!r}")
        if not isinstance(record["video"], str) or not record["video"]:
            raise PredictionsError(f"{where}: video must be a path, got {record['video']!r}")
        _check_solution(record["solution"], where)
        query_id = str(record["id"])
        query = queries.get(query_id)
        if query is None:
            queries[query_id] = {
                "id": query_id,
                **{k: record[k] for k in QUERY_FIELDS},
                "outputs": [],
                "line": line_no,
            }
            query = queries[query_id]
        else:
            for key in QUERY_FIELDS:
                if record[key] != query[key]:
                    raise PredictionsError(
                        f"{where}: {key} {record[key]!r} differs from {query[key]!r} on line "
                        f"{query['line']} for the same id {query_id!r}"
                    )
        query["outputs"].append(record["output"])
    if not queries:
        raise PredictionsError(f"{path}: no predictions")
    return list(queries.values())


# -- statistics and the band ---------------------------------------------------------------------------------


def query_stats(query: dict, span_scoring: str = "best_window", reader: str = "ours") -> dict:
    """IoU of each answer (evaluate's rules, ``span_scoring`` and its ``reader`` among them), their mean and
    population std."""
    scored = [score_output(output, query["solution"], span_scoring, reader) for output in query["outputs"]]
    ious = [iou for iou, _ in scored]
    mean = sum(ious) / len(ious)
    std = math.sqrt(sum((x - mean) ** 2 for x in ious) / len(ious))
    return {
        "id": query["id"],
        "k": len(ious),
        "mean_iou": mean,
        "std_iou": std,
        "ious": ious,
        "parse_failures": sum(not parsed for _, parsed in scored),
    }


def assign_status(
    stats: list[dict], min_iou: float, max_iou: float, max_queries: int | None = None, target_iou: float = 0.5
) -> list[dict]:
    """Set each entry's ``status``: too_hard (mean < min_iou), too_easy (mean > max_iou), else kept, except that
    beyond ``max_queries`` the kept ones farthest from ``target_iou`` (ties: larger id) become capped."""
    if not 0 <= min_iou <= max_iou <= 1:
        raise ValueError(f"need 0 <= min_iou <= max_iou <= 1, got min_iou={min_iou}, max_iou={max_iou}")
    if max_queries is not None and max_queries < 1:
        raise ValueError(f"max_queries must be >= 1, got {max_queries}")
    for entry in stats:
        mean = entry["mean_iou"]
        entry["status"] = "too_hard" if mean < min_iou else "too_easy" if mean > max_iou else "kept"
    kept = [entry for entry in stats if entry["status"] == "kept"]
    if max_queries is not None and len(kept) > max_queries:
        ranked = sorted(kept, key=lambda e: (abs(e["mean_iou"] - target_iou), e["id"]))
        for entry in ranked[max_queries:]:
            entry["status"] = "capped"
    return stats


def assign_gaussian_status(
    stats: list[dict], target_size: int, seed: int, mean: float, std: float
) -> list[dict]:
    """TimeLens's rule: the drawn queries are kept, the others not_drawn (:func:`difficulty_draw.gaussian_draw`)."""
    from video_grpo.data.difficulty_draw import gaussian_draw

    drawn = set(gaussian_draw([e["mean_iou"] for e in stats], target_size, seed, mean, std))
    for index, entry in enumerate(stats):
        entry["status"] = "kept" if index in drawn else "not_drawn"
    return stats


# -- writing -------------------------------------------------------------------------------------------------


def choose_video_root(queries: list[dict], video_root: str | None) -> Path:
    if video_root:
        return Path(video_root).resolve()
    absolute = [q["video"] for q in queries if os.path.isabs(q["video"])]
    if not absolute:
        return Path.cwd()
    return Path(os.path.commonpath([os.path.dirname(v) for v in absolute]))


def relative_video(video: str, root: Path, where: str) -> str:
    if not os.path.isabs(video):
        return video
    relative = os.path.relpath(Path(video).resolve(), root)
    if relative == ".." or relative.startswith(".." + os.sep):
        raise PredictionsError(
            f"{where}: video {video!r} is not under video_root {str(root)!r}; pass --video_root "
            "with a folder that holds every video"
        )
    return relative


def plot_histogram(
    stats: list[dict], output: Path, min_iou: float, max_iou: float, title: str | None = None
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {
        "kept": "tab:green",
        "too_hard": "tab:red",
        "too_easy": "tab:blue",
        "capped": "tab:gray",
        "not_drawn": "tab:olive",
    }
    groups = [[e["mean_iou"] for e in stats if e["status"] == status] for status in STATUSES]
    labels = [
        f"{status.replace('_', ' ')} ({len(values)})" for status, values in zip(STATUSES, groups, strict=True)
    ]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist(
        groups, bins=20, range=(0.0, 1.0), stacked=True, color=[colors[s] for s in STATUSES], label=labels
    )
    for x in (min_iou, max_iou) if title is None else ():
        ax.axvline(x, color="black", linestyle="--", linewidth=1)
    k_values = sorted({e["k"] for e in stats})
    k_text = str(k_values[0]) if len(k_values) == 1 else f"{k_values[0]}-{k_values[-1]}"
    ax.set(
        xlabel=f"mean IoU of the query's {k_text} sampled answers",
        ylabel="queries",
        xlim=(0, 1),
        title=title or f"{len(stats)} queries; band [{min_iou:g}, {max_iou:g}]",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return output


def curate_queries(
    queries: list[dict],
    output_dir: str | Path,
    min_iou: float = 0.05,
    max_iou: float = 0.95,
    max_queries: int | None = None,
    target_iou: float = 0.5,
    video_root: str | None = None,
    source: str = "",
    rule: str = "band",
    target_size: int = 2500,
    seed: int = 42,
    gaussian_mean: float = 0.05,
    gaussian_std: float = 0.2,
    span_scoring: str = "best_window",
    reader: str = "ours",
) -> dict:
    """Write per_query.jsonl, curated.jsonl, mean_iou_hist.png and summary.json; return the summary.

    ``rule``: "band" (min_iou/max_iou, max_queries, target_iou) or "gaussian" (target_size, seed,
    gaussian_mean, gaussian_std; TimeLens's draw)."""
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; choose one of {list(RULES)}")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    stats = [query_stats(q, span_scoring, reader) for q in queries]
    if rule == "gaussian":
        assign_gaussian_status(stats, target_size, seed, gaussian_mean, gaussian_std)
        title = (
            f"{len(stats)} queries; {sum(e['status'] == 'kept' for e in stats)} drawn, Gaussian "
            f"({gaussian_mean:g}, {gaussian_std:g}) x inverse bin density, seed {seed}"
        )
    else:
        assign_status(stats, min_iou, max_iou, max_queries, target_iou)
        title = None
    root = choose_video_root(queries, video_root)
    curated = []
    for query, entry in zip(queries, stats, strict=True):
        if entry["status"] == "kept":
            where = f"{source}:{query['line']}" if source else query["id"]
            curated.append(
                {
                    "id": query["id"],
                    "video": relative_video(query["video"], root, where),
                    "duration": query["duration"],
                    "solution": query["solution"],
                    "sentence": query["sentence"],
                }
            )
    write_jsonl(out / "per_query.jsonl", stats)
    write_jsonl(out / "curated.jsonl", curated)
    plot_histogram(stats, out / "mean_iou_hist.png", min_iou, max_iou, title)
    counts = {status: sum(e["status"] == status for e in stats) for status in STATUSES}
    summary = {
        "queries": len(stats),
        "answers": sum(e["k"] for e in stats),
        **counts,
        "min_iou": min_iou,
        "max_iou": max_iou,
        "max_queries": max_queries,
        "target_iou": target_iou,
        "rule": rule,
        "span_scoring": span_scoring,
        "reader": reader,
        **(
            {
                "target_size": target_size,
                "seed": seed,
                "gaussian_mean": gaussian_mean,
                "gaussian_std": gaussian_std,
            }
            if rule == "gaussian"
            else {}
        ),
        "video_root": str(root),
        "curated": str(out / "curated.jsonl"),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def format_summary(summary: dict, source: str) -> str:
    k = summary["answers"] / summary["queries"]
    if summary.get("rule") == "gaussian":
        lines = [
            f"{summary['queries']} queries, {summary['answers']} answers ({k:g} per query) from {source}",
            f"  kept (drawn)       {summary['kept']:>6}  (target_size {summary['target_size']}, weight Gaussian("
            f"mean IoU; {summary['gaussian_mean']:g}, {summary['gaussian_std']:g}) x inverse density of 20 IoU "
            f"bins, seed {summary['seed']})",
            f"  not drawn          {summary['not_drawn']:>6}",
        ]
    else:
        lines = _band_lines(summary, source, k)
    out = Path(summary["curated"]).parent
    lines += [
        f"wrote {out / 'per_query.jsonl'}, {out / 'curated.jsonl'}, {out / 'mean_iou_hist.png'}",
        f"train on it with:  train_file: {summary['curated']}   video_root: {summary['video_root']}",
    ]
    return "\n".join(lines)


def _band_lines(summary: dict, source: str, k: float) -> list[str]:
    lines = [
        f"{summary['queries']} queries, {summary['answers']} answers ({k:g} per query) from {source}",
        f"  kept               {summary['kept']:>6}  (min_iou {summary['min_iou']:g} <= mean IoU <= max_iou "
        f"{summary['max_iou']:g})",
        f"  dropped, too hard  {summary['too_hard']:>6}  (mean IoU < {summary['min_iou']:g})",
        f"  dropped, too easy  {summary['too_easy']:>6}  (mean IoU > {summary['max_iou']:g})",
    ]
    if summary["max_queries"] is not None:
        lines.append(
            f"  dropped, capped    {summary['capped']:>6}  (over max_queries {summary['max_queries']}; kept the "
            f"means closest to {summary['target_iou']:g})"
        )
    return lines


# -- command line ----------------------------------------------------------------------------------------------


def sample_main(args: argparse.Namespace) -> tuple[Path | None, str | None]:
    """Sample k answers per query into ``D/samples.jsonl`` (sharded, resumable). Returns the file on the main
    process (None elsewhere) and the video root the loader used. A recipe with ``train_sources`` samples every source
    (``evaluate.load_split``), so the ids of ``per_query.jsonl`` are the ``<source>/<id>`` that training reads."""
    from transformers import set_seed

    from video_grpo.configs import script_args_from_yaml
    from video_grpo.evaluate import generate_parts, load_split, merge_parts
    from video_grpo.inputs.families import family_of_model

    state = process_state()
    set_seed(args.seed + state.process_index)
    dataset, ids = load_split(
        args.config, family_of_model(args.model_name_or_path), args.split, args.annotations, args.max_samples
    )
    script_args = script_args_from_yaml(args.config)
    source = args.annotations or (script_args.eval_file if args.split == "eval" else script_args.train_file)
    # train_sources (no one file): the recipe's video_root, else the deepest folder holding every video
    loader_root = script_args.video_root or (str(Path(source).resolve().parent) if source else None)
    out_dir = Path(args.output_dir)
    args.do_sample = True
    generate_parts(
        args, dataset, ids, out_dir, state, prefix="samples", num_samples=args.num_samples, desc="sampling"
    )
    state.wait_for_everyone()
    if not state.is_main_process:
        return None, loader_root
    merge_parts(out_dir, ids, prefix="samples", num_samples=args.num_samples)
    return out_dir / "samples.jsonl", loader_root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m video_grpo.curate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_argument_group("what to curate (one of)")
    source.add_argument("--predictions", help="sampled predictions, evaluate run's format, k lines per id")
    source.add_argument("--model_name_or_path", help="sample the answers with this model (needs --config)")
    parser.add_argument(
        "--config", help="recipe YAML: data files, video sampling, prompt; its video_root is used"
    )
    parser.add_argument(
        "--split", choices=["train", "eval"], default="train", help="which file of the recipe"
    )
    parser.add_argument("--annotations", help="sample this annotation file instead of the recipe's split")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--num_samples", type=int, default=8, help="k: answers sampled per query")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--batch_size", type=int, default=8, help="answers per generate call")
    parser.add_argument("--max_new_tokens", type=int, default=256)
    parser.add_argument("--max_samples", type=int, help="only the first N queries (smoke runs)")
    parser.add_argument("--dtype", default="auto", help="auto, bfloat16, float16 or float32")
    add_decode_arguments(parser)
    parser.add_argument(
        "--seed", type=int, default=0, help="sampling seed, and the gaussian draw's (TimeLens: 42)"
    )
    parser.add_argument("--min_iou", type=float, default=0.05, help="below this mean IoU a query is too hard")
    parser.add_argument("--max_iou", type=float, default=0.95, help="above this mean IoU a query is too easy")
    parser.add_argument(
        "--max_queries", type=int, help="keep at most N queries: those closest to --target_iou"
    )
    parser.add_argument("--target_iou", type=float, default=0.5)
    parser.add_argument("--video_root", help="write video paths relative to this folder (see the module doc)")
    parser.add_argument(
        "--rule",
        choices=RULES,
        default="band",
        help="band (min/max IoU) or gaussian (TimeLens's weighted draw)",
    )
    parser.add_argument(
        "--target_size", type=int, default=2500, help="gaussian: queries drawn (TimeLens: 2500)"
    )
    parser.add_argument(
        "--gaussian_mean", type=float, default=0.05, help="gaussian: weight centre (TimeLens)"
    )
    parser.add_argument("--gaussian_std", type=float, default=0.2, help="gaussian: weight width (TimeLens)")
    parser.add_argument(
        "--span_scoring",
        choices=SPAN_SCORINGS,
        default="best_window",
        help="how an answer's IoU is computed, as in evaluate: best_window, set (every answered span against "
        "every true span, TimeLens2's tIoU: use it for multi-span data and TimeLens2's draw weights), or timelens "
        "(TimeLens's evaluation: the first pair its extract_time finds, plain IoU)",
    )
    parser.add_argument(
        "--reader",
        choices=SET_READERS,
        help="how --span_scoring set reads an answer: ours, or timelens2 (TimeLens2's JSON reading and tIoU); "
        "default: as the --config recipe's tiou/twass/parse_penalty rewards read it (TimeLens2's presets: "
        "timelens2), so that the draw weights come from the same reading as the training reward; else ours",
    )
    args = parser.parse_args(argv)
    if args.reader is None:
        args.reader = "ours"
        if args.config:
            from video_grpo.configs import script_args_from_yaml
            from video_grpo.rewards.functions import recipe_reader

            recipe = script_args_from_yaml(args.config)
            args.reader = recipe_reader(recipe.reward_funcs, recipe.reward_kwargs)
    if bool(args.predictions) == bool(args.model_name_or_path):
        parser.error("give either --predictions or --model_name_or_path (with --config)")
    if args.model_name_or_path and not args.config:
        parser.error("--model_name_or_path needs --config (the recipe's data, video sampling and prompt)")
    if args.num_samples < 1:
        parser.error("--num_samples must be >= 1")
    if args.target_size < 1 or args.gaussian_std <= 0:
        parser.error("--target_size must be >= 1 and --gaussian_std > 0")
    if not 0 <= args.min_iou <= args.max_iou <= 1:
        parser.error(f"need 0 <= --min_iou <= --max_iou <= 1, got {args.min_iou} and {args.max_iou}")
    video_root = args.video_root
    if video_root is None and args.config:
        from video_grpo.configs import script_args_from_yaml

        video_root = script_args_from_yaml(args.config).video_root
    if args.predictions:
        return curate_main(args, Path(args.predictions), video_root)
    path, loader_root = sample_main(args)
    try:  # the main process curates while the others wait, then every rank ends the run together
        return 0 if path is None else curate_main(args, path, video_root or loader_root)
    finally:
        end_run()


def curate_main(args: argparse.Namespace, path: Path, video_root: str | None) -> int:
    """Curate the sampled answers in ``path``; print the summary. Returns the exit code."""
    try:
        queries = read_samples(path)
        summary = curate_queries(
            queries,
            args.output_dir,
            args.min_iou,
            args.max_iou,
            args.max_queries,
            args.target_iou,
            video_root,
            source=str(path),
            rule=args.rule,
            target_size=args.target_size,
            seed=args.seed,
            gaussian_mean=args.gaussian_mean,
            gaussian_std=args.gaussian_std,
            span_scoring=args.span_scoring,
            reader=args.reader,
        )
    except PredictionsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_summary(summary, str(path)))
    if not summary["kept"]:
        print("error: no query is left in the band; widen --min_iou/--max_iou", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    exit_process(main())
