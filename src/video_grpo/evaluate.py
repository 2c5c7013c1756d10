"""Evaluate temporal grounding the way published Charades-STA / ActivityNet numbers are computed.

    python -m video_grpo.evaluate run --model_name_or_path outputs/demo --config configs/grpo/demo_tiny.yaml \\
        --split eval --output_dir outputs/demo/eval
    accelerate launch --num_processes 8 -m video_grpo.evaluate run ...          # queries sharded over processes
    python -m video_grpo.evaluate score --predictions predictions.jsonl [--output metrics.json]

``run`` uses the training path for prompts, frame sampling and processing (``video_grpo.data`` and
``video_grpo.processing``), decodes greedily by default, and appends one line per query to
``predictions.rank<R>.jsonl`` as it goes; a restarted run skips every id already written, so a killed run
loses nothing it finished. At the end the parts are merged into ``predictions.jsonl`` and scored into
``metrics.json``.

Metric rules (``score``):

- IoU = max(0, min(E, E') - max(S, S')) / (max(E, E') - min(S, S')), and 0 when the union is 0;
- spans are used as parsed and as annotated (``solution_raw``), with no clamping;
- the span is parsed from the last ``<answer>`` block; without one, the last ``S to E`` anywhere in the
  text is used (so base models can be scored zero-shot); S > E is a parse failure;
- a parse failure counts as IoU 0 and stays in the denominator;
- R1@m is the percentage of queries with IoU >= m, for m = 0.3, 0.5, 0.7; mIoU is the mean IoU (in %);
- ``--span_scoring best_window`` (the default): one predicted span, the last; with several true windows
  (QVHighlights), a query's IoU is the best IoU over its windows;
- ``--span_scoring set`` (TimeLens2's evaluation, VLMEvalKit's multi-span IoU): every predicted span is read
  (``S to E`` or the JSON ``[[S, E], ...]``), from the answer block or, without one, the whole text; the
  predicted spans are merged, and IoU = sum of their overlaps with the true spans / the length of the union of
  both sets. For one predicted and one true span this is the IoU above. (TimeLens2 leaves the true spans
  unmerged; we merge them too, which differs only when true spans overlap each other.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

from video_grpo import prefill
from video_grpo.annotations import write_jsonl
from video_grpo.answers import (
    answer_block,
    completion_text,
    parse_answer_spans,
    parse_span_in,
    solution_spans,
)
from video_grpo.decode import CompiledDecoder, add_decode_arguments, evaluation_decoder
from video_grpo.distributed import end_run, exit_process, process_state
from video_grpo.families import detect_family, family_of_model
from video_grpo.prefix import unforkable_layers
from video_grpo.processing import encode_rows, generation_inputs, vision_placeholder_ids
from video_grpo.rewards import temporal_iou
from video_grpo.span_sets import union_iou

THRESHOLDS = (0.3, 0.5, 0.7)
DURATION_BUCKETS = ((0, 30), (30, 60), (60, 120), (120, float("inf")))
SPAN_SCORINGS = ("best_window", "set")


# -- scoring -----------------------------------------------------------------------------------------------


def parse_prediction(output: str | None) -> tuple[float, float] | None:
    """Span from the last ``<answer>`` block, else the last ``S to E`` anywhere; None on failure."""
    if not output:
        return None
    text = completion_text(output)
    block = answer_block(text)
    return parse_span_in(block if block is not None else text)


def query_iou(span: tuple[float, float] | None, solution) -> float:
    if span is None:
        return 0.0
    windows = solution if isinstance(solution[0], list | tuple) else [solution]
    return max(temporal_iou(span, (float(s), float(e))) for s, e in windows)


def parse_prediction_spans(output: str | None) -> list[tuple[float, float]] | None:
    """Every span of the last ``<answer>`` block, else of the whole text; None on failure."""
    return parse_answer_spans(output) if output else None


def set_iou(spans: list[tuple[float, float]] | None, solution) -> float:
    """TimeLens2's multi-span IoU of the predicted span set with the true one(s); 0 on a parse failure."""
    return 0.0 if spans is None else union_iou(spans, solution_spans(solution))


def score_output(output: str | None, solution, span_scoring: str = "best_window") -> tuple[float, bool]:
    """``(IoU, parsed)`` of one answer under ``span_scoring`` (see the module docstring)."""
    if span_scoring == "set":
        spans = parse_prediction_spans(output)
        return set_iou(spans, solution), spans is not None
    if span_scoring != "best_window":
        raise ValueError(f"span_scoring {span_scoring!r} is not one of {SPAN_SCORINGS}")
    span = parse_prediction(output)
    return query_iou(span, solution), span is not None


def _summary(ious: list[float], failures: int) -> dict:
    n = len(ious)
    metrics = {f"R1@{m}": (100.0 * sum(iou >= m for iou in ious) / n if n else 0.0) for m in THRESHOLDS}
    metrics["mIoU"] = 100.0 * sum(ious) / n if n else 0.0
    metrics["num_queries"] = n
    metrics["num_parse_failures"] = failures
    return metrics


def score_records(records: list[dict], span_scoring: str = "best_window") -> dict:
    """Metrics from prediction records with ``output``, ``solution`` and ``duration``."""
    ious, failures, buckets = [], 0, {b: ([], [0]) for b in DURATION_BUCKETS}
    for record in records:
        iou, parsed = score_output(record.get("output"), record["solution"], span_scoring)
        failures += not parsed
        ious.append(iou)
        for low, high in DURATION_BUCKETS:
            if low <= float(record["duration"]) < high:
                buckets[(low, high)][0].append(iou)
                buckets[(low, high)][1][0] += not parsed
    metrics = _summary(ious, failures)
    metrics["span_scoring"] = span_scoring
    metrics["by_duration"] = {
        (f"{low:g}-{high:g}s" if high != float("inf") else f">={low:g}s"): _summary(b_ious, b_fail[0])
        for (low, high), (b_ious, b_fail) in buckets.items()
        if b_ious
    }
    return metrics


def read_predictions(path: str | Path) -> list[dict]:
    records = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if line.endswith("\n"):
                    raise ValueError(f"{path}:{line_no}: not valid JSON") from None
                continue  # a last line cut short by a kill: that query is simply redone
            missing = [k for k in ("output", "solution", "duration") if k not in record]
            if missing:
                raise ValueError(
                    f"{path}:{line_no}: missing {missing}; each line needs output, solution, duration"
                )
            records.append(record)
    return records


# -- generation --------------------------------------------------------------------------------------------


@torch.no_grad()
def generate_answers(
    model,
    processor,
    rows: list[dict],
    max_new_tokens: int = 256,
    do_sample: bool = False,
    temperature: float = 1.0,
    shared_prefill: bool = True,
    text_timestamps: bool = False,
    decoder: CompiledDecoder | None = None,
) -> list[str]:
    """Answers for a batch of dataset rows, through the same processing as training.

    ``shared_prefill``: rows that repeat a query (k samples per query) prefill its prompt once
    (:mod:`video_grpo.prefill`, which copies Qwen3.5's Gated DeltaNet states too); models with sequence-state
    layers their family cannot fork take the plain path.
    ``text_timestamps``: the recipe's ``frame_timestamps_in_text`` (TimeLens-7B), as in training.
    ``decoder``: decode through its static cache and compiled step (:mod:`video_grpo.decode`; the same tokens)."""
    config = model.config
    tokenizer = processor.tokenizer
    encoded = encode_rows(processor, rows, detect_family(config).with_text_timestamps(text_timestamps))
    shared_prefill = shared_prefill and not unforkable_layers(config)
    inputs = generation_inputs(
        encoded,
        tokenizer.pad_token_id,
        config.video_token_id,
        device=model.device,
        one_copy_per_video=shared_prefill,  # k answers of a query: one copy of its video, not k
    )
    kwargs = {
        "max_new_tokens": max_new_tokens,
        "do_sample": do_sample,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "suppress_tokens": vision_placeholder_ids(config),
    }
    if do_sample:
        kwargs["temperature"] = temperature
    else:
        kwargs.update(temperature=None, top_p=None, top_k=None)
    decoder = decoder if decoder is not None and decoder.enabled else None
    if shared_prefill or decoder is not None:
        output = prefill.generate(model, **inputs, **kwargs, decoder=decoder, share=shared_prefill)
    else:
        output = model.generate(**inputs, **kwargs)
    return processor.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def prediction_record(
    row: dict, output: str | None, error: str | None = None, span_scoring: str = "best_window"
) -> dict:
    span = parse_prediction(output)
    solution = row.get("solution_raw") or row["solution"]
    record = {
        "id": row["id"],
        "video": row["video"],
        "sentence": row["sentence"],
        "duration": row["duration"],
        "solution": solution,
        "output": output,
        "span": list(span) if span else None,
        "iou": score_output(output, solution, span_scoring)[0],
    }
    if error:
        record["error"] = error
    return record


# -- running a model over a split (shared with `python -m video_grpo.curate`) ---------------------------------


def sample_key(record: dict) -> tuple[str, int]:
    """What a written answer answers: its query id and, when k answers per query are drawn, its sample index."""
    return record["id"], int(record.get("sample", 0))


def load_split(
    config: str, family, split: str = "eval", annotations: str | None = None, max_samples: int | None = None
):
    """``(dataset, ids)`` for a recipe's eval/train file or another annotation file, its frames sampled for the
    model ``family``. The train split of a recipe with ``train_sources`` is every source, read as training reads
    it (ids ``<source>/<id>``, each source's prompt). Reading the ids decodes nothing."""
    from video_grpo.configs import script_args_from_yaml
    from video_grpo.data import build_dataset, build_train_dataset, dataset_kwargs

    script_args = script_args_from_yaml(config)
    if split == "train" and not annotations:
        if not script_args.train_file and not script_args.train_sources:
            raise SystemExit(f"{config} has no train_file or train_sources; pass --annotations")
        dataset = build_train_dataset(script_args, family, max_samples, replace_bad_samples=False)
        return dataset, dataset.with_format(None)["id"]
    path = annotations or script_args.eval_file
    if not path:
        raise SystemExit(f"{config} has no {split}_file; pass --annotations")
    dataset = build_dataset(
        path,
        max_samples=max_samples,
        replace_bad_samples=False,
        normalize_query=script_args.normalize_query,
        **dataset_kwargs(script_args, family),
    )
    return dataset, dataset.with_format(None)["id"]  # plain column access: no video decoding


def generate_parts(
    args: argparse.Namespace,
    dataset,
    ids: list[str],
    out_dir: Path,
    state,
    prefix: str = "predictions",
    num_samples: int = 1,
    desc: str = "evaluating",
) -> None:
    """Answer each (query, sample) that no ``out_dir/<prefix>*.jsonl`` holds yet, appending one line per answer
    to ``<prefix>.rank<R>.jsonl`` as it is made; the work is split over the processes of ``state``.

    With ``num_samples`` k > 1 every query is answered k times and each line carries ``sample`` (0..k-1), so a
    killed run redoes only the missing (query, sample) pairs. ``args`` supplies ``model_name_or_path``,
    ``dtype``, ``batch_size`` (answers per generate call), ``max_new_tokens``, ``do_sample``, ``temperature``."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from video_grpo.video import VideoReadError

    out_dir.mkdir(parents=True, exist_ok=True)
    done = set()
    for part in out_dir.glob(f"{prefix}*.jsonl"):
        done.update(sample_key(record) for record in read_predictions(part))
    todo = [(i, j) for i, query_id in enumerate(ids) for j in range(num_samples) if (query_id, j) not in done]
    todo = todo[state.process_index :: state.num_processes]
    # Every rank must split the same list: none may write a line before all have read what was done. Without
    # this barrier a rank that starts late sees an early rank's new lines, splits a shorter list, and some
    # answers are made by no rank (seen: 5 of 6 samples under load).
    state.wait_for_everyone()

    processor = AutoProcessor.from_pretrained(args.model_name_or_path)
    dtype = getattr(torch, args.dtype) if args.dtype != "auto" else "auto"
    model = (
        AutoModelForImageTextToText.from_pretrained(args.model_name_or_path, dtype=dtype)
        .to(state.device)
        .eval()
    )
    text_timestamps, script_args = False, None
    if getattr(args, "config", None):
        from video_grpo.configs import script_args_from_yaml

        script_args = script_args_from_yaml(args.config)
        text_timestamps = script_args.frame_timestamps_in_text
    decoder = evaluation_decoder(args, state.device, args.batch_size, model.config)
    if decoder is not None and script_args is not None:  # the cache as long as the recipe's longest prompt
        from video_grpo.plan.startup import decode_cache_tokens

        decoder.max_cache_len = decode_cache_tokens(script_args, args.model_name_or_path, args.max_new_tokens)
    unit = "answer" if num_samples > 1 else "query"
    progress = tqdm(
        total=len(todo),
        desc=f"{desc} ({len(done)} done before)",
        unit=unit,
        disable=not state.is_main_process,
    )
    with open(out_dir / f"{prefix}.rank{state.process_index}.jsonl", "a", encoding="utf-8") as part:
        for start in range(0, len(todo), args.batch_size):
            items = todo[start : start + args.batch_size]
            unique = list(dict.fromkeys(i for i, _ in items))  # a query's k answers share one decoded video
            try:
                fetched = dict(zip(unique, dataset.__getitems__(unique), strict=True))
                rows = [fetched[i] for i, _ in items]
                outputs = generate_answers(
                    model,
                    processor,
                    rows,
                    args.max_new_tokens,
                    args.do_sample,
                    args.temperature,
                    getattr(args, "shared_prefill", True),
                    text_timestamps,
                    decoder,
                )
                scoring = getattr(args, "span_scoring", "best_window")
                records = [
                    prediction_record(row, output, span_scoring=scoring)
                    for row, output in zip(rows, outputs, strict=True)
                ]
            except (
                VideoReadError
            ) as err:  # one bad video must not end the run: it scores 0, in the denominator
                plain = dict(zip(unique, dataset.select(unique).with_format(None), strict=True))
                records = [prediction_record(plain[i], None, error=str(err)) for i, _ in items]
            for (_, sample), record in zip(items, records, strict=True):
                if num_samples > 1:
                    record["sample"] = sample
                part.write(json.dumps(record) + "\n")
            part.flush()
            progress.update(len(items))
    progress.close()


def merge_parts(
    out_dir: Path, ids: list[str], prefix: str = "predictions", num_samples: int = 1
) -> list[dict]:
    """Join the part files into ``<prefix>.jsonl`` (in query order, then sample order) and delete the parts."""
    merged = {}
    for path in sorted(out_dir.glob(f"{prefix}*.jsonl")):
        for record in read_predictions(path):
            merged.setdefault(sample_key(record), record)
    ordered = [
        merged[(query_id, j)] for query_id in ids for j in range(num_samples) if (query_id, j) in merged
    ]
    tmp = out_dir / f"{prefix}.jsonl.tmp"
    write_jsonl(tmp, ordered)
    tmp.replace(out_dir / f"{prefix}.jsonl")
    for path in out_dir.glob(f"{prefix}.rank*.jsonl"):
        path.unlink()
    return ordered


def run_main(args: argparse.Namespace) -> int:
    state = process_state()
    dataset, ids = load_split(
        args.config, family_of_model(args.model_name_or_path), args.split, args.annotations, args.max_samples
    )
    out_dir = Path(args.output_dir)
    generate_parts(args, dataset, ids, out_dir, state)
    state.wait_for_everyone()
    if state.is_main_process:
        ordered = merge_parts(out_dir, ids)
        metrics = score_records(ordered, args.span_scoring)
        (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
        print(json.dumps({k: v for k, v in metrics.items() if k != "by_duration"}))
    end_run()
    return 0


def score_main(args: argparse.Namespace) -> int:
    metrics = score_records(read_predictions(args.predictions), args.span_scoring)
    text = json.dumps(metrics, indent=2)
    if args.output:
        Path(args.output).write_text(text)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m video_grpo.evaluate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="generate answers for a split and score them")
    run.add_argument("--model_name_or_path", required=True)
    run.add_argument("--config", required=True, help="recipe YAML: data files, video sampling, prompt")
    run.add_argument("--split", choices=["eval", "train"], default="eval", help="which file of the recipe")
    run.add_argument("--annotations", help="evaluate this annotation file instead of the recipe's split")
    run.add_argument("--output_dir", required=True)
    run.add_argument("--batch_size", type=int, default=4)
    run.add_argument("--max_samples", type=int)
    run.add_argument("--max_new_tokens", type=int, default=256)
    run.add_argument("--do_sample", action="store_true", help="sample instead of greedy decoding")
    run.add_argument("--temperature", type=float, default=1.0)
    run.add_argument(
        "--shared_prefill",
        type=lambda v: v.lower() in ("1", "true", "yes"),
        default=True,
        help="prefill a query's prompt once for its k sampled answers (true/false; exact)",
    )
    run.add_argument("--dtype", default="auto", help="auto, bfloat16, float16 or float32")
    add_decode_arguments(run)
    score = sub.add_parser("score", help="recompute metrics from a predictions file (no model)")
    score.add_argument("--predictions", required=True)
    score.add_argument("--output")
    for command in (run, score):
        command.add_argument(
            "--span_scoring",
            choices=SPAN_SCORINGS,
            default="best_window",
            help="best_window: the last predicted span, best IoU over the true windows; set: TimeLens2's "
            "multi-span IoU of all predicted spans, merged, with all true spans",
        )
    args = parser.parse_args(argv)
    return run_main(args) if args.command == "run" else score_main(args)


if __name__ == "__main__":
    exit_process(main())
