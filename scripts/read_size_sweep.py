"""How the read ceiling depends on the size of one read (GPU; a measurement, not a test).

The decode fractions divide by the ceiling of a 4 GiB read. A decode call reads far less at
(1, 32768) 32/8 (134 MB, one wave of 512 programs), so launch, ramp-up and tail weigh more. This
times the streaming-read kernel of pagedattn.bench.read_probe (every tile config) and ``x.sum()`` from CUDA
graphs of 10 calls, as bench_decode times decode, over the decode shapes' byte counts, and prints
each size's best GB/s, time, and fraction of the 4 GiB ceiling.

usage: python scripts/read_size_sweep.py [--csv PATH]
"""
import argparse

from pagedattn.bench.read_probe import read_ceiling

# bytes of K+V read by the decode table's shapes (D 128, bf16): (label, bytes)
SIZES = [("(1,32768) 32/8", 134_217_728), ("(8,8192) 32/8", 268_435_456),
         ("(128,512) 32/8", 268_435_456), ("(1,32768) 32/32", 536_870_912),
         ("(64,4096) 32/8", 1_073_741_824), ("(256,2048) 32/8", 2_147_483_648),
         ("4 GiB", 4 * 2 ** 30)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv")
    args = ap.parse_args()
    rows = []
    for label, n in SIZES:
        bps, _, gbps = read_ceiling("cuda", n, graph_calls=10)
        how = max(gbps, key=gbps.get)  # the winning candidate's name
        rows.append((label, n, how, n / bps * 1e6, bps / 1e9))
    ceil = rows[-1][4]
    print(f"{'shape':18} {'MB':>8} {'best':>22} {'us':>8} {'GB/s':>7} {'frac of 4 GiB':>13}")
    for label, n, how, t, gbs in rows:
        print(f"{label:18} {n / 1e6:8.1f} {how:>22} {t:8.1f} {gbs:7.0f} {gbs / ceil:13.3f}")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("shape,bytes,best,us,gbps,frac_of_4gib\n")
            for label, n, how, t, gbs in rows:
                f.write(f'"{label}",{n},{how},{t:.2f},{gbs:.1f},{gbs / ceil:.4f}\n')


if __name__ == "__main__":
    main()
