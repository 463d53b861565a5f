"""The verdicts of `pagedattn-bench radix` (pagedattn/bench/radix.py `targets`) on made-up
measurements: each target line says PASS exactly when its condition holds, and the spread lines
pair the replays of one round. No timing here."""
import pandas as pd
import pytest

from pagedattn.bench.radix import targets

WORKLOADS = ["few-shot", "1M cached"]


def rows(p16_runs):
    """Our rows at pages 1 and 16: page 1 at 10 us a request in each of three rounds, page 16
    at `p16_runs` (mean: their median)."""
    out = []
    for w in WORKLOADS:
        for ps, runs in ((1, [10.0, 10.0, 10.0]), (16, p16_runs)):
            mean = sorted(runs)[1]
            out.append(dict(workload=w, page=ps, impl="pagedattn", mean_us=mean, med_us=mean,
                            req_s=1e6 / mean, gc_max_ms=0.05,
                            mean_us_runs="/".join(f"{x:.3f}" for x in runs)))
    return pd.DataFrame(out)


def evict(us_1k, us_32k):
    return pd.DataFrame([dict(impl="pagedattn", page=1, leaves=n, us_per_leaf=sorted(v)[1],
                              us_runs="/".join(f"{x:.3f}" for x in v))
                         for n, v in ((1000, us_1k), (32000, us_32k))])


def line(text, start):
    """The one line of `text` that starts (after indentation) with `start`."""
    got = [ln for ln in text.splitlines() if ln.lstrip().startswith(start)]
    assert len(got) == 1, (start, text)
    return got[0]


@pytest.mark.parametrize("p16, verdict", [([9.0, 9.5, 11.0], "PASS"),     # median 9.5
                                          ([10.5, 10.2, 9.0], "FAIL")])   # median 10.2
def test_page_verdict_and_its_spread(p16, verdict):
    text = targets(rows(p16), evict([1.0] * 3, [1.1] * 3), [], [])
    assert f"per request: {verdict} (" in line(text, "* page 16 at least as fast")
    spread = line(text, "* the spread: page 16 / page 1")
    want = " / ".join(f"{x / 10:.3f}" for x in p16)       # round by round, not sorted
    assert all(f"{w} {want}" in spread for w in WORKLOADS), spread


@pytest.mark.parametrize("us_32k, verdict", [([1.15, 1.2, 1.1], "PASS"),
                                             ([1.2, 1.2, 1.2], "PASS"),      # 1.2x is within
                                             ([1.3, 1.21, 1.1], "FAIL")])
def test_evict_verdict_and_its_spread(us_32k, verdict):
    text = targets(rows([9.0] * 3), evict([1.0] * 3, us_32k), [], [])
    assert f"(page 1): {verdict} (" in line(text, "* evict flat")
    assert line(text, "* the spread: largest / smallest").endswith(
        " / ".join(f"{x:.2f}" for x in us_32k))
