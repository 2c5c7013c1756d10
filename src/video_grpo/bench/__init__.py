"""Benchmarks and proofs: what the trainer saves (``perf``, ``shared_prefix``) and whether it learns (``learning``,
``curation``). Nothing in the product imports this package."""
