"""Benchmarks shipped with the package: the serving replay, the A/B tables and the tables of
record (``python -m pagedattn.bench``, installed as ``pagedattn-bench``; docs/bench.md)."""
