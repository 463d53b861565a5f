"""Helpers shared by the dispatch tests (test_dispatch.py, test_dispatch_runs.py); not a test
module. ``_clean_dispatch`` is autouse: each test module imports it by name so it applies there."""
import pytest
import torch

import pagedattn as pa
from pagedattn import dispatch

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
ATTN_OPS = ["paged_decode", "extend_attention"]


@pytest.fixture(autouse=True)
def _clean_dispatch(monkeypatch):
    """Every test starts with empty decision/arch caches and no override in the environment."""
    for var in ("PAGEDATTN_BACKEND", "PAGEDATTN_PARTITION_SIZE"):
        monkeypatch.delenv(var, raising=False)
    dispatch.cache_clear()
    yield
    dispatch.cache_clear()


def _decode_args(dtype=torch.float32, d=64, hq=4, hkv=2, bs=16, layout="bhsd"):
    k, v = pa.make_kv_cache(6, bs, hkv, d, layout=layout, dtype=dtype)
    k.normal_(), v.normal_()
    q = torch.randn(2, hq, d, dtype=dtype)
    table = torch.tensor([[3, 1], [5, 2]], dtype=torch.int32)
    return q, k, v, table, torch.tensor([20, 7], dtype=torch.int32)
