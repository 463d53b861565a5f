"""HIP vs Triton decode speed per issue row across several timed runs (CPU: reads result CSVs).

Each input is a CSV with Hq, Hkv, block, batch, ctx and a pair of ``<hip>_graph_us`` /
``<triton>_graph_us`` columns: a benchmark table (``hip``/``triton``) or an A/B table, whose pairs
are named with ``--pair hip_a:triton_a`` (repeatable). Prints, per row, Triton time / HIP time in
every run (> 1: HIP faster), their median and minimum, as markdown; ``--csv`` writes it too.

Usage: python scripts/hip_vs_triton_runs.py [--pair H:T ...] [--csv OUT] NAME=PATH [NAME=PATH ...]
"""
import argparse

import pandas as pd

KEY = ["Hq", "Hkv", "block", "batch", "ctx"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", action="append", default=[],
                    help="HIP:TRITON column stems of an A/B table (default hip:triton)")
    ap.add_argument("--csv", default=None)
    ap.add_argument("runs", nargs="+", help="NAME=PATH")
    args = ap.parse_args(argv)
    pairs = [p.split(":") for p in args.pair] or [["hip", "triton"]]
    table = None
    for spec in args.runs:
        name, path = spec.split("=", 1)
        df = pd.read_csv(path)
        cols = []
        for h, t in pairs:
            if f"{h}_graph_us" in df and f"{t}_graph_us" in df:
                col = name if len(cols) == 0 else f"{name}.{len(cols) + 1}"
                df[col] = df[f"{t}_graph_us"] / df[f"{h}_graph_us"]
                cols.append(col)
        if not cols:
            raise SystemExit(f"{path}: no HIP/Triton column pair among {pairs}")
        part = df[KEY + cols]
        table = part if table is None else table.merge(part, on=KEY, how="outer")
    runs = [c for c in table.columns if c not in KEY]
    table["median"] = table[runs].median(axis=1)
    table["min"] = table[runs].min(axis=1)
    table["runs"] = table[runs].notna().sum(axis=1)
    print(table.round(3).to_markdown(index=False))
    ahead = (table["median"] >= 1).sum()
    print(f"\nmedian >= 1 (HIP at least as fast) on {ahead} of {len(table)} rows; "
          f"min {table['min'].min():.3f}")
    if args.csv:
        table.round(4).to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
