"""One step proves one step: a run of 12 training steps with evaluations between, as a user runs it (TRL's default
gradient checkpointing on), on videos of three lengths, counting what may grow at every step.

The compiled case decodes through the compiled step (``aot_eager``: the graph inductor would compile, without code
generation) and must stay compiled at every step, within its bound on graphs (one per call shape, see
``video_grpo.rollout.decode.DecodeStats``) and with no recompile that no new call shape explains. Both cases keep one
input-gradient hook per embedding module (``video_grpo.runtime.checkpointing``): before that fix, the compiled case died at
step 9 with torch's ``FailOnRecompileLimitHit``, and the hooks grew by 2 a step in both.
"""

from __future__ import annotations

import dataclasses

import pytest
from transformers import TrainerCallback

from video_grpo.data.dataset import build_dataset
from video_grpo.runtime.checkpointing import input_grad_hooks

from .test_trainer import SAMPLING, make_trainer

STEPS = 12
# 10-60 s clips at 0.2 fps: 2 to 12 frames, so prompts of several widths (the committed samples)
LENGTHS = dataclasses.replace(SAMPLING, fps=0.2, min_frames=2, max_frames=12, max_tokens=96)


class Counts(TrainerCallback):
    """At the end of every training step: the hooks on the input embeddings, the decoder's graphs, and the widths
    of the prompts generated from."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.hooks: list[list[int]] = []
        self.graphs: list[int] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.hooks.append(input_grad_hooks(self.trainer.model))
        decoder = self.trainer.decoder
        self.graphs.append(decoder.stats.graphs if decoder is not None else 0)


@pytest.mark.parametrize("decoding", ["compiled", "eager"])
def test_a_long_run_stays_healthy(decoding, tiny_model_dir, train_file, tmp_path):
    import torch

    torch._dynamo.reset()
    data = build_dataset(train_file, sampling=LENGTHS)
    durations = sorted(set(data.with_format(None)["duration"]))
    assert len(durations) >= 3
    trainer = make_trainer(
        tiny_model_dir,
        data,
        tmp_path,
        eval_dataset=data.select(range(4)),
        max_steps=STEPS,
        gradient_checkpointing=True,
        eval_strategy="steps",
        eval_steps=4,
        per_device_eval_batch_size=4,
        trainer_kwargs={
            "decode_compile": "true" if decoding == "compiled" else "false",
            "decode_compile_backend": "aot_eager",
            "grounding_eval_samples": 4,
        },
    )
    counts = Counts(trainer)
    trainer.add_callback(counts)
    widths = set()
    original = trainer._generate_single_turn

    def spy(prompt_ids, *args, **kwargs):
        widths.update(len(ids) for ids in prompt_ids)
        return original(prompt_ids, *args, **kwargs)

    trainer._generate_single_turn = spy
    trainer.train()

    assert len(counts.hooks) == STEPS and all(hooks == counts.hooks[0] for hooks in counts.hooks), (
        counts.hooks
    )
    assert counts.hooks[0] and set(counts.hooks[0]) == {1}
    assert len(widths) >= 3, widths  # prompts of at least three widths were generated from
    # accelerate's prepared loaders: the training one and the last evaluation's, not one more per evaluation
    assert len(trainer.accelerator._dataloaders) == 2, trainer.accelerator._dataloaders
    history = trainer.state.log_history
    evaluations = [entry for entry in history if "eval_mIoU" in entry]
    assert len(evaluations) == STEPS // 4, evaluations
    compiled = [
        entry["decode/compiled"] for entry in history if "decode/compiled" in entry and "loss" in entry
    ]
    assert len(compiled) == STEPS, history
    if decoding == "eager":
        assert compiled == [0.0] * STEPS and trainer.decoder is None
        return
    assert compiled == [1.0] * STEPS, compiled
    stats = trainer.decoder.stats
    # the bound: one graph per call shape (train mode; eval mode; a sampled eval batch of other rows)
    assert stats.graphs == len(stats.graph_keys) <= 3, stats
    assert stats.unexpected_recompiles == 0 and stats.fallbacks == 0 and stats.cache_growths == 0, stats
    assert counts.graphs[-1] == counts.graphs[4], counts.graphs  # nothing new after the first evaluation
