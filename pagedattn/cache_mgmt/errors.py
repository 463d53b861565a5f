"""Typed errors of the cache managers. Every failed operation leaves the state unchanged."""


class CacheError(Exception):
    """Base class of cache-manager errors."""


class OutOfBlocks(CacheError):
    """Not enough free blocks/slots for the request (state rolled back)."""


class DoubleFree(CacheError, ValueError):
    """A block or slot freed that is already free."""


class ForeignId(CacheError, ValueError):
    """An id out of range, reserved, or unknown to this manager (block, slot or sequence)."""


class LockError(CacheError, ValueError):
    """Unlock of an unlocked node, or a lock on a node not in the tree."""
