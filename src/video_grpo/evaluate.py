"""Evaluate temporal grounding the way published Charades-STA / ActivityNet numbers are computed.

    python -m video_grpo.evaluate run --model_name_or_path outputs/demo --config configs/grpo/demo_tiny.yaml \\
        --split eval --output_dir outputs/demo/eval
    accelerate launch --num_processes 8 -m video_grpo.evaluate run ...          # queries sharded over processes
    python -m video_grpo.evaluate score --predictions predictions.jsonl [--output metrics.json]

``run`` uses the training path for prompts, frame sampling and processing (``video_grpo.data.dataset`` and
``video_grpo.inputs.processing``), decodes as the recipe's ``eval_generation_kwargs`` say (greedy, 256 new tokens when
it says nothing; command-line flags win), scores with the recipe's ``span_scoring`` unless ``--span_scoring`` is
given, and appends one line per query to ``predictions.rank<R>.jsonl`` as it goes; a restarted run skips every id
already written, so a killed run loses nothing it finished. At the end the parts are merged into
``predictions.jsonl`` and scored into ``metrics.json``.

Metric rules (``score``; the scorings are :mod:`video_grpo.rewards.span_scoring`'s):

- R1@m is the percentage of queries with IoU >= m, for m = 0.3, 0.5, 0.7; mIoU is the mean IoU (in %);
- a parse failure counts as IoU 0 and stays in the denominator;
- spans are used as parsed and as annotated (``solution_raw``), with no clamping;
- ``--span_scoring best_window`` (the default): the span is the last one of the last ``<answer>`` block;
  without a block, the last ``S to E`` anywhere in the text (so base models can be scored zero-shot); S > E is a
  parse failure; IoU = max(0, min(E, E') - max(S, S')) / (max(E, E') - min(S, S')), 0 when the union is 0;
  with several true windows (QVHighlights), a query's IoU is the best IoU over its windows;
- ``--span_scoring set`` (the multi-span IoU of TimeLens2's VLMEvalKit for VUE-TR, ``vidi_vue_tr.py``): every
  predicted span is read (``S to E`` or the JSON ``[[S, E], ...]``), from the answer block or, without one, the
  whole text; the predicted spans are merged, and IoU = sum of their overlaps with the true spans / the length
  of the union of both sets. For one predicted and one true span this is the IoU above. (TimeLens2 leaves the
  true spans unmerged; we merge them too, which differs only when true spans overlap each other.)
- ``--span_scoring timelens`` (how TimeLens and TimeLens2's VLMEvalKit score Charades-, ActivityNet- and
  QVHighlights-TimeLens, ``TimeLensBase.evaluate``): the whole output, tags and all, is read by TimeLens's
  ``extract_time`` (clock-time pairs, else ``a - b`` ranges, else ``a to b``, else any numbers paired in order);
  the *first* pair is scored against the first true span with the IoU above, unswapped: a reversed pair scores 0
  (it is not a parse failure); an output with no pair is one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

from video_grpo.data.annotations import write_jsonl
from video_grpo.inputs.families import detect_family, family_of_model
from video_grpo.inputs.prefix import unforkable_layers
from video_grpo.inputs.processing import encode_rows, generation_inputs, vision_placeholder_ids
from video_grpo.rewards.functions import recipe_reader
from video_grpo.rewards.span_scoring import (  # noqa: F401  (re-exported: evaluate's public scoring API)
    SET_READERS,
    SPAN_SCORING_HELP,
    SPAN_SCORINGS,
    check_span_scoring,
    parse_prediction,
    parse_prediction_spans,
    query_iou,
    score_output,
    scored_span,
    set_iou,
    timelens_iou,
    timelens_prediction,
)
from video_grpo.rollout import prefill
from video_grpo.rollout.decode import CompiledDecoder, add_decode_arguments, evaluation_decoder
from video_grpo.runtime.distributed import end_run, exit_process, process_state

THRESHOLDS = (0.3, 0.5, 0.7)
DURATION_BUCKETS = ((0, 30), (30, 60), (60, 120), (120, float("inf")))


# -- scoring -----------------------------------------------------------------------------------------------


def _summary(ious: list[float], failures: int) -> dict:
    n = len(ious)
    metrics = {f"R1@{m}": (100.0 * sum(iou >= m for iou in ious) / n if n else 0.0) for m in THRESHOLDS}
    metrics["mIoU"] = 100.0 * sum(ious) / n if n else 0.0
    metrics["num_queries"] = n
    metrics["num_parse_failures"] = failures
    return metrics


def score_records(records: list[dict], span_scoring: str = "best_window", reader: str = "ours") -> dict:
    """Metrics from prediction records with ``output``, ``solution`` and ``duration``; ``reader``: how ``set``
    reads an answer (the recipe's, :func:`video_grpo.rewards.functions.recipe_reader`)."""
    ious, failures, buckets = [], 0, {b: ([], [0]) for b in DURATION_BUCKETS}
    for record in records:
        iou, parsed = score_output(record.get("output"), record["solution"], span_scoring, reader)
        failures += not parsed
        ious.append(iou)
        for low, high in DURATION_BUCKETS:
            if low <= float(record["duration"]) < high:
                buckets[(low, high)][0].append(iou)
                buckets[(low, high)][1][0] += not parsed
    metrics = _summary(ious, failures)
    metrics["span_scoring"] = span_scoring
    if span_scoring == "set":
        metrics["reader"] = reader
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
    top_p: float | None = None,
    top_k: int | None = None,
    repetition_penalty: float | None = None,
) -> list[str]:
    """Answers for a batch of dataset rows, through the same processing as training.

    ``shared_prefill``: rows that repeat a query (k samples per query) prefill its prompt once
    (:mod:`video_grpo.rollout.prefill`, which copies Qwen3.5's Gated DeltaNet states too); models with sequence-state
    layers their family cannot fork take the plain path.
    ``text_timestamps``: the recipe's ``frame_timestamps_in_text`` (TimeLens-7B), as in training.
    ``decoder``: decode through its static cache and compiled step (:mod:`video_grpo.rollout.decode`; the same tokens).
    ``top_p``, ``top_k`` (when sampling) and ``repetition_penalty``: passed to ``generate`` when given, on every
    path (the shared prefill and the compiled step hand ``generate`` its keyword arguments as they are); unset, the
    model's generation_config decides, as before."""
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
        sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k}
        kwargs.update({key: value for key, value in sampling.items() if value is not None})
    else:
        kwargs.update(temperature=None, top_p=None, top_k=None)
    if repetition_penalty is not None:
        kwargs["repetition_penalty"] = repetition_penalty
    decoder = decoder if decoder is not None and decoder.enabled else None
    if shared_prefill or decoder is not None:
        output = prefill.generate(model, **inputs, **kwargs, decoder=decoder, share=shared_prefill)
    else:
        output = model.generate(**inputs, **kwargs)
    return processor.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def prediction_record(
    row: dict,
    output: str | None,
    error: str | None = None,
    span_scoring: str = "best_window",
    reader: str = "ours",
) -> dict:
    """One line of ``predictions.jsonl``: ``span`` is what ``span_scoring`` read (for ``set``, every span read)
    and ``iou`` its score."""
    solution = row.get("solution_raw") or row["solution"]
    record = {
        "id": row["id"],
        "video": row["video"],
        "sentence": row["sentence"],
        "duration": row["duration"],
        "solution": solution,
        "output": output,
        "span": scored_span(output, span_scoring, reader),
        "iou": score_output(output, solution, span_scoring, reader)[0],
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
    from video_grpo.data.dataset import build_dataset, build_train_dataset, dataset_kwargs

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
    ``dtype``, ``batch_size`` (answers per generate call), ``max_new_tokens``, ``do_sample``, ``temperature`` and
    optionally ``top_p``, ``top_k``, ``repetition_penalty`` and ``span_scoring``."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from video_grpo.data.video import VideoReadError

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
    scoring = getattr(args, "span_scoring", None) or "best_window"
    reader = getattr(args, "reader", None) or "ours"
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
                    top_p=getattr(args, "top_p", None),
                    top_k=getattr(args, "top_k", None),
                    repetition_penalty=getattr(args, "repetition_penalty", None),
                )
                records = [
                    prediction_record(row, output, span_scoring=scoring, reader=reader)
                    for row, output in zip(rows, outputs, strict=True)
                ]
            except (
                VideoReadError
            ) as err:  # one bad video must not end the run: it scores 0, in the denominator
                plain = dict(zip(unique, dataset.select(unique).with_format(None), strict=True))
                records = [
                    prediction_record(plain[i], None, error=str(err), span_scoring=scoring, reader=reader)
                    for i, _ in items
                ]
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


# evaluate run's decoding where neither the command line nor the recipe's eval_generation_kwargs sets it
RUN_GENERATION_DEFAULTS = {"do_sample": False, "temperature": 1.0, "max_new_tokens": 256}


def resolve_run_settings(args: argparse.Namespace, script_args=None) -> argparse.Namespace:
    """``evaluate run``'s span scoring and decoding, in ``args``: each flag given on the command line, else the
    recipe's ``span_scoring`` / ``eval_generation_kwargs`` key, else :data:`RUN_GENERATION_DEFAULTS` (top_p, top_k
    and repetition_penalty unset: the model's generation_config). Without ``script_args``, the recipe at
    ``args.config`` is read."""
    from video_grpo.configs import EVAL_GENERATION_KEYS, script_args_from_yaml

    if script_args is None:
        script_args = script_args_from_yaml(args.config)
    if getattr(args, "span_scoring", None) is None:
        args.span_scoring = script_args.span_scoring
    if getattr(args, "reader", None) is None:  # read answers as the recipe's training rewards do
        args.reader = recipe_reader(script_args.reward_funcs, script_args.reward_kwargs)
    check_span_scoring(args.span_scoring, args.reader)
    recipe = script_args.eval_generation_kwargs or {}
    for key in EVAL_GENERATION_KEYS:
        if getattr(args, key, None) is None:
            setattr(args, key, recipe.get(key, RUN_GENERATION_DEFAULTS.get(key)))
    return args


def run_settings(args: argparse.Namespace) -> dict:
    """The resolved scoring and decoding of a run, as printed at its start."""
    from video_grpo.configs import EVAL_GENERATION_KEYS

    return {
        "span_scoring": args.span_scoring,
        "reader": args.reader,
        **{key: getattr(args, key) for key in EVAL_GENERATION_KEYS if getattr(args, key) is not None},
    }


def run_main(args: argparse.Namespace) -> int:
    state = process_state()
    resolve_run_settings(args)
    if state.is_main_process:
        print(f"evaluate run: {json.dumps(run_settings(args))}", flush=True)
    dataset, ids = load_split(
        args.config, family_of_model(args.model_name_or_path), args.split, args.annotations, args.max_samples
    )
    out_dir = Path(args.output_dir)
    generate_parts(args, dataset, ids, out_dir, state)
    state.wait_for_everyone()
    if state.is_main_process:
        ordered = merge_parts(out_dir, ids)
        metrics = score_records(ordered, args.span_scoring, args.reader)
        (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
        print(json.dumps({k: v for k, v in metrics.items() if k != "by_duration"}))
    end_run()
    return 0


def score_main(args: argparse.Namespace) -> int:
    if args.config:  # the recipe's scoring and reader, where the command line does not name them
        from video_grpo.configs import script_args_from_yaml

        script_args = script_args_from_yaml(args.config)
        args.span_scoring = args.span_scoring or script_args.span_scoring
        args.reader = args.reader or recipe_reader(script_args.reward_funcs, script_args.reward_kwargs)
    args.span_scoring, args.reader = args.span_scoring or "best_window", args.reader or "ours"
    check_span_scoring(args.span_scoring, args.reader)
    metrics = score_records(read_predictions(args.predictions), args.span_scoring, args.reader)
    text = json.dumps(metrics, indent=2)
    if args.output:
        Path(args.output).write_text(text)
    print(text)
    return 0


def _true_or_false(value: str) -> bool:
    if value.lower() in ("1", "true", "yes"):
        return True
    if value.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def build_parser() -> argparse.ArgumentParser:
    """The ``run`` and ``score`` command lines (a function of its own so tests can resolve a run's settings)."""
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
    recipe = "default: the recipe's eval_generation_kwargs, else"
    run.add_argument("--max_new_tokens", type=int, help=f"{recipe} 256")
    run.add_argument(
        "--do_sample",
        type=_true_or_false,
        nargs="?",
        const=True,
        help=f"sample instead of greedy decoding (--do_sample, or --do_sample true/false; {recipe} false)",
    )
    run.add_argument("--temperature", type=float, help=f"when sampling ({recipe} 1.0)")
    run.add_argument("--top_p", type=float, help=f"when sampling ({recipe} the model's generation_config)")
    run.add_argument("--top_k", type=int, help=f"when sampling ({recipe} the model's generation_config)")
    run.add_argument("--repetition_penalty", type=float, help=f"{recipe} the model's generation_config")
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
    run.add_argument(
        "--span_scoring",
        choices=SPAN_SCORINGS,
        help=f"default: the recipe's span_scoring. {SPAN_SCORING_HELP}",
    )
    score.add_argument(
        "--span_scoring",
        choices=SPAN_SCORINGS,
        help=f"default: the --config recipe's span_scoring, else best_window. {SPAN_SCORING_HELP}",
    )
    score.add_argument(
        "--config",
        help="a recipe YAML: score with its span_scoring, reading answers as its rewards do (reader)",
    )
    for command in (run, score):
        command.add_argument(
            "--reader",
            choices=SET_READERS,
            help="how span_scoring set reads an answer: ours, or timelens2 (TimeLens2's JSON reading and tIoU); "
            "default: the reader of the --config recipe's tiou/twass/parse_penalty rewards, else ours",
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_main(args) if args.command == "run" else score_main(args)


if __name__ == "__main__":
    exit_process(main())
