"""Environment reads on the per-call path (keys of remembered launches and backend choices).

``os.environ.get`` encodes the name and decodes the value on every read: ~1.5 us on the H200
host, and an eager decode call read 16 knobs (session 13). On CPython/POSIX ``os.environ`` keeps
its bytes in ``os.environ._data``, updated by every ``os.environ[...] = ...`` (monkeypatch.setenv
included), so a lookup by a pre-encoded name sees the same values for ~0.05 us. Elsewhere this
falls back to ``os.environ.get``.
"""
import os

_DATA = os.environ.__dict__.get("_data")
if os.name != "posix" or not isinstance(_DATA, dict):
    _DATA = None


def names(*env_names) -> tuple:
    """The names in the form :func:`values` takes."""
    return tuple(n.encode() for n in env_names) if _DATA is not None else env_names


def values(encoded_names) -> tuple:
    """The raw values (None when unset; bytes on POSIX) of names prepared by :func:`names`: for
    comparing, never for parsing."""
    if _DATA is not None:
        return tuple(map(_DATA.get, encoded_names))
    return tuple(map(os.environ.get, encoded_names))
