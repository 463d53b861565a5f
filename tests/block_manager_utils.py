"""Helpers shared by the block manager tests (test_block_manager.py,
test_block_manager_model.py); not a test module."""


def flat_prefix(key):
    """The token prefix spelled by a nested registry key ``(parent_key, tokens)``."""
    parts = []
    while key is not None:
        key, toks = key
        parts.append(toks)
    return tuple(t for p in reversed(parts) for t in p)
