"""video_grpo.state_fork on one Gated DeltaNet layer: a packed row's segments get what the layer gives
``stem + segment`` run alone, and the gradient reaching the shared stem is the sum over its segments. (Within
1e-6: transformers' kernel computes in float32 whatever the inputs' dtype, and the chunk boundaries differ.)"""

from __future__ import annotations

import torch

from video_grpo import state_fork


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
