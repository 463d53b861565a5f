"""Malformed-metadata cases for tests/test_fuzz_metadata.py: the runner, which builds one case's
tensors, calls the public op in the default mode (no validation) and checks the guard contract of
the op's docstring; and the worker loop that runs cases in a process of their own, so that a crash
fails the case instead of the test run (``python fuzz_utils.py``: JSON cases in, JSON replies out).

A case is a JSON dict: the op, the geometry, the metadata (possibly malformed) and a seed for the
tensor data. The caches (and decode/extend's ``out``) are views inside larger buffers whose other
elements hold ``SENTINEL``: a write outside the view changes it, a read outside shows up in the
output. Checks:

* no crash, and an exception only when the metadata is malformed, then ValueError or TypeError;
* attention rows whose request's metadata is valid equal the float32 reference; rows of an invalid
  request (every row of q when cu_seqlens_q is invalid: not monotone, starting below 0 or ending
  past q), or rows that see a key through a bad block id, are NaN in out and lse; a row that sees
  only good keys of a request with a bad id elsewhere, or of a request whose Lq exceeds
  max_q_len, may be NaN or exact;
* the caches are untouched by attention ops and by a raise; store_kv and copy_blocks write exactly
  the entries the guards keep, and nothing else;
* the errors counter is > 0 exactly when rows were guarded (NaN), and for store_kv and copy_blocks
  it counts the skipped entries;
* under the interpreter, no load, store or atomic of any kernel reaches outside the tensors of its
  launch (tests/bounds_check.py, extent "view": a cache's own bytes, not the sentinel buffer
  around it), checked at the access: an out-of-bounds lane fails the case before it is made.
"""
import contextlib
import faulthandler
import inspect
import json
import math
import os
import sys
import traceback

import torch

SENTINEL = 1234.5  # the buffer around every cache and out view
POISON = 777.0  # out's rows before the launch: an unwritten row is neither exact nor NaN
EXACT, NAN, EITHER = "exact", "nan", "either"


def device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sentinel_view(shape, dtype, dev, gen, rows_only=False):
    """N(0,1) values of ``shape`` as a view inside a buffer one entry larger on each side of dim 0
    (and one larger in dim 1 unless rows_only) filled with SENTINEL (the dtype's max if lower):
    (view, buffer)."""
    big = [shape[0] + 2] + [shape[1] + (0 if rows_only else 1)] + list(shape[2:])
    buf = torch.full(big, min(SENTINEL, torch.finfo(dtype).max), dtype=dtype, device=dev)
    view = buf[1:-1] if rows_only else buf[1:-1, 1:]
    view.copy_(torch.randn(shape, generator=gen).to(device=dev, dtype=dtype))
    return view, buf


def _bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _same(a, b, what):
    assert torch.equal(_bits(a), _bits(b)), what


# ----------------------------------------------------------------------------------------------
# attention: which rows must be exact, NaN, or either
# ----------------------------------------------------------------------------------------------

def attention_rows(case, mask=None):
    """[(row, b, i, status)]: row = q index (extend) or (b,) / (b, i) (decode), b the request, i the
    query's index within it. ``mask``: the flat custom mask tensor, if any."""
    lens, table, bs, nb = case["seq_lens"], case["table"], case["block_size"], case["num_blocks"]
    cap = len(table[0]) * bs
    win = case.get("window")
    if case["op"] == "extend":
        cu, t = case["cu"], case["num_tokens"]
        mono = all(a <= b for a, b in zip(cu, cu[1:]))
        if not mono or cu[0] < 0 or cu[-1] > t:  # an invalid cu_seqlens_q: every row of q
            return [(r, 0, 0, NAN) for r in range(t)]
        spans = [(cu[b], cu[b + 1]) for b in range(len(lens))]
    else:
        lq = case.get("q_len", 1)
        spans = [(b * lq, (b + 1) * lq) for b in range(len(lens))]
    rows = []
    for b, (q0, q1) in enumerate(spans):
        nq, nk = q1 - q0, lens[b]
        if case["op"] == "extend":
            need = nk - nq if case["k_new"] else nk
            long_q = not case["causal"] and not case["k_new"]  # Lq > Lk is valid then
            bad = nk < 0 or (nq > nk and not long_q) or need > cap
            # Lq above max_q_len: NaN past the grid's query blocks, exact within the last one
            over = case["max_q_len"] is not None and nq > case["max_q_len"]
            mi = case.get("mask_indptr")
            if mi is not None and nq > 0 and not bad:
                bad = mi[b] < 0 or mi[b] + nq * nk > case["mask_len"]
            own = range(max(q0, 0), min(q1, t))
            keys = [(r, r - q0) for r in own]
        else:
            need, over = nk, False
            bad = nk < 0 or nk > cap or (lq > 1 and nk < lq)
            keys = [((b, i) if case.get("q4") else (b,), i) for i in range(lq)]
        if bad:
            rows += [(r, b, i, NAN) for r, i in keys]
            continue
        bad_pos = set()
        for j in range(math.ceil(need / bs)):
            if not 0 <= table[b][j] < nb:
                bad_pos.update(range(j * bs, min(need, (j + 1) * bs)))
        for r, i in keys:
            p = nk - nq + i
            seen = {j for j in bad_pos if _visible(case, mask, b, i, j, p, nq, nk, win)}
            rows.append((r, b, i, NAN if seen else EITHER if bad_pos or over else EXACT))
    return rows


def _visible(case, mask, b, i, j, p, nq, nk, win):
    if win is not None and j <= p - win:
        return False
    if mask is not None:
        return bool(mask[case["mask_indptr"][b] + i * nk + j])
    return j <= p or not case.get("causal", True)


def _check_row(out, lse, ref_out, ref_lse, status, what):
    from attn_utils import assert_attn_close, assert_lse_close
    if status != EXACT and torch.isnan(out).all() and torch.isnan(lse).all():
        return
    assert status != NAN, f"{what}: invalid metadata, expected NaN out and lse, got " \
        f"out {out.flatten()[:4].tolist()} lse {lse.flatten()[:4].tolist()}"
    assert_attn_close(out, ref_out, torch.float32, what=f"{what} out")
    assert_lse_close(lse, ref_lse, torch.float32)


def _safe_row(row, nb):
    """A table row with its bad ids replaced by block 0: the reference of rows that do not see
    them."""
    return torch.tensor([x if 0 <= x < nb else 0 for x in row], dtype=torch.int32)


def run_attention(case):
    import pagedattn as pa
    from pagedattn import reference as R
    dev = device()
    gen = torch.Generator().manual_seed(case["seed"])
    nb, bs, hkv, d, layout = (case[k] for k in ("num_blocks", "block_size", "num_kv_heads",
                                                "head_dim", "layout"))
    dv = case.get("head_dim_v", d)
    hq = hkv * case["group"]
    shapes = pa.layouts.kv_cache_shapes(nb, bs, hkv, d, layout, torch.float32, dv)
    (kc, kbuf), (vc, vbuf) = (sentinel_view(s, torch.float32, dev, gen) for s in shapes)
    kb0, vb0 = kbuf.clone(), vbuf.clone()
    table = torch.tensor(case["table"], dtype=torch.int32, device=dev)
    lens = torch.tensor(case["seq_lens"], dtype=torch.int32, device=dev)
    nseq = len(case["seq_lens"])
    opts = dict(layout=layout, sliding_window=case.get("window"))
    mask = None
    if case["op"] == "extend":
        t = case["num_tokens"]
        q = torch.randn(t, hq, d, generator=gen).to(dev)
        kn = vn = None
        if case["k_new"]:
            kn = torch.randn(t, hkv, d, generator=gen).to(dev)
            vn = torch.randn(t, hkv, dv, generator=gen).to(dev)
        cu = torch.tensor(case["cu"], dtype=torch.int32, device=dev)
        if case.get("mask_indptr") is not None:
            mask = (torch.rand(case["mask_len"], generator=gen) < 0.7).to(dev)
            opts.update(custom_mask=mask, mask_indptr=torch.tensor(
                case["mask_indptr"], dtype=torch.int32, device=dev))
        opts.update(causal=case["causal"], k_new=kn, v_new=vn, max_q_len=case["max_q_len"])
        args = (q, kc, vc, table, cu, lens)
        fn = pa.extend_attention
    else:
        shape = (nseq, hq, d) if not case.get("q4") else (nseq, case["q_len"], hq, d)
        q = torch.randn(shape, generator=gen).to(dev)
        opts.update(partition_size=case.get("partition_size"))
        args = (q, kc, vc, table, lens)
        fn = pa.paged_decode
    out, obuf = sentinel_view(q.shape[:-1] + (dv,), torch.float32, dev, gen, rows_only=True)
    out.fill_(POISON)
    ob0 = obuf.clone()
    errors = torch.zeros(1, dtype=torch.int32, device=dev)
    rows = attention_rows(case, None if mask is None else mask.cpu())
    may_raise = case["mutated"] or any(s != EXACT for *_, s in rows)
    try:
        if case["op"] == "run_decode":
            res = _run_plan(case, q, kc, vc, table, lens, out, errors)
        else:
            res = fn(*args, backend="triton", out=out, return_lse=True, errors=errors, **opts)
    except (ValueError, TypeError) as e:
        assert may_raise, f"{type(e).__name__} on valid metadata: {e}"
        res = None
    _same(kbuf, kb0, "k_cache buffer changed (cache or sentinel)")
    _same(vbuf, vb0, "v_cache buffer changed (cache or sentinel)")
    _same(obuf[0], ob0[0], "the sentinel row before out changed")
    _same(obuf[-1], ob0[-1], "the sentinel row after out changed")
    if res is None:
        return
    got, lse = res
    assert got.data_ptr() == out.data_ptr()
    for r, b, i, status in rows:
        if status == NAN:
            ref_o, ref_l = None, None
        else:
            ref_o, ref_l = _reference(case, R, q, kc, vc, b, i, mask, opts)
        _check_row(got[r].cpu(), lse[r].cpu(), ref_o, ref_l, status, f"row {r} (request {b})")
    if case["op"] != "run_decode" or case.get("plan_errors"):
        nan_rows = bool(torch.isnan(got).any())
        assert (int(errors) > 0) == nan_rows, \
            f"errors counter {int(errors)} but NaN rows: {nan_rows}"
    if case["op"] != "run_decode":
        strict = not case["mutated"] and case.get("mask_len") == (case.get("mask_indptr")
                                                                   or [None])[-1]
        _validated(case, lambda **kw: fn(*args, backend="triton", return_lse=True, **opts, **kw),
                   torch.full_like(out, POISON), strict, (got, lse))


def _validated(case, call, out, strict, want):
    """The same call in validation mode raises exactly when the metadata is malformed (strict:
    valid, with nothing that only the guards tolerate), and otherwise gives the same bits."""
    try:
        res = call(out=out, validate=True)
    except (ValueError, TypeError) as e:
        assert not strict, f"validation mode rejects valid metadata: {e}"
        return
    assert not case["mutated"], f"validation mode accepts {case['malformed']}"
    for a, b in zip(res, want):
        _same(a, b, "validation mode gives other bits than the default mode")


def _run_plan(case, q, kc, vc, table, lens, out, errors):
    """plan_decode on the valid metadata, then the (malformed) metadata written into the planned
    tensors in place: a plan that no longer matches them."""
    import pagedattn as pa
    plan_table = torch.tensor(case["plan_table"], dtype=torch.int32, device=table.device)
    plan_lens = torch.tensor(case["plan_lens"], dtype=torch.int32, device=lens.device)
    g = case
    plan = pa.plan_decode(plan_table, plan_lens, num_q_heads=q.shape[-2],
                          num_kv_heads=g["num_kv_heads"], head_dim=g["head_dim"],
                          head_dim_v=g.get("head_dim_v"),
                          block_size=g["block_size"], num_blocks=g["num_blocks"],
                          q_dtype=q.dtype, q_len=q.shape[1] if q.dim() == 4 else 1,
                          layout=g["layout"], sliding_window=g.get("window"),
                          partition_size=g.get("partition_size"), backend="triton",
                          return_lse=True)
    plan_table.copy_(table)
    plan_lens.copy_(lens)
    kw = {}
    if "errors" in inspect.signature(pa.run_decode).parameters:
        kw["errors"] = errors
        case["plan_errors"] = True
    return pa.run_decode(plan, q, kc, vc, out=out, return_lse=True, **kw)


def _reference(case, R, q, kc, vc, b, i, mask, opts):
    """float32 reference of query i of request b alone (its bad ids replaced: it does not see
    them)."""
    nb, layout, lens = case["num_blocks"], case["layout"], case["seq_lens"]
    row = _safe_row(case["table"][b], nb).view(1, -1).to(q.device)
    nk = torch.tensor([lens[b]], dtype=torch.int32, device=q.device)
    win = case.get("window")
    if case["op"] != "extend":
        qb = q[b:b + 1]
        o, lse = R.paged_decode(qb, kc, vc, row, nk, layout=layout, sliding_window=win,
                                return_lse=True)
        return (o[0], lse[0]) if q.dim() == 3 else (o[0, i], lse[0, i])
    q0, q1 = case["cu"][b], case["cu"][b + 1]
    nq = q1 - q0
    kw = dict(layout=layout, causal=case["causal"], sliding_window=win, return_lse=True)
    if opts.get("k_new") is not None:
        kw.update(k_new=opts["k_new"][q0:q1], v_new=opts["v_new"][q0:q1])
    if mask is not None:
        m0 = case["mask_indptr"][b]
        kw.update(custom_mask=mask[m0:m0 + nq * lens[b]],
                  mask_indptr=torch.tensor([0, nq * lens[b]], dtype=torch.int32))
    cu = torch.tensor([0, nq], dtype=torch.int32, device=q.device)
    o, lse = R.extend_attention(q[q0:q1], kc, vc, row, cu, nk, **kw)
    return o[i], lse[i]


# ----------------------------------------------------------------------------------------------
# store_kv and copy_blocks: exactly the kept entries are written
# ----------------------------------------------------------------------------------------------

def run_store(case):
    import pagedattn as pa
    from pagedattn import reference as R
    from pagedattn.triton_kernels import kv_store
    dev = device()
    gen = torch.Generator().manual_seed(case["seed"])
    nb, bs, hkv, d, layout = (case[k] for k in ("num_blocks", "block_size", "num_kv_heads",
                                                "head_dim", "layout"))
    dt = getattr(torch, case["dtype"])
    shapes = pa.layouts.kv_cache_shapes(nb, bs, hkv, d, layout, dt)
    (kc, kbuf), (vc, vbuf) = (sentinel_view(s, dt, dev, gen) for s in shapes)
    slots = torch.tensor(case["slots"], dtype=getattr(torch, case["slot_dtype"]), device=dev)
    t = slots.numel()
    k, v = (torch.randn(t, hkv, d, generator=gen).to(device=dev, dtype=dt) for _ in range(2))
    s = case["slots"]
    keep = [0 <= x < nb * bs and s.count(x) == 1 for x in s]
    skipped = sum(1 for x, kp in zip(s, keep) if x >= 0 and not kp)
    want_k, want_v = kbuf.clone(), vbuf.clone()
    kt = torch.tensor(keep, dtype=torch.bool, device=dev)
    R.store_kv(k[kt], v[kt], want_k[1:-1, 1:], want_v[1:-1, 1:], slots[kt], layout=layout)
    errors = torch.full((1,), 3, dtype=torch.int32, device=dev)
    limit = kv_store.PAIRWISE_MAX_TOKENS
    if case["dup_path"] == "sorted":  # the prefill path on a small batch
        kv_store.PAIRWISE_MAX_TOKENS = 0
    try:
        pa.store_kv(k, v, kc, vc, slots, layout=layout, backend="triton", errors=errors)
    finally:
        kv_store.PAIRWISE_MAX_TOKENS = limit
    _same(kbuf, want_k, "k_cache buffer (cache or sentinel) differs from the kept writes")
    _same(vbuf, want_v, "v_cache buffer (cache or sentinel) differs from the kept writes")
    assert int(errors) == 3 + skipped, f"errors counter {int(errors) - 3}, skipped {skipped}"
    try:  # validation mode raises exactly when something is skipped (and writes nothing), else
        # writes the same values again
        pa.store_kv(k, v, kc, vc, slots, layout=layout, backend="triton", validate=True)
        assert not skipped, "validation mode accepts skipped slots"
    except ValueError:
        assert skipped, "validation mode rejects valid slots"
    _same(kbuf, want_k, "k_cache buffer changed in validation mode")
    _same(vbuf, want_v, "v_cache buffer changed in validation mode")


def run_copy(case):
    import pagedattn as pa
    from pagedattn.triton_kernels import block_copy
    dev = device()
    gen = torch.Generator().manual_seed(case["seed"])
    nb, pairs = case["num_blocks"], case["pairs"]
    views, bufs = [], []
    for layout, bs, dtype in case["layers"]:
        for shp in pa.layouts.kv_cache_shapes(nb, bs, 2, case["head_dim"], layout,
                                              getattr(torch, dtype)):
            view, buf = sentinel_view(shp, getattr(torch, dtype), dev, gen)
            views.append(view)
            bufs.append(buf)
    src, dst = [p[0] for p in pairs], [p[1] for p in pairs]
    keep = [0 <= s < nb and 0 <= d < nb and dst.count(d) == 1 and d not in src
            for s, d in pairs]
    want = [b.clone() for b in bufs]
    for (s, d), kp in zip(pairs, keep):
        for w in want:
            if kp:
                w[1 + d, 1:] = w[1 + s, 1:]
    errors = torch.zeros(1, dtype=torch.int32, device=dev)
    limit = block_copy.PAIRWISE_MAX_PAIRS
    if case["clash_path"] == "sorted":  # the path of large mappings on a small one
        block_copy.PAIRWISE_MAX_PAIRS = 0
    try:
        mapping = torch.tensor(pairs, dtype=torch.int64).reshape(-1, 2)
        pa.copy_blocks(views[0::2], views[1::2], mapping, backend="triton", errors=errors)
    finally:
        block_copy.PAIRWISE_MAX_PAIRS = limit
    for i, (b, w) in enumerate(zip(bufs, want)):
        _same(b, w, f"cache {i} buffer (cache or sentinel) differs from the kept copies")
    assert int(errors) == keep.count(False), f"errors counter {int(errors)}, skipped " \
        f"{keep.count(False)}"
    try:  # validation mode raises exactly when a pair is skipped (then before any copy)
        pa.copy_blocks(views[0::2], views[1::2], mapping, backend="triton", validate=True)
        assert all(keep), "validation mode accepts skipped pairs"  # (copied again: same bits)
    except ValueError:
        assert not all(keep), "validation mode rejects valid pairs"
    for i, (b, w) in enumerate(zip(bufs, want)):
        _same(b, w, f"cache {i} buffer changed in validation mode")


RUNNERS = {"decode": run_attention, "run_decode": run_attention, "extend": run_attention,
           "store_kv": run_store, "copy_blocks": run_copy}


def worker():
    """Run cases from stdin (one JSON object a line), reply one JSON line each on the original
    stdout; anything the ops print goes to stderr."""
    faulthandler.enable()
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import pagedattn  # noqa: F401  (import once, before the first case)
    bounds_off = None  # why the bounds checker cannot run under this interpreter
    if device().type == "cpu":
        import bounds_check
        bounds_off = bounds_check.unavailable()
    reply.write(json.dumps({"ready": True, "bounds_off": bounds_off}) + "\n")
    reply.flush()
    for line in sys.stdin:
        case = json.loads(line)
        print(f"case: {line.strip()}", file=sys.stderr, flush=True)  # the last one names a crash
        try:
            checked = contextlib.nullcontext()
            if device().type == "cpu" and bounds_off is None:
                checked = bounds_check.checking(extent="view")
            with checked:
                RUNNERS[case["op"]](case)
            msg = None
        except AssertionError as e:
            msg = str(e)
        except Exception:  # anything else the op raised is a failure too
            msg = traceback.format_exc(limit=-6)
        reply.write(json.dumps({"ok": msg is None, "msg": msg}) + "\n")
        reply.flush()
        if msg is not None and device().type == "cuda":
            return  # a device error can poison the context: the next case gets a fresh process


if __name__ == "__main__":
    worker()
