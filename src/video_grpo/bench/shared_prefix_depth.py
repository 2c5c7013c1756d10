"""The shared prompt at full depth, from per-layer costs measured inside a real step.

A CPU cannot run the plain side of a real-depth step (36 text and 32 vision layers at 3B widths), but a layer's
cost is linear in depth. So each side (shared prompt, plain G rows) runs the step of
:mod:`video_grpo.bench.shared_prefix` at 1 text + 1 vision layer, and hooks on its two layers measure, inside that
step, each layer's forward + backward time and the live tensor bytes its forward leaves for the backward. The
full-depth step is the measured one with its single layers replaced by the real number of each:

    time(T, V)   = step - text - vision + T x text + V x vision
    memory(T, V) = max(A + (T - 1) x text saved + (V - 1) x vision saved, B + (V - 1) x vision saved, C)

where A, B and C are the 1 + 1 step's live-byte peaks until its text layer's backward ends, then until its vision
block's backward ends, then to the end. Without gradient checkpointing every layer's saved tensors are alive until
its own backward, so a deeper model adds them to A and (the vision blocks') to B; C, the embedding's and patch
projection's gradients after the layers are freed, does not grow. ``tests/test_shared_prefix_depth.py`` checks the
rule against a deeper step measured outright.
Memory is live tensor bytes (``video_grpo.runtime.live_memory.LiveBytes``) of a first, uncounted-for-time step; time is
the faster of two further steps. Rows: ``train_step_time_shared_prefix_full_depth`` and
``peak_memory_shared_prefix_full_depth``, for the 3B's depth (36 + 32) and for the 7B's (28 + 32, the same
3B-width layers: the 7B's own widths are not measured here).
"""

from __future__ import annotations

import sys
import time

import torch

from video_grpo.bench.emit import emit
from video_grpo.bench.group_scoring import answer_logps, group_inputs
from video_grpo.bench.peak_memory import in_fresh_process
from video_grpo.bench.qwen_widths import build_model, model_config
from video_grpo.runtime.live_memory import LiveBytes

DEPTHS = {"3b": (36, 32), "7b": (28, 32)}  # published (text layers, vision blocks)


class LayerMeter:
    """Forward + backward seconds of one module, and the live bytes its forward leaves behind (with ``live``)."""

    def __init__(self, module: torch.nn.Module, live: LiveBytes | None = None) -> None:
        self.live, self.seconds, self.saved = live, 0.0, 0
        self.calls = {"forward": 0, "backward": 0}  # both must fire once per step, or the time is partial
        self._started = 0.0
        self._bytes = 0
        self.handles = [
            module.register_forward_pre_hook(self._forward_start),
            module.register_forward_hook(self._forward_end),
            module.register_full_backward_pre_hook(self._backward_start),
            module.register_full_backward_hook(self._backward_end),
        ]

    def _forward_start(self, *_):
        self._started = time.perf_counter()
        self._bytes = self.live.current if self.live else 0

    def _forward_end(self, *_):
        self.calls["forward"] += 1
        self.seconds += time.perf_counter() - self._started
        if self.live:
            self.saved += self.live.current - self._bytes

    def _backward_start(self, *_):
        self._started = time.perf_counter()

    def _backward_end(self, *_):
        self.calls["backward"] += 1
        self.seconds += time.perf_counter() - self._started

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def measure_side(setting: dict) -> dict:
    """One side in this process (1 + 1 layers unless ``setting`` says otherwise): its step's time and live-byte
    peak, and the shares of its first text layer and first vision block."""
    config, origin = model_config(
        setting["widths"], setting.get("text_layers", 1), setting.get("vision_layers", 1)
    )
    model = build_model(config)
    text_layer, vision_block = model.model.language_model.layers[0], model.model.visual.blocks[0]
    batch = group_inputs(config, setting["visual_tokens"], setting["G"])
    for parameter in model.parameters():  # gradients resident before the step, as in training
        parameter.grad = torch.zeros_like(parameter)

    # memory: one counted step (the dispatch mode slows it, so it is not timed). The peak is split at the end of
    # the text layer's backward and of the vision block's: a deeper model holds more saved tensors before the
    # first point (all its layers'), fewer before the second (its vision blocks'), and the same after it.
    segments: dict[str, int] = {}

    def end_segment(name: str):
        def hook(*_):
            segments[name] = live.peak
            live.reset_peak()

        return hook

    with LiveBytes() as live:
        meters = LayerMeter(text_layer, live), LayerMeter(vision_block, live)
        marks = [
            text_layer.register_full_backward_hook(end_segment("until_text_backward")),
            vision_block.register_full_backward_hook(end_segment("until_vision_backward")),
        ]
        logps, positions = answer_logps(model, batch, setting["shared"])
        (-logps.mean()).backward()
        del logps
        segments["rest"] = live.peak
    memory = {
        "peak": max(segments.values()),
        **segments,
        "text": meters[0].saved,
        "vision": meters[1].saved,
    }
    for handle in [*marks, *meters]:
        handle.remove()

    runs = []
    for _ in range(2):  # time: the faster of two steps (this machine is shared)
        meters = LayerMeter(text_layer), LayerMeter(vision_block)
        started = time.perf_counter()
        logps, _ = answer_logps(model, batch, setting["shared"])
        (-logps.mean()).backward()
        runs.append(
            {"step": time.perf_counter() - started, "text": meters[0].seconds, "vision": meters[1].seconds}
        )
        calls = [meter.calls for meter in meters]
        if any(count != {"forward": 1, "backward": 1} for count in calls):
            raise RuntimeError(f"a layer's hooks did not fire once each in the step: {calls}")
        for meter in meters:
            meter.remove()
        del logps
    fastest = min(runs, key=lambda run: run["step"])
    return {
        "memory": memory,
        "time": fastest,
        "step_seconds": [round(run["step"], 2) for run in runs],
        "positions": positions,
        "prompt_tokens": batch["prompt_tokens"],
        "answers": batch["answers"],
        "visual_tokens": batch["visual_tokens"],
        "config": origin,
    }


def run_side(setting: dict) -> dict:
    """:func:`measure_side` in a fresh process, so both sides start from the same state."""
    return in_fresh_process("video_grpo.bench.shared_prefix_depth", "measure_side", setting)


def full_depth(side: dict, text_layers: int, vision_blocks: int) -> tuple[float, int]:
    """(seconds, peak bytes) of the side's step with ``text_layers`` + ``vision_blocks`` layers."""
    t, m = side["time"], side["memory"]
    seconds = t["step"] + (text_layers - 1) * t["text"] + (vision_blocks - 1) * t["vision"]
    more_text, more_vision = (text_layers - 1) * m["text"], (vision_blocks - 1) * m["vision"]
    peak = max(
        m["until_text_backward"] + more_text + more_vision,
        m["until_vision_backward"] + more_vision,
        m["rest"],
    )
    return seconds, peak


def full_depth_rows(emit=emit, widths: str = "3b", visual_tokens: int = 2048, group_size: int = 8) -> None:
    setting = {"widths": widths, "visual_tokens": visual_tokens, "G": group_size}
    shared, plain = run_side({**setting, "shared": True}), run_side({**setting, "shared": False})
    measured = {
        "shared": {key: shared[key] for key in ("time", "memory", "step_seconds", "positions")},
        "plain": {key: plain[key] for key in ("time", "memory", "step_seconds", "positions")},
    }
    for name, (text_layers, vision_blocks) in DEPTHS.items():
        (ours_s, ours_b), (base_s, base_b) = (
            full_depth(shared, text_layers, vision_blocks),
            full_depth(plain, text_layers, vision_blocks),
        )
        common = {
            "depth": f"{text_layers} text + {vision_blocks} vision layers ({name.upper()}'s depth)",
            "layers_measured_at": f"Qwen2.5-VL {widths} widths, 1 text + 1 vision layer, random weights, fp32, cpu",
            "config": plain["config"],
            "prompt_tokens": plain["prompt_tokens"],
            "visual_tokens": plain["visual_tokens"],
            "G": group_size,
            "answer_tokens": plain["answers"],
            "ours_setting": "shared_prefix",
            "baseline_setting": "plain (G rows)",
            "measured": measured,
        }
        emit(
            "train_step_time_shared_prefix_full_depth",
            ours_s,
            base_s,
            "s per loss forward+backward (extrapolated from per-layer times)",
            goal="ratio <= 0.35",
            **common,
        )
        emit(
            "peak_memory_shared_prefix_full_depth",
            ours_b / 2**20,
            base_b / 2**20,
            "MB of live tensors added by forward+backward (extrapolated from per-layer bytes)",
            goal="ratio <= 0.4",
            **common,
        )


def main(argv: list[str] | None = None) -> int:
    import argparse

    from video_grpo.bench.qwen_widths import WIDTHS

    parser = argparse.ArgumentParser(
        prog="python -m video_grpo.bench.shared_prefix_depth",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--widths", choices=list(WIDTHS), default="3b", help="the layers' widths")
    parser.add_argument("--visual_tokens", type=int, default=2048)
    parser.add_argument("--G", type=int, default=8)
    args = parser.parse_args(argv)
    full_depth_rows(emit, args.widths, args.visual_tokens, args.G)
    return 0


if __name__ == "__main__":
    sys.exit(main())
