"""What the GPU path keeps alive, observed on the CPU with a live-storage counter (``video_grpo.runtime.live_memory``).

No GPU runs here, so each check counts the bytes of live tensors that a step creates: the packed mask is built
where the model runs (not O(L²) on the host), a packed loss forward and a generation call hold each video's
pixels once (not G times), the frozen tower's cache does not keep the batch's concatenated pixels, and the
prefill's hidden states are gone before decoding starts.
"""

from __future__ import annotations

import functools
import gc
import weakref
from types import SimpleNamespace

import torch
from transformers import AutoModelForImageTextToText

from video_grpo.data.dataset import build_dataset
from video_grpo.inputs.encoder import install
from video_grpo.inputs.positions import reference_rope_index
from video_grpo.inputs.prefix import pack_rows
from video_grpo.rollout import prefill
from video_grpo.runtime.live_memory import LiveBytes

from .test_shared_prefix import micro_batch
from .test_shared_prefix_generation import batch as generation_batch
from .test_trainer import SAMPLING, make_trainer

PIXEL_COLUMNS = 3 * 2 * 14 * 14  # Qwen2.5-VL: channels x temporal patch x 14 x 14


def test_live_bytes_counts_storages_once_and_frees_them():
    with LiveBytes() as live:
        a = torch.ones(1000)  # 4,000 bytes
        view = a.view(10, 100)  # same storage: not counted again
        b = a * 2  # 4,000 more
        del a, view
        c = torch.ones(250)  # after a is gone: peak stays 8,000
    assert (live.peak, live.current) == (8000, 5000)
    del b, c
    assert live.current == 0


def packed_case(prompt_tokens: int, answers: int = 4, answer_tokens: int = 40):
    """One prompt (a 4-token video among ``prompt_tokens``) repeated over ``answers`` rows, as TRL lays them out."""
    video_id, pad_id = 99, 0
    prompt = torch.randint(5, 90, (prompt_tokens,))
    prompt[10:14] = video_id
    completion = torch.randint(5, 90, (answers, answer_tokens))
    input_ids = torch.cat([prompt.expand(answers, -1), completion], dim=1)
    mask = torch.ones_like(input_ids)
    rows = {
        "video_pixels": [torch.zeros(16, PIXEL_COLUMNS)] * answers,
        "video_grid_thw": torch.tensor([[1, 4, 4]] * answers),
        "second_per_grid_ts": torch.tensor([1.0] * answers),
    }
    config = SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=2, tokens_per_second=2))
    rope_index = functools.partial(reference_rope_index, SimpleNamespace(config=config))
    return (input_ids, mask, answer_tokens, rows, slice(0, answers), rope_index, video_id, pad_id)


def test_packing_for_a_device_builds_the_mask_there():
    """The host side of packing is O(length): segment ids, positions, labels. The (rows, 1, L, L) mask is made on
    the model's device (meta here, which allocates nothing), not on the CPU and then copied."""
    peaks, lengths = [], []
    for prompt_tokens in (1500, 3000):
        case = packed_case(prompt_tokens)
        with LiveBytes("cpu") as host:
            packed = pack_rows(*case, device="meta")
        assert packed.model_inputs["attention_mask"].device.type == "meta"
        lengths.append(packed.model_inputs["input_ids"].shape[1])
        peaks.append(host.peak)
    assert lengths[1] > 1.9 * lengths[0]
    assert peaks[1] < 2.5 * peaks[0], peaks  # grows with L; an L x L host mask would grow 4x
    assert peaks[1] < lengths[1] ** 2 / 8, peaks  # far below even a boolean L x L mask


def pixel_copies() -> LiveBytes:
    """Counts only tensors shaped like pixel rows (patches x 1176 float32 columns), in units of bytes."""
    return LiveBytes(
        predicate=lambda t: t.dtype == torch.float32 and t.dim() == 2 and t.shape[-1] == PIXEL_COLUMNS
    )


def two_prompts_generation(model_dir, train_file, tmp_path):
    """A trainer whose generation batch is 2 prompts x G = 4 answers, and that batch's rows (one micro-batch)."""
    data = build_dataset(train_file, sampling=SAMPLING)
    trainer = make_trainer(
        model_dir, data, tmp_path, per_device_train_batch_size=8, num_generations=4, steps_per_generation=1
    )
    assert trainer.shared_prefix and trainer.shared_prefill
    trainer.model.train()
    return trainer, next(iter(trainer.get_train_dataloader()))


def bytes_once(pixels_per_row: list[torch.Tensor]) -> int:
    """Bytes of each distinct video's pixels, once (rows of a prompt share one tensor)."""
    videos = {id(v): v for v in pixels_per_row}
    assert len(videos) == 2 and len(pixels_per_row) == 8
    return sum(v.numel() * v.element_size() for v in videos.values())


def test_generation_holds_each_video_once(tiny_model_dir, train_file, tmp_path):
    """A generation call holds the rows' processed pixels (once per video) and generation's input (once per
    video: the prefill needs no more), not 1 + G copies."""
    trainer, rows = two_prompts_generation(tiny_model_dir, train_file, tmp_path)
    torch.manual_seed(0)
    with pixel_copies() as generation:
        output = trainer._generate_and_score_completions(rows)
    once = bytes_once(output["video_pixels"])
    assert generation.peak == 2 * once, (generation.peak, once)


def test_packed_loss_forward_holds_each_video_once(tiny_model_dir, train_file, tmp_path):
    """The packed loss forward and its backward hold each prompt's pixels once (the packed rows' input), not G."""
    trainer, rows = two_prompts_generation(tiny_model_dir, train_file, tmp_path)
    torch.manual_seed(0)
    inputs = micro_batch(trainer._generate_and_score_completions(rows), slice(0, 8))
    once = bytes_once(inputs["video_pixels"])
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    trainer._video_rows = {
        key: inputs[key] for key in ("video_pixels", "video_grid_thw", "second_per_grid_ts")
    }
    packed_before = trainer.prefix_positions[1]
    with pixel_copies() as loss_forward:
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, inputs["completion_ids"].shape[1]
        )
        logps.sum().backward()
    trainer._video_rows = None
    assert trainer.prefix_positions[1] > packed_before  # it packed
    assert loss_forward.peak == once, (loss_forward.peak, once)


def test_frozen_tower_cache_does_not_keep_the_batch_pixels(tiny_model_dir, train_file):
    """The cache keeps each video's own pixels for its exact comparison, not views into the concatenated input,
    which would keep every row's copy alive until the next generation batch."""
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    model.model.visual.requires_grad_(False)
    hook = install(model, reuse_across_calls=True)
    _, inputs, _ = generation_batch(tiny_model_dir, train_file, "qwen2_5_vl")  # two videos, G rows each
    pixels, grids = inputs["pixel_values_videos"].clone(), inputs["video_grid_thw"]
    alive = weakref.ref(pixels)
    with torch.no_grad():
        hook(pixels, grids)
    assert len(hook.cache) == 2
    del pixels
    gc.collect()
    assert alive() is None
    rows = grids.prod(-1).tolist()
    with torch.no_grad():  # and the cache still serves the same videos, exactly
        hook.must_hit = True
        hook(torch.cat([inputs["pixel_values_videos"][: rows[0]]]), grids[:1])


def test_prefill_outputs_are_freed_before_decoding(tiny_model_dir, train_file):
    """Only the cache survives the prefill: its hidden states are gone when decoding starts."""
    model, inputs, kwargs = generation_batch(tiny_model_dir, train_file, "qwen2_5_vl")
    hidden = []
    backbone = prefill.language_backbone(model)
    handle = backbone.register_forward_hook(
        lambda module, args, out: hidden.append(weakref.ref(out.last_hidden_state))
    )

    def decode(**decode_kwargs):
        gc.collect()
        assert hidden and hidden[0]() is None, "the prefill's hidden states are still alive"
        return model.generate(**decode_kwargs)

    prefill.generate(model, decode, **inputs, do_sample=False, **kwargs)
    handle.remove()
