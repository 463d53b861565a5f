"""Serving workloads of the replay, as data: where prefix reuse pays.

A request's prompt is its parent's full history (prompt + generated tokens) followed by its own
tokens; a request with a parent becomes ready when the parent finishes (multi-turn chat, tree
search). For the "fork" kind a parent means "forked from" (parallel sampling): the child shares
the parent's prompt blocks instead of waiting for it.
"""
import random
from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class ReqSpec:
    rid: int
    own: Tuple[int, ...]          # tokens appended to the parent's history
    max_new: int                  # tokens to generate
    parent: Optional[int] = None
    temperature: float = 0.0      # 0: greedy
    arrival: int = 0              # scheduler step at which it arrives (radix kind)


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str                     # "radix": RadixCache + TokenPool; "fork": BlockManager + CoW
    reqs: Tuple[ReqSpec, ...]
    note: str


def _toks(rng: random.Random, n: int, vocab: int) -> Tuple[int, ...]:
    return tuple(rng.randrange(vocab) for _ in range(n))


def few_shot(*, quick: bool, vocab: int, seed: int) -> Workload:
    """n users, one shared system prompt + few-shot examples, each with its own question."""
    rng = random.Random(seed)
    system, n = _toks(rng, 48 if quick else 160, vocab), 4 if quick else 12
    # one arrival per scheduler step: the first request's prefill publishes the shared prefix
    reqs = tuple(ReqSpec(i, system + _toks(rng, 12, vocab), 6 if quick else 10, arrival=i)
                 for i in range(n))
    return Workload("few-shot", "radix", reqs,
                    f"{n} requests share a {len(system)}-token prefix, one arrival per step")


def multi_turn(*, quick: bool, vocab: int, seed: int) -> Workload:
    """c conversations of t turns; turn k's prompt = turn k-1's prompt + reply + new message."""
    rng = random.Random(seed + 1)
    c, t = (2, 3) if quick else (3, 4)
    reqs, rid = [], 0
    for _ in range(c):
        parent = None
        for _ in range(t):
            reqs.append(ReqSpec(rid, _toks(rng, 16 if quick else 32, vocab), 6 if quick else 12,
                                parent=parent))
            parent, rid = rid, rid + 1
    return Workload("multi-turn", "radix", tuple(reqs), f"{c} chats x {t} turns")


def parallel_sampling(*, quick: bool, vocab: int, seed: int) -> Workload:
    """p prompts, n samples each (temperature 1): fork after prefill, copy-on-write on append."""
    rng = random.Random(seed + 2)
    p, n, length = (1, 3, 29) if quick else (2, 4, 61)  # odd lengths: the last block is shared
    reqs, rid = [], 0
    for _ in range(p):
        prompt, head = _toks(rng, length, vocab), rid
        for j in range(n):
            reqs.append(ReqSpec(rid, prompt, 6 if quick else 16, parent=None if j == 0 else head,
                                temperature=1.0))
            rid += 1
    return Workload("parallel-sampling", "fork", tuple(reqs), f"{p} prompts x {n} samples")


def tree_search(*, quick: bool, vocab: int, seed: int) -> Workload:
    """A trunk, b branches off it, each branch expanded into b children after it finishes."""
    rng = random.Random(seed + 3)
    trunk, b = _toks(rng, 40 if quick else 96, vocab), 2 if quick else 3
    reqs = [ReqSpec(0, trunk, 4 if quick else 8)]
    for i in range(b):
        reqs.append(ReqSpec(len(reqs), _toks(rng, 6, vocab), 4 if quick else 8, parent=0))
    for branch in range(1, b + 1):
        for _ in range(b - 1 if quick else 2):
            reqs.append(ReqSpec(len(reqs), _toks(rng, 4, vocab), 4 if quick else 8,
                                parent=branch))
    return Workload("tree-search", "radix", tuple(reqs),
                    f"trunk {len(trunk)}, {len(reqs)} nodes, depth 2")


ALL = (few_shot, multi_turn, parallel_sampling, tree_search)


def build(*, quick: bool, vocab: int, seed: int = 0):
    return [f(quick=quick, vocab=vocab, seed=seed) for f in ALL]
