"""One prefill per prompt (video_grpo.rollout.prefill): the same answers as plain ``generate``, one prefill per prompt."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from video_grpo.inputs.families import detect_family
from video_grpo.inputs.processing import encode_rows, generation_inputs, vision_placeholder_ids
from video_grpo.rollout import prefill

from .test_shared_prefix import family_dataset

G = 4


def batch(model_dir, train_file, family: str):
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    data = family_dataset(train_file, family)
    durations = list(data.with_format(None)["duration"])
    short, long = durations.index(min(durations)), durations.index(max(durations))
    rows = data.__getitems__([short] * G + [long] * G)  # two prompts of different lengths
    encoded = encode_rows(processor, rows, detect_family(model.config))
    inputs = generation_inputs(encoded, processor.tokenizer.pad_token_id, model.config.video_token_id)
    kwargs = {
        "max_new_tokens": 12,
        "pad_token_id": processor.tokenizer.pad_token_id,
        "suppress_tokens": vision_placeholder_ids(model.config),
    }
    return model, inputs, kwargs


def count_prefill_rows(model) -> list[int]:
    """Rows of every language-model forward that carries more than one token (a prefill)."""
    rows = []
    language = prefill.language_backbone(model).language_model
    language.register_forward_pre_hook(
        lambda module, args, kwargs: (
            rows.append(kwargs["inputs_embeds"].shape[0]) if kwargs["inputs_embeds"].shape[1] > 1 else None
        ),
        with_kwargs=True,
    )
    return rows


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_greedy_answers_are_the_plain_answers(family, family_model, train_file):
    model, inputs, kwargs = batch(family_model(family), train_file, family)
    assert inputs["attention_mask"][0].sum() != inputs["attention_mask"][-1].sum()  # left padding in play
    prefills = count_prefill_rows(model)
    plain = model.generate(**inputs, do_sample=False, **kwargs)
    assert prefills == [2 * G]
    with prefill.one_prefill_per_prompt(model):
        shared = model.generate(**inputs, do_sample=False, **kwargs)
    assert prefills[1:] == [2]  # one prefill row per prompt
    assert "generate" not in vars(model)  # the patch is gone
    assert torch.equal(shared, plain)


def test_sampled_answers_score_like_the_model(family_model, train_file):
    """Sampling from the shared cache: the scores at each step match a plain forward over prompt + answer."""
    model, inputs, kwargs = batch(family_model("qwen2_5_vl"), train_file, "qwen2_5_vl")
    torch.manual_seed(0)
    out = prefill.generate(
        model, **inputs, do_sample=True, output_logits=True, return_dict_in_generate=True, **kwargs
    )
    width = inputs["input_ids"].shape[1]
    answers = out.sequences[:, width:]
    logits = torch.stack(out.logits, dim=1)  # (rows, steps, vocab): the raw logits each step sampled from
    full_mask = torch.cat([inputs["attention_mask"], torch.ones_like(answers)], dim=1)
    with torch.no_grad():
        plain = model(
            input_ids=out.sequences,
            attention_mask=full_mask,
            pixel_values_videos=inputs["pixel_values_videos"],
            video_grid_thw=inputs["video_grid_thw"],
            second_per_grid_ts=inputs["second_per_grid_ts"],
            mm_token_type_ids=(out.sequences == model.config.video_token_id).long() * 2,
        ).logits
    plain = plain[:, width - 1 : -1]
    got = torch.log_softmax(logits, -1).gather(-1, answers[..., None])
    want = torch.log_softmax(plain, -1).gather(-1, answers[..., None])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert len({tuple(a.tolist()) for a in answers}) > 2  # really sampled, not G copies


def test_evaluation_and_curation_sampling_prefill_each_query_once(family_model, train_file):
    """``evaluate run --do_sample`` and ``curate`` answer a query k times in one batch: one prefill row per
    query; greedy answers equal the plain path's."""
    from video_grpo.evaluate import generate_answers

    model_dir = family_model("qwen2_5_vl")
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    rows = family_dataset(train_file, "qwen2_5_vl").__getitems__(
        [1, 1, 1, 2, 2, 2]
    )  # k = 3 answers per query
    prefills = count_prefill_rows(model)
    torch.manual_seed(0)
    sampled = generate_answers(model, processor, rows, max_new_tokens=6, do_sample=True)
    assert prefills == [2] and len(sampled) == 6
    greedy = generate_answers(model, processor, rows, max_new_tokens=6)
    assert greedy == generate_answers(model, processor, rows, max_new_tokens=6, shared_prefill=False)
    assert prefills[1:] == [2, 6]  # shared, then plain
