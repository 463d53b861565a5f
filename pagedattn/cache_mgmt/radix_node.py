"""Tree node, match result and key encoding of the radix prefix cache (radix_cache.py).

GC footprint: a TreeNode is the only garbage-collector-tracked object per cached edge. Its key is
`bytes`, its value a numpy array, its `children` a dict of bytes -> int (child nids): none of them
is tracked, and a node refers up to its parent object but down only by id, so a tree has no
reference cycles and is freed by reference counting.
"""
from __future__ import annotations

from array import array
from typing import NamedTuple

import numpy as np
import torch

__all__ = ["TreeNode", "MatchResult", "encode_tokens"]

_TB = 8  # bytes per token in a key (int64)
def encode_tokens(tokens) -> bytes:
    """Token ids -> the cache's key bytes (native int64). `bytes` input is taken as already encoded.

    Encoding a request once and passing the bytes saves the conversion on every call.
    """
    if isinstance(tokens, bytes):
        if len(tokens) % _TB:
            raise ValueError(f"tokens: bytes length {len(tokens)} is not a multiple of 8")
        return tokens
    if isinstance(tokens, np.ndarray):
        if tokens.size and tokens.dtype.kind not in "iu":
            raise TypeError(f"tokens: expected integer token ids, got dtype {tokens.dtype}")
        return np.ascontiguousarray(tokens, dtype=np.int64).tobytes()
    if isinstance(tokens, torch.Tensor):
        if tokens.dtype.is_floating_point:
            raise TypeError(f"tokens: expected integer token ids, got {tokens.dtype}")
        return tokens.detach().to("cpu", torch.int64).contiguous().numpy().tobytes()
    try:
        return array("q", tokens).tobytes()
    except TypeError as e:
        raise TypeError(f"tokens: expected a sequence of ints ({e})") from None


class TreeNode:
    """One edge of the tree. Opaque handle for callers; fields are read-only outside this module."""

    __slots__ = ("key", "value", "children", "parent", "lock_ref", "time", "hits", "nid",
                 "where", "tok", "bucket", "owner", "ns")

    def __init__(self, key: bytes, value, parent, time: int, nid: int, owner: int, ns):
        self.key = key              # bytes, int64 tokens; b"" for a root
        self.value = value          # np.ndarray int64, len(key) // 8 slots, owns its memory
        self.children = None        # dict[first-page bytes, child nid] or None for a leaf
        self.parent = parent        # None for a root and for a deleted node
        self.lock_ref = 0
        self.time = time            # cache clock at the last touch
        self.hits = 0               # matches through this node (LFU)
        self.nid = nid              # creation order; -1 for roots
        self.where = 0              # eviction-index membership (radix_evict.py)
        self.tok = 0
        self.bucket = 0
        self.owner = owner          # uid of the owning cache
        self.ns = ns                # extra_key namespace

    def __len__(self) -> int:
        return len(self.key) // _TB

    def __repr__(self) -> str:
        return f"TreeNode(nid={self.nid}, len={len(self)}, lock_ref={self.lock_ref})"


class MatchResult(NamedTuple):
    """indices: int64 tensor [prefix_len], a fresh copy of the cached slots of the prefix.
    last_node: the node ending the prefix (a root on a miss). The slots are only safe to use
    while `last_node` is locked (`inc_lock_ref`): an unlocked path may be evicted and its slots
    handed to another request."""
    indices: torch.Tensor
    last_node: TreeNode
