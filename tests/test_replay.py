"""The serving replay as a CI test: prefix reuse, fork and copy-on-write change no logit.

CPU, torch backend, float32, the tiny decoder of bench/model.py and the --quick workloads. Each
workload runs with and without prefix reuse (teacher-forced to the same tokens); every generated
position's logits must agree within 1e-4, and with a dense no-cache forward. The workloads must
actually share (hit rate > 0, copy-on-write copies for parallel sampling), or the equality would
prove nothing. No timing is asserted anywhere.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("pandas")
pytest.importorskip("tabulate")

from pagedattn.bench import workloads as W  # noqa: E402
from pagedattn.bench.engine import ForkEngine, RadixEngine  # noqa: E402
from pagedattn.bench.model import ModelConfig, TinyDecoder  # noqa: E402
from pagedattn.bench.replay import run_workload  # noqa: E402

TOL = 1e-4  # fp32 on CPU: only the summation order differs between the two runs
WORKLOADS = {f.__name__: f for f in W.ALL}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return TinyDecoder(ModelConfig(seed=0), device="cpu", dtype=torch.float32)


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_cache_on_equals_cache_off(model, name):
    wl = WORKLOADS[name](quick=True, vocab=model.cfg.vocab, seed=0)
    row = run_workload(wl, model, backend="torch", seed=0, dense_checks=1)
    assert row["hit rate"] > 0.3, f"{name}: the workload must reuse prefixes, got {row}"
    assert row["prefill tok (on)"] < row["prefill tok (off)"]
    assert row["max|Δlogit|"] <= TOL, f"{name}: cache on vs off differ: {row['max|Δlogit|']}"
    assert row["vs dense"] <= TOL, f"{name}: paged vs dense forward differ: {row['vs dense']}"
    assert row["KV paged+shared"] <= row["KV paged"] < row["KV static"]
    if wl.kind == "fork":
        assert row["CoW copies"] > 0, "parallel sampling must exercise copy-on-write"
    assert row["ok"]


def test_radix_engine_leaves_nothing_behind(model):
    """After a run every pool slot is free or cached-evictable; nothing stays locked."""
    wl = W.few_shot(quick=True, vocab=model.cfg.vocab, seed=1)
    eng = RadixEngine(model, backend="torch", pool_size=1024, max_batch=2, use_cache=True,
                      forced=None, seed=1)
    done = eng.run(list(wl.reqs))
    assert len(done) == len(wl.reqs)
    assert eng.cache.protected_size() == 0
    assert eng.pool.available_size() + eng.cache.evictable_size() == eng.pool.size
    eng.cache.evict(eng.cache.evictable_size())
    assert eng.pool.available_size() == eng.pool.size
    eng.cache.check_integrity()


def test_radix_engine_evicts_under_pressure(model):
    """A pool too small to keep every finished prefix: eviction runs, logits still agree."""
    wl = W.multi_turn(quick=True, vocab=model.cfg.vocab, seed=2)
    on = RadixEngine(model, backend="torch", pool_size=96, max_batch=1, use_cache=True,
                     forced=None, seed=2)
    res_on = on.run(list(wl.reqs))
    assert on.stats.evicted > 0
    forced = {rid: r.output for rid, r in res_on.items()}
    off = RadixEngine(model, backend="torch", pool_size=96, max_batch=1, use_cache=False,
                      forced=forced, seed=2)
    res_off = off.run(list(wl.reqs))
    for rid, r in res_on.items():
        d = (torch.stack(r.logits) - torch.stack(res_off[rid].logits)).abs().max()
        assert float(d) <= TOL
    assert off.pool.available_size() == off.pool.size


def test_fork_engine_frees_every_block(model):
    wl = W.parallel_sampling(quick=True, vocab=model.cfg.vocab, seed=3)
    eng = ForkEngine(model, backend="torch", num_blocks=64, block_size=8, use_cache=True,
                     forced=None, seed=3)
    done = eng.run(list(wl.reqs))
    outs = {tuple(r.output) for r in done.values()}
    assert len(outs) > 1, "samples should differ (temperature 1, one stream per sample)"
    assert eng.stats.cow_copies > 0
    assert eng.bm.num_free_blocks == 64 - 1  # block 0 is the reserved null block
    eng.bm.check_integrity()


def test_bench_run_quick_writes_tables(tmp_path):
    """`python -m pagedattn.bench run --quick` end to end (subprocess, bounded by a timeout)."""
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "pagedattn.bench", "run", "--out", str(tmp_path),
                           "--quick"], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=110 if not torch.cuda.is_available() else 400)  # GPU: compiles
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    for name in ("replay", "ab_decode", "ab_extend"):
        for ext in ("md", "csv", "json"):
            assert (tmp_path / f"{name}.{ext}").is_file(), f"{name}.{ext} missing"
    replay = (tmp_path / "replay.md").read_text()
    assert "commit:" in replay and "device:" in replay
    for wl in ("few-shot", "multi-turn", "parallel-sampling", "tree-search"):
        assert wl in replay
    if not torch.cuda.is_available():
        assert "Triton interpreter" in (tmp_path / "ab_decode.md").read_text()


def test_read_probe_reads_every_element():
    """The streaming-read ceiling kernel sums every element once (ragged tail included): a probe
    that skipped loads would report an inflated ceiling."""
    import torch

    from pagedattn.bench.read_probe import stream_sum
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU runs it under the interpreter
    x = (torch.arange(5000, dtype=torch.float32) % 7 - 3).to(dev)
    for blk, it, w in ((256, 4, 4), (1024, 2, 4)):
        part = stream_sum(x, blk, it, w)
        assert part.shape[0] == -(-5000 // (blk * it))
        assert float(part.sum()) == float(x.sum())
