"""pagedattn benchmarks: ``python -m bench run`` (the main job), ``all``, ``ab``, ``replay``.

Not part of the installed package: run from a source checkout (``pagedattn-bench`` finds it).
See docs/bench.md.
"""
