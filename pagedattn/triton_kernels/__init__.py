"""The ``triton`` backend: portable Triton kernels (CPU via TRITON_INTERPRET=1)."""


def supports(op: str, **facts) -> list:
    return [f"the triton backend does not implement {op} yet"]
