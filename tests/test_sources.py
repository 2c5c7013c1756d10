"""Several annotation sources in one run (``train_sources``, video_grpo.data.sources): two fixtures of different formats
and prompts (TimeLens2-93K and TimeLens-100K, as TimeLens2 trains on) read together, their ids, solutions and
prompts; parse-time errors naming the source and the key; data check per source; evaluation's and curate's reading;
the planner's longest template; gt_guidance refused per source."""

from __future__ import annotations

import json

import pytest
import yaml

from video_grpo.configs import DEFAULT_PROMPT, script_args_from_yaml, validate_recipe
from video_grpo.data.annotations import AnnotationError
from video_grpo.data.check import check_main
from video_grpo.data.dataset import build_train_dataset
from video_grpo.data.sample_weights import draw_weights
from video_grpo.data.sources import parse_train_sources, prompt_templates, recipe_sources
from video_grpo.grpo import parse_args
from video_grpo.inputs.families import FAMILIES

from .conftest import SAMPLES
from .test_trainer import SAMPLING

VIDEOS = SAMPLES / "videos"
RAW_93K = SAMPLES / "timelens" / "timelens2-93k_raw_annotations.jsonl"
TIMELENS_100K = SAMPLES / "timelens" / "timelens-100k_samples.jsonl"
TEMPLATE_93K = "Query: '{sentence}'\nReturn the matching time intervals in seconds as [[start, end], ...]."
TEMPLATE_100K = (
    "Please find the visual event described by the sentence '{sentence}', determining its starting and ending "
    "times.\nReturn the result strictly as [[start, end]] (in seconds)."
)
SOURCES = {
    "timelens2-93k": {"train_file": str(RAW_93K), "prompt_template": TEMPLATE_93K},
    "timelens-100k": {
        "train_file": str(TIMELENS_100K),
        "dataset_format": "timelens_100k",
        "prompt_template": TEMPLATE_100K,
    },
}
QWEN = FAMILIES["qwen2_5_vl"]


def recipe(tmp_path, **fields) -> str:
    values = {
        "model_name_or_path": "not-loaded",
        "video_root": str(VIDEOS),
        "train_sources": SOURCES,
        "output_dir": str(tmp_path / "out"),
        "use_cpu": True,
        "bf16": False,
        "video_fps": SAMPLING.fps,
        "video_min_frames": SAMPLING.min_frames,
        "video_max_frames": SAMPLING.max_frames,
        "video_min_pixels": SAMPLING.min_pixels,
        "video_max_pixels": SAMPLING.max_pixels,
        "video_max_tokens": SAMPLING.max_tokens,
        **fields,
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in values.items() if v is not None}, sort_keys=False))
    return str(path)


def test_two_sources_train_as_one_dataset(tmp_path):
    """Rows in source order, ids '<source>/<id>', a data_source column, each prompt from its source's template, one
    solution shape (lists of spans, as the TimeLens2-93K source has multi-span queries)."""
    script_args = script_args_from_yaml(recipe(tmp_path))
    dataset = build_train_dataset(script_args, QWEN)
    plain = dataset.with_format(None)
    assert plain["id"] == [
        "timelens2-93k/train_000_0",
        "timelens2-93k/train_000_1",
        "timelens2-93k/train_001_0",
        "timelens2-93k/train_002_0",
        "timelens2-93k/train_002_1",
        "timelens-100k/train_003_0",
        "timelens-100k/train_004_0",
        "timelens-100k/train_004_1",
        "timelens-100k/train_005_0",
    ]
    assert plain["data_source"] == ["timelens2-93k"] * 5 + ["timelens-100k"] * 4
    assert plain["row_index"] == list(range(9))
    assert plain["solution"][1] == [[0.0, 8.2], [22.7, 34.0]]  # several spans stay several
    assert plain["solution"][5] == [[20.8, 36.7]]  # a one-span source joins as lists of one span
    # the TimeLens-100K loader folds "a red  circle moves across the screen." as TimeLens does
    assert plain["sentence"][5] == "a red circle moves across the screen"
    first, last = dataset.__getitems__([0, 5])
    assert first["prompt"][0]["content"][1]["text"] == TEMPLATE_93K.replace(
        "{sentence}", "a red circle moves across the screen"
    )
    assert last["prompt"][0]["content"][1]["text"] == TEMPLATE_100K.replace(
        "{sentence}", "a red circle moves across the screen"
    )
    assert first["video_frames"] is not None and last["video"].endswith("train_003.mp4")
    # max_train_samples keeps the first rows of the concatenation
    assert build_train_dataset(script_args, QWEN, max_samples=6).with_format(None)["id"][-1] == (
        "timelens-100k/train_003_0"
    )


def test_a_source_falls_back_to_the_recipe_and_null_means_none(tmp_path):
    """A key left out takes the top-level field; null sets none; normalize_query folds the query as TimeLens2."""
    messy = tmp_path / "raw.jsonl"
    messy.write_text(
        json.dumps(
            {
                "video_id": "train_001",
                "annotations": [{"text": " a  green\tsquare moves.. ", "timestamps": [5.3, 19.5]}],
            }
        )
        + "\n"
    )
    durations = tmp_path / "durations.csv"
    durations.write_text("id,length\ntrain_001,29.0\n")
    sources = {
        "kept": {"train_file": str(messy)},
        "folded": {"train_file": str(messy), "normalize_query": True, "durations_file": None},
    }
    script_args = script_args_from_yaml(
        recipe(tmp_path, train_sources=sources, durations_file=str(durations))
    )
    kept, folded = recipe_sources(script_args)
    assert (kept.video_root, kept.durations_file, kept.prompt_template) == (
        str(VIDEOS),
        str(durations),
        DEFAULT_PROMPT,
    )
    assert folded.durations_file is None and folded.normalize_query and not kept.normalize_query
    plain = build_train_dataset(script_args, QWEN).with_format(None)
    assert plain["sentence"] == ["a  green\tsquare moves..", "a green square moves"]
    assert plain["duration"] == [29.0, 29.0]  # from the CSV, and from the video's header


@pytest.mark.parametrize(
    ("sources", "fields", "message"),
    [
        (
            {"timelens-100k": {"train_file": "x.jsonl", "anno_path": "x.jsonl"}},
            {},
            r"GRPOScriptArguments.train_sources.timelens-100k.anno_path: unknown key; a source takes \['train_file'",
        ),
        ({"a": {"video_root": "v"}}, {}, r"train_sources.a.train_file: not set"),
        (
            {"a": {"train_file": "x", "dataset_format": "csv"}},
            {},
            r"train_sources.a.dataset_format: unknown format 'csv'",
        ),
        (
            {"a": {"train_file": "x", "prompt_template": "no query"}},
            {},
            r"train_sources.a.prompt_template: must contain",
        ),
        (
            {"a": {"train_file": "x", "prompt_template": "When does '{query}' happen?"}},
            {},
            r"train_sources.a.prompt_template: must contain .*write it \{query\}: rename it \{sentence\}",
        ),
        (
            {"a": {"train_file": "x", "normalize_query": "yes"}},
            {},
            r"train_sources.a.normalize_query: must be true or",
        ),
        ({"a/b": {"train_file": "x"}}, {}, r"source name 'a/b' must be letters"),
        ({}, {}, r"train_sources: must be a non-empty mapping"),
        (
            SOURCES,
            {"train_file": str(SAMPLES / "train.jsonl")},
            r"train_file: is set .* together with train_sources",
        ),
    ],
)
def test_a_bad_source_fails_at_parse_time_naming_the_source_and_key(tmp_path, sources, fields, message):
    with pytest.raises(ValueError, match=message):
        parse_args(["--config", recipe(tmp_path, train_sources=sources, **fields)])


def test_files_are_checked_per_source_before_the_model_loads(tmp_path):
    missing = {**SOURCES, "ego4d": {"train_file": str(tmp_path / "nlq.jsonl")}}
    script, training, model = parse_args(["--config", recipe(tmp_path, train_sources=missing)])
    with pytest.raises(
        ValueError, match=r"train_sources.ego4d.train_file: '.*nlq.jsonl' is not an existing file"
    ):
        validate_recipe(script, training, model)
    no_root = {"a": {"train_file": str(RAW_93K), "video_root": str(tmp_path / "nowhere")}}
    script, training, model = parse_args(["--config", recipe(tmp_path, train_sources=no_root)])
    with pytest.raises(
        ValueError, match=r"train_sources.a.video_root: '.*nowhere' is not an existing directory"
    ):
        validate_recipe(script, training, model)
    readme = {"a": {"train_file": str(SAMPLES.parent / "README.md")}}
    script, training, model = parse_args(["--config", recipe(tmp_path, train_sources=readme)])
    with pytest.raises(
        ValueError, match=r"train_sources.a.dataset_format: .*cannot tell the annotation format"
    ):
        validate_recipe(script, training, model)


def test_train_sources_from_the_command_line_is_json(tmp_path):
    path = recipe(tmp_path, train_sources=None, train_file=None)
    script, _, _ = parse_args(["--config", path, "--train_sources", json.dumps(SOURCES)])
    assert list(script.train_sources) == ["timelens2-93k", "timelens-100k"]
    with pytest.raises(ValueError, match=r"train_sources: is not valid JSON"):
        parse_train_sources("{timelens: ")


def test_data_check_reports_each_source(tmp_path, capsys):
    """Both fixtures' videos are in data_samples/videos: OK per source; a source whose videos are elsewhere is
    NOT READY under its own name; a malformed line is an error naming its source."""
    assert check_main(["--config", recipe(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "== source timelens2-93k ==" in out and "== source timelens-100k ==" in out
    assert "5 usable queries over 3 videos" in out and "4 usable queries over 3 videos" in out
    assert "all sources: 9 usable queries in 2 sources; OK: the data can train." in out
    elsewhere = {**SOURCES, "timelens-100k": {**SOURCES["timelens-100k"], "video_root": str(tmp_path)}}
    assert check_main(["--config", recipe(tmp_path, train_sources=elsewhere), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["can_train"] is False and report["records"] == 9
    assert report["sources"]["timelens2-93k"]["can_train"] is True
    assert len(report["sources"]["timelens-100k"]["missing_videos"]) == 3
    broken = tmp_path / "broken.jsonl"
    broken.write_text(TIMELENS_100K.read_text() + '{"video_path": "x.mp4", "events": []}\n')
    bad = {**SOURCES, "timelens-100k": {**SOURCES["timelens-100k"], "train_file": str(broken)}}
    assert check_main(["--config", recipe(tmp_path, train_sources=bad)]) == 2
    err = capsys.readouterr().err
    assert f"error: train_sources.timelens-100k ({broken}): {broken}:4: missing field(s) ['duration']" in err
    gone = {
        **SOURCES,
        "timelens-100k": {**SOURCES["timelens-100k"], "durations_file": str(tmp_path / "d.csv")},
    }
    assert check_main(["--config", recipe(tmp_path, train_sources=gone)]) == 2
    assert "error: train_sources.timelens-100k.durations_file: " in capsys.readouterr().err


def test_evaluation_and_curate_read_every_source_with_training_ids(tmp_path):
    """evaluate.load_split(split='train') (what curate samples) gives the ids training reads, so curate's
    per_query.jsonl lines up with the draw weights."""
    from video_grpo.evaluate import load_split

    path = recipe(tmp_path)
    dataset, ids = load_split(path, QWEN, split="train")
    training_ids = build_train_dataset(script_args_from_yaml(path), QWEN).with_format(None)["id"]
    assert ids == training_ids and len(ids) == 9
    assert dataset.__getitems__([8])[0]["prompt"][0]["content"][1]["text"].startswith(
        "Please find the visual event"
    )
    per_query = tmp_path / "per_query.jsonl"
    per_query.write_text("".join(json.dumps({"id": i, "k": 8, "mean_iou": 0.5}) + "\n" for i in ids))
    assert draw_weights(training_ids, per_query, "mean_iou", 2).tolist() == pytest.approx([1 / 9] * 9)


def test_the_planner_sizes_the_prompt_by_the_longest_template(tmp_path):
    from video_grpo.plan.workload import recipe_values, workload_from_recipe

    assert prompt_templates(SOURCES, DEFAULT_PROMPT) == [TEMPLATE_93K, TEMPLATE_100K]
    assert prompt_templates(SOURCES, DEFAULT_PROMPT, eval_file="e.json")[-1] == DEFAULT_PROMPT
    assert prompt_templates({"a": {"train_file": "x"}}, DEFAULT_PROMPT) == [DEFAULT_PROMPT]
    launch = {"num_processes": 1, "zero_stage": 0, "offload_optimizer": False, "offload_params": False}
    launch["mixed_precision"] = None
    long = TEMPLATE_100K + " Think about it carefully before you answer." * 20

    def text_tokens(sources) -> int:
        values = recipe_values(recipe(tmp_path, train_sources=sources, per_device_train_batch_size=2))
        values.update(num_generations=2, max_completion_length=8)
        return workload_from_recipe(values, QWEN, launch).text_tokens

    short_only = text_tokens({"a": SOURCES["timelens2-93k"]})
    both = text_tokens(SOURCES)
    longer = text_tokens({**SOURCES, "timelens-100k": {**SOURCES["timelens-100k"], "prompt_template": long}})
    assert short_only < both < longer


def test_gt_guidance_names_the_source_with_multi_span_queries(tmp_path):
    from video_grpo.loss.guidance import check_guided_template
    from video_grpo.rewards.functions import DEFAULT_ANSWER_TEMPLATE

    script_args = script_args_from_yaml(recipe(tmp_path))
    dataset = build_train_dataset(script_args, QWEN)
    where = {source.name: source.describe() for source in recipe_sources(script_args)}
    with pytest.raises(
        ValueError,
        match=r"but train_sources.timelens2-93k \(.*\) has queries with several spans \(the first: timelens2-93k/train_000_1, 2 spans\)",
    ):
        check_guided_template(DEFAULT_ANSWER_TEMPLATE, dataset, where)


def test_duplicate_ids_in_a_source_are_named(tmp_path):
    twice = tmp_path / "twice.jsonl"
    row = json.loads((SAMPLES / "train.jsonl").read_text().splitlines()[0])
    row["video"] = "train_000.mp4"
    twice.write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")
    script_args = script_args_from_yaml(recipe(tmp_path, train_sources={"mine": {"train_file": str(twice)}}))
    with pytest.raises(AnnotationError, match=r"train_sources.mine: query id 'mine/train_000' appears twice"):
        build_train_dataset(script_args, QWEN)


def test_preprocess_caches_every_sources_videos(tmp_path, capsys):
    from video_grpo.preprocess import main as preprocess_main

    path = recipe(tmp_path)
    assert (
        preprocess_main(
            ["--config", path, "--model_family", "qwen2_5_vl", "--dry_run", "--estimate_samples", "1"]
        )
        == 0
    )
    assert "for 6 videos" in capsys.readouterr().out  # train_000..002 (TimeLens2-93K) and train_003..005
    gone = {
        **SOURCES,
        "timelens-100k": {**SOURCES["timelens-100k"], "train_file": str(tmp_path / "none.jsonl")},
    }
    assert (
        preprocess_main(
            ["--config", recipe(tmp_path, train_sources=gone), "--model_family", "qwen2_5_vl", "--dry_run"]
        )
        == 2
    )
    assert "error: train_sources.timelens-100k.train_file: " in capsys.readouterr().err
