"""``decode_compile`` (video_grpo.rollout.decode): one static cache, a compiled decode step, the same tokens.

Every comparison runs the compiled path and the eager path on the same rows in fp32: greedy tokens against plain
``generate`` and against today's one-prefill path, same-seed sampled tokens, and the sampled tokens' log-probs
against a plain forward. The compiled step's backend counts the graphs it compiled and the steps that ran through
them, so a test fails if the switch silently decodes eagerly. The default suite traces with ``aot_eager`` (the
same graph as inductor, seconds to build); one case compiles with inductor.
"""

from __future__ import annotations

import logging

import pytest
import torch
import yaml
from transformers import AutoModelForImageTextToText, AutoProcessor, StaticCache

from video_grpo.inputs.families import detect_family
from video_grpo.inputs.processing import encode_rows, generation_inputs, vision_placeholder_ids
from video_grpo.rollout import decode, prefill
from video_grpo.rollout.decode import CompiledDecoder, DecodeSettings, decode_settings, parse_decode_compile

from .test_shared_prefix import family_dataset
from .test_trainer import make_trainer

G = 4
NEW_TOKENS = 8
# keep_cache: the cache keeps its addresses, as CUDA graphs need. The exactness tests' decoders are strict
# (decode_compile: true): a failure raises, instead of an eager redo whose tokens would match by construction
CHEAP = DecodeSettings("aot_eager", keep_cache=True)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test's graphs are its own: dynamo's cache (and its recompile limit) is per code object, shared by
    every model's ``__call__``."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def load(model_dir):
    return AutoProcessor.from_pretrained(model_dir), AutoModelForImageTextToText.from_pretrained(
        model_dir
    ).eval()


def calls(processor, model, data) -> list[tuple[dict, dict]]:
    """Three generation calls of different prompt widths, the last with G rows fewer (a partial batch): each as
    the one-prefill path takes it (each video once) and as plain ``generate`` does (a copy per row)."""
    durations = list(data.with_format(None)["duration"])
    order = sorted(range(len(durations)), key=durations.__getitem__)
    out = []
    for prompts in ([order[0], order[-1]], [order[1], order[2]], [order[3]]):
        rows = data.__getitems__([i for i in prompts for _ in range(G)])
        encoded = encode_rows(processor, rows, detect_family(model.config))
        pad, video = processor.tokenizer.pad_token_id, model.config.video_token_id
        out.append(
            (
                generation_inputs(encoded, pad, video, one_copy_per_video=True),
                generation_inputs(encoded, pad, video),
            )
        )
    assert len({shared["input_ids"].shape[1] for shared, _ in out}) == 3  # three widths
    return out


def settings_kwargs(processor, model, **extra) -> dict:
    return {
        "max_new_tokens": NEW_TOKENS,
        "pad_token_id": processor.tokenizer.pad_token_id,
        "suppress_tokens": vision_placeholder_ids(model.config),
        **extra,
    }


def sampled_logps_match_a_plain_forward(model, plain: dict, out) -> None:
    """The log-prob of each sampled token, from the logits the compiled step gave, equals a plain forward's."""
    width = plain["input_ids"].shape[1]
    answers = out.sequences[:, width:]
    logits = torch.stack(out.logits, dim=1)
    time = {k: plain[k] for k in ("second_per_grid_ts",) if k in plain}
    with torch.no_grad():
        full = model(
            input_ids=out.sequences,
            attention_mask=torch.cat([plain["attention_mask"], torch.ones_like(answers)], dim=1),
            pixel_values_videos=plain["pixel_values_videos"],
            video_grid_thw=plain["video_grid_thw"],
            mm_token_type_ids=(out.sequences == model.config.video_token_id).long() * 2,
            **time,
        ).logits[:, width - 1 : -1]
    got = torch.log_softmax(logits, -1).gather(-1, answers[..., None])
    want = torch.log_softmax(full, -1).gather(-1, answers[..., None])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


# -- the switch --------------------------------------------------------------------------------------------------


def test_decode_compile_from_yaml_and_the_command_line(tmp_path):
    from video_grpo.grpo import parse_args

    recipe = {
        "model_name_or_path": "m",
        "train_file": "a.jsonl",
        "output_dir": str(tmp_path),
        "use_cpu": True,
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert parse_args(["--config", str(path)])[0].decode_compile == "auto"
    path.write_text(yaml.safe_dump({**recipe, "decode_compile": True, "decode_compile_backend": "aot_eager"}))
    script = parse_args(["--config", str(path)])[0]
    assert (script.decode_compile, script.decode_compile_backend) == ("true", "aot_eager")
    assert parse_args(["--config", str(path), "--decode_compile", "false"])[0].decode_compile == "false"
    with pytest.raises(ValueError, match="GRPOScriptArguments.decode_compile: 'maybe' is not one of auto"):
        parse_args(["--config", str(path), "--decode_compile", "maybe"])
    with pytest.raises(ValueError, match="decode_compile_backend"):
        parse_args(["--config", str(path), "--decode_compile_backend", "cudagraphs"])
    assert [parse_decode_compile(v) for v in (True, "False", "AUTO", "1")] == [
        "true",
        "false",
        "auto",
        "true",
    ]
    path.write_text(yaml.safe_dump({**recipe, "decode_cuda_graphs": "auto"}))  # a YAML string, not a bool
    with pytest.raises(SystemExit):  # the parser's bool type refuses it
        parse_args(["--config", str(path)])
    path.write_text(yaml.safe_dump({**recipe, "decode_cuda_graphs": "no"}))
    assert parse_args(["--config", str(path)])[0].decode_cuda_graphs is False
    from video_grpo.configs import GRPOScriptArguments

    with pytest.raises(ValueError, match="GRPOScriptArguments.decode_cuda_graphs: 'auto' is not a choice"):
        GRPOScriptArguments(train_file="a.jsonl", decode_cuda_graphs="auto")  # built in code, not parsed


@pytest.mark.parametrize("tool", ["evaluate", "curate"])
def test_evaluate_and_curate_take_the_switch(tool, capsys):
    import importlib

    main = importlib.import_module(f"video_grpo.{tool}").main
    with pytest.raises(SystemExit):
        main((["run"] if tool == "evaluate" else []) + ["--help"])
    shown = capsys.readouterr().out
    assert "--decode_compile DECODE_COMPILE" in shown and "--decode_compile_backend" in shown
    with pytest.raises(SystemExit):
        main((["run"] if tool == "evaluate" else []) + ["--decode_cuda_graphs", "auto"])
    assert "'auto' is not a choice; say true or false" in capsys.readouterr().err


def test_cuda_graphs_only_when_asked_and_where_every_address_stays():
    """CUDA graphs keep the cache allocated all step, so they are asked for (decode_cuda_graphs), and they bake in
    addresses: never under ZeRO-3 with ds3_gather_for_generation (the gathered weights move, see
    tests/test_zero3_bf16.py), never off CUDA or off inductor. Under ZeRO-3 the step may break once (DeepSpeed's
    pre-forward hook)."""
    assert not decode_settings("inductor", "cuda")[0].cuda_graphs  # the default
    graphs = decode_settings("inductor", "cuda", cuda_graphs=True)[0]
    assert graphs == DecodeSettings("inductor", cuda_graphs=True) and graphs.persistent
    assert decode_settings("inductor", "cuda", zero_stage=2, cuda_graphs=True)[0].cuda_graphs
    settings, why = decode_settings("inductor", "cuda", 3, gather_for_generation=True, cuda_graphs=True)
    assert not settings.cuda_graphs and not settings.persistent and not settings.fullgraph and "ZeRO-3" in why
    assert not decode_settings("inductor", "cpu", cuda_graphs=True)[0].cuda_graphs
    assert not decode_settings("aot_eager", "cuda", cuda_graphs=True)[0].cuda_graphs
    settings, why = decode_settings("inductor", "cuda", 3, gather_for_generation=False)
    assert settings is None and "ds3_gather_for_generation" in why  # the one place ZeRO-3 decides eager


def test_one_graph_or_several_is_decided_before_compiling(family_model):
    """From the model's config, before anything compiles: FlashAttention (the GPU recipes' choice) is a graph
    break, so a one-graph step would fail at its first call; Qwen3.5's Gated DeltaNet may run hub kernels on
    CUDA. sdpa and eager attention elsewhere: one graph."""
    from transformers import AutoConfig

    from video_grpo.rollout.decode import step_shape

    for family in ("qwen2_5_vl", "qwen3_vl", "qwen3_5"):
        config = AutoConfig.from_pretrained(family_model(family))
        config._attn_implementation = "sdpa"
        on_gpu = decode_settings("inductor", "cuda", **step_shape(config))[0]
        assert on_gpu.fullgraph == (family != "qwen3_5"), family
        assert decode_settings("inductor", "cpu", **step_shape(config))[0].fullgraph, family
        config._attn_implementation = "flash_attention_2"
        settings, why = decode_settings("inductor", "cuda", **step_shape(config))
        assert not settings.fullgraph and "flash_attention_2 is a graph break" in why, family


def test_select_cache_rows_refuses_a_static_layer(tiny_model_dir):
    """It used to skip a StaticLayer silently; decoding then failed far away, in index_copy_."""
    from transformers import AutoConfig

    cache = StaticCache(config=AutoConfig.from_pretrained(tiny_model_dir), max_cache_len=8)
    cache.layers[0].lazy_initialization(torch.zeros(2, 1, 3, 4), torch.zeros(2, 1, 3, 4))
    with pytest.raises(TypeError, match="cannot select rows of cache layer 0 .StaticLayer"):
        prefill.select_cache_rows(cache, torch.tensor([0, 0]))


# -- exactness ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "backend"), [("qwen2_5_vl", "aot_eager"), ("qwen3_vl", "eager"), ("qwen3_5", "eager")]
)
def test_compiled_decoding_is_exact(family, backend, family_model, train_file):
    """Calls of different widths through one graph (Qwen2.5-VL: three, the last a partial batch padded to the
    cache's rows; the others: the first and the partial one): greedy tokens equal plain ``generate``'s and the
    one-prefill path's; the cache never moves; same-seed sampled tokens are equal (a sampled partial batch decodes
    on row views of the cache, one more graph), and their log-probs are a plain forward's. (``eager`` traces the
    same graph as ``aot_eager``, without AOT autograd: cheaper.)"""
    processor, model = load(family_model(family))
    kwargs = settings_kwargs(processor, model, do_sample=False)
    decoder = CompiledDecoder(rows=2 * G, settings=DecodeSettings(backend, keep_cache=True), strict=True)
    batches = calls(processor, model, family_dataset(train_file, family))
    if family != "qwen2_5_vl":
        batches = [batches[0], batches[-1]]
    pointers, steps = None, 0
    for number, (inputs, plain_form) in enumerate(batches):
        compiled = prefill.generate(model, **inputs, **kwargs, decoder=decoder)
        if number == 0:  # plain generate, and today's path
            assert torch.equal(compiled, model.generate(**plain_form, **kwargs))
            assert torch.equal(compiled, prefill.generate(model, **inputs, **kwargs))
        else:
            assert torch.equal(compiled, prefill.generate(model, **inputs, **kwargs)), f"call {number}"
        assert decoder.last_call_compiled and decoder.stats.graphs == 1, decoder.stats  # no recompile
        steps += compiled.shape[1] - inputs["input_ids"].shape[1] - 1  # the first token: the prefill's step
        assert decoder.stats.compiled_steps == steps, decoder.stats
        pointers = pointers or decoder.data_pointers()
        assert decoder.data_pointers() == pointers
    assert decoder.stats.recompiles == 0 and decoder.rows == 2 * G
    sample = settings_kwargs(
        processor, model, do_sample=True, output_logits=True, return_dict_in_generate=True
    )
    for inputs, _ in (batches[0], batches[-1]):
        torch.manual_seed(0)
        eager = prefill.generate(model, **inputs, **sample)
        torch.manual_seed(0)
        compiled = prefill.generate(model, **inputs, **sample, decoder=decoder)
        assert torch.equal(compiled.sequences, eager.sequences)
        assert len({tuple(row.tolist()) for row in compiled.sequences}) > 2  # really sampled, not copies
    sampled_logps_match_a_plain_forward(model, batches[-1][1], compiled)
    assert decoder.stats.graphs == 2 and decoder.data_pointers() == pointers  # the views share the cache


def test_inductor_step_is_exact_and_the_cache_is_freed_without_cuda_graphs(tiny_model_dir, train_file):
    """The one inductor case (its C++ kernels take about 30 s to build): the same greedy tokens. Without CUDA
    graphs the cache is freed after each call, and a new allocation does not recompile."""
    processor, model = load(tiny_model_dir)
    kwargs = settings_kwargs(processor, model, do_sample=False)
    decoder = CompiledDecoder(rows=2 * G, settings=DecodeSettings("inductor"), strict=True)
    first, _, partial = calls(processor, model, family_dataset(train_file, "qwen2_5_vl"))
    for inputs, _ in (first, partial):
        compiled = prefill.generate(model, **inputs, **kwargs, decoder=decoder)
        assert torch.equal(compiled, prefill.generate(model, **inputs, **kwargs))
        assert decoder.cache is None and decoder.last_call_compiled
    assert decoder.stats.graphs == 1 and decoder.stats.compiled_steps > 0


def test_a_failing_compile_falls_back_loudly(tiny_model_dir, train_file, monkeypatch, caplog):
    processor, model = load(tiny_model_dir)
    kwargs = settings_kwargs(processor, model, do_sample=False)
    inputs = calls(processor, model, family_dataset(train_file, "qwen2_5_vl"))[0][0]

    def broken(settings, graph, example_inputs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(decode, "_compile_graph", broken)
    decoder = CompiledDecoder(rows=2 * G, settings=DecodeSettings("eager"))
    with caplog.at_level(logging.WARNING, logger="video_grpo.rollout.decode"):
        output = prefill.generate(model, **inputs, **kwargs, decoder=decoder)
    assert torch.equal(output, prefill.generate(model, **inputs, **kwargs))
    assert not decoder.enabled and not decoder.last_call_compiled and decoder.stats.fallbacks == 1
    assert "the compiled decode step failed (BackendCompilerFailed" in caplog.text
    assert "no compiler here" in caplog.text


def test_evaluation_decodes_through_the_step(tiny_model_dir, train_file):
    """``evaluate run`` / ``curate``'s generate_answers: the same greedy answers with the decoder, shared prefill
    on and off; TimeLens2's decoding (sampling at top_k 1, top_p 0.001, temperature 0.01) gives them too through the
    same graph, so those keywords reach generate on the compiled path (the eager paths: test_timelens_scoring.py)."""
    from video_grpo.evaluate import generate_answers

    processor, model = load(tiny_model_dir)
    rows = family_dataset(train_file, "qwen2_5_vl").__getitems__([1, 1, 2, 2])
    decoder = CompiledDecoder(rows=4, settings=CHEAP, strict=True)
    eager = generate_answers(model, processor, rows, max_new_tokens=4)
    for shared in (True, False):
        assert generate_answers(model, processor, rows, 4, shared_prefill=shared, decoder=decoder) == eager
        assert decoder.last_call_compiled
    timelens2 = {"top_p": 0.001, "top_k": 1, "repetition_penalty": 1.0}
    assert generate_answers(model, processor, rows, 4, True, 0.01, decoder=decoder, **timelens2) == eager
    assert decoder.last_call_compiled
    assert decoder.stats.graphs == 1


# -- training ----------------------------------------------------------------------------------------------------


class EagerTwin:
    """Wraps a trainer's ``_generate_single_turn``: each generation call runs through the compiled step (what the
    training step uses), then once more on the same inputs from the same random state with the decoder off, which
    is ``decode_compile: false``'s path; the random state and the metrics are then put back as the compiled call
    left them, so the step trains as if the second call had not been made."""

    def __init__(self, trainer) -> None:
        self.pairs: list[tuple[list, list]] = []
        original = trainer._generate_single_turn

        def both(*args, **kwargs):
            state = torch.get_rng_state()
            compiled, logprobs = original(*args, **kwargs)
            after, metrics = torch.get_rng_state(), {k: len(v) for k, v in trainer._metrics["train"].items()}
            torch.set_rng_state(state)
            trainer.decoder.enabled = False
            try:
                eager, _ = original(*args, **kwargs)
            finally:
                trainer.decoder.enabled = True
                torch.set_rng_state(after)
                logged = trainer._metrics["train"]
                for key in list(logged):
                    if key in metrics:
                        del logged[key][metrics[key] :]
                    else:
                        del logged[key]
            self.pairs.append(([list(ids) for ids in compiled], [list(ids) for ids in eager]))
            return compiled, logprobs

        trainer._generate_single_turn = both


CASES = {  # Qwen2.5-VL with the shared prefill on: the ZeRO-3 launch (tests/test_zero3_bf16.py)
    "qwen2_5_vl-shared_prefix_off": {"trainer_kwargs": {"shared_prefix": False}},
    "qwen3_vl-frozen_tower-beta": {"trainer_kwargs": {"freeze_vision_tower": True}, "beta": 0.04},
    "qwen3_5-lora": {"peft": True},
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_training_step_decodes_through_the_compiled_step(case, family_model, train_file, tmp_path):
    """The issue's done-when: with decode_compile true, one CPU training step of each family decodes through the
    compiled step (decode/compiled 1), and its completions equal decode_compile false's path's on the same
    inputs from the same random state, token for token."""
    from peft import LoraConfig

    family = case.split("-")[0]
    options = dict(CASES[case])
    options["trainer_kwargs"] = {
        **options.get("trainer_kwargs", {}),
        "decode_compile": "true",
        "decode_compile_backend": "aot_eager",
    }
    if options.pop("peft", False):
        options["trainer_kwargs"]["peft_config"] = LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0
        )
    trainer = make_trainer(family_model(family), family_dataset(train_file, family), tmp_path, **options)
    twin = EagerTwin(trainer)
    trainer.train()
    assert twin.pairs and all(compiled == eager for compiled, eager in twin.pairs), twin.pairs
    assert len({tuple(ids) for ids in twin.pairs[0][0]}) > 1  # sampled answers, not one repeated
    logged = [entry for entry in trainer.state.log_history if "decode/compiled" in entry]
    assert logged and logged[0]["decode/compiled"] == 1.0 and logged[0]["decode/recompiles"] == 0.0, logged
    assert trainer.decoder.stats.compiled_steps > 0 and trainer.decoder.stats.graphs == 1


def test_decode_compile_false_is_the_eager_path(tiny_model_dir, train_file, tmp_path):
    """``false`` builds no decoder and logs decode/compiled 0 (no trainer step: the generation call only)."""
    trainer = make_trainer(
        tiny_model_dir,
        family_dataset(train_file, "qwen2_5_vl"),
        tmp_path,
        trainer_kwargs={"decode_compile": False},
    )
    assert trainer.decoder is None
    trainer.model.train()
    batch = next(iter(trainer.get_train_dataloader()))
    trainer._generate_and_score_completions(batch)
    assert trainer._metrics["train"]["decode/compiled"] == [0.0]


# -- the planner -------------------------------------------------------------------------------------------------


def test_the_planner_plans_the_decode_path(tiny_model_dir):
    """Which path a run decodes by (what the trainer would choose), its memory (a static cache kept all step only
    with CUDA graphs) and its time (the stated efficiency of each path); the report and --json say the path."""
    from video_grpo.plan import make_plan, plan_recipe
    from video_grpo.plan.report import report
    from video_grpo.plan.sizes import DTYPE_BYTES
    from video_grpo.plan.workload import decode_path

    compiled = plan_recipe(
        "configs/grpo/demo_tiny.yaml",
        gpu="h100-80gb",
        model_config=str(tiny_model_dir / "config.json"),
        overrides={"model_name_or_path": str(tiny_model_dir)},
    )
    work, shape = compiled.work, compiled.shape
    assert compiled.decode_path == decode_path(work) == "compiled"  # auto on CUDA
    assert decode_path(work, "cpu") == "eager"
    assert decode_path(work.replace(decode_compile="false")) == "eager"
    assert decode_path(work.replace(decode_cuda_graphs=True)) == "compiled_cuda_graphs"
    assert decode_path(work.replace(decode_cuda_graphs=True, zero_stage=3)) == "compiled"  # weights move
    assert decode_path(work.replace(zero_stage=3, gather_for_generation=False)) == "eager"
    eager = make_plan(shape, work.replace(decode_compile="false"), compiled.gpu)
    graphs = make_plan(shape, work.replace(decode_cuda_graphs=True), compiled.gpu)
    kept = work.generation_rows * (
        work.decode_cache_tokens * shape.kv_bytes_per_token(DTYPE_BYTES[work.dtype])
        + shape.linear_state_bytes()
    )
    assert graphs.memory.phases["loss"].by_category["kv cache"] == kept
    assert not compiled.memory.phases["loss"].by_category.get("kv cache")
    assert compiled.seconds["generation"] < eager.seconds["generation"]
    assert compiled.as_json()["decode_path"] == "compiled" and "decoding: compiled step" in report(compiled)


def test_the_static_cache_is_sized_from_the_recipe_as_the_planner_sizes_it(tiny_model_dir, caplog):
    """What `python -m video_grpo.grpo` and `evaluate run` give the decoder (``decode_cache_tokens``, from the
    recipe's video budget, before the model loads) is the cache the planner counts, for a tiny and a shipped
    recipe, with no fallback warning (a silent fallback sizes the cache at the first call instead)."""
    from video_grpo.configs import script_args_from_yaml
    from video_grpo.plan import plan_recipe
    from video_grpo.plan.startup import decode_cache_tokens

    cases = [
        ("configs/grpo/demo_tiny.yaml", str(tiny_model_dir)),
        ("configs/grpo/qwen3_vl_8b_charades.yaml", "Qwen/Qwen3-VL-8B-Instruct"),
    ]
    for recipe, model in cases:
        plan = plan_recipe(recipe, gpu="h100-80gb", overrides={"model_name_or_path": model})
        with caplog.at_level(logging.WARNING):
            tokens = decode_cache_tokens(script_args_from_yaml(recipe), model, plan.work.completion_tokens)
        assert tokens == plan.work.decode_cache_tokens, (recipe, tokens, plan.work.decode_cache_tokens)
        assert "could not size" not in caplog.text
