"""Offline sm_90 compiles of the Gluon kernels (no GPU needed): the extend and decode compile
tests share them. Triton 3.6 only (the kernels' Gluon API)."""
import glob
import os
import subprocess


def compile_sm90(kernel, cst, ptr_types, num_warps):
    """Compile a Gluon kernel for sm_90 with this triton. cst: constexprs by name; ptr_types:
    pointer types by name (other pointers *bf16); qk_scale fp32, other scalars i32; pointers and
    strides declared 16-divisible, as the launchers' alignment gates guarantee."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    names = kernel.arg_names

    def ty(n):
        if n in cst:
            return "constexpr"
        if n.endswith("_ptr"):
            return ptr_types.get(n, "*bf16")
        return "fp32" if n == "qk_scale" else "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if n.endswith("_ptr") or n.startswith("stride")}
    src = GluonASTSource(kernel, {n: ty(n) for n in names},
                         constexprs={(names.index(c),): v for c, v in cst.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=num_warps))


def resource_usage(ck):
    """``cuobjdump -res-usage`` of a compiled kernel (registers, stack, local memory), or None
    where this triton ships no cuobjdump."""
    import triton

    tool = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                                  "cuobjdump"))
    if not tool:
        return None
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"gluon_{os.getpid()}.cubin")
    with open(path, "wb") as f:
        f.write(ck.asm["cubin"])
    try:
        return subprocess.run([tool[0], "-res-usage", path], capture_output=True,
                              text=True).stdout
    finally:
        os.remove(path)
