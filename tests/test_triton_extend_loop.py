"""The extend kernel's one-pass key loop (``pagedattn/triton_kernels/_extend_loop.py``) and the
two-stage fallback against the float64 oracle, on the CPU under the interpreter."""
import pytest
import torch

from attn_utils import FP8
from test_triton_extend import run_case

# Interpreter tiles are 16 x 16: page 1 (16 ids per tile), 4 (page < tile), 16 (= tile) and
# 32 (a tile is half a page: start % PAGE != 0). Prefixes off the page and tile grid.
_OPT_GEN = torch.Generator().manual_seed(3)  # the options' draws: the same every run
LOOP_CASES = [
    dict(layout="bhsd", dtype=torch.float16, heads=(8, 2), bs=4, prefixes=[21, 0, 7],
         extends=[9, 20, 1]),
    dict(layout="vllm", dtype=torch.float32, heads=(5, 1), bs=16, prefixes=[35, 3],
         extends=[18, 2]),
    dict(layout="hcu", dtype=torch.float16, heads=(4, 4), bs=1, prefixes=[17, 0],
         extends=[5, 19], causal=False),
    dict(layout="bshd", dtype=torch.float32, heads=(8, 2), bs=32, d=80, prefixes=[40, 0],
         extends=[7, 3], opts={"logit_cap": 5.0,
                               "alibi_slopes": torch.rand(8, generator=_OPT_GEN) * 0.5,
                               "sinks": torch.randn(8, generator=_OPT_GEN)}),
    dict(layout="bhsd", dtype=torch.float16, kv_dtype=FP8[0], heads=(8, 2), bs=4,
         prefixes=[9, 0], extends=[5, 7]),
]


@pytest.mark.parametrize("case", range(len(LOOP_CASES)))
def test_extend_one_pass_loop(device, case):
    from pagedattn.triton_kernels import _extend_loop as V
    c = LOOP_CASES[case]
    assert V.serves(has_mask=False, has_window=False, page=c["bs"]), \
        "the one-pass loop must actually run for this case"
    run_case(device, seed=30 + case, **c)


@pytest.mark.parametrize("case", [0, 3, 4])
def test_extend_one_pass_loop_with_k_new(device, case):
    """k_new/v_new calls run the one-pass loop over the cached prefix, then the new-key stage."""
    run_case(device, seed=50 + case, new_from="k_new", **LOOP_CASES[case])


@pytest.mark.parametrize("case", [0, 1, 3])
def test_extend_masked_tiles_narrower_than_unmasked(device, monkeypatch, case):
    """Masked (diagonal) tiles of half the unmasked tile's keys (as on sm_90): 32-key unmasked
    tiles, 16-key masked ones, so the masked range starts mid-tile, and with page 4 and 16 a
    masked tile holds several pages or part of one."""
    from pagedattn.triton_kernels import _extend_configs as C
    cfg = C.TileConfig(32, 32, 4, 1, block_nm=16)
    monkeypatch.setitem(C._DEFAULTS, "interp", {256: cfg})
    assert C.masked_tile(cfg) == 16
    run_case(device, seed=70 + case, **LOOP_CASES[case])


def test_extend_masked_tile_rule():
    """The masked tile: the config's block_nm, else block_n, never more than block_n."""
    from pagedattn.triton_kernels import _extend_configs as C
    cfg = C.TileConfig(128, 64, 8, 3)
    assert C.masked_tile(cfg) == 64
    assert C.masked_tile(cfg._replace(block_nm=32)) == 32
    assert C.masked_tile(cfg._replace(block_nm=128)) == 64


def test_extend_two_stage_fallback(device):
    """A window, a custom mask or a page that is not a power of 2 run the two-stage loop."""
    from pagedattn.triton_kernels import _extend_loop as V
    assert not V.serves(has_mask=False, has_window=True, page=16)
    assert not V.serves(has_mask=True, has_window=False, page=16)
    assert not V.serves(has_mask=False, has_window=False, page=12)
    assert V.serves(has_mask=False, has_window=False, page=16)
    run_case(device, layout="bshd", dtype=torch.float32, heads=(8, 2), bs=4, prefixes=[6, 0],
             extends=[5, 9], new_from="k_new", opts={"sliding_window": 4}, seed=40)
