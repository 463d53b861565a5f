"""CPU-side KV-cache managers: block allocator/manager, token pools, radix prefix cache.

Every manager keeps its state consistent on failure (typed errors in ``errors``) and offers a
``check_integrity()`` that walks the whole structure.
"""
from pagedattn.cache_mgmt.block_hash_cache import BlockHashCache, BlockMatch
from pagedattn.cache_mgmt.block_manager import (AllocResult, AllocStatus, BlockAllocator,
                                                BlockManager, BlockTables)
from pagedattn.cache_mgmt.errors import (CacheError, DoubleFree, ForeignId, LockError,
                                         OutOfBlocks)
from pagedattn.cache_mgmt.radix_cache import MatchResult, NodeInfo, RadixCache, encode_tokens
from pagedattn.cache_mgmt.radix_lifecycle import (Req, admit_req, cache_finished_req,
                                                  cache_unfinished_req, extend_req, owned_slots,
                                                  release_pending, schedule_order)
from pagedattn.cache_mgmt.token_pool import PagedTokenPool, TokenPool

__all__ = [
    "AllocResult", "AllocStatus", "BlockAllocator", "BlockManager", "BlockTables",
    "BlockHashCache", "BlockMatch", "CacheError", "DoubleFree", "ForeignId", "LockError",
    "OutOfBlocks", "MatchResult", "NodeInfo", "RadixCache", "encode_tokens", "PagedTokenPool",
    "TokenPool", "Req",
    "admit_req", "cache_finished_req", "cache_unfinished_req", "extend_req", "owned_slots",
    "release_pending", "schedule_order",
]
