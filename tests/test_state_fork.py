"""video_grpo.inputs.state_fork on one Gated DeltaNet layer: a packed row's segments get what the layer gives
``stem + segment`` run alone, and the gradient reaching the shared stem is the sum over its segments. (Within
1e-6: transformers' kernel computes in float32 whatever the inputs' dtype, and the chunk boundaries differ.)"""

from __future__ import annotations

import pytest
import torch

from video_grpo.inputs import state_fork


def layer():
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    config = Qwen3_5TextConfig(
        hidden_size=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        num_hidden_layers=1,
        layer_types=["linear_attention"],
    )
    torch.manual_seed(0)
    return Qwen3_5GatedDeltaNet(config, layer_idx=0).double()


def test_each_segment_continues_from_its_own_stem():
    # row 0: a 70-token stem (two chunks of 64) and answers of 3, 1 and 5 tokens; row 1: a 1-token stem (shorter
    # than the convolution's 3-token context) and one answer of 4; padding after both
    segments = torch.full((2, 82), -2)
    segments[0, :70], segments[0, 70:73], segments[0, 73:74], segments[0, 74:79] = -1, 0, 1, 2
    segments[1, :1], segments[1, 1:5] = -1, 0
    module = layer()
    state_fork.install()
    hidden = torch.randn(2, 82, 32, dtype=torch.float64, requires_grad=True)
    packed = module(hidden, state_fork=state_fork.layout(segments))
    assert (packed[segments == -2] == 0).all()

    spans = [(0, 70, 70, 73), (0, 70, 73, 74), (0, 70, 74, 79), (1, 1, 1, 5)]
    for row, stem, start, end in spans:
        alone = module(torch.cat([hidden[row, :stem], hidden[row, start:end]])[None])[
            0
        ]  # the original forward
        torch.testing.assert_close(packed[row, start:end], alone[stem:], rtol=0, atol=1e-6)
        torch.testing.assert_close(packed[row, :stem], alone[:stem], rtol=0, atol=1e-6)

    weights = torch.randn_like(packed)
    (grad_packed,) = torch.autograd.grad((packed * weights).sum(), hidden)
    total = 0
    for row, stem, start, end in spans:  # the plain rows: each answer with its own copy of the stem
        alone = module(torch.cat([hidden[row, :stem], hidden[row, start:end]])[None])[0]
        stem_weight = weights[row, :stem] if start == stem else torch.zeros_like(weights[row, :stem])
        total = total + (alone * torch.cat([stem_weight, weights[row, start:end]])).sum()
    (grad_plain,) = torch.autograd.grad(total, hidden)
    torch.testing.assert_close(grad_packed, grad_plain, rtol=0, atol=1e-6)


def test_without_state_fork_the_layer_runs_as_before():
    module = layer()
    hidden = torch.randn(1, 9, 32, dtype=torch.float64)
    before = module(hidden)
    state_fork.install()
    torch.testing.assert_close(module(hidden), before, rtol=0, atol=0)


def is_state_fork_wrapper(function) -> bool:
    """Whether ``function`` is :func:`state_fork.install`'s wrapper (transformers' own forward is wrapped too, by
    its decorators, so ``__wrapped__`` alone does not tell)."""
    return function.__code__.co_filename == state_fork.__file__


@pytest.fixture
def unwrapped_layer_forward():
    """The Gated DeltaNet forward as transformers defines it, with :func:`state_fork.install` not yet run, as in a
    fresh process (an earlier test may have installed the wrapper; it is put back afterwards)."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    before = Qwen3_5GatedDeltaNet.forward
    if is_state_fork_wrapper(before):
        Qwen3_5GatedDeltaNet.forward = before.__wrapped__
    state_fork.install.cache_clear()
    torch._dynamo.reset()
    yield Qwen3_5GatedDeltaNet
    Qwen3_5GatedDeltaNet.forward = (
        before  # install() stays cached: it will not wrap the restored wrapper again
    )
    torch._dynamo.reset()


def test_a_compiled_run_does_not_recompile_when_the_state_is_first_forked(
    unwrapped_layer_forward, family_model, train_file, tmp_path
):
    """12 Qwen3.5 steps with the shared prompt (packed forwards fork the state) and compiled decoding: the layer's
    forward is wrapped when the trainer is built, so the graph compiled at the first generation call serves every
    later one. Wrapped at the first packed forward instead (step 1's loss), it changed under the compiled step,
    which recompiled at the second call (an unexpected recompile, found by ``python -m video_grpo.bench soak
    --family qwen3_5``)."""
    from .test_shared_prefix import family_dataset
    from .test_trainer import make_trainer

    steps = 12
    trainer = make_trainer(
        family_model("qwen3_5"),
        family_dataset(train_file, "qwen3_5"),
        tmp_path,
        max_steps=steps,
        gradient_checkpointing=True,
        trainer_kwargs={"decode_compile": "true", "decode_compile_backend": "aot_eager"},
    )
    wrapped = unwrapped_layer_forward.forward
    assert is_state_fork_wrapper(wrapped)  # wrapped before the first step
    graphs = []
    original = trainer._generate_single_turn

    def counted(*args, **kwargs):
        out = original(*args, **kwargs)
        graphs.append((trainer.decoder.stats.graphs, trainer.decoder.stats.unexpected_recompiles))
        return out

    trainer._generate_single_turn = counted
    trainer.train()
    assert len(graphs) == steps and graphs == [graphs[0]] * steps, graphs
    stats = trainer.decoder.stats
    assert stats.unexpected_recompiles == 0 and stats.graphs == len(stats.graph_keys), stats
    assert unwrapped_layer_forward.forward is wrapped
