"""The planner (``video_grpo.plan``): the command on every shipped recipe, offline with the shipped model configs,
the GPU class each recipe's header says it fits, the docs' fit tables and the plan cache shipped in the package (all
from one fresh process that reads the shipped cache and traces the rest), a fresh clone's documented call read from
that cache, the same plans traced in-process after training steps (and the shipped entries against those traces),
the plan against a live-tensor measurement of the same step (where a wrong formula fails), the measurement itself
against real tensors, and the start-up summary."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from video_grpo.plan import cache, main, plan_recipe, suggestions
from video_grpo.plan.cli import plan_json
from video_grpo.plan.doc_tables import PLAN_HEADER as HEADER
from video_grpo.plan.model import shipped_model_configs
from video_grpo.plan.shipped import COMMAND, shipped_keys
from video_grpo.plan.workload import worst_case_video

from .conftest import REPO
from .plan_all import DOCUMENTED, FAMILIES, RECIPES, documented_report, plan_all, tiny_family

GPU_RECIPES = [r for r in RECIPES if tiny_family(r) is None]
KEYS = {"peak_gb", "fits", "phase", "by_phase_gb", "by_category_gb", "flops_by_phase", "time_s_by_phase"}


@pytest.fixture(scope="module")
def fresh_plans(family_model, tmp_path_factory):
    """Every shipped recipe planned in ONE fresh process (tests/plan_all.py), as a user runs the planner on a fresh
    clone: an empty disk cache of its own over the shipped one, so the shipped models' entries are read (a miss is
    traced and written to that folder) and the tiny models of the CPU recipes are traced; started in the background
    at the first test that asks, read when a test needs it. ``fresh_plans()["plans"]``: recipe stem -> what plan_all
    gives; ``fresh_plans()["report"]``: the documented command's output; ``fresh_plans()["shipped"]``: the shipped
    keys' entries it held at the end (read, or traced where the shipped files lacked them). The shipped entries'
    values are checked against traces in :func:`test_a_plan_is_a_function_of_its_inputs`, which traces with the
    cache off; tracing every shipped model here too cost about 180 CPU s more.

    Under pytest-xdist (``make test``) the workers share one such process: the first worker to ask claims it and
    writes what it printed into the run's temporary folder, and the other reads that (tiny models are made from a
    fixed seed, so the other worker's are the same models)."""
    run_folder = tmp_path_factory.getbasetemp().parent if os.environ.get("PYTEST_XDIST_WORKER") else None
    process = None
    if run_folder is None or _claim(run_folder / "fresh_plans.claim"):
        tiny = {family: str(family_model(family)) for family in FAMILIES}
        own_cache = tmp_path_factory.mktemp("fresh-plan-cache")  # empty: nothing another test wrote is read
        process = subprocess.Popen(
            [sys.executable, "tests/plan_all.py", json.dumps(tiny)],
            cwd=REPO,
            env={**os.environ, cache.ENV: str(own_cache)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    planned: dict = {}

    def get() -> dict:
        if not planned:
            if process is not None:
                out, err = process.communicate(timeout=1800)
                result = {"returncode": process.returncode, "out": out, "err": err[-3000:]}
                if run_folder is not None:  # written whole, then renamed: the other worker never reads half
                    partial = run_folder / "fresh_plans.partial"
                    partial.write_text(json.dumps(result))
                    partial.rename(run_folder / "fresh_plans.json")
            else:
                result = _wait_for(run_folder / "fresh_plans.json", timeout=1800)
            assert result["returncode"] == 0, result["err"]
            planned.update(json.loads(result["out"].strip().splitlines()[-1]))
        return planned

    yield get
    if process is not None and run_folder is not None and not planned:
        with contextlib.suppress(AssertionError):
            get()  # the other worker may be waiting for what this one claimed
    if process is not None and process.poll() is None:
        process.kill()
        process.communicate()


def _claim(path: Path) -> bool:
    """Whether this process is the first to create ``path`` (atomic: O_CREAT | O_EXCL)."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _wait_for(path: Path, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while not path.is_file():
        assert time.monotonic() < deadline, f"no {path.name} from the other worker within {timeout:.0f} s"
        time.sleep(1)
    return json.loads(path.read_text())


# Planned again in-process by the test below: every CPU recipe (one tiny model of each family) and one GPU recipe
# of each of the other two families, tied embeddings included (Qwen3-VL-4B) and a frozen tower with its merger
# trained (TimeLens2 8B). Qwen3.5-4B is left out: its Gated DeltaNet layers, traced on fake tensors chunk by
# chunk, make it the dearest recipe to plan (75 s of CPU planned alone); its family's layers are traced here only
# through the tiny Qwen3.5, whose embeddings are untied, so the tied Qwen3.5 of the docs/planning.md incident is
# planned in the fresh process only (conftest's check that no test leaves tie_weights patched still guards it).
# Not in-process either: a frozen tower without its merger (Time-R1), gt_guidance (TempSamp-R1), the TimeLens
# recipes. Measured side by side in one
# process: these recipes 28-36 s of CPU, every recipe 108 s.
IN_PROCESS_GPU = ("qwen2_5_vl_7b_charades", "qwen3_vl_4b_charades", "timelens2_qwen3_vl_8b")


def test_a_plan_is_a_function_of_its_inputs(fresh_plans, family_model, train_file, tmp_path, monkeypatch):
    """Shipped recipes planned in this process, after a tiny trainer of each family was built and stepped here,
    equal the fresh-process plans to the byte (grpo.main plans in-process, and re-plans for its plan check after
    the first step; the command plans in a fresh one): every CPU recipe and the GPU recipes of
    :data:`IN_PROCESS_GPU`, traced afresh here (the fresh process read their models from the shipped plan cache,
    so the shipped entries of those models are checked against these traces too). In the suite a test's threads once left transformers' weight tying
    switched off and the Qwen3.5 plan grew by 2.4 GB (docs/planning.md); the planner now refuses such a process,
    and conftest fails the test that leaks."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    from video_grpo.data.dataset import build_dataset

    from .test_families import sampling_for
    from .test_trainer import make_trainer

    # the fixture started the fresh process: it plans while this one trains
    for family in FAMILIES:
        data = build_dataset(train_file, sampling=sampling_for(family))
        trainer = make_trainer(family_model(family), data, tmp_path / family, beta=0.04)
        trainer.train()
        assert trainer.state.global_step == 1
    assert hasattr(Qwen3_5GatedDeltaNet.forward, "__wrapped__")  # the packed Qwen3.5 step installed the fork
    # traced here, after those steps: nothing kept from before them or read from the disk cache
    monkeypatch.setenv(cache.ENV, "off")
    cache.clear_memory()
    chosen = [r for r in RECIPES if tiny_family(r) is not None or r.stem in IN_PROCESS_GPU]
    assert {r.stem for r in chosen} >= set(IN_PROCESS_GPU) and len(chosen) > len(IN_PROCESS_GPU), chosen
    # the tiny models the fresh process planned (under xdist the other worker may have made them: the same models,
    # made from a fixed seed, in another folder, and a CPU plan names its tokenizer's folder)
    here = plan_all(fresh_plans()["tiny"], recipes=chosen)
    fresh = fresh_plans()["plans"]
    assert set(fresh) == {r.stem for r in RECIPES} and set(here) == {r.stem for r in chosen}
    moved = [name for name in here if json.dumps(here[name]) != json.dumps(fresh[name])]
    assert not moved, {name: {"here": here[name]["json"], "fresh": fresh[name]["json"]} for name in moved}
    # The fresh process read the shipped models' entries: what was traced here of them (three models and TRL's
    # defaults) is what is shipped, to the byte, and the documented command prints here what it printed there.
    traced, shipped = cache.kept(shipped_keys()), cache.shipped()
    assert len(traced) >= len(IN_PROCESS_GPU) + 1, sorted(traced)
    differ = [
        (key, name)
        for key, entries in traced.items()
        for name, value in entries.items()
        if json.dumps(value) != json.dumps(shipped.get(key, {}).get(name))
    ]
    assert not differ, (f"the shipped plan cache differs from traces; {COMMAND} regenerates it", differ)
    assert documented_report() == fresh_plans()["report"]


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_the_command_plans_every_shipped_recipe(recipe, fresh_plans):
    """What `python -m video_grpo.plan --json` prints for every recipe: a GPU recipe on the launch its header names
    and an H100, with no --model_config; a CPU recipe on one CPU process with its tiny model."""
    out = fresh_plans()["plans"][recipe.stem]["json"]
    if tiny_family(recipe) is not None:
        assert out["fits"] and out["peak_gb"] > 0 and out["flops_by_phase"]["loss"] > 0
        return
    assert out.keys() >= KEYS
    assert out["peak_gb"] == max(out["by_phase_gb"].values()) and out["phase"] in out["by_phase_gb"]
    assert set(out["by_phase_gb"]) == {"generation", "old_and_reference", "loss", "optimizer"}
    assert out["by_category_gb"][out["phase"]]["weights"] > 0 and out["flops_by_phase"]["loss"] > 0
    assert all(seconds >= 0 for seconds in out["time_s_by_phase"].values()) and out["fits"] in (True, False)


def test_a_shipped_model_is_planned_offline_without_being_named(fresh_plans):
    """Each GPU recipe names a Hub model; offline, with no --model_config, its config comes from configs/models/
    (configs/models/index.json maps the id to the file), and one line says so."""
    shipped = shipped_model_configs()
    assert shipped and all(path.is_file() for path in shipped.values())
    for recipe in GPU_RECIPES:
        model = yaml.safe_load(recipe.read_text())["model_name_or_path"]
        source = fresh_plans()["plans"][recipe.stem]["source"]
        assert source.startswith(
            f"plan: {model}'s architecture from configs/models/{shipped[model].name},"
        ), (
            recipe.name,
            source,
        )


def shipped_differences(traced: dict[str, dict], shipped: dict[str, dict]) -> list:
    """Where the shipped files (key -> entries) differ from the traced entries: a key, an entry name, or a value
    (compared as JSON, so a dict's order counts: a plan's JSON follows it)."""
    found: list = [("missing key", key) for key in sorted(set(traced) - set(shipped))]
    found += [("stale key", key) for key in sorted(set(shipped) - set(traced))]
    for key in sorted(set(traced) & set(shipped)):
        found += [("entry", key, name) for name in sorted(set(traced[key]) ^ set(shipped[key]))]
        found += [
            ("value", key, name)
            for name, value in traced[key].items()
            if name in shipped[key] and json.dumps(value) != json.dumps(shipped[key][name])
        ]
    return found


def test_the_shipped_plan_cache_is_what_the_planner_reads(fresh_plans):
    """The plan cache shipped in the package (video_grpo/plan/shipped/) holds, under today's keys, every entry the
    fresh process needed of every shipped model and TRL's defaults, and no file that no key reads: a planner source
    or a version changed since it was made is a key no file has, and an entry the shipped files lack is one the
    fresh process had to trace; both fail here. That the shipped values are what tracing gives is checked, to the
    byte, against the cold traces of :func:`test_a_plan_is_a_function_of_its_inputs`."""
    held = fresh_plans()["shipped"]
    stale = f"the shipped plan cache ({cache.SHIPPED}) differs from what the planner needs; {COMMAND} regenerates it"
    assert set(held) == shipped_keys(), (stale, "a shipped model or TRL's defaults were not planned")
    assert not shipped_differences(held, cache.shipped()), (stale, shipped_differences(held, cache.shipped()))


def test_the_shipped_check_finds_each_difference():
    """:func:`shipped_differences` finds a key too many or too few, an entry too many, and a changed value (the
    shipped files against copies of themselves, one change each)."""
    shipped = cache.shipped()
    assert len(shipped) > 1 and not shipped_differences(shipped, shipped)
    key = next(k for k in shipped if "shape" in shipped[k])
    fewer = {k: v for k, v in shipped.items() if k != key}
    more = {**shipped, key: {**shipped[key], "new": 1}}
    changed = {**shipped, key: {**shipped[key], "shape": {**shipped[key]["shape"], "hidden": -1}}}
    reordered = {**shipped, key: {**shipped[key], "shape": dict(reversed(shipped[key]["shape"].items()))}}
    assert shipped_differences(fewer, shipped) == [("stale key", key)]
    assert shipped_differences(shipped, fewer) == [("missing key", key)]
    assert shipped_differences(more, shipped) == [("entry", key, "new")]
    assert shipped_differences(changed, shipped) == [("value", key, "shape")]
    assert shipped_differences(reordered, shipped) == [("value", key, "shape")]


FRESH_CLONE = """
import json, sys
from video_grpo.plan import cache, main
from tests.plan_all import DOCUMENTED
code = main(DOCUMENTED)
print(json.dumps({"code": code, **cache.stats(), "imported": [m for m in ("torch", "transformers", "trl") if m in sys.modules]}))
"""


def test_a_fresh_clone_plans_the_documented_recipe_from_the_shipped_cache(fresh_plans, tmp_path):
    """The documented command in a fresh process with an empty disk cache (a fresh clone, a user's first call):
    every entry it needs is read from the shipped cache (no miss, so nothing written to the user's folder), it
    imports neither torch, transformers nor TRL, and it prints the report the fresh process traced, to the byte."""
    empty = tmp_path / "user-cache"
    done = subprocess.run(
        [sys.executable, "-c", FRESH_CLONE],
        cwd=REPO,
        env={**os.environ, cache.ENV: str(empty)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    *report, last = done.stdout.splitlines(keepends=True)
    result = json.loads(last)
    assert result["code"] == 0 and result["hits"] > 0 and result["misses"] == 0, result
    assert result["imported"] == [] and not empty.exists(), result
    assert "".join(report) == fresh_plans()["report"]["stdout"]


def test_the_shipped_cache_lies_under_the_disk_cache(tmp_path, monkeypatch):
    """A key's entries are the shipped file's with the disk file's over them; a new entry is written to the disk
    folder only, never into the shipped one; ``off`` reads neither (every entry computed afresh)."""
    shipped, disk = tmp_path / "shipped", tmp_path / "disk"
    shipped.mkdir()
    disk.mkdir()
    (shipped / "k.json").write_text(json.dumps({"a": 1, "b": 2}))
    (disk / "k.json").write_text(json.dumps({"b": 3}))
    monkeypatch.setattr(cache, "SHIPPED", shipped)
    monkeypatch.setenv(cache.ENV, str(disk))
    cache.clear_memory()
    assert [cache.cached("k", name, lambda: 0) for name in ("a", "b", "c")] == [1, 3, 0]
    assert json.loads((disk / "k.json").read_text()) == {"b": 3, "c": 0}
    assert json.loads((shipped / "k.json").read_text()) == {"a": 1, "b": 2}
    monkeypatch.setenv(cache.ENV, "off")
    cache.clear_memory()
    assert [cache.cached("k", name, lambda: 9) for name in ("a", "b")] == [9, 9]
    cache.clear_memory()


def test_a_wrong_or_unknown_model_config_names_the_shipped_files(tmp_path, capsys):
    """A wrong guess at --model_config says the file does not exist; a model that is not shipped names the files
    and the flag. Both list the shipped files."""
    recipe = "configs/grpo/timelens_qwen2_5_vl_7b.yaml"
    assert main(["--config", recipe, "--model_config", "configs/models/qwen2_5_vl_7b.json"]) == 2
    err = capsys.readouterr().err
    assert "configs/models/qwen2_5_vl_7b.json: no such file" in err and "qwen2_5_vl_7b_instruct.json" in err
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(
        (REPO / recipe).read_text().replace("Qwen/Qwen2.5-VL-7B-Instruct", "Example/Unknown-VL-7B")
    )
    assert main(["--config", str(unknown)]) == 2
    err = capsys.readouterr().err
    assert "'Example/Unknown-VL-7B'" in err and "--model_config" in err
    assert all(path.name in err for path in shipped_model_configs().values()), err
    # a CPU recipe whose tiny model was not made yet: the error says where it looked and what makes it
    missing = tmp_path / "tiny.yaml"
    missing.write_text(
        (REPO / "configs/grpo/demo_tiny.yaml")
        .read_text()
        .replace("outputs/tiny-qwen2_5_vl", "outputs/not-made")
    )
    assert main(["--config", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "'outputs/not-made' is meant as a local folder, there is none at" in err and "make tiny" in err, (
        err
    )


def test_the_models_readme_lists_the_index():
    """configs/models/README.md's table and index.json (what the planner reads) name the same files for the same
    models."""
    table = re.findall(
        r"^\| `([\w.]+\.json)` \| ([\w./-]+) \|", (REPO / "configs/models/README.md").read_text(), re.M
    )
    assert {model: name for name, model in table} == {m: p.name for m, p in shipped_model_configs().items()}


def test_the_report_reads_as_documented(fresh_plans):
    """The command docs/planning.md shows first (run in the fresh process) prints the breakdown, the verdict and
    the time per phase; offline and with no --model_config, it says on stderr which shipped config it planned."""
    result = fresh_plans()["report"]
    assert result["code"] == 0, result["stderr"][-2000:]
    note = "plan: Qwen/Qwen2.5-VL-7B-Instruct's architecture from configs/models/qwen2_5_vl_7b_instruct.json"
    assert [line for line in result["stderr"].splitlines() if line.startswith("plan:")] == [
        note + ", shipped with video_grpo (--model_config to plan another)"
    ]
    text = result["stdout"]
    for expected in (
        "memory per GPU",
        "kv cache",
        "optimizer states",
        "plan: peak",
        "fits H100",
        "TFLOP",
        " s\n",
    ):
        assert expected in text, (expected, text)
    assert "python -m video_grpo.plan " + " ".join(DOCUMENTED) in " ".join(
        (REPO / "docs/planning.md").read_text().replace("\\\n", " ").split()
    )


@pytest.mark.parametrize("recipe", GPU_RECIPES, ids=lambda r: r.stem)
def test_each_gpu_recipe_fits_the_class_its_header_names(recipe, fresh_plans):
    """Every GPU recipe's header names the GPUs it fits (`# Plan: fits a, b with configs/accelerate/X.yaml`); the
    planner, on the published config (planned on that launch in the fresh process), agrees: each named GPU fits
    and each GPU of the table left out does not."""
    from video_grpo.plan.compute import GPUS

    match = HEADER.search(recipe.read_text())
    assert match, f"{recipe.name}: no '# Plan: fits <gpus> with configs/accelerate/<launch>.yaml' header line"
    named = {g.strip() for g in match["gpus"].split(",")}
    assert named <= set(GPUS), f"{recipe.name}: unknown GPUs {named - set(GPUS)} in its header"
    planned = fresh_plans()["plans"][recipe.stem]
    assert planned["launch"] == match["launch"]
    fitting = set(planned["fits"])
    assert fitting == named, f"{recipe.name}: fits {sorted(fitting)}; its header names {sorted(named)}"


def test_the_docs_blocks_are_what_the_planner_writes(fresh_plans):
    """README's fit table, planning.md's recipe tables, settings per GPU class and auto-fit's worked example are
    what ``python -m video_grpo.plan --markdown`` makes (in the fresh process, from the plans the tests above
    check): committed text that differs fails with the diff. The settings table had drifted once by hand, and the
    fit tables' "off" column had once been filled with `shared_prefix` alone off."""
    from video_grpo.plan.doc_blocks import check_pages

    blocks = {name: tuple(block) for name, block in fresh_plans()["docs"].items()}
    assert {page for page, _ in blocks.values()} == {"README.md", "docs/planning.md"}
    diffs = check_pages(REPO, blocks)
    assert not diffs, "".join(diffs) + "\nrun: python -m video_grpo.plan --markdown --write"


def test_every_gpu_recipe_is_a_row_of_the_fit_tables(fresh_plans):
    """The fit tables' rows are made from configs/grpo/: a new GPU recipe (one whose model is a shipped Hub config)
    gets its row, with its peak and step times, when the tables are regenerated."""
    docs = fresh_plans()["docs"]
    for name in ("fit-table", "recipe-table", "recipe-times"):
        rows = re.findall(r"^\| [^|`]*`(\w+)`", docs[name][1], re.M)
        assert rows == [stem for stem in rows if stem in {r.stem for r in GPU_RECIPES}], (name, rows)
        assert sorted(rows) == sorted(r.stem for r in GPU_RECIPES), (name, rows)


def test_a_recipe_that_does_not_fit_gets_changes_that_do():
    plan = plan_recipe(
        "configs/grpo/qwen2_5_vl_7b_charades.yaml",
        "configs/accelerate/zero3.yaml",
        gpu="a100-40gb",
        model_config="configs/models/qwen2_5_vl_7b_instruct.json",
    )
    assert plan.fits is False
    found = suggestions(plan)
    assert found and all(peak <= plan.usable_bytes for _, peak in found)
    assert all(peak < plan.memory.peak for _, peak in found)
    # the offload change it names is what that accelerate config plans (parameters offloaded too, not only the
    # optimizer's states)
    offload = next(peak for text, peak in found if "zero3_offload.yaml" in text)
    launched = plan_recipe(
        "configs/grpo/qwen2_5_vl_7b_charades.yaml",
        "configs/accelerate/zero3_offload.yaml",
        gpu="a100-40gb",
        model_config="configs/models/qwen2_5_vl_7b_instruct.json",
    )
    assert offload == launched.memory.peak


def test_the_worst_case_video_of_a_recipe():
    """The 7B recipe: 2 fps, 128 frames of at most 256 tokens per pair, 3,584 tokens at most: the budget binds."""
    from video_grpo.inputs.families import QWEN2_5_VL, QWEN3_VL

    assert worst_case_video(QWEN2_5_VL, 3584, 128, 12544, 200704) == (3584, 64, 56)
    assert worst_case_video(QWEN2_5_VL, 100_000, 8, 3136, 12544) == (64, 4, 16)  # frames x pixels bind
    tokens, pairs, per_pair = worst_case_video(QWEN3_VL, 4096, 64, 32 * 32 * 16, 32 * 32 * 256)
    assert tokens <= 4096 and pairs == 32 and per_pair * pairs == tokens


def test_the_plan_matches_a_measured_step():
    """The quick grid of `bench plan --quick` at narrow widths (512 wide, the real 152k vocabulary), each step
    measured on live tensor bytes and FlopCounterMode (video_grpo.bench.plan_measure): the peak within 10%, every
    category within 15%, FLOPs within 5%. A formula that forgot a term (the head's tiles, a mask, the optimizer's
    states) fails here. Its cells run at half the grid's video and answers (256 visual tokens, 16 answer tokens),
    at half its cost: each cell still takes its path and holds the same categories above the 2% floor. The
    measurement makes TRL's head tiles fake (plan_measure.Measuring; they ran for real at this width, half of each
    cell's CPU time): the same bytes and FLOPs in every cell, checked against real tensors in the test below."""
    from video_grpo.bench.plan_check import CATEGORY_GOAL, FLOPS_GOAL, PEAK_GOAL, compare, grid, within

    for widths, depth, settings in grid(quick=True):
        if settings["visual_tokens"] == 512:
            settings = {**settings, "visual_tokens": 256, "answer_tokens": 16}
        result = compare(widths, depth, **settings)
        cell = result["cell"]
        assert within(result["peak_ratio"], PEAK_GOAL), (cell, result["peak_ratio"], result["phase_ratios"])
        assert len(result["category_ratios"]) >= 3, (cell, result)  # weights, states or activations, the head
        assert all(within(v, CATEGORY_GOAL) for v in result["category_ratios"].values()), (cell, result)
        assert all(within(v, FLOPS_GOAL) for v in result["flops_ratios"].values()), (cell, result)
        assert set(result["flops_ratios"]) >= {"generation", "loss"}


def test_the_fake_measurement_is_the_real_one():
    """The planner is checked on fake tensors (full width, no weights); on a model small enough to run for real,
    the same step with real tensors holds the same bytes at every phase's peak and counts the same FLOPs. The fake
    step here takes the measurement's every rule, the new-buffer one included (TRL's head tiles of 32,768 columns
    are over its 16 MB, so they and all that is computed from them are fake, as in the grid's cells)."""
    from video_grpo.bench.plan_check import model_values
    from video_grpo.bench.plan_measure import StepSetting, measure_step

    for settings in (
        {},
        {"shared_prefix": False, "gradient_checkpointing": True, "training": "lora", "beta": 0.04},
    ):
        setting = StepSetting(
            config=model_values("quick", 1), visual_tokens=128, group_size=4, answer_tokens=16, **settings
        )
        fake, real = measure_step(setting), measure_step(setting, fake=False)
        assert {k: v.bytes for k, v in fake.peaks.items()} == {k: v.bytes for k, v in real.peaks.items()}
        assert fake.flops == real.flops and fake.flops["loss"] > 0
        assert fake.fake_buffers > 0  # the rule fired (a real measurement has no fake mode to count in)


def test_the_startup_summary_is_logged_and_warns_when_over(tiny_model_dir, caplog, monkeypatch):
    from video_grpo.grpo import parse_args
    from video_grpo.plan import log_startup_plan

    script_args, training_args, model_args = parse_args(
        ["--config", "configs/grpo/demo_tiny.yaml", "--model_name_or_path", str(tiny_model_dir)]
    )
    logger = logging.getLogger("test_plan")
    with caplog.at_level(logging.INFO, logger="test_plan"):
        plan = log_startup_plan(script_args, training_args, model_args, logger)
    assert plan is not None and "plan: peak" in caplog.text and "per GPU in" in caplog.text
    assert "exceeds" not in caplog.text  # no GPU here: no verdict, no warning

    class TinyGPU:  # a CUDA device far too small for anything
        name, total_memory = "a 1 MB GPU", 2**20

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: TinyGPU)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="test_plan"):
        plan = log_startup_plan(script_args, training_args, model_args, logger)
    assert plan.fits is False and "exceeds" in caplog.text and "Training goes on" in caplog.text


def test_the_startup_summary_says_when_it_planned_a_shipped_config(caplog):
    """Offline (as the tests run), a run of a Hub model shipped in configs/models/ is planned from that file, and
    the summary says so in one line."""
    from video_grpo.grpo import parse_args
    from video_grpo.plan import log_startup_plan

    args = parse_args(
        ["--config", "configs/grpo/demo_tiny.yaml", "--model_name_or_path", "Qwen/Qwen2.5-VL-3B-Instruct"]
    )
    with caplog.at_level(logging.INFO, logger="test_plan"):
        plan = log_startup_plan(*args, logging.getLogger("test_plan"))
    assert plan is not None and plan.shape.params > 3e9
    assert (
        "Qwen/Qwen2.5-VL-3B-Instruct's architecture from configs/models/qwen2_5_vl_3b_instruct.json"
        in caplog.text
    )


def test_a_process_with_weight_tying_switched_off_is_refused(monkeypatch):
    """A from_pretrained in another thread can leave transformers' tie_weights a no-op for the whole process; a
    tied model built then has its output projection apart, and the plan would count it twice. The planner
    refuses instead, naming the cause."""
    from transformers.modeling_utils import PreTrainedModel

    from video_grpo.plan.model import load_model_config, read_model_shape

    monkeypatch.setenv(cache.ENV, "off")  # the model is built here, not read from what an earlier plan kept
    cache.clear_memory()
    config, _ = load_model_config("Qwen/Qwen2.5-VL-3B-Instruct")  # tied embeddings
    assert read_model_shape(config).tied
    cache.clear_memory()
    monkeypatch.setattr(PreTrainedModel, "tie_weights", lambda self, *args, **kwargs: None)
    with pytest.raises(RuntimeError, match="lm_head.weight apart .* weight tying is switched off"):
        read_model_shape(config)


def test_a_kept_plan_is_the_traced_plan(tiny_model_dir, tmp_path, monkeypatch):
    """A shipped recipe (the CPU demo's, as the tests plan it) planned with nothing kept (every layer traced, the
    model built) and again in a process that kept nothing in memory, from the disk cache the first wrote: the same
    plan to the byte, and the second read neither the model's config nor any trace."""
    from video_grpo.plan.model import ConfigFile

    monkeypatch.setenv(cache.ENV, str(tmp_path))
    loads = []
    load = ConfigFile.load
    monkeypatch.setattr(ConfigFile, "load", lambda self: loads.append(self) or load(self))
    model = str(tiny_model_dir)
    recipe = dict(gpu="cpu", gpu_memory_gb=24, model_config=model, overrides={"model_name_or_path": model})
    plans = []
    for _ in range(2):
        cache.clear_memory()
        before = cache.stats()["misses"]
        plans.append(plan_recipe("configs/grpo/demo_tiny.yaml", **recipe))
        plans[-1].misses = cache.stats()["misses"] - before
    traced, kept = plans
    assert traced.misses > 0 and list(tmp_path.glob("*.json"))
    assert (
        kept.misses == 0 and not loads and "config" not in vars(kept.shape)
    )  # all from disk, no config read
    assert json.dumps(plan_json(kept)) == json.dumps(plan_json(traced)) and kept.source == traced.source
    cache.clear_memory()


def test_a_failed_write_leaves_the_cache_as_it_was(tmp_path, monkeypatch):
    """An entry that cannot be written (here: a dump that raises OSError, as a full disk would) leaves the
    kept file as it was and no temporary file behind; the plan goes on with the value."""
    monkeypatch.setenv(cache.ENV, str(tmp_path))
    cache.clear_memory()
    assert cache.cached("k", "kept", lambda: 1) == 1
    before = (tmp_path / "k.json").read_bytes()
    dump = json.dump
    monkeypatch.setattr(json, "dump", lambda *a, **k: (_ for _ in ()).throw(OSError("no space left")))
    assert cache.cached("k", "lost", lambda: 2) == 2
    monkeypatch.setattr(json, "dump", dump)
    assert (tmp_path / "k.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.json"]
    cache.clear_memory()


def test_a_changed_input_is_never_read_from_the_cache(tmp_path, monkeypatch):
    """The disk cache's key covers what a kept result depends on: a model config that differs in one field, a
    changed version of transformers, or an edited planner source file is a miss, never the old entry."""
    from video_grpo.plan.model import find_config_file, read_model_shape

    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    cache.clear_memory()
    shipped = shipped_model_configs()["Qwen/Qwen3-VL-4B-Instruct"]
    shape = read_model_shape(find_config_file("unused", str(shipped)))
    values = json.loads(shipped.read_text())
    values["text_config"]["num_hidden_layers"] += 1  # one decoder layer more
    deeper = tmp_path / "config.json"
    deeper.write_text(json.dumps(values))
    cache.clear_memory()
    more = read_model_shape(find_config_file("unused", str(deeper)))
    assert len(more.text_layers) == len(shape.text_layers) + 1
    assert more.params == shape.params + more.text_layer_params["full_attention"]
    key = cache.file_key(shipped.read_bytes(), False)
    assert cache.has(key, "shape")
    version = cache._version
    for change in ("version", "source"):
        cache.clear_memory()
        monkeypatch.setattr(cache, "_fingerprint", None)
        if change == "version":
            monkeypatch.setattr(
                cache, "_version", lambda name: "0.0" if name == "transformers" else version(name)
            )
        else:  # the package with one comment more in the layer tracer
            edited = tmp_path / "video_grpo"
            (edited / "plan").mkdir(parents=True)
            for path in [*(cache.PACKAGE / "plan").glob("*.py"), *(cache.PACKAGE / n for n in cache.SOURCES)]:
                copy = edited / path.relative_to(cache.PACKAGE)
                copy.parent.mkdir(parents=True, exist_ok=True)
                copy.write_bytes(path.read_bytes())
            with open(edited / "plan" / "layers.py", "a") as f:
                f.write("# edited\n")
            monkeypatch.setattr(cache, "_version", version)
            monkeypatch.setattr(cache, "PACKAGE", edited)
        assert not cache.has(cache.file_key(shipped.read_bytes(), False), "shape"), change
    cache.clear_memory()


def test_a_plan_that_cannot_be_made_never_stops_training(caplog):
    from types import SimpleNamespace

    from video_grpo.plan import log_startup_plan

    broken = SimpleNamespace(model_name_or_path="/nonexistent/model", model_revision=None)
    with caplog.at_level(logging.WARNING):
        assert log_startup_plan(SimpleNamespace(), SimpleNamespace(), broken, logging.getLogger("x")) is None
    assert "could not plan" in caplog.text


def test_planning_inside_a_zero3_launch_starts_no_collective(tiny_model_dir):
    """grpo.main plans on rank 0 alone, after TrainingArguments has switched transformers to ZeRO-3 init. A meta
    model built through ``deepspeed.zero.Init`` there broadcasts with no partner rank: the launch aborts (it did on
    6dc1279). Observed here: with a ZeRO-3 config alive, planning must not enter ``zero.Init``."""
    import deepspeed
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    entered = []
    original = deepspeed.zero.Init.__init__

    def spy(self, *args, **kwargs):
        entered.append(True)
        return original(self, *args, **kwargs)

    keep_alive = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    assert is_deepspeed_zero3_enabled()
    deepspeed.zero.Init.__init__ = spy
    try:
        plan = plan_recipe(
            "configs/grpo/demo_tiny.yaml",
            model_config=str(tiny_model_dir / "config.json"),
            overrides={"model_name_or_path": str(tiny_model_dir)},
        )
    finally:
        deepspeed.zero.Init.__init__ = original
    del keep_alive
    assert entered == [] and plan.memory.peak > 0


def test_a_qwen3_5_model_is_planned(family_model):
    """Qwen3.5's linear-attention layers take no 4-D mask; the launched Qwen3.5 run logs this plan."""
    tiny = family_model("qwen3_5")
    plan = plan_recipe(
        "configs/grpo/tiny_qwen3_vl.yaml",
        model_config=str(tiny / "config.json"),
        overrides={"model_name_or_path": str(tiny)},
    )
    assert plan.memory.peak > 0 and "plan: peak" in plan.summary()


def test_counting_flops_keeps_no_recomputed_tensor_alive():
    """torch's FlopCounterMode files FLOPs by module with hooks on every module's outputs; under checkpointing they
    kept each layer's recomputed tensors alive until the backward ended, and the measured peak counted them (a
    checkpointed Qwen3-VL-4B step of 2 layers: 0.93 GB of 14.9). plan_measure's counter counts the same FLOPs and
    leaves the bytes as they are without a counter."""
    import contextlib

    from torch.utils.checkpoint import checkpoint
    from torch.utils.flop_counter import FlopCounterMode

    from video_grpo.bench.plan_measure import flop_counter
    from video_grpo.runtime.live_memory import LiveBytes

    def step(counter) -> tuple[int, int]:
        torch.manual_seed(0)
        layers = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(4))
        x = torch.randn(512, 64, requires_grad=True)
        at_input_grad = []
        with LiveBytes() as live, counter:
            x.register_hook(lambda grad: at_input_grad.append(live.current))
            hidden = x
            for layer in layers:
                hidden = checkpoint(lambda t, layer=layer: torch.tanh(layer(t)), hidden, use_reentrant=False)
            hidden.sum().backward()
        return at_input_grad[0], getattr(counter, "get_total_flops", lambda: 0)()

    plain_bytes, _ = step(contextlib.nullcontext())
    stock_bytes, stock_flops = step(FlopCounterMode(display=False))
    ours_bytes, ours_flops = step(flop_counter())
    assert stock_bytes > plain_bytes  # what the stock counter's hooks hold (the reason for ours)
    assert ours_bytes == plain_bytes
    assert ours_flops == stock_flops > 0


@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "transposed"])
def test_counting_flops_of_a_grouped_convolution_backward(transposed):
    """torch's formula counts a grouped convolution's weight gradient as if ungrouped (``groups`` times too many:
    Qwen3.5's depthwise causal convolution came out at 5.4 TFLOP of a 34.4 TFLOP step); plan_measure's counter
    gives input and weight gradients one forward's FLOPs each, grouped or not, and agrees with torch ungrouped."""
    from torch.utils.flop_counter import FlopCounterMode

    from video_grpo.bench.plan_measure import flop_counter

    def flops(counter, groups: int) -> tuple[int, int]:
        torch.manual_seed(0)
        kind = torch.nn.ConvTranspose1d if transposed else torch.nn.Conv1d
        conv = kind(64, 64, 4, groups=groups, padding=3)
        x = torch.randn(2, 64, 100, requires_grad=True)
        with FlopCounterMode(display=False) as forward:
            out = conv(x)
        with counter:
            out.sum().backward()
        return forward.get_total_flops(), counter.get_total_flops()

    for groups in (1, 64):
        forward, ours = flops(flop_counter(), groups)
        _, stock = flops(FlopCounterMode(display=False), groups)
        assert ours == 2 * forward > 0
        if groups == 1:
            assert stock == ours
        else:
            assert stock == (1 + groups) * forward  # what the fix is for


def test_deepspeeds_buffers_live_where_deepspeed_allocates_them():
    """DeepSpeed's own buffers (video_grpo.plan.deepspeed_buffers) by stage, on the 3B recipe's 8 GPUs: ZeRO-1/2's
    1 GB reduce bucket (5e8 bf16 elements) only in the loss phase (the backward allocates and frees it), ZeRO-3's in
    every phase (kept from the optimizer's construction), nothing without DeepSpeed; the optimizer step's float32
    gradient partition (ZeRO-3: its flattened bf16 copy too), which offload moves to the host. The ZeRO-2 launch
    (tests/test_launch.py) measures the loss phase's bucket on the CPU twin."""
    from video_grpo.plan.memory import trainable_params
    from video_grpo.plan.recipe import make_plan

    shipped = plan_recipe("configs/grpo/qwen2_5_vl_3b_charades.yaml", "configs/accelerate/zero3.yaml")
    bucket = 5e8 * 2
    partition = trainable_params(shipped.shape, shipped.work) // 8
    step = {1: partition * 4, 2: partition * 4, 3: partition * (2 + 4)}
    for stage, offload in ((0, False), (1, False), (2, False), (3, False), (3, True)):
        work = shipped.work.replace(zero_stage=stage, offload_optimizer=offload, offload_params=offload)
        phases = make_plan(shipped.shape, work, shipped.gpu).memory.phases
        buffers = {name: phase.by_category.get("deepspeed buffers", 0) for name, phase in phases.items()}
        optimizer = 0 if (offload or not stage) else step[stage]
        if stage == 0:
            expected = dict.fromkeys(phases, 0)
        elif stage < 3:
            expected = {"generation": 0, "old_and_reference": 0, "loss": bucket, "optimizer": optimizer}
        else:
            expected = {**dict.fromkeys(phases, bucket), "optimizer": bucket + optimizer}
        assert buffers == expected, (stage, offload, buffers)
