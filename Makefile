# `make demo` and `make test` work on a fresh machine: both create the venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TINY := outputs/tiny-qwen2_5_vl
DEMO_OUT := outputs/demo

.PHONY: install demo test test-fast lint tiny samples clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

tiny: $(TINY)/config.json

$(TINY)/config.json: $(STAMP)
	$(PY) -m video_grpo.tiny $(TINY)

# A short real GRPO run on data_samples/: 2 CPU processes under DeepSpeed ZeRO-2, whole model trainable.
demo: $(STAMP) $(TINY)/config.json
	rm -rf $(DEMO_OUT)
	OMP_NUM_THREADS=1 $(VENV)/bin/accelerate launch --config_file configs/accelerate/cpu_zero2.yaml \
		-m video_grpo.grpo --config configs/grpo/demo_tiny.yaml --output_dir $(DEMO_OUT)
	$(PY) scripts/demo_report.py --run_dir $(DEMO_OUT) --initial_model $(TINY)
	@echo "--- evaluating the untrained tiny model (zero-shot baseline) and the trained one on data_samples/test.jsonl"
	OMP_NUM_THREADS=1 $(PY) -m video_grpo.evaluate run --model_name_or_path $(TINY) --config configs/grpo/demo_tiny.yaml \
		--split eval --output_dir $(DEMO_OUT)/eval_base --max_new_tokens 64
	OMP_NUM_THREADS=1 $(PY) -m video_grpo.evaluate run --model_name_or_path $(DEMO_OUT) --config configs/grpo/demo_tiny.yaml \
		--split eval --output_dir $(DEMO_OUT)/eval --max_new_tokens 64
	$(PY) -m video_grpo.plot train --run_dir $(DEMO_OUT)
	$(PY) -m video_grpo.plot timeline --predictions $(DEMO_OUT)/eval/predictions.jsonl

test: $(STAMP)
	$(PY) -m pytest

# Everything but the multi-process launches, benchmarks and the learning run.
test-fast: $(STAMP)
	$(PY) -m pytest -m "not launch and not learning"

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests scripts
	$(VENV)/bin/ruff format --check src tests scripts

# Regenerate the committed synthetic videos (needs the dev extra's ffmpeg).
samples: $(STAMP)
	rm -rf data_samples
	$(PY) scripts/make_samples.py --out data_samples

clean:
	rm -rf outputs .pytest_cache
