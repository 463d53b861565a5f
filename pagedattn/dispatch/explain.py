"""``explain(op, *args, **kwargs)``: the decision for a public-op call, printed with its reasons."""
import inspect

from pagedattn.dispatch.core import Decision, resolve_decision

OPS = ("paged_decode", "extend_attention", "store_kv", "copy_blocks")


def facts_for_call(op: str, *args, **kwargs):
    """(backend, facts) that the public op ``op`` passes to ``resolve`` for these arguments.

    Runs the op's host checks (shapes, dtypes, options), so a bad call raises the same typed
    error it would raise from the op itself; never reads device data.
    """
    from pagedattn import api
    from pagedattn import validation as V

    if op not in OPS:
        raise ValueError(f"op: expected one of {list(OPS)}, got {op!r}")
    fn = getattr(api, op)
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"explain({op!r}, ...): arguments do not match pagedattn.{op}: {e}") \
            from None
    bound.apply_defaults()
    a = bound.arguments
    if op == "copy_blocks":
        k = a["k_cache"]
        k0 = k if not isinstance(k, (list, tuple)) else k[0]
        return a["backend"], dict(q=None, k_cache=k0, layout=None, geom=None)
    if op == "store_kv":  # v_cache None: an MLA latent cache, K only
        g = V.check_cache(a["k_cache"], a["v_cache"] if a["v_cache"] is not None
                          else a["k_cache"], a["layout"])
    else:  # v_cache None: V is the K cache's first head_dim_v columns
        g = V.check_cache(a["k_cache"], V.resolve_v_cache(a["k_cache"], a["v_cache"],
                                                          a["layout"], a["head_dim_v"]),
                          a["layout"])
    if op == "store_kv":
        return a["backend"], dict(q=a["k"], k_cache=a["k_cache"], layout=a["layout"], geom=g)
    q = a["q"]
    V.check_q_and_heads(q, g, a["k_cache"].dtype, a["k_cache"].device,
                        dims=(3, 4) if op == "paged_decode" else (3,), layout=a["layout"])
    opts = V.attn_options(q=q, g=g, kv_dtype=a["k_cache"].dtype, scale=a["scale"],
                          k_scale=a["k_scale"], v_scale=a["v_scale"],
                          sliding_window=a["sliding_window"], logit_cap=a["logit_cap"],
                          alibi_slopes=a["alibi_slopes"], sinks=a["sinks"])
    # return_lse and partition_size travel in the call record the backend receives, so the
    # explanation includes them (api.resolve is not given them).
    facts = dict(q=q, k_cache=a["k_cache"], layout=a["layout"], geom=g, opts=opts,
                 return_lse=a["return_lse"])
    if op == "paged_decode":
        facts["partition_size"] = V.check_partition_size(a["partition_size"])
    else:
        facts.update(causal=a["causal"], k_new=a["k_new"], custom_mask=a["custom_mask"])
    return a["backend"], facts


def explain(op: str, *args, quiet: bool = False, **kwargs) -> Decision:
    """Which backend ``pagedattn.<op>(*args, **kwargs)`` would run, the kernel variant and its
    parameters, and why; printed unless ``quiet``.

    Takes exactly the public op's arguments, e.g.
    ``explain("paged_decode", q, k_cache, v_cache, block_table, seq_lens, layout="bshd")``.
    A forced backend (``backend=`` or ``PAGEDATTN_BACKEND``) that cannot serve the call raises
    ValueError with the reasons, as the op itself would.
    """
    backend, facts = facts_for_call(op, *args, **kwargs)
    d = resolve_decision(op, backend, **facts)
    if not quiet:
        print(f"{op} -> {d.describe()}")
    return d
