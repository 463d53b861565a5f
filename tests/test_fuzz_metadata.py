"""Random malformed metadata against every public op in the default mode (no validation, Triton
backend; the interpreter on the CPU): the kernels' guards (docs/layout.md, "Malformed metadata").

Each case starts from a valid batch and applies up to a few malformations: block ids -1, past
the cache or 2**31-1 in used table slots; seq_len beyond the table, negative or near 2**31; more
query tokens than keys; cu_seqlens_q non-monotone or outside q; max_q_len below a real query
count; a mask_indptr outside the mask; store_kv slots past the cache or repeated; copy_blocks ids
out of range, repeated destinations, destinations that are sources; and for run_decode, metadata
changed after the plan. tests/fuzz_utils.py states the checks and runs each case in a worker
process: a crash fails the case (hypothesis then shrinks it) and the worker restarts. Under the
interpreter the worker runs every case with the bounds checker (tests/bounds_check.py): a load or
store outside the launch's tensors fails the case at the access, before it can crash the worker.
"""
import json
import math
import os
import select
import subprocess
import sys
import tempfile
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

HERE = os.path.dirname(os.path.abspath(__file__))
LAYOUTS = ["bhsd", "bshd", "vllm", "hcu"]
INT32_MAX = 2 ** 31 - 1


def _examples(ci: int) -> int:
    """Examples per test: ``ci`` under the ci profile (300 examples), scaled with the profile."""
    return max(2, ci * settings.default.max_examples // 300)


class Worker:
    """A process running fuzz_utils.worker: one case at a time, restarted after a crash."""

    def __init__(self):
        self.proc = None
        self.log = None

    def _start(self):
        env = dict(os.environ, PAGEDATTN_VALIDATE="0")  # the default mode of a user
        if not torch.cuda.is_available():
            env.setdefault("TRITON_INTERPRET", "1")
        env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), HERE,
                                             env.get("PYTHONPATH", "")])
        if self.log is not None:
            self.log.close()
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-u", os.path.join(HERE, "fuzz_utils.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, cwd=HERE, env=env, text=True)
        start = json.loads(self._reply(120, "start"))
        if start["bounds_off"]:  # the worker runs the cases without the bounds checker
            warnings.warn(f"bounds checker off: {start['bounds_off']}", pytest.PytestWarning)

    def _reply(self, timeout, what):
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if line:
            return line
        if not ready:
            self.proc.kill()
        rc = self.proc.wait()
        self.log.seek(0)
        tail = self.log.read().decode(errors="replace")[-3000:]
        self.proc = None
        raise AssertionError(f"the worker {'timed out' if not ready else f'died (exit {rc})'} "
                             f"on {what}\n{tail}")

    def run(self, case, timeout=300):
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self._reply(timeout, f"case {json.dumps(case)}"))
        assert reply["ok"], f"{reply['msg']}\ncase: {json.dumps(case)}"

    def close(self):
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        if self.log is not None:
            self.log.close()


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


# ----------------------------------------------------------------------------------------------
# valid batches, then malformations
# ----------------------------------------------------------------------------------------------

def _paged(draw, case, need):
    """Scattered unique pages for each request's ``need`` tokens; table slack poisoned."""
    bs = case["block_size"]
    pages = [math.ceil(n / bs) for n in need]
    width = max(pages + [1]) + draw(st.integers(0, 2))
    nb = sum(pages) + draw(st.integers(1, 3))
    perm = draw(st.permutations(range(nb)))
    table, used = [], 0
    for p in pages:
        slack = [draw(st.sampled_from([-1, nb + 7, INT32_MAX])) for _ in range(width - p)]
        table.append(list(perm[used:used + p]) + slack)
        used += p
    case.update(num_blocks=nb, table=table, pages=pages)


def _geometry(draw, op):
    """Block sizes 1 (token pools), 5 (not a power of 2: hybrid models' pages) and powers of 2;
    head dims 32 and 20 (not a power of 2), V as wide as K or 24 wide."""
    d = draw(st.sampled_from([32, 20]))
    return dict(op=op, seed=draw(st.integers(0, 2 ** 16)), layout=draw(st.sampled_from(LAYOUTS)),
                block_size=draw(st.sampled_from([1, 4, 5, 16])),
                num_kv_heads=draw(st.sampled_from([1, 2])), group=draw(st.sampled_from([1, 2])),
                head_dim=d, head_dim_v=draw(st.sampled_from([d, d, 24])),
                window=draw(st.sampled_from([None, None, 5])))


def _malform(draw, case, kind):
    """Apply one malformation; False when it does not apply to this case."""
    lens, nseq = case["seq_lens"], len(case["seq_lens"])
    b = draw(st.integers(0, nseq - 1))
    cap = len(case["table"][0]) * case["block_size"]
    nq = case["cu"][b + 1] - case["cu"][b] if case["op"] == "extend" else case.get("q_len", 1)
    if kind == "block_id":
        used = [(i, j) for i, p in enumerate(case["pages"]) for j in range(p)]
        if not used:
            return False
        i, j = draw(st.sampled_from(used))
        nb = case["num_blocks"]
        case["table"][i][j] = draw(st.sampled_from([-1, -2 ** 31, nb, nb + 7, INT32_MAX]))
    elif kind == "len_over_capacity":
        lens[b] = cap + draw(st.integers(1, 5)) + (nq if case.get("k_new") else 0)
    elif kind == "len_negative":
        lens[b] = draw(st.sampled_from([-1, -5, -2 ** 31]))
    elif kind == "len_huge":
        lens[b] = draw(st.sampled_from([INT32_MAX, 2 ** 31 - cap, INT32_MAX - max(nq, 0)]))
    elif kind == "q_over_len":
        if nq < 1 or (case["op"] == "extend" and not case["causal"] and not case["k_new"]):
            return False  # non-causal over the cache: more queries than keys is valid
        lens[b] = draw(st.integers(0, nq - 1))
    elif kind == "cu_nonmono":
        i = draw(st.integers(1, nseq))
        cu = case["cu"]
        cu[i] = (cu[i + 1] + draw(st.integers(1, 3))) if i < nseq else -draw(st.integers(1, 3))
    elif kind == "cu_out_of_range":
        i = draw(st.integers(0, nseq))
        shift = draw(st.integers(1, 4))
        if i == 0:
            case["cu"][0] = -shift
        else:
            case["cu"][i:] = [x + shift for x in case["cu"][i:]]
    elif kind == "max_q_len_low":
        top = max(y - x for x, y in zip(case["cu"], case["cu"][1:]))
        if top < 1:
            return False
        case["max_q_len"] = draw(st.integers(0, top - 1))
    elif kind == "mask_indptr":
        if case.get("mask_indptr") is None or nq < 1:
            return False
        case["mask_indptr"][b] = draw(st.sampled_from([-1, case["mask_len"] - 1, INT32_MAX,
                                                       -2 ** 31]))
    return True


def _malformations(draw, case, kinds):
    meta = ("table", "seq_lens", "cu", "max_q_len", "mask_indptr")
    valid = json.dumps([case.get(k) for k in meta])
    applied = [k for k in draw(st.lists(st.sampled_from(kinds), max_size=2))
               if _malform(draw, case, k)]
    case["mutated"] = json.dumps([case.get(k) for k in meta]) != valid
    case["malformed"] = applied
    return case


@st.composite
def decode_cases(draw, op="decode"):
    case = _geometry(draw, op)
    q4 = draw(st.booleans())
    lq = draw(st.integers(2, 3)) if q4 and draw(st.booleans()) else 1
    if op == "run_decode":  # a plan takes a 4-D q for q_len > 1 only
        q4 = lq > 1
    nseq = draw(st.integers(1, 3))
    lens = [draw(st.integers(lq if lq > 1 else 0, 40)) for _ in range(nseq)]
    case.update(q4=q4, q_len=lq, seq_lens=lens,
                partition_size=draw(st.sampled_from([None, 16])))
    _paged(draw, case, lens)
    if op == "run_decode":
        case.update(plan_table=[list(r) for r in case["table"]], plan_lens=list(lens))
    kinds = ["block_id", "len_over_capacity", "len_negative", "len_huge"]
    return _malformations(draw, case, kinds + (["q_over_len"] if lq > 1 else []))


@st.composite
def extend_cases(draw):
    case = _geometry(draw, "extend")
    nseq = draw(st.integers(1, 3))
    prefix = [draw(st.integers(0, 20)) for _ in range(nseq)]
    nq = [draw(st.integers(0, 5)) for _ in range(nseq)]
    nq[0] = max(nq[0], 1)
    lens = [p + n for p, n in zip(prefix, nq)]
    k_new = draw(st.booleans())
    cu = [0]
    for n in nq:
        cu.append(cu[-1] + n)
    case.update(seq_lens=lens, cu=cu, num_tokens=cu[-1], k_new=k_new,
                causal=draw(st.sampled_from([True, True, False])),
                max_q_len=draw(st.sampled_from([None, max(nq), max(nq) + 2])))
    if draw(st.integers(0, 2)) == 0:
        mi = [0]
        for n, k in zip(nq, lens):
            mi.append(mi[-1] + n * k)
        case.update(mask_indptr=mi, mask_len=mi[-1] + draw(st.integers(0, 3)))
    _paged(draw, case, prefix if k_new else lens)
    return _malformations(draw, case, ["block_id", "len_over_capacity", "len_negative",
                                       "len_huge", "q_over_len", "cu_nonmono",
                                       "cu_out_of_range", "max_q_len_low", "mask_indptr"])


@st.composite
def store_cases(draw):
    nb, bs = draw(st.integers(1, 6)), draw(st.sampled_from([1, 4, 5, 16]))
    cap, t = nb * bs, draw(st.integers(1, 16))
    sdt = draw(st.sampled_from(["int32", "int64"]))
    slots = list(draw(st.permutations(range(cap))))[:t] + [-1] * max(0, t - cap)
    for kind in draw(st.lists(st.sampled_from(["past", "dup", "pad", "huge"]), max_size=4)):
        i = draw(st.integers(0, t - 1))
        if kind == "past":
            slots[i] = cap + draw(st.integers(0, 5))
        elif kind == "dup" and t > 1:
            slots[i] = slots[draw(st.integers(0, t - 1).filter(lambda j: j != i))]
        elif kind == "pad":
            slots[i] = draw(st.sampled_from([-1, -7]))
        elif kind == "huge":
            slots[i] = draw(st.sampled_from([INT32_MAX] + ([2 ** 40, 2 ** 63 - 1]
                                                           if sdt == "int64" else [])))
    return dict(op="store_kv", seed=draw(st.integers(0, 2 ** 16)), num_blocks=nb, block_size=bs,
                num_kv_heads=draw(st.sampled_from([1, 2])), head_dim=32,
                layout=draw(st.sampled_from(LAYOUTS)),
                dtype=draw(st.sampled_from(["float16", "float32"])), slots=slots,
                slot_dtype=sdt, dup_path=draw(st.sampled_from(["in-kernel", "sorted"])))


@st.composite
def copy_cases(draw):
    nb = draw(st.integers(1, 8))
    block_id = st.one_of(st.integers(0, nb - 1), st.integers(0, nb - 1), st.integers(-2, nb + 1),
                         st.sampled_from([2 ** 40, -2 ** 31, INT32_MAX]))
    pairs = draw(st.lists(st.tuples(block_id, block_id), max_size=6))
    layer = st.tuples(st.sampled_from(LAYOUTS), st.sampled_from([1, 4, 5, 16]),
                      st.sampled_from(["float16", "float32", "float8_e4m3fn"]))
    return dict(op="copy_blocks", seed=draw(st.integers(0, 2 ** 16)), num_blocks=nb,
                pairs=[list(p) for p in pairs], head_dim=32,
                layers=[list(x) for x in draw(st.lists(layer, min_size=1, max_size=2))],
                clash_path=draw(st.sampled_from(["in-kernel", "sorted"])))


# ----------------------------------------------------------------------------------------------
# the tests
# ----------------------------------------------------------------------------------------------

@settings(max_examples=_examples(12), deadline=None)
@given(case=decode_cases())
def test_fuzz_paged_decode(worker, case):
    worker.run(case)


@settings(max_examples=_examples(5), deadline=None)
@given(case=decode_cases(op="run_decode"))
def test_fuzz_run_decode_after_the_plan_changed(worker, case):
    worker.run(case)


@settings(max_examples=_examples(14), deadline=None)
@given(case=extend_cases())
def test_fuzz_extend_attention(worker, case):
    worker.run(case)


@settings(max_examples=_examples(25), deadline=None)
@given(case=store_cases())
def test_fuzz_store_kv(worker, case):
    worker.run(case)


@settings(max_examples=_examples(25), deadline=None)
@given(case=copy_cases())
def test_fuzz_copy_blocks(worker, case):
    worker.run(case)
