"""CPU lint: 64-bit address math in every Triton kernel file.

Rules checked on the AST of pagedattn/triton_kernels/*.py, inside @triton.jit functions:
1. every ``stride_*`` parameter is annotated ``tl.int64``;
2. every ``tl.load`` of a table / indptr / slot / mapping / indices tensor is immediately
   widened with ``.to(tl.int64)`` (SGLang #20389, vLLM #47671: int32 index x stride);
3. no ``tl.where(c, x, tl.load(...))``: both arms are evaluated, so the load must be masked
   itself (vllm-ascend #16275).
"""
import ast
import pathlib

import pytest

KERNEL_DIR = pathlib.Path(__file__).resolve().parents[1] / "pagedattn" / "triton_kernels"
INDEX_WORDS = ("table", "indptr", "slot", "mapping", "indices", "bt_")


def _is_jit(fn):
    for d in fn.decorator_list:
        src = ast.unparse(d)
        if "triton.jit" in src or src == "jit":
            return True
    return False


def _is_tl_load(node):
    return isinstance(node, ast.Call) and ast.unparse(node.func) in ("tl.load",)


def _violations(path):
    tree = ast.parse(path.read_text())
    parents = {}
    for p in ast.walk(tree):
        for c in ast.iter_child_nodes(p):
            parents[c] = p
    bad = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or not _is_jit(fn):
            continue
        for a in fn.args.args + fn.args.kwonlyargs:
            if a.arg.startswith("stride_") and (a.annotation is None
                                                or ast.unparse(a.annotation) != "tl.int64"):
                bad.append(f"{path.name}:{a.lineno} {fn.name}: param {a.arg} not tl.int64")
        for node in ast.walk(fn):
            if _is_tl_load(node) and node.args:
                ptr = ast.unparse(node.args[0])
                if any(w in ptr for w in INDEX_WORDS):
                    attr = parents.get(node)
                    call = parents.get(attr)
                    ok = (isinstance(attr, ast.Attribute) and attr.attr == "to"
                          and isinstance(call, ast.Call) and call.args
                          and ast.unparse(call.args[0]) == "tl.int64")
                    if not ok:
                        bad.append(f"{path.name}:{node.lineno} {fn.name}: tl.load({ptr}) not "
                                   "widened with .to(tl.int64)")
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "tl.where":
                for arm in node.args[1:]:
                    for sub in ast.walk(arm):
                        if _is_tl_load(sub) and not any(k.arg == "mask" for k in sub.keywords):
                            bad.append(f"{path.name}:{node.lineno} {fn.name}: unmasked "
                                       "tl.load inside tl.where")
    return bad


FILES = sorted(KERNEL_DIR.glob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_int64_address_math(path):
    bad = _violations(path)
    assert not bad, "\n".join(bad)


def test_lint_catches_violations(tmp_path):
    """The lint itself can fail: a narrow stride and an int32 table load are reported."""
    src = tmp_path / "bad.py"
    src.write_text(
        "import triton\nimport triton.language as tl\n\n@triton.jit\n"
        "def k(block_table_ptr, x_ptr, stride_b, i):\n"
        "    blk = tl.load(block_table_ptr + i)\n"
        "    y = tl.where(i > 0, 0, tl.load(x_ptr + i - 1))\n"
        "    return blk * stride_b + y\n")
    bad = _violations(src)
    assert len(bad) == 3, bad
