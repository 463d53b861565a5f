"""Key encoding, match result and node snapshot of the radix prefix cache (radix_cache.py).

Keys are `bytes` of native int64 tokens: comparing a run of tokens with a node's key is one
memcmp. `encode_tokens` converts once per request; a plain list goes through the C helper
(`_radix_native.c`, under 1 ns a token) or, without it, `struct.pack` (about 4 ns a token,
2.5x faster than `array('q', list)`), numpy arrays and tensors through their buffers. Values (a
node's slots) are `bytes` of int64 too: one object per value, joined in C and turned into a
tensor with one `torch.frombuffer` (`slots_tensor`).
"""
from __future__ import annotations

import itertools
from array import array
from typing import NamedTuple

import numpy as np
import torch

from . import native
from .int64_ids import PACK_ERRORS, int64_array, int64_bytes, pack_error, packer

__all__ = ["MatchResult", "NodeInfo", "encode_tokens", "encoder", "slots_tensor"]

_TB = 8  # bytes per token in a key (int64)
_NIDS = itertools.count(1)  # node ids, unique in the process: a foreign handle never resolves


def slots_tensor(vals: list) -> torch.Tensor:
    """The int64 tensor of the concatenated slot bytes `vals` (a fresh, writable copy)."""
    if not vals:
        return torch.empty(0, dtype=torch.int64)
    buf = bytearray(vals[0]) if len(vals) == 1 else bytearray().join(vals)
    if not buf:
        return torch.empty(0, dtype=torch.int64)
    return torch.frombuffer(buf, dtype=torch.int64)


def encoder(nat):
    """`encode_tokens` over the C module `nat` (lists and tuples), or the pure-Python one for
    None (`native.load()`)."""
    if nat is None:
        return encode_tokens_py
    enc = nat.encode

    def encode_tokens(tokens) -> bytes:
        t = type(tokens)
        if t is list or t is tuple:
            return enc(tokens)
        return encode_tokens_py(tokens)
    encode_tokens.__doc__ = encode_tokens_py.__doc__
    return encode_tokens


def encode_tokens_py(tokens) -> bytes:
    """Token ids -> the cache's key bytes (native int64). `bytes` is taken as already encoded.

    Parameters
    ----------
    tokens : list[int] | tuple[int] | array.array | numpy.ndarray | torch.Tensor | bytes
        Token ids; 1-D arrays and tensors of any integer dtype (tensors on any device, copied
        to the host), or bytes from an earlier call. `array('q')` is copied as it is. Every
        kind takes and refuses the same ids (int64_ids.py).

    Returns
    -------
    bytes
        ``8 * len(tokens)`` bytes. Equal token sequences give equal bytes whatever the input
        type.

    Raises
    ------
    TypeError
        Non-integer tokens: floats or strings in a sequence; an array or tensor whose dtype is
        not an integer one (bool, float, complex, object), even an empty one. A bool in a list
        is the int 0 or 1.
    ValueError
        A token outside int64 (2**63 .. 2**64 - 1 in a uint64 array or tensor too), an array
        or tensor that is not 1-D, or bytes whose length is not a multiple of 8.

    Examples
    --------
    >>> encode_tokens([1, 2]) == encode_tokens(np.array([1, 2], np.int32))
    True
    """
    t = type(tokens)
    if t is list or t is tuple:
        try:
            return packer(len(tokens))(*tokens)
        except PACK_ERRORS as e:
            raise pack_error(e, "tokens", "token") from None
    if t is bytes:
        if len(tokens) % _TB:
            raise ValueError(f"tokens: bytes length {len(tokens)} is not a multiple of 8")
        return tokens
    if t is array and tokens.typecode in "ql" and tokens.itemsize == _TB:
        return tokens.tobytes()                # newer SGLang schedulers hold array('q')
    if t is array or isinstance(tokens, (np.ndarray, torch.Tensor)):
        return int64_array(tokens, "tokens", "token").tobytes()
    return int64_bytes(tokens, "tokens", "token")     # other sequences: a list's rule


def encode_tokens(tokens) -> bytes:
    t = type(tokens)
    if t is list or t is tuple:
        nat = native.load()         # built on the first list, not when the package is imported
        if nat is not None:
            return nat.encode(tokens)
    return encode_tokens_py(tokens)


encode_tokens.__doc__ = encode_tokens_py.__doc__


class MatchResult(NamedTuple):
    """Result of `RadixCache.match_prefix`.

    indices: int64 tensor [prefix_len], a fresh copy of the cached slots of the prefix. Only
        safe to use while `last_node` is locked (`inc_lock_ref`): an unlocked path may be
        evicted and its slots handed to another request.
    last_node: int handle of the node ending the prefix (a namespace root on a miss).
    key: the whole query encoded (`encode_tokens`), reused by `insert(tokens, ..., start=m)`.
    source: the object passed as tokens (not copied); `insert` reuses `key` when it gets the
        same list, tuple or array.array again.
    root: the root of the namespace matched in.
    """
    indices: torch.Tensor
    last_node: int
    key: bytes = b""
    source: object = None
    root: int = 0


class NodeInfo(NamedTuple):
    """A snapshot of one node (`RadixCache.node`), for tests and debugging."""
    nid: int
    parent: int              # -1 for a namespace root
    tokens: tuple            # this edge's token run
    slots: tuple             # its pool slots
    children: tuple          # child ids, ascending (creation order)
    lock_ref: int            # live handles whose path contains the node
    own_locks: int           # live handles that end at the node
    time: int                # cache clock at the last touch
    hits: int                # matches through the node (counted under LFU)
    namespace: object        # extra_key of its tree
