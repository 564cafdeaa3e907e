"""Benchmarks for alkstore_django: run ``python bench/run.py`` (see docs/performance.md)."""
