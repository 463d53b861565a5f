"""Block manager on the CPU: operation throughput, and KV memory utilisation of static vs paged.

* Throughput: ``--num-seqs`` (10k) sequences through allocate -> append_slot x ``--decode`` ->
  fork -> append_slot on every child (one copy-on-write each) -> free, plus ``get_block_table``
  for batches of 256; with prefix caching off and on (every prompt shares a 64-token system
  prompt). Wall-clock ops/s of the Python manager, one thread.
* Memory (docs/block_manager.md, "Memory utilisation"; vLLM paper §2.3 / Fig. 2): the fraction
  of reserved KV slots that hold real tokens, averaged over every decode step of every request
  (token-steps), for

  | scheme | slots reserved for a request with prompt p at output step t (of o) |
  |---|---|
  | static max      | ``max_seq_len`` (FasterTransformer / Orca "Max")         |
  | static pow2     | ``p + 2^ceil(log2 o)`` (Orca "Pow2": output bound within 2x) |
  | static oracle   | ``p + o`` (Orca "Oracle": exact output length known)     |
  | paged B         | ``B * ceil((p + t) / B)`` (grows one block at a time)     |

  Workloads: lognormal prompt/output lengths (sigma 1) with the means of the vLLM paper's
  traces (ShareGPT 161 / 338 tokens, Alpaca 19 / 58), clipped to ``[1, max_seq_len]``.
  Paged waste is only the unfilled part of each sequence's last block: ``B - 1 - (L - 1) % B``
  slots, about ``(B - 1) / 2`` on average (the reference's "B/2").

Run: ``python -m pagedattn.bench block-manager [--out DIR]`` (about 10 s).
"""
import argparse
import random
import sys
import time

import numpy as np
import pandas as pd

from pagedattn.bench import common as C
from pagedattn.cache_mgmt.block_manager import BlockManager

BLOCK_SIZES = (16, 32, 64, 128)
WORKLOADS = {"sharegpt": (161, 338), "alpaca": (19, 58)}   # mean prompt, mean output tokens


# ############################################ memory ############################################

def sample_lengths(mean_prompt: float, mean_output: float, n: int, max_seq_len: int, seed: int):
    """(prompt, output) int arrays, lognormal with the given means, ``p + o <= max_seq_len``."""
    rng = np.random.default_rng(seed)

    def draw(mean):                                # lognormal mean = exp(mu + sigma^2 / 2)
        return np.maximum(1, rng.lognormal(np.log(mean) - 0.5, 1.0, n).round().astype(np.int64))
    p = np.minimum(draw(mean_prompt), max_seq_len // 2)
    o = np.minimum(draw(mean_output), max_seq_len - p)
    return p, o


def token_steps(p: np.ndarray, o: np.ndarray):
    """Per request, live tokens at each output step t = 1..o, flattened: ``p + t``."""
    starts = np.repeat(p, o)
    t = np.arange(o.sum()) - np.repeat(np.cumsum(o) - o, o) + 1
    return starts + t


def paged_reserved(live: np.ndarray, block_size: int) -> np.ndarray:
    """Slots held by paging for ``live`` tokens: whole blocks only."""
    return -(-live // block_size) * block_size


def memory_table(*, n: int, max_seq_len: int, seed: int) -> pd.DataFrame:
    rows = []
    for name, (mp, mo) in WORKLOADS.items():
        p, o = sample_lengths(mp, mo, n, max_seq_len, seed)
        live = token_steps(p, o)
        used = live.sum()
        pow2 = p + 2 ** np.ceil(np.log2(np.maximum(o, 1))).astype(np.int64)
        static = {"static max": np.full(n, max_seq_len),
                  "static pow2": np.minimum(pow2, max_seq_len),
                  "static oracle": p + o}
        for scheme, per_req in static.items():
            reserved = (per_req * o).sum()          # held for every step of the request
            rows.append(_row(name, scheme, p, o, used, reserved, reserved - used))
        for B in BLOCK_SIZES:
            reserved = paged_reserved(live, B).sum()
            final = p + o
            tail_waste = (paged_reserved(final, B) - final).mean()
            rows.append(_row(name, f"paged B={B}", p, o, used, reserved, reserved - used,
                             tail_waste=tail_waste, expected=(B - 1) / 2))
    return pd.DataFrame(rows)


def _row(workload, scheme, p, o, used, reserved, wasted, tail_waste=None, expected="-"):
    return {"workload": workload, "scheme": scheme, "mean prompt": round(float(p.mean()), 1),
            "mean output": round(float(o.mean()), 1),
            "useful %": round(100.0 * used / reserved, 2),
            "waste %": round(100.0 * wasted / reserved, 2),
            "waste tok/seq (end)": "-" if tail_waste is None else round(float(tail_waste), 2),
            "(B-1)/2": expected}


# ########################################## throughput ##########################################

def throughput_table(*, num_seqs: int, decode: int, block_size: int, seed: int) -> pd.DataFrame:
    rng = random.Random(seed)
    prompts = [rng.randint(16, 512) for _ in range(num_seqs)]
    rows = []
    for caching in (False, True):
        system = list(range(64))
        toks = [system + [rng.randrange(32000) for _ in range(n - 64)] if n > 64 else system[:n]
                for n in prompts]
        need = sum(-(-(n + decode + 1) // block_size) for n in prompts) + 2 * num_seqs
        bm = BlockManager(need + 1, block_size, 0.0, enable_prefix_caching=caching)
        ids = range(num_seqs)
        kids = range(num_seqs, 2 * num_seqs)

        def run(op, calls, fn):
            t = time.perf_counter()
            out = fn()
            dt = time.perf_counter() - t
            rows.append({"op": op, "prefix caching": caching, "calls": calls,
                         "seconds": round(dt, 4),
                         "ops/s": round(calls / dt), "free blocks after": bm.num_free_blocks})
            return out

        if caching:
            run("allocate", num_seqs, lambda: [bm.allocate(i, token_ids=toks[i]) for i in ids])
            run("append_slot", num_seqs * decode,
                lambda: [bm.append_slot(i, 7) for _ in range(decode) for i in ids])
        else:
            run("allocate", num_seqs, lambda: [bm.allocate(i, prompts[i]) for i in ids])
            run("append_slot", num_seqs * decode,
                lambda: [bm.append_slot(i) for _ in range(decode) for i in ids])
        run("fork", num_seqs, lambda: [bm.fork(i, i + num_seqs) for i in ids])
        tok = 9 if caching else None
        copies = run("append_slot (CoW)", num_seqs, lambda: [bm.append_slot(k, tok) for k in kids])
        n_copies = sum(len(c) for c in copies)
        batches = [list(range(s, min(s + 256, num_seqs))) for s in range(0, num_seqs, 256)]
        run("get_block_table (256 seqs)", len(batches),
            lambda: [bm.get_block_table(b) for b in batches])
        run("free", 2 * num_seqs, lambda: [bm.free(i) for i in range(2 * num_seqs)])
        bm.check_integrity()
        assert bm.num_free_blocks == bm.allocator.num_usable, "leak after freeing everything"
        rows[-3]["op"] += f", {n_copies} copies"
    return pd.DataFrame(rows)


# ############################################# main #############################################

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="pagedattn-bench block-manager",
                               description=__doc__.splitlines()[0])
    ap.add_argument("--num-seqs", type=int, default=10_000)
    ap.add_argument("--decode", type=int, default=16, help="append_slot calls per sequence")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--mem-requests", type=int, default=20_000)
    ap.add_argument("--max-seq-len", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="1k sequences, 2k requests")
    ap.add_argument("--out", default=None, help="write .md/.csv/.json tables here")
    a = ap.parse_args(argv)
    if a.quick:
        a.num_seqs, a.mem_requests = min(a.num_seqs, 1000), min(a.mem_requests, 2000)
    t0 = time.perf_counter()
    thr = throughput_table(num_seqs=a.num_seqs, decode=a.decode, block_size=a.block_size,
                           seed=a.seed)
    mem = memory_table(n=a.mem_requests, max_seq_len=a.max_seq_len, seed=a.seed)
    print(f"## block manager throughput ({a.num_seqs} sequences, block_size {a.block_size}, CPU)\n")
    print(C.markdown(thr))
    print(f"\n## KV memory utilisation (max_seq_len {a.max_seq_len}, {a.mem_requests} requests)\n")
    print(C.markdown(mem))
    if a.out:
        header = C.results_header(device="cpu")
        C.write_table(thr, a.out, "block_manager_throughput", header=header,
                      title="Block manager throughput (CPU, Python)")
        C.write_table(mem, a.out, "block_manager_memory", header=header,
                      title="KV memory utilisation: static vs paged",
                      notes=["useful % = token-steps of real tokens / token-steps of reserved "
                             "slots, over every decode step of every request"])
    print(f"\nbench_block_manager: {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
