"""Token ids and slot ids as int64: one rule for every input kind of the radix cache (its keys,
radix_node.py) and of its token pools (slots, token_pool.py).

A list, a tuple, an `array.array`, a numpy array and a tensor (any integer dtype) take the same
ids and refuse the same ones, with the same exception, its message naming the argument:

* an integer outside int64 -> ValueError. A uint64 array or tensor holds such ids too, so its
  values are checked before the cast: a plain cast would wrap 2**63 .. 2**64 - 1 onto negative
  ids (2**64 - 1 onto -1), which a key would then match and a slot check would misname;
* an array or tensor that is not 1-D -> ValueError (never flattened);
* a non-integer -> TypeError. An array or tensor is judged by its dtype, so an empty float or
  bool one is refused as well; an element of a list by `__index__`, so a Python bool in a list
  is the int 0 or 1 (as `struct` and the C helper `encode` take it) and a float is refused.

The C helper `encode` (_radix_native.c) applies the same rule to lists and tuples of tokens;
tests/test_radix_checks.py runs every kind on both paths.
"""
from __future__ import annotations

import struct
from array import array

import numpy as np
import torch

__all__ = ["PACK_ERRORS", "int64_array", "int64_bytes", "pack_error", "packer"]

_PACKERS: dict = {}          # id count -> bound Struct.pack (no format parsing per call)
_INT_TYPECODES = "bBhHiIlLqQ"
_I64_MAX = np.uint64(2**63 - 1)
PACK_ERRORS = (struct.error, TypeError)   # what `packer` raises for ids it refuses


def packer(n: int):
    """`struct.Struct(f"{n}q").pack`, cached per length."""
    p = _PACKERS.get(n)
    if p is None:
        if len(_PACKERS) >= 4096:        # bounded: request lengths vary without limit
            _PACKERS.clear()
        p = _PACKERS[n] = struct.Struct(f"{n}q").pack
    return p


def pack_error(e: Exception, name: str, what: str) -> Exception:
    """The error for a sequence that `packer` refused with `e`: ValueError for an int outside
    int64, TypeError for anything else (a non-integer element, a non-sequence)."""
    if isinstance(e, struct.error) and "out of range" in str(e):
        return ValueError(f"{name}: expected int64 {what} ids ({e})")
    return TypeError(f"{name}: expected int64 {what} ids ({e})")


def int64_bytes(seq, name: str, what: str) -> bytes:
    """Native int64 bytes of the ids in the sequence `seq` (list, tuple, range, ...), one per
    element; `name` is the argument and `what` the kind of id ("token", "slot") in errors."""
    try:
        return packer(len(seq))(*seq)
    except PACK_ERRORS as e:
        raise pack_error(e, name, what) from None


def int64_array(a, name: str, what: str) -> np.ndarray:
    """A 1-D int64 numpy array of the numpy array, tensor (copied to the host) or `array.array`
    `a`: a view when `a` already is one (not writable then), else a copy."""
    if isinstance(a, torch.Tensor):
        if a.dtype.is_floating_point or a.dtype.is_complex or a.dtype == torch.bool:
            raise TypeError(f"{name}: expected integer {what} ids, got {a.dtype}")
        try:
            a = a.detach().cpu().numpy()    # every integer dtype converts, uint64 included
        except TypeError:                   # quantized dtypes
            raise TypeError(f"{name}: expected integer {what} ids, got {a.dtype}") from None
    elif type(a) is array:
        if a.typecode not in _INT_TYPECODES:
            raise TypeError(f"{name}: expected integer {what} ids, got array('{a.typecode}')")
        a = np.asarray(a)                   # the buffer's own dtype: 'Q' stays uint64
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integer {what} ids, got dtype {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array of {what} ids, got shape {a.shape}")
    if a.dtype.kind == "u" and a.dtype.itemsize == 8 and a.size:
        over = a > _I64_MAX
        if over.any():
            i = int(over.argmax())
            raise ValueError(f"{name}: expected int64 {what} ids ({what} {i} is out of "
                             f"range: {int(a[i])})")
    return a if a.dtype == np.int64 else a.astype(np.int64)
