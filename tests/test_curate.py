"""Difficulty curation: exact statistics and band from a hand-written predictions file, the curated file trains,
malformed files fail with file:line, and sampling with the tiny model runs end to end and resumes."""

from __future__ import annotations

import json
import math
import subprocess

import pytest
import yaml
from PIL import Image

from video_grpo.configs import validate_recipe
from video_grpo.curate import PredictionsError, assign_status, main, read_samples
from video_grpo.data.dataset import build_dataset
from video_grpo.grpo import parse_args

from .conftest import REPO, SAMPLES
from .launch_entry import ended_in_order
from .test_launch import CPU_ENV, two_process_launcher

VIDEOS = sorted((SAMPLES / "videos").glob("train_*.mp4"))


def line(query_id, output, solution, video=0, duration=30.0, sentence="a red circle moves", **extra):
    return {
        "id": query_id,
        "video": str(VIDEOS[video].resolve()),
        "duration": duration,
        "solution": solution,
        "sentence": sentence,
        "output": output,
        **extra,
    }


# (id, IoUs by hand)
HAND = [
    line("hard", "<answer>0 to 5</answer>", [10, 20]),  # 0
    line("hard", "no idea", [10, 20]),  # parse failure: 0
    line("mid", "<think>x</think><answer>10 to 15</answer>", [10, 20], 1),  # 5/10 = 0.5
    line("easy", "<answer>10 to 20</answer>", [10, 20], 2),  # 1
    line("mid", "<answer>5 to 20</answer>", [10, 20], 1),  # 10/15
    line("easy", "<answer>10.0 to 20.0</answer>", [10, 20], 2),  # 1
    line("low", "<answer>0 to 1</answer>", [0, 10], 3),  # 0.1
    line("low", "<answer>20 to 30</answer>", [0, 10], 3),  # 0
    line("multi", "<answer>4 to 6</answer>", [[0, 2], [4, 6]], 4, 20.0),  # best window: 1
    line("multi", "<answer>0 to 2</answer>", [[0, 2], [4, 6]], 4, 20.0),  # 1
    line("multi", "<answer>2 to 4</answer>", [[0, 2], [4, 6]], 4, 20.0),  # 0
]
EXPECTED = {  # id: (k, mean, population std, parse failures)
    "hard": (2, 0.0, 0.0, 1),
    "mid": (2, (0.5 + 10 / 15) / 2, (10 / 15 - 0.5) / 2, 0),
    "easy": (2, 1.0, 0.0, 0),
    "low": (2, 0.05, 0.05, 0),
    "multi": (3, 2 / 3, math.sqrt(2 / 9), 0),
}


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_stats_band_and_counts_are_exact(tmp_path, capsys):
    predictions = write(tmp_path / "p.jsonl", HAND)
    out = tmp_path / "out"
    assert (
        main(["--predictions", str(predictions), "--output_dir", str(out), "--video_root", str(SAMPLES)]) == 0
    )
    per_query = [json.loads(x) for x in (out / "per_query.jsonl").read_text().splitlines()]
    assert [q["id"] for q in per_query] == ["hard", "mid", "easy", "low", "multi"]  # first-seen order
    for q in per_query:
        k, mean, std, failures = EXPECTED[q["id"]]
        assert (q["k"], q["parse_failures"]) == (k, failures)
        assert q["mean_iou"] == pytest.approx(mean, abs=1e-12) and q["std_iou"] == pytest.approx(
            std, abs=1e-12
        )
    # default band [0.05, 0.95], inclusive: "low" sits exactly on min_iou and is kept
    assert {q["id"]: q["status"] for q in per_query} == {
        "hard": "too_hard",
        "mid": "kept",
        "easy": "too_easy",
        "low": "kept",
        "multi": "kept",
    }
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["kept"], summary["too_hard"], summary["too_easy"], summary["capped"]) == (3, 1, 1, 0)
    assert (summary["queries"], summary["answers"]) == (5, 11)
    printed = capsys.readouterr().out
    assert "dropped, too hard       1" in printed and "dropped, too easy       1" in printed
    assert f"video_root: {SAMPLES.resolve()}" in printed

    curated = [json.loads(x) for x in (out / "curated.jsonl").read_text().splitlines()]
    assert [r["id"] for r in curated] == ["mid", "low", "multi"]
    assert curated[0] == {
        "id": "mid",
        "video": "videos/train_001.mp4",
        "duration": 30.0,
        "solution": [10, 20],
        "sentence": "a red circle moves",
    }
    assert curated[2]["solution"] == [[0, 2], [4, 6]]

    image = Image.open(out / "mean_iou_hist.png")
    assert image.width >= 600 and len(set(image.convert("L").getdata())) > 10


def test_the_curated_file_trains(tmp_path, tiny_model_dir):
    # single-span queries only: the loader cannot mix [s, e] and [[s, e], ...] solutions in one file (nor can a source)
    predictions = write(tmp_path / "p.jsonl", [r for r in HAND if r["id"] != "multi"])
    out = tmp_path / "out"
    assert (
        main(["--predictions", str(predictions), "--output_dir", str(out), "--video_root", str(SAMPLES)]) == 0
    )
    dataset = build_dataset(out / "curated.jsonl", video_root=SAMPLES)
    assert dataset.with_format(None)["id"] == ["mid", "low"]
    assert dataset[0]["video_frames"] is not None  # the relative path resolves and decodes
    recipe = yaml.safe_load((REPO / "configs/grpo/demo_tiny.yaml").read_text())
    recipe.update(
        model_name_or_path=str(tiny_model_dir),  # the recipe's own is built by `make demo`, not by the tests
        train_file=str(out / "curated.jsonl"),
        video_root=str(SAMPLES),
        eval_file=None,
        output_dir=str(tmp_path / "run"),
    )
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    script, training, model = parse_args(["--config", str(tmp_path / "recipe.yaml")])
    validate_recipe(script, training, model)
    assert script.train_file == str(out / "curated.jsonl")


def test_capping_keeps_the_means_closest_to_the_target():
    stats = [
        {"id": i, "mean_iou": m} for i, m in [("a", 0.05), ("b", 0.6), ("c", 0.4), ("d", 0.7), ("e", 0.5)]
    ]
    statuses = {e["id"]: e["status"] for e in assign_status(stats, 0.05, 0.95, max_queries=3)}
    # distances to 0.5: e 0, b 0.1, c 0.1 (tie: b before c by id), d 0.2, a 0.45
    assert statuses == {"e": "kept", "b": "kept", "c": "kept", "d": "capped", "a": "capped"}
    statuses = {e["id"]: e["status"] for e in assign_status(stats, 0.05, 0.95, max_queries=2)}
    assert statuses == {"e": "kept", "b": "kept", "c": "capped", "d": "capped", "a": "capped"}
    statuses = {e["id"]: e["status"] for e in assign_status(stats, 0.1, 0.65, max_queries=1, target_iou=0.3)}
    assert statuses == {"a": "too_hard", "d": "too_easy", "c": "kept", "b": "capped", "e": "capped"}


def test_cli_capping(tmp_path, capsys):
    predictions = write(tmp_path / "p.jsonl", HAND)
    out = tmp_path / "out"
    assert (
        main(
            [
                "--predictions",
                str(predictions),
                "--output_dir",
                str(out),
                "--video_root",
                str(SAMPLES),
                "--max_queries",
                "2",
            ]
        )
        == 0
    )
    assert [json.loads(x)["id"] for x in (out / "curated.jsonl").read_text().splitlines()] == ["mid", "multi"]
    assert "dropped, capped         1" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["{not json"], r"p\.jsonl:2: not valid JSON"),
        (
            [{"id": "x", "video": "v.mp4", "duration": 3.0, "solution": [0, 1], "sentence": "s"}],
            r"p\.jsonl:2: missing \['output'\]",
        ),
        (
            [line("mid", "<answer>1 to 2</answer>", [10, 21], 1)],
            r"p\.jsonl:2: solution \[10, 21\] differs from \[10, 20\] on line 1",
        ),
        ([line("z", "a", [5, 1e400])], r"p\.jsonl:2: span .* is not finite"),
        ([line("z", "a", [0, 1], duration=-3)], r"p\.jsonl:2: duration must be a number > 0"),
        ([line("z", 7, [0, 1])], r"p\.jsonl:2: output must be a string or null"),
    ],
)
def test_malformed_predictions_name_file_and_line(tmp_path, capsys, lines, message):
    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps(HAND[2])
        + "\n"
        + "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
    )
    with pytest.raises(PredictionsError, match=message):
        read_samples(path)
    assert main(["--predictions", str(path), "--output_dir", str(tmp_path / "out")]) == 2
    assert "error:" in capsys.readouterr().err


def test_a_video_outside_the_root_is_an_error(tmp_path, capsys):
    predictions = write(tmp_path / "p.jsonl", HAND)
    assert (
        main(
            [
                "--predictions",
                str(predictions),
                "--output_dir",
                str(tmp_path / "out"),
                "--video_root",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert "is not under video_root" in capsys.readouterr().err


def test_sampling_mode_end_to_end_and_resumable(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    args = [
        "--model_name_or_path",
        str(tiny_model_dir),
        "--config",
        "configs/grpo/demo_tiny.yaml",
        "--max_samples",
        "3",
        "--num_samples",
        "2",
        "--max_new_tokens",
        "12",
        "--batch_size",
        "4",
        "--output_dir",
        str(out),
        "--min_iou",
        "0",
        "--max_iou",
        "1",
        "--dtype",
        "float32",
    ]
    import os

    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        assert main(args) == 0
        first = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
        ids = [json.loads(x)["id"] for x in (SAMPLES / "train.jsonl").read_text().splitlines()[:3]]
        assert [(r["id"], r["sample"]) for r in first] == [(i, j) for i in ids for j in (0, 1)]
        assert all({"output", "span", "iou", "video", "solution"} <= set(r) for r in first)
        per_query = [json.loads(x) for x in (out / "per_query.jsonl").read_text().splitlines()]
        assert [(q["id"], q["k"]) for q in per_query] == [(i, 2) for i in ids]
        curated = [json.loads(x) for x in (out / "curated.jsonl").read_text().splitlines()]
        assert [r["video"] for r in curated] == [f"videos/{i}.mp4" for i in ids]  # relative to data_samples/
        assert (out / "mean_iou_hist.png").is_file()
        capsys.readouterr()

        # a run killed after 4 of the 6 answers: its part file holds them; the rerun adds only the other 2
        (out / "samples.rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in first[:4]))
        (out / "samples.jsonl").unlink()
        assert main(args) == 0
        assert "(4 done before)" in capsys.readouterr().err
        second = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
        assert second[:4] == first[:4] and [(r["id"], r["sample"]) for r in second] == [
            (r["id"], r["sample"]) for r in first
        ]
        assert not list(out.glob("samples.rank*.jsonl"))
    finally:
        os.chdir(cwd)


def test_sampling_over_two_processes_ends_in_order(tiny_model_dir, tmp_path):
    """Sampling sharded over 2 launched processes: rank 0 merges and curates while rank 1 waits; both leave
    ``main`` with the process group torn down and exit 0."""
    out, ends = tmp_path / "out", tmp_path / "ends"
    command = [
        *two_process_launcher("tests/launch_entry.py", "--record", str(ends), "video_grpo.curate"),
        *("--model_name_or_path", str(tiny_model_dir), "--config", "configs/grpo/demo_tiny.yaml"),
        *("--max_samples", "3", "--num_samples", "2", "--max_new_tokens", "8", "--batch_size", "2"),
        *("--output_dir", str(out), "--min_iou", "0", "--max_iou", "1", "--dtype", "float32"),
    ]
    result = subprocess.run(command, cwd=REPO, env=CPU_ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert len((out / "samples.jsonl").read_text().splitlines()) == 6
    assert len((out / "per_query.jsonl").read_text().splitlines()) == 3
    assert [end["returned"] for end in ended_in_order(ends)] == [0, 0]


def test_a_late_rank_splits_the_same_work(tiny_model_dir, tmp_path, monkeypatch):
    """Each rank lists what is already answered, then takes its share. A rank that starts after another has
    begun writing must still see the list as it was: here rank 1 starts only once rank 0 has either finished or
    is waiting for it. On 047d11c rank 0 wrote its 3 answers first, rank 1 saw them as done and split a shorter
    list, and 2 of the 6 answers were made by no one (the launched test lost one under load)."""
    import argparse
    import threading
    from types import SimpleNamespace

    from video_grpo.evaluate import generate_parts, load_split, merge_parts
    from video_grpo.inputs.families import family_of_model

    dataset, ids = load_split(
        "configs/grpo/demo_tiny.yaml", family_of_model(str(tiny_model_dir)), "train", None, 3
    )
    args = argparse.Namespace(
        model_name_or_path=str(tiny_model_dir),
        dtype="float32",
        batch_size=2,
        max_new_tokens=4,
        do_sample=True,
        temperature=1.0,
    )
    barrier, errors = threading.Barrier(2, timeout=300), []
    # The ranks are threads here, and transformers' from_pretrained is not thread-safe: while loading it swaps
    # PreTrainedModel.tie_weights for a no-op and puts back what it found, so two loads at once can leave the no-op
    # in place, and every model built later in this process comes out untied (it moved the planner's Qwen3.5 plan
    # by 2.4 GB in the suite; transformers PR #44940). Real ranks are processes; here the loads take turns.
    from transformers import AutoModelForImageTextToText

    load, one_at_a_time = AutoModelForImageTextToText.from_pretrained, threading.Lock()

    def load_in_turn(*args, **kwargs):
        with one_at_a_time:
            return load(*args, **kwargs)

    monkeypatch.setattr(AutoModelForImageTextToText, "from_pretrained", load_in_turn)

    def rank(index: int) -> None:
        state = SimpleNamespace(
            process_index=index,
            num_processes=2,
            device="cpu",
            is_main_process=index == 0,
            wait_for_everyone=barrier.wait,
        )
        try:
            generate_parts(args, dataset, ids, tmp_path, state, prefix="samples", num_samples=2)
        except Exception as err:  # noqa: BLE001 (reported below)
            errors.append(err)
            barrier.abort()

    first = threading.Thread(target=rank, args=(0,))
    first.start()
    while first.is_alive() and barrier.n_waiting == 0:
        first.join(0.05)
    second = threading.Thread(target=rank, args=(1,))
    second.start()
    first.join(600)
    second.join(600)
    assert not errors, errors
    merged = merge_parts(tmp_path, ids, prefix="samples", num_samples=2)
    assert len(merged) == 6


def test_set_scoring_reads_every_span_as_timelens2_does():
    """A two-span truth: one answer names one of its spans, one names both, one does not parse. best_window scores
    the first 1 (it matches a window); set scoring gives 10/20 = 0.5, 1 and 0 (TimeLens2's tIoU)."""
    from video_grpo.curate import query_stats

    query = {
        "id": "q",
        "solution": [[0.0, 10.0], [20.0, 30.0]],
        "outputs": ["[[0.0, 10.0]]", "[[0.0, 10.0], [20.0, 30.0]]", "no idea"],
    }
    assert query_stats(query, "set")["ious"] == [0.5, 1.0, 0.0]
    assert query_stats(query, "set")["parse_failures"] == 1
    assert query_stats(query)["ious"][0] == 1.0
