"""Serving replay: the end-to-end proof, as a table (docs/bench.md).

Each workload (workloads.py) runs twice through a tiny decoder (model.py) on the
engines of engine.py: **cache on** (RadixCache prefix reuse, or fork + copy-on-write for
parallel sampling) and **cache off** (no reuse, teacher-forced to the cache-on run's tokens). The
logits of every generated position must agree between the two runs, and with a dense no-cache
forward for the first requests: prefix reuse, forking and copy-on-write change only the work
done. The row also gives the prefix hit rate, prefill tokens saved, peak KV memory (paged,
paged + shared, and a static allocation of max_seq_len per request) and tokens/s.
"""
import argparse
import time
import traceback

import torch

from pagedattn.bench import workloads as W
from pagedattn.bench.engine import ForkEngine, RadixEngine
from pagedattn.bench.model import ModelConfig, TinyDecoder

# (atol, rtol): |logit(cache on) - logit(cache off)| <= atol + rtol * |logit| at every position.
# The two runs differ only in summation order (batch composition, prefix/new split); in bf16 the
# LM head rounds logits of magnitude ~10 to steps of 0.0625, so one or two ulps must pass. A real
# bug (a wrong or stale prefix slot) moves logits by O(1). bf16 activations also round at every
# layer: on the H200 (2026-11-30) cache on vs off differed by up to 0.125 and the no-cache dense
# oracle by 0.094 at logits of magnitude ~2-4, hence atol 0.25 (still 4x below a real bug).
TOL = {("cpu", torch.float32): (1e-4, 0.0), ("cuda", torch.float32): (2e-3, 0.0),
       ("cuda", torch.float16): (5e-2, 1e-2), ("cuda", torch.bfloat16): (2.5e-1, 2e-2)}


# ----------------------------------------------------------------------------- the table


def _engine(wl: W.Workload, model, *, backend, use_cache, forced, seed, max_batch):
    total = sum(len(s.own) + s.max_new for s in wl.reqs)
    if wl.kind == "fork":
        return ForkEngine(model, backend=backend, num_blocks=total // 8 + 64, block_size=8,
                          use_cache=use_cache, forced=forced, seed=seed)
    # room for every token of every request + parents' histories: no eviction in this size
    return RadixEngine(model, backend=backend, pool_size=4 * total + 64, max_batch=max_batch,
                       use_cache=use_cache, forced=forced, seed=seed)


def run_workload(wl: W.Workload, model: TinyDecoder, *, backend: str = "auto", seed: int = 0,
                 max_batch: int = 4, dense_checks: int = 2, repeats: int = 1) -> dict:
    """Run ``wl`` with and without prefix reuse; return one table row (see module doc).

    ``repeats`` > 1 runs each mode again and keeps the last run's stats (GPU: the first run
    pays Triton's JIT compilation for every new specialisation).
    """
    forced = None
    for use_cache in (True, False):
        for _ in range(repeats):
            eng = _engine(wl, model, backend=backend, use_cache=use_cache, forced=forced,
                          seed=seed, max_batch=max_batch)
            res = eng.run(list(wl.reqs))
        if use_cache:
            on_eng, on = eng, res
            forced = {rid: r.output for rid, r in on.items()}
        else:
            off_eng, off = eng, res
    atol, rtol = TOL.get((model.device.type, model.dtype), (1e-1, 2e-2))
    diff = dense = 0.0
    ok = True

    def compare(got, ref):
        nonlocal ok
        d = (got - ref).abs()
        ok &= bool((d <= atol + rtol * ref.abs()).all())
        return float(d.max())

    for i in on:
        diff = max(diff, compare(torch.stack(on[i].logits), torch.stack(off[i].logits)))
    for i in sorted(on)[:dense_checks]:  # an independent oracle: no cache, plain attention
        r = on[i]
        ref = model.dense_logits(r.history()[:-1])[len(r.prompt) - 1:].cpu()
        dense = max(dense, compare(torch.stack(r.logits), ref))
    s, s0 = on_eng.stats, off_eng.stats
    used = {**off_eng.used, **on_eng.used}
    static = s0.peak_running * model.cfg.max_seq_len
    return {
        "workload": wl.name,
        "ops via": "/".join(sorted(set(used.values()))),
        "reqs": s.reqs,
        "prompt tok": s.prompt_tokens,
        "prefill tok (off)": s0.prefill_tokens,
        "prefill tok (on)": s.prefill_tokens,
        "hit rate": 1 - s.prefill_tokens / max(s.prompt_tokens, 1),
        "decode tok": s.decode_tokens,
        "KV static": static,
        "KV paged": s0.peak_kv,
        "KV paged+shared": s.peak_kv,
        "KV vs static": s.peak_kv / max(static, 1),
        "CoW copies": s.cow_copies,
        "gen tok/s": (s.decode_tokens + s.reqs) / max(s.wall_s, 1e-9),
        "speed-up": s0.wall_s / max(s.wall_s, 1e-9),
        "max|Δlogit|": diff,
        "vs dense": dense,
        "ok": ok,
    }


def run_replay(*, device: str = "cpu", backend: str = "auto", dtype: torch.dtype = torch.float32,
               quick: bool = False, seed: int = 0, names=None, progress=None):
    """All workloads -> (pandas DataFrame, notes). Raises ImportError when the cache managers
    are not importable."""
    import pandas as pd

    model = TinyDecoder(ModelConfig(seed=seed), device=device, dtype=dtype)
    rows, notes = [], []
    repeats = 2 if device == "cuda" else 1  # GPU: time the second run (JIT compiled)
    try:  # CPU warm-up (first-call costs), so that the first workload's timings are like the rest
        if repeats == 1:
            run_workload(W.multi_turn(quick=True, vocab=model.cfg.vocab, seed=seed), model,
                         backend=backend, seed=seed, dense_checks=0)
    except ImportError:
        pass
    for wl in W.build(quick=quick, vocab=model.cfg.vocab, seed=seed):
        if names and wl.name not in names:
            continue
        try:
            rows.append(run_workload(wl, model, backend=backend, seed=seed, repeats=repeats))
        except ImportError as e:  # a cache manager that has not landed yet
            notes.append(f"{wl.name}: skipped, {e}")
        except Exception as e:  # noqa: BLE001 - an op's failure is a failed row, not a crash
            traceback.print_exc()
            rows.append({"workload": wl.name, "ok": False,
                         "error": f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"})
        if progress:
            progress.step(wl.name)
        notes.append(f"{wl.name}: {wl.note}")
    c = model.cfg
    notes += [
        f"model: {c.layers} layers, {c.q_heads} q / {c.kv_heads} kv heads, head_dim {c.head_dim}, "
        f"hidden {c.hidden}, vocab {c.vocab}, RoPE, seed {seed}, "
        f"{str(dtype).replace('torch.', '')}",
        "hit rate = prompt tokens served from the cache / prompt tokens; KV columns are peak "
        "token slots: static = peak running requests x max_seq_len "
        f"({c.max_seq_len}), paged = cache off, paged+shared = cache on",
        "max|Δlogit| = cache on vs cache off over every generated position; "
        "vs dense = cache on vs "
        f"a no-cache dense forward of the first requests; ok: |Δ| <= atol + rtol·|logit| with "
        f"(atol, rtol) = {TOL.get((device, dtype))}",
        "gen tok/s and speed-up (wall off / wall on) include Python scheduling overhead"
        + ("; timed on the second of two runs per mode (JIT warm)" if repeats > 1 else ""),
    ]
    return pd.DataFrame(rows), notes


def main(argv=None) -> int:
    from pagedattn.bench import common as C

    ap = argparse.ArgumentParser(prog="pagedattn-bench replay",
                               description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results")
    ap.add_argument("--backend", default="auto", choices=["auto", "torch", "triton", "hip"])
    ap.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workload", action="append", help="run only these (repeatable)")
    a = ap.parse_args(argv)
    # auto on a CPU = torch unless TRITON_INTERPRET=1 is exported (the interpreter takes minutes)
    device = C.setup_device(interpret=a.backend == "triton")
    dtype = getattr(torch, a.dtype) if a.dtype else torch.float32
    return report(device=device, backend=a.backend, dtype=dtype, quick=a.quick, seed=a.seed,
                  out=a.out, names=a.workload)


def report(*, device, backend, dtype, quick, seed, out, names=None, ceilings=None) -> int:
    """Run the replay, print and write ``replay.md/csv/json``; 0 when every check passed."""
    from pagedattn.bench import common as C

    t0 = time.perf_counter()
    names = names or None
    n = len([w for w in W.ALL if not names or w.__name__.replace("_", "-") in names])
    df, notes = run_replay(device=device, backend=backend, dtype=dtype, quick=quick, seed=seed,
                           names=names, progress=C.Progress(n, "replay"))
    ran = sorted({b for via in df["ops via"] for b in via.split("/")}) if len(df) else []
    title = f"Serving replay on {C.device_name(device)}, backend={backend}"
    if device == "cpu":
        title += f" ({C.cpu_note(ran)})"
    notes.append(f"replay wall time {C.elapsed(t0)}")
    print(C.write_table(df, out, "replay", title=title, notes=notes,
                        header=C.results_header(device=device, ceilings=ceilings, ran=ran)),
          flush=True)
    return 0 if len(df) and bool(df["ok"].all()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
