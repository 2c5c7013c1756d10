"""Toys: tiny random-weight models (``tiny``) and generated videos with known answers (``synthetic``).

They stand in for ``Qwen/*`` checkpoints and real datasets where nothing can be downloaded: the tests, ``make
demo``, the benchmarks and CPU trial runs of a recipe. A training run on real data needs neither; nothing in the
product imports this package."""
