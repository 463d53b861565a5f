"""RadixCache.insert (radix_cache.py): key reuse, the checks, then the changes.

Order of work, so that a failed call changes nothing:

    1. key        the match's encoding when `tokens` is the very list (tuple, array) it was
                  made from
    2. checks     slot count; `start` (its prefix is a prefix of tokens, same namespace);
                  the read-only walk; the new slots it leaves to add (owned by the caller:
                  handed out by the pool, not in the tree, each once, whole pages). The C
                  helper `claim` checks them and marks them CACHED in one pass, last.
    3. changes    touch the path, split where the walk ends inside a node, add the leaf

Regions of `tokens` (E = end of the cached part, N = page-aligned length)::

    [0, start)  the start node's path          -> touched
    [start, E)  cached further down             -> touched (a node cut at E: both halves)
    [E, N)      new                             -> one new leaf holding indices[E:N] (copied)
    [N, end)    partial last page               -> not cached
"""
from __future__ import annotations

from array import array

import numpy as np
import torch

from .errors import CacheError, ForeignId
from .radix_node import _NIDS, _TB, MatchResult
from .token_pool import CACHED, FREE, as_slot_array, out_of_range

__all__ = ["insert_tokens"]

try:   # NOTE: np.count_nonzero's Python-level dispatch costs 4x its C work on a few slots
    from numpy._core.multiarray import count_nonzero as _nonzero
except ImportError:  # pragma: no cover - other numpy layouts
    _nonzero = np.count_nonzero
_REUSABLE = (list, tuple, array)   # sequences whose encoding a match result carries
_I64 = np.dtype(np.int64)


def insert_tokens(c, tokens, indices, extra_key, start):
    """RadixCache.insert on cache `c`; returns (already cached tokens, the node ending the
    cached path (the new leaf if one was added), values (slot bytes) of the nodes walked
    after `start`)."""
    t, reused = type(tokens), False
    if type(start) is MatchResult and tokens is start.source and t in _REUSABLE \
            and len(tokens) >= len(start.key) >> 3:
        key, have, reused = start.key, len(start.key) >> 3, True
        if len(tokens) > have:                 # appended to since the match
            key = key + c._encode(tokens[have:])
    else:
        key = c._encode(tokens)
    pb, n = c._pb, len(key)
    if pb != _TB:
        n -= n % pb
    idx = None
    if type(indices) is torch.Tensor:
        try:
            idx = indices.numpy()              # CPU only; integer tensors never require grad
        except (TypeError, RuntimeError):
            pass
    if idx is None or idx.dtype is not _I64 or idx.ndim != 1:
        idx = as_slot_array(indices, "indices")
    if idx.size * _TB < n:
        raise ValueError(f"indices: {idx.size} slots for {n // _TB} tokens to cache")
    try:
        root = c._roots.get(extra_key)         # None: a namespace without a tree yet
    except TypeError:
        raise TypeError(f"extra_key: must be hashable, got {type(extra_key).__name__}") \
            from None
    node, pos = root, 0
    if start is not None:
        node, pos = _resume(c, start, key, n, extra_key, root, reused)
    top = node
    path, cut, m = [], 0, 0
    if root is not None:
        path, node, pos, cut, m = c._find(node, key, pos, n)
    end = pos + m
    new = None
    claim = c._claim
    if end < n:
        new = idx[end >> 3:n >> 3]
        vb = new.tobytes()                     # the leaf's value
        if claim is None:
            heads = _check_new_slots(c, new)
        elif claim(c.pool._state_buf, vb, c.page_size):      # marks the pages CACHED on 0
            _check_new_slots(c, new)                         # names the error
            raise CacheError("insert: the C and Python slot checks disagree")
    # Checks done: from here on nothing raises.
    if root is None:
        node = top = root = c._root(extra_key)
    c._clock = clock = c._clock + 1
    time, loc, index, valt = c._time, c._index.loc, c._index, c._val
    if top != root:                            # resumed below the root: touch the path above
        x = top
        while x >= 0:
            time[x] = clock
            x = c._par[x]
        if top in loc:
            index.touch(top)
    vals = []
    for x in path:
        time[x] = clock
        if x in loc:
            index.touch(x)
        vals.append(valt[x])
    if cut:
        node = c._split(cut, m)                # stamps both halves
        vals.append(valt[node])
    if new is None:
        return n >> 3, node, vals
    leaf = next(_NIDS)
    c._key[leaf], valt[leaf], c._par[leaf] = key[end:n], vb, node
    if claim is None:
        c.pool._state[heads] = CACHED
    c._lock[leaf], time[leaf] = 0, clock
    kids, first = c._kids.get(node), key[end:end + pb]
    c._first[leaf] = first
    if kids is None:
        c._kids[node] = {first: leaf}
        if node in loc:                        # node was an evictable leaf
            index.remove(node)
    else:
        kids[first] = leaf
    c._evictable += len(new)
    index.add(leaf)
    return end >> 3, leaf, vals


def _resume(c, start, key: bytes, n: int, extra_key, root, reused: bool):
    """(node, key position) where the walk may start, from `start`; ValueError when its prefix
    is not a prefix of `key[:n]` in `extra_key` (`reused`: `key` extends the match's own key).
    A start node evicted since (or unknown) gives the root: resuming is only a shortcut."""
    if type(start) is MatchResult and start.key:
        snode, end, skey = start.last_node, start.indices.shape[0] * _TB, start.key
        if end > n or not (reused or key.startswith(skey if len(skey) == end else skey[:end])):
            raise ValueError(f"start: the match's {end // _TB}-token prefix is not a prefix of "
                             f"the {n // _TB} page-aligned tokens")
        if snode not in c._par:
            return root, 0
        if start.root != root or root is None:
            raise ValueError(f"start: a match in another namespace than extra_key={extra_key!r}")
        return snode, end                      # a match's node ends at its prefix, always
    if type(start) is MatchResult:             # built by hand, without the key: verify
        snode, end = start.last_node, start.indices.shape[0] * _TB
    else:
        try:
            snode, plen = start
            end = int(plen) * _TB
        except (TypeError, ValueError):
            raise TypeError(f"start: expected a MatchResult or (node, prefix_len), got "
                            f"{start!r}") from None
    try:
        if snode not in c._par:
            return root, 0
    except TypeError:
        raise TypeError(f"start: node handle {snode!r} is not an int") from None
    if end > n:
        raise ValueError(f"start: prefix of {end // _TB} tokens is longer than the "
                         f"{n // _TB} page-aligned tokens")
    par, keys, x, pos = c._par, c._key, snode, end
    while par[x] >= 0:                         # compare the node's path with key[:end]
        k = keys[x]
        st = pos - len(k)
        if st < 0 or key[st:pos] != k:
            raise ValueError(f"start: node {snode}'s path is not a prefix of tokens")
        pos, x = st, par[x]
    if pos:
        raise ValueError(f"start: prefix_len {end // _TB} != node {snode}'s path length")
    if x != root:
        raise ValueError(f"start: node {snode} is in namespace {c._ns[x]!r}, not "
                         f"extra_key={extra_key!r}")
    return snode, end


def _check_new_slots(c, new: np.ndarray):
    """The first slot of each page of `new` after checking that the caller owns all of them:
    whole pages (ValueError), in range, each listed once, handed out by the pool and not in
    the tree (ForeignId). A page's first slot stands for the page in the masks: the pool hands
    out and takes back whole pages, and the tree holds whole pages.

    NOTE: each numpy call costs a quarter to half a microsecond whatever the size, so a few
    dozen pages are checked in Python (set, min, max) instead of sorted with numpy, and scalar
    operands are 0-d arrays (a Python int operand costs a conversion per call).
    """
    pool, ps = c.pool, c.page_size
    heads, masked = new, False
    if ps > 1:
        # Whole pages in order: new[r*ps + j] == p_r*ps + j, i.e. x = new - (0..ps-1 tiled)
        # repeats each page's start p_r*ps, a non-negative multiple of ps, ps times. A power
        # of two rounds down with a mask that also clears the sign bit: a negative or huge slot
        # fails the compare and is told apart there.
        if c._tiled.size < new.size:
            c._tiled = np.tile(c._offs, 2 * new.size // ps)
        x = new - c._tiled[:new.size]
        heads = x[::ps]
        masked = ps & (ps - 1) == 0
        heads = heads & c._pmask if masked else heads - heads % c._ps0
        if x.tobytes() != heads.repeat(ps).tobytes():
            _not_whole_pages(new, pool.size, ps)
    if heads.size <= 32:
        hl = heads.tolist()
        neg, twice = not masked and min(hl) < 0, len(set(hl)) < len(hl)
    else:
        srt = heads.copy()                     # (np.sort adds a Python-level wrapper)
        srt.sort()
        neg, twice = srt[0] < 0, bool(_nonzero(srt[1:] == srt[:-1]))
    try:                                       # take raises for a slot >= pool.size
        if neg:
            raise IndexError
        st = pool._state.take(heads)
    except IndexError:
        raise ForeignId(f"indices: slot out of range [0, {pool.size}): min {heads.min()}, "
                        f"max {heads.max()}") from None
    if twice:
        raise ForeignId(f"indices: slots {_dups(heads)} are given twice")
    _check_states(heads, st)
    return heads


def _check_states(heads: np.ndarray, st: np.ndarray) -> None:
    """ForeignId unless every state `st` of `heads` is HELD (0).

    NOTE: pool._state is the pool's per-slot state (token_pool.py, same package): the caller's
    slots are HELD; FREE and CACHED are not the caller's to give."""
    if _nonzero(st):
        bad = heads[st == FREE][:8].tolist()
        if bad:
            raise ForeignId(f"indices: slots {bad} are free in the pool (never handed out, or "
                            f"freed)")
        raise ForeignId(f"indices: slots {heads[st != 0][:8].tolist()} are already cached "
                        f"(under another key)")


def _not_whole_pages(new: np.ndarray, size: int, ps: int):
    """Raise for new slots that failed the page check: ForeignId when some are out of range,
    else ValueError."""
    if out_of_range(new, size):
        raise ForeignId(f"indices: slot out of range [0, {size}): min {new.min()}, max "
                        f"{new.max()}")
    raise ValueError(f"indices: new slots are not whole pages of {ps} (each page p * {ps} .. "
                     f"p * {ps} + {ps - 1}, in order)")


def _dups(a: np.ndarray) -> list:
    srt = np.sort(a)
    return srt[1:][srt[1:] == srt[:-1]][:8].tolist()
