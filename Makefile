# `make demo` and `make test` work on a fresh machine: both create the venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TINY := outputs/tiny-qwen2_5_vl
DEMO_OUT := outputs/demo

.PHONY: install demo test test-fast test-learning-full lint tiny samples clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

tiny: $(TINY)/config.json

$(TINY)/config.json: $(STAMP)
	$(PY) -m video_grpo.toys.tiny $(TINY)

# GRPO that learns, on generated flash videos (scripts/demo_flash.py: data + SFT cold start), then a before/after
# table and timelines: 2 CPU processes under DeepSpeed ZeRO-2, whole model trainable. `make demo SEED=1` picks
# other videos, initial weights, SFT and GRPO sampling; the same seed gives the same table on one machine.
SEED ?= 0
demo: $(STAMP)
	rm -rf $(DEMO_OUT)
	OMP_NUM_THREADS=1 $(PY) scripts/demo_flash.py prepare --out outputs/demo_flash --seed $(SEED)
	OMP_NUM_THREADS=1 $(VENV)/bin/accelerate launch --config_file configs/accelerate/cpu_zero2.yaml \
		-m video_grpo.grpo --config configs/grpo/demo_flash.yaml --output_dir $(DEMO_OUT) --seed $(SEED)
	$(PY) scripts/demo_report.py --run_dir $(DEMO_OUT) --initial_model outputs/demo_flash/sft
	$(PY) -m video_grpo.plot train --run_dir $(DEMO_OUT)
	OMP_NUM_THREADS=2 $(PY) scripts/demo_flash.py report --out outputs/demo_flash --run_dir $(DEMO_OUT)

# Two workers (pytest-xdist) on the two cores; the longest tests start first (tests/conftest.py).
test: lint
	$(PY) -m pytest -n 2 --dist worksteal -m "not learning_full"

# The full learning benchmark with every assertion (its guided and answer-only arms too; make test runs the suite
# variant, tests/test_learning.py).
test-learning-full: $(STAMP)
	$(PY) -m pytest tests/test_learning.py -m learning_full

# Everything but the multi-process launches, benchmarks and the learning run.
test-fast: $(STAMP)
	$(PY) -m pytest -n 2 --dist worksteal -m "not launch and not learning"

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests scripts
	$(VENV)/bin/ruff format --check src tests scripts

# Regenerate the committed synthetic videos (needs the dev extra's ffmpeg).
samples: $(STAMP)
	rm -rf data_samples
	$(PY) scripts/make_samples.py --out data_samples

clean:
	rm -rf outputs .pytest_cache
