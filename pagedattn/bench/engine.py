"""The replay's serving engines: a scheduler loop over the cache managers and the real ops.

* ``RadixEngine``: continuous batching over RadixCache + TokenPool (one slot = one token = a
  block_size-1 cache in layout "bshd"), cache-aware admission (longest cached prefix first), one
  ragged ``extend_attention`` batch per step for newly admitted requests (``store_kv`` writes the
  new tokens first), one ``paged_decode`` batch per step for the running ones, the request
  lifecycle of cache_mgmt/radix_lifecycle.py (match + lock, allocate the rest, insert after
  prefill and at finish, unlock).
* ``ForkEngine``: parallel sampling on a BlockManager (layout "bhsd"): prefill once, ``fork``,
  and the copy-on-write copies of ``append_slot`` applied by ``copy_blocks`` before each write.

``use_cache=False`` turns prefix reuse off (every prompt prefilled in full, no fork); ``forced``
teacher-forces the generated tokens, so a cache-off run reproduces a cache-on run's sequences.
"""
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

import pagedattn as pa
from pagedattn.bench import workloads as W
from pagedattn.bench.model import TinyDecoder, sample


@dataclass
class Req:
    """One request of a run; the spec fields come from workloads.py."""

    spec: W.ReqSpec
    prompt: List[int] = field(default_factory=list)
    output: List[int] = field(default_factory=list)
    logits: List[torch.Tensor] = field(default_factory=list)
    slots: Optional[torch.Tensor] = None  # int64 KV slots of prompt + output[:-1]
    matched: int = 0                      # slots[:matched] belong to the tree, locked by node
    node: object = None

    @property
    def rid(self) -> int:
        return self.spec.rid

    def history(self) -> List[int]:
        return self.prompt + self.output


@dataclass
class RunStats:
    reqs: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0   # prompt tokens actually computed
    decode_tokens: int = 0
    peak_running: int = 0
    peak_kv: int = 0          # distinct KV slots referenced by running requests, at the peak
    cow_copies: int = 0
    evicted: int = 0
    wall_s: float = 0.0


class _Engine:
    """What both engines share: the model, the caches, the layer callbacks, token choice."""

    layout = "bshd"

    def __init__(self, model: TinyDecoder, *, backend: str, num_blocks: int, block_size: int,
                 forced: Optional[Dict[int, List[int]]], seed: int):
        c = model.cfg
        self.model, self.backend, self.forced, self.seed = model, backend, forced, seed
        self.caches = [pa.make_kv_cache(num_blocks, block_size, c.kv_heads, c.head_dim,
                                        layout=self.layout, dtype=model.dtype,
                                        device=model.device) for _ in range(c.layers)]
        for k, v in self.caches:  # poison: a read of an unwritten slot shows up as NaN
            k.fill_(float("nan")), v.fill_(float("nan"))
        self.stats = RunStats()
        self.used: Dict[str, str] = {}  # op -> backend dispatch picked (first call)

    def _call(self, op: str, *args):
        if op not in self.used:
            from pagedattn.bench.common import decision
            self.used[op] = decision(op, *args, layout=self.layout, backend=self.backend).backend
        return getattr(pa, op)(*args, layout=self.layout, backend=self.backend)

    def _attn_extend(self, slot_mapping, table, cu, lens):
        def attn(layer, q, k, v):
            kc, vc = self.caches[layer]
            self._call("store_kv", k, v, kc, vc, slot_mapping)
            return self._call("extend_attention", q, kc, vc, table, cu, lens)
        return attn

    def _attn_decode(self, slot_mapping, table, lens):
        def attn(layer, q, k, v):
            kc, vc = self.caches[layer]
            self._call("store_kv", k, v, kc, vc, slot_mapping)
            return self._call("paged_decode", q, kc, vc, table, lens)
        return attn

    def _pick(self, r: Req, row: torch.Tensor) -> int:
        r.logits.append(row.detach().cpu())
        if self.forced is not None:
            return self.forced[r.rid][len(r.output)]
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + r.rid * 1009 + len(r.output))
        return sample(row, temperature=r.spec.temperature, generator=gen)

    def _dev(self, x):
        return torch.as_tensor(x).to(self.model.device)


def _table(rows: List[torch.Tensor]) -> torch.Tensor:
    """int32 [B, max_len] block table from per-request slot/block lists (0-padded, never read)."""
    t = torch.zeros((len(rows), max(1, max(len(r) for r in rows))), dtype=torch.int32)
    for i, r in enumerate(rows):
        t[i, :len(r)] = r.to(torch.int32)
    return t


class RadixEngine(_Engine):
    """Continuous batching over RadixCache + TokenPool (page_size 1)."""

    def __init__(self, model, *, backend, pool_size, max_batch, use_cache, forced, seed):
        from pagedattn.cache_mgmt.radix_cache import RadixCache
        from pagedattn.cache_mgmt.token_pool import TokenPool
        super().__init__(model, backend=backend, num_blocks=pool_size, block_size=1,
                         forced=forced, seed=seed)
        self.pool = TokenPool(pool_size)
        self.cache = RadixCache(self.pool, page_size=1) if use_cache else None
        self.max_batch = max_batch

    def run(self, specs: List[W.ReqSpec]) -> Dict[int, Req]:
        t0 = time.perf_counter()
        pending = {s.rid: Req(s) for s in specs}
        waiting, running, done, step = [], [], {}, 0
        while pending or waiting or running:
            ready = [r for r in pending.values() if r.spec.arrival <= step
                     and (r.spec.parent is None or r.spec.parent in done)]
            step += 1
            for r in ready:
                parent = done[r.spec.parent].history() if r.spec.parent is not None else []
                r.prompt = parent + list(r.spec.own)
                waiting.append(pending.pop(r.rid))
            batch = self._admit(waiting, running)
            if waiting and not batch and not running:
                raise RuntimeError(f"pool of {self.pool.size} slots cannot hold one request")
            if batch:
                self._prefill(batch)
                running += batch
            decoding = [r for r in running if len(r.output) < r.spec.max_new]
            if decoding:
                self._decode(decoding)
            if running:
                live = torch.unique(torch.cat([r.slots for r in running])).numel()
                self.stats.peak_kv = max(self.stats.peak_kv, live)
                self.stats.peak_running = max(self.stats.peak_running, len(running))
            for r in [r for r in running if len(r.output) >= r.spec.max_new]:
                self._finish(r)
                running.remove(r)
                done[r.rid] = r
        self.stats.reqs = len(done)
        self.stats.wall_s = time.perf_counter() - t0
        return done

    # --------------------------------------------------------------------- scheduler steps

    def _match(self, r: Req):
        # at least one prompt token is always computed: its logits start the generation
        return self.cache.match_prefix(r.prompt[:-1])

    def _reserve(self, n: int) -> bool:
        """Make n slots free, evicting unlocked cached prefixes (LRU leaves) if needed."""
        short = n - self.pool.available_size()
        if short > 0 and self.cache is not None and self.cache.evictable_size() > 0:
            k = min(short, self.cache.evictable_size())
            self.cache.evict(k)
            self.stats.evicted += k
        return self.pool.available_size() >= n

    def _admit(self, waiting: List[Req], running: List[Req]) -> List[Req]:
        if self.cache is not None:  # cache-aware order: longest cached prefix first
            waiting.sort(key=lambda r: -len(self._match(r).indices))
        batch = []
        while waiting and len(running) + len(batch) < self.max_batch:
            r = waiting[0]
            m = self._match(r) if self.cache is not None else None
            hit = len(m.indices) if m is not None else 0
            if m is not None:
                self.cache.inc_lock_ref(m.last_node)
            if not self._reserve(len(r.prompt) - hit + r.spec.max_new):
                if m is not None:
                    self.cache.dec_lock_ref(m.last_node)
                break
            new = self.pool.alloc(len(r.prompt) - hit)
            r.slots = torch.cat([m.indices.to(torch.int64).cpu(), new]) if hit else new
            r.matched, r.node = hit, (m.last_node if m is not None else None)
            batch.append(waiting.pop(0))
        return batch

    def _prefill(self, batch: List[Req]) -> None:
        toks, pos, slots, qlens = [], [], [], []
        for r in batch:
            toks += r.prompt[r.matched:]
            pos += range(r.matched, len(r.prompt))
            slots.append(r.slots[r.matched:])
            qlens.append(len(r.prompt) - r.matched)
            self.stats.prompt_tokens += len(r.prompt)
            self.stats.prefill_tokens += qlens[-1]
        cu = torch.zeros(len(batch) + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(torch.tensor(qlens), 0)
        lens = torch.tensor([len(r.prompt) for r in batch], dtype=torch.int32)
        table = _table([r.slots for r in batch])
        attn = self._attn_extend(self._dev(torch.cat(slots)), self._dev(table), self._dev(cu),
                                 self._dev(lens))
        logits = self.model.forward(torch.tensor(toks), torch.tensor(pos), attn,
                                    logit_rows=cu[1:].to(torch.int64) - 1)
        for r, row in zip(batch, logits):
            r.output.append(self._pick(r, row))
            if self.cache is not None:
                self._cache_req(r, r.prompt, finished=False)

    def _decode(self, batch: List[Req]) -> None:
        for r in batch:
            if not self._reserve(1):
                raise RuntimeError("KV pool exhausted during decode (no preemption in the replay)")
            r.slots = torch.cat([r.slots, self.pool.alloc(1)])
        toks = torch.tensor([r.output[-1] for r in batch])
        pos = torch.tensor([len(r.slots) - 1 for r in batch])
        lens = torch.tensor([len(r.slots) for r in batch], dtype=torch.int32)
        new = torch.stack([r.slots[-1] for r in batch])
        attn = self._attn_decode(self._dev(new), self._dev(_table([r.slots for r in batch])),
                                 self._dev(lens))
        for r, row in zip(batch, self.model.forward(toks, pos, attn)):
            r.output.append(self._pick(r, row))
        self.stats.decode_tokens += len(batch)

    def _finish(self, r: Req) -> None:
        if self.cache is None:
            self.pool.free(r.slots)
        else:
            self._cache_req(r, r.history()[:-1], finished=True)  # the last token has no KV
        r.slots = None

    def _cache_req(self, r: Req, tokens: List[int], *, finished: bool) -> None:
        """Hand the request's computed KV to the tree (SGLang cache_{un,}finished_req).

        r.slots (n = len(tokens) = len(r.slots) here):
          [0, r.matched)        the tree's own slots, locked through r.node
          [r.matched, n_tree)   duplicates: another request inserted these tokens first -> free
          [n_tree, n)           now owned by the tree (inserted by this call)
        Unfinished: re-match so r.slots[:n] become the tree's and the lock moves to the new node.
        """
        n = len(tokens)
        n_tree = self.cache.insert(tokens, r.slots[:n].clone())
        if n_tree > r.matched:
            self.pool.free(r.slots[r.matched:n_tree])
        old = r.node
        if finished:
            if old is not None:
                self.cache.dec_lock_ref(old)
            return
        m = self.cache.match_prefix(tokens)
        if len(m.indices) != n:
            raise RuntimeError(f"radix cache lost a just-inserted prefix ({len(m.indices)} != {n})")
        self.cache.inc_lock_ref(m.last_node)
        if old is not None:
            self.cache.dec_lock_ref(old)
        r.slots = torch.cat([m.indices.to(torch.int64).cpu(), r.slots[n:]])
        r.matched, r.node = n, m.last_node


class ForkEngine(_Engine):
    """Parallel sampling on a BlockManager: prefill once, fork n-1 times, copy-on-write."""

    layout = "bhsd"

    def __init__(self, model, *, backend, num_blocks, block_size, use_cache, forced, seed):
        from pagedattn.cache_mgmt.block_manager import BlockManager
        super().__init__(model, backend=backend, num_blocks=num_blocks, block_size=block_size,
                         forced=forced, seed=seed)
        self.bm, self.bs, self.share = BlockManager(num_blocks, block_size), block_size, use_cache
        self.num_blocks = num_blocks

    def _slots(self, table, seq_rows, positions) -> torch.Tensor:
        p = torch.as_tensor(positions, dtype=torch.int64)
        blk = table[torch.as_tensor(seq_rows), p // self.bs].to(torch.int64)
        return blk * self.bs + p % self.bs

    def _kv_in_use(self) -> int:
        return (self.num_blocks - self.bm.num_free_blocks - 1) * self.bs  # block 0: reserved null

    def run(self, specs: List[W.ReqSpec]) -> Dict[int, Req]:
        t0 = time.perf_counter()
        reqs = [Req(s, prompt=list(s.own)) for s in specs]
        # cache on: the first sample of each group prefills, the others fork from it
        heads = [r for r in reqs if not self.share or r.spec.parent is None]
        for r in heads:
            self.bm.allocate(r.rid, len(r.prompt))
        table, lens = self.bm.get_block_table([r.rid for r in heads])
        cu = torch.zeros(len(heads) + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(lens.to(torch.int64), 0)
        rows = [i for i, r in enumerate(heads) for _ in r.prompt]
        pos = [p for r in heads for p in range(len(r.prompt))]
        attn = self._attn_extend(self._dev(self._slots(table, rows, pos)), self._dev(table),
                                 self._dev(cu), self._dev(lens))
        logits = self.model.forward(torch.tensor([t for r in heads for t in r.prompt]),
                                    torch.tensor(pos), attn, logit_rows=cu[1:].to(torch.int64) - 1)
        first = {r.rid: row for r, row in zip(heads, logits)}
        for r in reqs:
            self.stats.prompt_tokens += len(r.prompt)
            if r.rid not in first:  # a forked sample: zero new blocks, refs + 1
                self.bm.fork(r.spec.parent, r.rid)
                first[r.rid] = first[r.spec.parent]
            else:
                self.stats.prefill_tokens += len(r.prompt)
        for r in reqs:
            r.output.append(self._pick(r, first[r.rid]))
        self.stats.peak_running = len(reqs)
        for _ in range(max(s.max_new for s in specs) - 1):
            live = [r for r in reqs if len(r.output) < r.spec.max_new]
            copies = [c for r in live for c in self.bm.append_slot(r.rid)]
            if copies:  # copy-on-write: the shared last block is copied before it is written
                ks, vs = [k for k, _ in self.caches], [v for _, v in self.caches]
                m = torch.tensor(copies, dtype=torch.int64, device=self.model.device)
                if "copy_blocks" not in self.used:
                    from pagedattn.bench.common import decision
                    self.used["copy_blocks"] = decision("copy_blocks", ks, vs, m,
                                                        backend=self.backend).backend
                pa.copy_blocks(ks, vs, m, backend=self.backend)
                self.stats.cow_copies += len(copies)
            table, lens = self.bm.get_block_table([r.rid for r in live])
            p = lens.to(torch.int64) - 1
            attn = self._attn_decode(self._dev(self._slots(table, range(len(live)), p)),
                                     self._dev(table), self._dev(lens))
            out = self.model.forward(torch.tensor([r.output[-1] for r in live]), p, attn)
            for r, row in zip(live, out):
                r.output.append(self._pick(r, row))
            self.stats.decode_tokens += len(live)
            self.stats.peak_kv = max(self.stats.peak_kv, self._kv_in_use())
        for r in reqs:
            self.bm.free(r.rid)
        self.stats.reqs = len(reqs)
        self.stats.wall_s = time.perf_counter() - t0
        return {r.rid: r for r in reqs}
