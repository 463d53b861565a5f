"""``pagedattn-bench``: the installed entry point of the benchmark CLI (``python -m bench``).

The benchmarks live in the top-level ``bench/`` folder of the source tree, which is not part of
the installed package (wheels ship ``pagedattn`` only). This entry point therefore works from a
source checkout, including an editable install (``pip install -e .``): it puts the checkout root
on ``sys.path`` and calls ``bench.__main__.main``. From a plain wheel install it exits with a
message saying so. Usage: ``pagedattn-bench run --out results`` (see docs/bench.md).
"""
import sys
from pathlib import Path


def _checkout_root():
    here = Path(__file__).resolve().parent.parent
    for root in (here, Path.cwd()):
        if (root / "bench" / "__main__.py").is_file() and (root / "pagedattn").is_dir():
            return root
    return None


def main(argv=None) -> int:
    root = _checkout_root()
    if root is None:
        sys.stderr.write("pagedattn-bench: the bench/ folder is not installed with the package; "
                         "run it from a source checkout of pagedattn (or `python -m bench` "
                         "there).\n")
        return 2
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from bench.__main__ import main as bench_main

    return bench_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
