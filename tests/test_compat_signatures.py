"""The compat entry points have the peers' signatures, and docs/compat.md a row per argument.

Peer signatures are parsed with ast from the pinned released wheels (tests/compat_peers.py);
ours are parsed the same way from our source, so names, kinds (positional, ``*args``,
keyword-only), order and default expressions are compared as written.
"""
import doctest
import os
import re

import pytest

from compat_peers import PINS, PeerUnavailable, our_signature, peer_signature
from pagedattn.compat import _flashinfer_prefill
from pagedattn.compat import flashinfer as F
from pagedattn.compat import sglang as S
from pagedattn.compat import vllm as VL

DEC, PRE = "BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper"
SGL = "sglang/kernels/ops/attention/"
# docs entry -> (ours, peer key, file in the wheel, qualified name there)
ENTRIES = {
    f"flashinfer.{DEC}.__init__": (F.BatchDecodeWithPagedKVCacheWrapper.__init__, "flashinfer",
                                   "flashinfer/decode.py", f"{DEC}.__init__"),
    f"flashinfer.{DEC}.plan": (F.BatchDecodeWithPagedKVCacheWrapper.plan, "flashinfer",
                               "flashinfer/decode.py", f"{DEC}.plan"),
    f"flashinfer.{DEC}.run": (F.BatchDecodeWithPagedKVCacheWrapper.run, "flashinfer",
                              "flashinfer/decode.py", f"{DEC}.run"),
    f"flashinfer.{PRE}.__init__": (F.BatchPrefillWithPagedKVCacheWrapper.__init__, "flashinfer",
                                   "flashinfer/prefill.py", f"{PRE}.__init__"),
    f"flashinfer.{PRE}.plan": (F.BatchPrefillWithPagedKVCacheWrapper.plan, "flashinfer",
                               "flashinfer/prefill.py", f"{PRE}.plan"),
    f"flashinfer.{PRE}.run": (F.BatchPrefillWithPagedKVCacheWrapper.run, "flashinfer",
                              "flashinfer/prefill.py", f"{PRE}.run"),
    "sglang.decode_attention_fwd": (S.decode_attention_fwd, "sglang",
                                    SGL + "decode_attention.py", "decode_attention_fwd"),
    "sglang.extend_attention_fwd": (S.extend_attention_fwd, "sglang",
                                    SGL + "extend_attention.py", "extend_attention_fwd"),
    "vllm.unified_attention": (VL.unified_attention, "vllm",
                               "vllm/v1/attention/ops/triton_unified_attention.py",
                               "unified_attention"),
    "vllm.paged_attention_v1": (VL.paged_attention_v1, "vllm_legacy", "vllm/_custom_ops.py",
                                "paged_attention_v1"),
    "vllm.paged_attention_v2": (VL.paged_attention_v2, "vllm_legacy", "vllm/_custom_ops.py",
                                "paged_attention_v2"),
}
DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "compat.md")
STATUSES = ("honoured", "unused", "raises", "honoured; raises", "unused; raises")


def test_pinned_versions_are_the_modules_versions():
    assert (F.PEER, F.PEER_VERSION) == PINS["flashinfer"]
    assert (S.PEER, S.PEER_VERSION) == PINS["sglang"]
    assert (VL.PEER, VL.PEER_VERSION) == PINS["vllm"]
    assert VL.LEGACY_PEER_VERSION == PINS["vllm_legacy"][1]
    for mod in (F, S, VL):  # and the module docstrings name them
        assert PINS[mod.PEER if mod is not F else "flashinfer"][1] in mod.__doc__


def _peer(key, member, qualname):
    try:
        sig = peer_signature(key, member, qualname)
        if qualname == f"{DEC}.plan":
            # FlashInfer's decode plan takes its options as **kwargs, deprecated positionals as
            # *args, and hands them to _plan_impl: its keyword-only parameters are the options
            impl = peer_signature(key, member, f"{DEC}._plan_impl")
            sig = [p for p in sig if not p[1].startswith("VAR_")] + \
                [p for p in impl if p[1] == "KEYWORD_ONLY"]
        return sig
    except PeerUnavailable as e:
        pytest.skip(f"{PINS[key][0]}=={PINS[key][1]} unavailable: {e}")


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_signature_matches_the_peer(entry):
    ours, key, member, qualname = ENTRIES[entry]
    want = _peer(key, member, qualname)
    got = our_signature(ours)
    assert [p[0] for p in got] == [p[0] for p in want], "names or order differ"
    diff = [(w, g) for w, g in zip(want, got) if w != g]
    assert not diff, f"kind or default differs (peer, ours): {diff}"


def doc_tables():
    """{entry: {argument: (status, note)}} from docs/compat.md's argument tables."""
    tables, entry = {}, None
    with open(DOC) as f:
        for line in f:
            m = re.match(r"### `(.+)`", line)
            if m:
                entry = m.group(1)
                tables[entry] = {}
                continue
            m = re.match(r"\| `(\w+)` \| ([^|]+) \|(.*)\|$", line.strip())
            if entry and m:
                assert m.group(1) not in tables[entry], f"{entry}: two rows for {m.group(1)}"
                tables[entry][m.group(1)] = (m.group(2).strip(), m.group(3).strip())
    return tables


def test_docs_table_has_one_row_per_argument():
    tables = doc_tables()
    assert set(tables) == set(ENTRIES)
    for entry, (ours, *_) in ENTRIES.items():
        names = [p[0] for p in our_signature(ours)]
        assert list(tables[entry]) == names, f"{entry}: rows differ from the arguments"
        for arg, (status, _) in tables[entry].items():
            assert status in STATUSES, f"{entry}.{arg}: status {status!r}"


@pytest.mark.parametrize("module", [F, _flashinfer_prefill, S, VL], ids=lambda m: m.__name__)
def test_docstring_examples_run(module):
    result = doctest.testmod(module, raise_on_error=False, verbose=False)
    assert result.attempted > 0 and result.failed == 0, result
