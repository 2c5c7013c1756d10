"""A compiled decode path never ends an ``auto`` run (video_grpo.rollout.decode, video_grpo.rollout.prefill.generate).

Each test injects one failure into the compiled path of the tiny Qwen2.5-VL, at the place a GPU run would meet it:
a kernel that fails at a graph's first call (a Triton compile or autotune error, a CUDA graph capture error), a
failure at a later step of a later call, a recompile storm (the hook leak of transformers 5.24, replayed by hand),
torch's recompile limit, and out-of-memory errors from the step, from the cache's allocation and from inside
inductor's compile. Under ``auto`` the failing call decodes again eagerly, from the random state it started from,
and gives the eager path's tokens; under ``true`` the run stops with a clear error; an out-of-memory error always
propagates, as itself.
"""

from __future__ import annotations

import logging

import pytest
import torch

from video_grpo.rollout import decode, prefill
from video_grpo.rollout.decode import CompiledDecoder, DecodeSettings

from .test_decode_compile import G, calls, load, settings_kwargs
from .test_shared_prefix import family_dataset

CHEAP = DecodeSettings("eager", keep_cache=True)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def setup(tiny_model_dir, train_file):
    processor, model = load(tiny_model_dir)
    batches = [shared for shared, _ in calls(processor, model, family_dataset(train_file, "qwen2_5_vl"))]
    return processor, model, batches


def failing_step(monkeypatch, fail_at: int, error: BaseException) -> dict:
    """The backend's compiled step raises ``error`` at its ``fail_at``-th run (1: a graph's first call)."""
    real = decode._compile_graph
    runs = {"count": 0}

    def compile_graph(settings, graph, example_inputs):
        compiled = real(settings, graph, example_inputs)

        def run(*args, **kwargs):
            runs["count"] += 1
            if runs["count"] == fail_at:
                raise error
            return compiled(*args, **kwargs)

        return run

    monkeypatch.setattr(decode, "_compile_graph", compile_graph)
    return runs


def decode_both(model, inputs, kwargs, decoder, seed=0):
    """(the call through the decoder, the eager path's call from the same seed)."""
    torch.manual_seed(seed)
    compiled = prefill.generate(model, **inputs, **kwargs, decoder=decoder)
    torch.manual_seed(seed)
    return compiled, prefill.generate(model, **inputs, **kwargs)


@pytest.mark.parametrize("where", ["first_call", "later_step"])
def test_a_failure_at_any_step_falls_back_under_auto(where, setup, monkeypatch, caplog):
    """``first_call``: the kernel fails the first time it runs (nothing ran through the step yet); ``later_step``:
    the first call decodes compiled, the second fails at its fourth compiled step. Sampled calls: the eager redo
    starts from the random state the failed call started from, so it draws what the eager path draws."""
    processor, model, batches = setup
    kwargs = settings_kwargs(processor, model, do_sample=True)
    fail_at = 1 if where == "first_call" else NEW_STEPS + 4
    failure = RuntimeError("triton: autotune of the fused kernel failed")
    runs = failing_step(monkeypatch, fail_at, failure)
    decoder = CompiledDecoder(rows=2 * G, settings=CHEAP)
    with caplog.at_level(logging.WARNING, logger="video_grpo.rollout.decode"):
        if where == "later_step":
            compiled, eager = decode_both(model, batches[0], kwargs, decoder)
            assert torch.equal(compiled, eager) and decoder.last_call_compiled
            assert decoder.stats.compiled_steps == NEW_STEPS
        compiled, eager = decode_both(model, batches[1], kwargs, decoder, seed=1)
    assert torch.equal(compiled, eager)
    assert runs["count"] == fail_at
    # the failing run is not counted: steps are counted after the compiled call returns
    assert decoder.stats.compiled_steps == fail_at - 1
    assert not decoder.enabled and not decoder.last_call_compiled and decoder.stats.fallbacks == 1
    warnings = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(warnings) == 1 and "autotune of the fused kernel failed" in warnings[0], warnings
    compiled, eager = decode_both(
        model, batches[2], kwargs, decoder, seed=2
    )  # later calls: eager, no warning
    assert torch.equal(compiled, eager) and decoder.stats.fallbacks == 1 and runs["count"] == fail_at


NEW_STEPS = 7  # compiled steps of one call: max_new_tokens 8, the first token is the prefill's


def test_decode_compile_true_stops_with_a_clear_error(setup, monkeypatch):
    processor, model, batches = setup
    failing_step(monkeypatch, 1, RuntimeError("CUDA graph capture failed: operation not permitted"))
    decoder = CompiledDecoder(rows=2 * G, settings=CHEAP, strict=True)
    kwargs = settings_kwargs(processor, model, do_sample=False)
    with pytest.raises(
        RuntimeError, match="decode_compile: true, and the compiled decode step failed"
    ) as err:
        prefill.generate(model, **batches[0], **kwargs, decoder=decoder)
    assert "CUDA graph capture failed" in str(err.value) and "decode_compile: auto" in str(err.value)
    assert decoder.stats.fallbacks == 0


@pytest.mark.parametrize("where", ["step", "cache_allocation", "compile"])
def test_out_of_memory_is_never_taken_for_a_compile_failure(where, setup, monkeypatch):
    """An allocation failure reaches the caller as ``torch.OutOfMemoryError`` itself (a caller retries smaller on
    it), never as a fallback. ``compile``: raised inside inductor's compile, which dynamo wraps in
    ``BackendCompilerFailed`` (inductor's own code generation wraps it in ``InductorError``, a subclass)."""
    processor, model, batches = setup
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def no_memory(*args, **kwargs):
        raise oom

    settings = CHEAP
    if where == "step":
        failing_step(monkeypatch, 2, oom)
    elif where == "cache_allocation":
        monkeypatch.setattr(decode, "init_layer", no_memory)
    else:
        import torch._inductor.compile_fx as inductor

        monkeypatch.setattr(inductor, "compile_fx", no_memory)  # what decode._compile_graph calls
        settings = DecodeSettings("inductor", keep_cache=True)
    decoder = CompiledDecoder(rows=2 * G, settings=settings)
    kwargs = settings_kwargs(processor, model, do_sample=False)
    with pytest.raises(torch.OutOfMemoryError) as raised:
        prefill.generate(model, **batches[0], **kwargs, decoder=decoder)
    assert raised.value is oom
    assert decoder.enabled and decoder.stats.fallbacks == 0
    assert decode.is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried"))
    assert not decode.is_out_of_memory(RuntimeError("triton: autotune failed"))


def test_a_recompile_storm_turns_compiling_off_naming_the_guard(setup, caplog):
    """transformers 5.24's leak, replayed: one more forward hook on the input embeddings before each call of the
    same shape. The first two recompiles are logged with the guard that failed; the third is refused, and the
    call decodes eagerly. Without the bound, the ninth would hit torch's recompile limit and end the run."""
    processor, model, batches = setup
    kwargs = settings_kwargs(processor, model, do_sample=False)
    decoder = CompiledDecoder(rows=2 * G, settings=CHEAP)
    embeddings = model.get_input_embeddings()
    # one hook when the step is traced, as under checkpointing (with none then, dynamo did not guard the count)
    handles = [embeddings.register_forward_hook(lambda module, args, output: None)]
    try:
        with caplog.at_level(logging.WARNING, logger="video_grpo.rollout.decode"):
            for call in range(decode.MAX_UNEXPECTED_RECOMPILES + 3):
                compiled, eager = decode_both(model, batches[0], kwargs, decoder)
                assert torch.equal(compiled, eager), call
                handles.append(embeddings.register_forward_hook(lambda module, args, output: None))
    finally:
        for handle in handles:
            handle.remove()
    stats = decoder.stats
    assert stats.unexpected_recompiles == decode.MAX_UNEXPECTED_RECOMPILES + 1, stats
    assert (
        stats.graphs == 1 + decode.MAX_UNEXPECTED_RECOMPILES and stats.fallbacks == 1 and not decoder.enabled
    )
    assert "_forward_hooks" in stats.last_guard_failure, stats.last_guard_failure
    text = caplog.text
    assert (
        text.count("recompiled for a call shape it had compiled before")
        == decode.MAX_UNEXPECTED_RECOMPILES + 1
    )
    assert "GraphBoundExceeded" in text and "_forward_hooks" in text


def test_a_guard_failure_in_the_first_call_of_a_shape_is_unexpected(setup):
    """A new call shape explains one compile of the step, not every compile during its first call: a forward hook
    added to the input embeddings after the call's first compiled step (every step checks guards, as under ZeRO-3)
    makes the next step recompile, and that recompile is counted as unexpected, with the guard that failed."""
    from transformers import LogitsProcessor, LogitsProcessorList

    processor, model, batches = setup
    decoder = CompiledDecoder(
        rows=2 * G, settings=DecodeSettings("eager", keep_cache=True, skip_guards=False)
    )
    embeddings = model.get_input_embeddings()
    # one hook when the step is traced, so that dynamo guards the count (see the storm test)
    handles = [embeddings.register_forward_hook(lambda module, args, output: None)]

    class AddHook(LogitsProcessor):
        def __call__(self, input_ids, scores):
            if len(handles) == 1 and decoder.stats.compiled_steps:
                handles.append(embeddings.register_forward_hook(lambda module, args, output: None))
            return scores

    kwargs = settings_kwargs(
        processor, model, do_sample=False, logits_processor=LogitsProcessorList([AddHook()])
    )
    try:
        prefill.generate(model, **batches[0], **kwargs, decoder=decoder)
    finally:
        for handle in handles:
            handle.remove()
    stats = decoder.stats
    assert len(handles) == 2 and decoder.last_call_compiled and len(stats.graph_keys) == 1, stats
    assert stats.graphs == 2 and stats.unexpected_recompiles == 1 and stats.recompiles == 1, stats
    assert "_forward_hooks" in stats.last_guard_failure, stats.last_guard_failure


def test_the_graph_bound_stops_before_torchs_recompile_limit(setup, caplog):
    """New call shapes each need a graph (sampled calls of 2G, then G rows); with torch's limit at 2 the second
    graph would be the last torch allows, so the decoder refuses it and decodes that call eagerly."""
    processor, model, batches = setup
    kwargs = settings_kwargs(processor, model, do_sample=True)
    decoder = CompiledDecoder(rows=2 * G, settings=CHEAP)
    with torch._dynamo.config.patch(recompile_limit=2):
        compiled, eager = decode_both(model, batches[0], kwargs, decoder)
        assert torch.equal(compiled, eager) and decoder.stats.graphs == 1
        compiled, eager = decode_both(model, batches[2], kwargs, decoder)  # G rows: a new shape
    assert torch.equal(compiled, eager)
    assert decoder.stats.graphs == 1 and decoder.stats.fallbacks == 1 and not decoder.enabled
    assert "recompile_limit 2" in caplog.text


def test_errors_outside_the_compiled_path_propagate_as_they_are(setup, monkeypatch):
    """Only the compiled path's own failures fall back. A logits processor that raises (a stand-in for sampling,
    a collective, the model's first eager step) propagates unchanged, and so does a device error from inside the
    step (an illegal memory access leaves the device unusable: no eager redo can help)."""
    from transformers import LogitsProcessor, LogitsProcessorList

    processor, model, batches = setup

    class Broken(LogitsProcessor):
        def __call__(self, input_ids, scores):
            raise ValueError("probability tensor contains inf")

    decoder = CompiledDecoder(rows=2 * G, settings=CHEAP)
    kwargs = settings_kwargs(
        processor, model, do_sample=True, logits_processor=LogitsProcessorList([Broken()])
    )
    with pytest.raises(ValueError, match="probability tensor contains inf"):
        prefill.generate(model, **batches[0], **kwargs, decoder=decoder)
    assert decoder.enabled and decoder.stats.fallbacks == 0
    failing_step(
        monkeypatch, 1, torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
    )
    with pytest.raises(torch.AcceleratorError):
        prefill.generate(model, **batches[0], **settings_kwargs(processor, model), decoder=decoder)
    assert decoder.enabled and decoder.stats.fallbacks == 0
