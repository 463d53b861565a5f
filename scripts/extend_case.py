"""Run one extend shape of bench/bench_extend.py a few times (a profiler's target, e.g. ncu).

  python scripts/extend_case.py BATCH PREFIX EXTEND [REPEATS]   # env picks the variant/knobs
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv):
    import torch

    from bench import bench_extend as BE
    batch, prefix, extend = (int(x) for x in argv[:3])
    reps = int(argv[3]) if len(argv) > 3 else 3
    x = BE.make_inputs(batch, prefix, extend, "cuda", torch.bfloat16)
    fn = BE.run_triton(x, extend, "cache")
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1:])
