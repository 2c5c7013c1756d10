"""``span_scoring: timelens`` scores as TimeLens2's VLMEvalKit does, and a recipe's scoring and decoding reach
``evaluate run`` and training's evaluation.

The expected values in ``tests/fixtures/timelens_vlmevalkit_scores.json`` are their code's, not ours: a one-off
script (not shipped) took ``extract_time`` and ``iou`` out of MCG-NJU/TimeLens2's
``evaluation/vlmeval/dataset/timelens.py`` at commit 2eb53e2 (``git show``, the two functions' source exec'd),
ran them on :func:`tests.timelens_answers.timelens2_style_answers` (seed 44, 360 answers) with
``TimeLensBase.evaluate``'s rule (the first pair, the first true span; no pair scores 0 in the denominator;
R1@m counts IoU >= m), and wrote each answer's first pair and IoU, their mean and R1s, the sha256 of the answers,
``prepare_dataset``'s query cleaning applied to a few queries, and ``TimeLensBase.GROUNDER_PROMPT``."""

from __future__ import annotations

import json

import pytest
import yaml

from video_grpo import evaluate
from video_grpo.configs import TIMELENS_PROMPT, GRPOScriptArguments, script_args_from_yaml
from video_grpo.evaluate import prediction_record, score_output, score_records, scored_span

from .conftest import REPO, SAMPLES
from .timelens_answers import answers_hash, timelens2_style_answers

FIXTURE = json.loads((REPO / "tests" / "fixtures" / "timelens_vlmevalkit_scores.json").read_text())
PRESET = REPO / "configs" / "evaluate" / "timelens2_charades_4fps.yaml"
# What docs/evaluation.md states for these answers under each scoring (mIoU, R1@0.3, R1@0.5, R1@0.7, failures)
DOCUMENTED = {
    "timelens": (43.18, 58.33, 45.00, 34.17, 25),
    "best_window": (37.40, 49.44, 41.11, 31.67, 121),
    "set": (37.76, 51.39, 41.94, 28.89, 123),
}


@pytest.fixture(scope="module")
def answers() -> list[dict]:
    records = timelens2_style_answers()
    assert answers_hash(records) == FIXTURE["answers_sha256"], "the generator changed: remake the fixture"
    return records


def test_evaluate_score_gives_their_numbers(answers, tmp_path):
    predictions, output = tmp_path / "predictions.jsonl", tmp_path / "metrics.json"
    predictions.write_text("".join(json.dumps(r) + "\n" for r in answers))
    argv = ["score", "--predictions", str(predictions), "--span_scoring", "timelens", "--output", str(output)]
    assert evaluate.main(argv) == 0
    metrics, theirs = json.loads(output.read_text()), FIXTURE["metrics"]
    assert metrics["span_scoring"] == "timelens" and metrics["num_queries"] == FIXTURE["count"] == 360
    for key in ("mIoU", "R1@0.3", "R1@0.5", "R1@0.7"):
        assert metrics[key] == pytest.approx(theirs[key], abs=1e-9), key
    assert metrics["num_parse_failures"] == theirs["no_pair"]


def test_each_answer_reads_and_scores_as_theirs(answers):
    for record, theirs in zip(answers, FIXTURE["per_answer"], strict=True):
        iou, parsed = score_output(record["output"], record["solution"], "timelens")
        assert (scored_span(record["output"], "timelens"), iou) == (theirs["first_pair"], theirs["iou"]), (
            record
        )
        assert parsed == (theirs["first_pair"] is not None)
        row = {**record, "video": "v.mp4", "sentence": "q"}
        line = prediction_record(row, record["output"], span_scoring="timelens")
        assert (line["span"], line["iou"]) == (theirs["first_pair"], theirs["iou"])
    # the forms that set the scorings apart are all there
    reversed_pairs = [
        p for p in FIXTURE["per_answer"] if p["first_pair"] and p["first_pair"][0] > p["first_pair"][1]
    ]
    assert reversed_pairs and all(p["iou"] == 0.0 for p in reversed_pairs)
    assert sum(p["first_pair"] is None for p in FIXTURE["per_answer"]) == 25


def test_the_documented_numbers_of_each_scoring(answers):
    """docs/evaluation.md's table: the same answers under the three scorings."""
    for scoring, expected in DOCUMENTED.items():
        metrics = score_records(answers, scoring)
        got = tuple(round(metrics[k], 2) for k in ("mIoU", "R1@0.3", "R1@0.5", "R1@0.7"))
        assert (*got, metrics["num_parse_failures"]) == expected, scoring


def test_other_scorings_keep_their_span_in_the_record():
    output = "<think>near 1 - 2</think><answer>[[4, 6], [8, 9]]</answer>"
    assert scored_span(output, "timelens") == [1.0, 2.0]  # the whole text: the think block's pair comes first
    assert scored_span(output, "best_window") == [8.0, 9.0]  # the last span of the answer block
    assert scored_span(output, "set") == [[4.0, 6.0], [8.0, 9.0]]  # every span set scoring reads
    with pytest.raises(ValueError, match="is not one of"):
        scored_span(output, "first")


def test_the_timeline_draws_every_span_of_a_set_record(tmp_path, monkeypatch):
    import matplotlib.axes

    from video_grpo.plot import plot_timeline

    row = {"id": "q", "video": "v.mp4", "sentence": "s", "duration": 20.0, "solution": [4, 6]}
    line = prediction_record(row, "[[4, 6], [8, 9]]", span_scoring="set")
    path = tmp_path / "predictions.jsonl"
    path.write_text(json.dumps(line) + "\n")
    drawn, plot = [], matplotlib.axes.Axes.plot

    def spy(self, *args, **kwargs):
        drawn.append((args[0] if args else None, kwargs.get("color")))
        return plot(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    plot_timeline(path, tmp_path / "timeline.png")
    assert [x for x, color in drawn if color == "tab:orange" and x] == [[4.0, 6.0], [8.0, 9.0]]


def test_bench_queries_are_cleaned_as_theirs(tmp_path):
    from video_grpo.data.annotations import load_annotations

    raw = [q for q, _ in FIXTURE["queries"]]
    bench = {"VID01": {"duration": 30.0, "spans": [[1.0, 2.0]] * len(raw), "queries": raw}}
    path = tmp_path / "charades-timelens.json"
    path.write_text(json.dumps(bench))
    records, _ = load_annotations(path, video_root=tmp_path)
    assert [r["sentence"] for r in records] == [clean for _, clean in FIXTURE["queries"]]


def test_the_preset_is_their_evaluation():
    args = script_args_from_yaml(str(PRESET))
    assert (
        args.prompt_template == FIXTURE["grounder_prompt"].replace("{query}", "{sentence}") == TIMELENS_PROMPT
    )
    assert args.span_scoring == "timelens"
    assert args.eval_generation_kwargs == {
        "do_sample": True,
        "temperature": 0.01,
        "top_p": 0.001,
        "top_k": 1,
        "max_new_tokens": 4096,
        "repetition_penalty": 1.0,
    }
    assert (args.video_fps, args.video_max_frames, args.video_max_tokens) == (4.0, 2048, 128000)


def run_args(config, *extra: str):
    argv = ["run", "--model_name_or_path", "m", "--config", str(config), "--output_dir", "o", *extra]
    return evaluate.resolve_run_settings(evaluate.build_parser().parse_args(argv))


def test_evaluate_run_takes_the_recipes_scoring_and_decoding():
    args = run_args(PRESET)
    assert evaluate.run_settings(args) == {
        "span_scoring": "timelens",
        "reader": "ours",
        "do_sample": True,
        "temperature": 0.01,
        "top_p": 0.001,
        "top_k": 1,
        "max_new_tokens": 4096,
        "repetition_penalty": 1.0,
    }
    # a flag given on the command line wins over the recipe
    args = run_args(
        PRESET, "--span_scoring", "set", "--max_new_tokens", "64", "--do_sample", "false", "--top_k", "5"
    )
    assert (args.span_scoring, args.max_new_tokens, args.do_sample, args.top_k, args.top_p) == (
        "set",
        64,
        False,
        5,
        0.001,
    )
    assert run_args(PRESET, "--do_sample").do_sample is True
    # a recipe without the keys: evaluate's defaults, as before
    args = run_args(REPO / "configs" / "grpo" / "demo_tiny.yaml")
    assert evaluate.run_settings(args) == {
        "span_scoring": "best_window",
        "reader": "ours",
        "do_sample": False,
        "temperature": 1.0,
        "max_new_tokens": 256,
    }


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"span_scoring": "first_pair"},
            r"GRPOScriptArguments\.span_scoring: unknown scoring 'first_pair'.*timelens",
        ),
        (
            {"eval_generation_kwargs": {"topk": 1}},
            r"eval_generation_kwargs: unknown key\(s\) \['topk'\]; allowed",
        ),
        (
            {"eval_generation_kwargs": {"top_k": 1}},
            r"\['top_k'\] only act when sampling; add do_sample: true",
        ),
        (
            {"eval_generation_kwargs": {"do_sample": True, "top_k": 0.5}},
            r"top_k must be an integer >= 1, got 0.5",
        ),
        ({"eval_generation_kwargs": {"do_sample": "yes"}}, r"do_sample must be true or false"),
        ({"eval_generation_kwargs": {"max_new_tokens": 0}}, r"max_new_tokens must be an integer >= 1"),
        (
            {"eval_generation_kwargs": {"do_sample": True, "top_p": 1.5}},
            r"top_p must be a number in \(0, 1\]",
        ),
        ({"eval_generation_kwargs": "{max_new_tokens: 5"}, r"eval_generation_kwargs: is not valid JSON"),
        ({"eval_generation_kwargs": [1, 2]}, r"must map GenerationConfig keys to values"),
    ],
)
def test_a_bad_scoring_or_decoding_fails_at_parse_time(values, message):
    with pytest.raises(ValueError, match=message):
        GRPOScriptArguments(**values)


def test_generation_kwargs_parse_from_yaml_and_json(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"eval_generation_kwargs": {"max_new_tokens": 64}, "span_scoring": "set"}))
    args = script_args_from_yaml(str(path))
    assert (args.eval_generation_kwargs, args.span_scoring) == ({"max_new_tokens": 64}, "set")
    parsed = GRPOScriptArguments(eval_generation_kwargs='{"do_sample": true, "top_k": 1}')
    assert parsed.eval_generation_kwargs == {
        "do_sample": True,
        "top_k": 1,
    }  # a JSON string on the command line
    from video_grpo.grpo import parse_args

    script_args, _, _ = parse_args(
        [
            "--config",
            str(path),
            "--output_dir",
            str(tmp_path),
            "--use_cpu",
            "true",
            "--span_scoring",
            "timelens",
        ]
    )
    assert script_args.span_scoring == "timelens" and script_args.eval_generation_kwargs == {
        "max_new_tokens": 64
    }


# -- on the tiny model ---------------------------------------------------------------------------------------


def test_top_k_1_sampling_is_greedy(tiny_model_dir, train_file):
    """TimeLens2's decoding (sampling at top_k 1) gives the greedy tokens through the plain path and the shared
    prefill, so the keywords reach ``generate``; at a high temperature without top_k the same sampling call gives
    other tokens (the comparison is not empty). The compiled step: test_decode_compile.py."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from video_grpo.data.dataset import build_dataset
    from video_grpo.evaluate import generate_answers

    from .test_trainer import SAMPLING

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir).eval()
    rows = build_dataset(train_file, sampling=SAMPLING).__getitems__([1, 1, 2])
    greedy = generate_answers(model, processor, rows, 6, shared_prefill=False)
    torch.manual_seed(0)
    assert generate_answers(model, processor, rows, 6, True, 50.0, shared_prefill=False) != greedy
    timelens2 = {"top_p": 0.001, "top_k": 1, "repetition_penalty": 1.0}
    for shared in (False, True):
        torch.manual_seed(1)
        sampled = generate_answers(model, processor, rows, 6, True, 0.01, shared_prefill=shared, **timelens2)
        assert sampled == greedy, shared


def test_training_evaluation_scores_with_the_recipes_scoring(tiny_model_dir, tmp_path, monkeypatch):
    """grpo.build_trainer hands the recipe's span_scoring to the trainer, whose evaluation scores with it."""
    from video_grpo.grpo import build_trainer, parse_args

    recipe = yaml.safe_load((REPO / "configs" / "grpo" / "demo_tiny.yaml").read_text())
    recipe.update(
        model_name_or_path=str(tiny_model_dir),
        train_file=str(SAMPLES / "train.jsonl"),
        eval_file=str(SAMPLES / "test.jsonl"),
        output_dir=str(tmp_path / "out"),
        max_completion_length=6,
        eval_grounding_samples=2,
        per_device_eval_batch_size=2,
        span_scoring="timelens",
    )
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    trainer = build_trainer(*parse_args(["--config", str(path)]))
    assert trainer.span_scoring == "timelens"
    seen = []
    original = evaluate.score_records

    def spy(records, span_scoring="best_window", reader="ours"):
        seen.append((span_scoring, [r["span"] == scored_span(r["output"], "timelens") for r in records]))
        return original(records, span_scoring, reader)

    monkeypatch.setattr(evaluate, "score_records", spy)
    metrics = trainer.grounding_metrics(trainer.eval_dataset)
    assert seen == [("timelens", [True, True])] and "mIoU" in metrics
