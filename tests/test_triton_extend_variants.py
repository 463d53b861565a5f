"""The extend kernel's A/B loop variants (PAGEDATTN_EXTEND_VARIANT;
``pagedattn/triton_kernels/_extend_variants.py``) and its tuning knobs against the float64 oracle,
on the CPU under the interpreter. Split from test_triton_extend.py (file size)."""
import pytest
import torch

from attn_utils import FP8
from test_triton_extend import run_case


VARIANT_NAMES = ["twostage", "onepass", "pages", "pipe", "pipe_fma", "early"]
# Interpreter tiles are 16 x 16: page 1 (16 ids per tile), 4 (page < tile), 16 (= tile) and
# 32 (a tile is half a page: start % PAGE != 0). Prefixes off the page and tile grid.
_OPT_GEN = torch.Generator().manual_seed(3)  # the options' draws: the same every run
VARIANT_CASES = [
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


@pytest.mark.parametrize("variant", VARIANT_NAMES)
@pytest.mark.parametrize("case", range(len(VARIANT_CASES)))
def test_extend_variant(device, monkeypatch, variant, case):
    from pagedattn.triton_kernels import _extend_variants as V
    monkeypatch.setenv(V.ENV, variant)
    c = VARIANT_CASES[case]
    assert V.resolve(has_mask=False, has_window=False, page=c["bs"]) \
        == V.VARIANTS[variant], "the variant must actually run for this case"
    monkeypatch.delenv(V.ENV)
    assert V.requested() == V.DEFAULT == "gluon"  # unset: the measured winner (sm_90)
    assert V.resolve(has_mask=False, has_window=False, page=4) == V.VARIANTS["early"]
    monkeypatch.setenv(V.ENV, variant)
    run_case(device, seed=30 + case, **c)


@pytest.mark.parametrize("variant", VARIANT_NAMES[1:])
@pytest.mark.parametrize("case", [0, 3, 4])
def test_extend_variant_prefix_pass_with_k_new(device, monkeypatch, variant, case):
    """k_new/v_new calls run a variant's loop over the cached prefix, then the new-key stage;
    unset, the default variant."""
    from pagedattn.triton_kernels import _extend_variants as V
    monkeypatch.delenv(V.ENV, raising=False)
    assert V.resolve(has_mask=False, has_window=False, page=4) \
        == V.VARIANTS[V.TRITON_DEFAULT]
    monkeypatch.setenv(V.ENV, variant)
    c = VARIANT_CASES[case]
    assert V.resolve(has_mask=False, has_window=False, page=c["bs"]) \
        == V.VARIANTS[variant], "the variant must actually run for this case"
    run_case(device, seed=50 + case, new_from="k_new", **c)


@pytest.mark.parametrize("variant", ["pipe_fma", "early"])
@pytest.mark.parametrize("case", [0, 1, 3])
def test_extend_masked_tiles_narrower_than_unmasked(device, monkeypatch, variant, case):
    """Masked (diagonal) tiles of half the unmasked tile's keys (PAGEDATTN_EXTEND_MASKED_N):
    32-key unmasked tiles, 16-key masked ones, so the masked range starts mid-tile, and with
    page 4 and 16 a masked tile holds several pages or part of one."""
    from pagedattn.triton_kernels import _extend_configs as C
    from pagedattn.triton_kernels import _extend_variants as V
    monkeypatch.setenv(V.ENV, variant)
    monkeypatch.setenv("PAGEDATTN_EXTEND_CONFIG", "32,32,4,1")
    monkeypatch.setenv("PAGEDATTN_EXTEND_MASKED_N", "16")
    assert C.masked_tile(C.config_override()) == 16
    c = VARIANT_CASES[case]
    run_case(device, seed=70 + case, **c)


def test_extend_masked_tile_knob(monkeypatch):
    """PAGEDATTN_EXTEND_MASKED_N: a power of 2 >= 16, capped at the unmasked tile; junk raises."""
    from pagedattn.triton_kernels import _extend_configs as C
    cfg = C.TileConfig(128, 64, 8, 3)
    monkeypatch.delenv("PAGEDATTN_EXTEND_MASKED_N", raising=False)
    assert C.masked_tile(cfg) == 64
    assert C.masked_tile(cfg._replace(block_nm=32)) == 32
    monkeypatch.setenv("PAGEDATTN_EXTEND_MASKED_N", "128")
    assert C.masked_tile(cfg) == 64
    for bad in ("8", "48", "x", "-16"):
        monkeypatch.setenv("PAGEDATTN_EXTEND_MASKED_N", bad)
        with pytest.raises(ValueError, match="PAGEDATTN_EXTEND_MASKED_N"):
            C.masked_tile(cfg)


def test_extend_config_knob(monkeypatch):
    """PAGEDATTN_EXTEND_CONFIG: whole tile configs pass; junk raises before any launch."""
    from pagedattn.triton_kernels import _extend_configs as C
    monkeypatch.delenv("PAGEDATTN_EXTEND_CONFIG", raising=False)
    assert C.config_override() is None
    monkeypatch.setenv("PAGEDATTN_EXTEND_CONFIG", "128,128,8,2,0,0,64")
    assert C.config_override() == C.TileConfig(128, 128, 8, 2, block_nm=64)
    for bad in ("48,64,4,2", "64,8,4,2", "64,64,3,2", "64,64,4,0", "64,64,4", "64,64,4,2,0,0,24",
                "64,64,4,2,-1", "x", "64,64,4,2,0,0,64,1"):
        monkeypatch.setenv("PAGEDATTN_EXTEND_CONFIG", bad)
        with pytest.raises(ValueError, match="PAGEDATTN_EXTEND_CONFIG"):
            C.config_override()


def test_extend_maxnreg_knob(monkeypatch):
    """PAGEDATTN_EXTEND_MAXNREG: validated before any launch; never passed to the interpreter."""
    from pagedattn.triton_kernels import _extend_configs as C
    cpu = torch.device("cpu")
    monkeypatch.delenv("PAGEDATTN_EXTEND_MAXNREG", raising=False)
    assert C.maxnreg_override(cpu) == {}
    monkeypatch.setenv("PAGEDATTN_EXTEND_MAXNREG", "128")
    assert C.maxnreg_override(cpu) == {}
    for bad in ("0", "256", "x", "-1"):
        monkeypatch.setenv("PAGEDATTN_EXTEND_MAXNREG", bad)
        with pytest.raises(ValueError, match="PAGEDATTN_EXTEND_MAXNREG"):
            C.maxnreg_override(cpu)


def test_extend_variant_falls_back_and_rejects_unknown(device, monkeypatch):
    """A window, a custom mask or a page that is not a power of 2 run the two-stage loop, and so
    does ``twostage`` by name; an unknown name is an error."""
    from pagedattn.triton_kernels import _extend_variants as V
    monkeypatch.setenv(V.ENV, "twostage")
    assert V.resolve(has_mask=False, has_window=False, page=16) == 0
    monkeypatch.setenv(V.ENV, "pipe_fma")
    assert V.resolve(has_mask=False, has_window=True, page=16) == 0
    assert V.resolve(has_mask=True, has_window=False, page=16) == 0
    assert V.resolve(has_mask=False, has_window=False, page=12) == 0
    assert V.resolve(has_mask=False, has_window=False, page=16) == V.VARIANTS["pipe_fma"]
    run_case(device, layout="bshd", dtype=torch.float32, heads=(8, 2), bs=4, prefixes=[6, 0],
             extends=[5, 9], new_from="k_new", opts={"sliding_window": 4}, seed=40)
    monkeypatch.setenv(V.ENV, "nope")
    with pytest.raises(ValueError, match="PAGEDATTN_EXTEND_VARIANT"):
        V.requested()
