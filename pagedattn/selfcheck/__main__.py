"""``python -m pagedattn.selfcheck [--backend NAME ...] [--device DEV] [--no-record] [-v]``.

Exit status 0 when every check that ran passed (skips are not failures), 1 otherwise, 2 before
any check when a ``PAGEDATTN_*`` variable is misspelled or has a bad value. On a machine
without a GPU the Triton kernels run under the interpreter (TRITON_INTERPRET=1 is set here
before triton is imported, unless the environment sets it).
"""
import argparse
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pagedattn.selfcheck",
                                 description="verify the backends on this device")
    ap.add_argument("--backend", action="append", choices=("torch", "triton", "hip"),
                    help="check only these backends (repeatable; default: all)")
    ap.add_argument("--device", default=None, help="cuda:N or cpu (default: the current GPU)")
    ap.add_argument("--no-record", action="store_true", help="do not write the record")
    ap.add_argument("-v", "--verbose", action="store_true", help="list every case")
    args = ap.parse_args(argv)
    from pagedattn import config
    try:
        config.validate_all()
    except ValueError as e:
        print(f"{ap.prog}: {e}", file=sys.stderr)
        return 2
    import torch
    if args.device in (None, "cpu") and (args.device == "cpu" or not torch.cuda.is_available()):
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported
    from pagedattn.selfcheck import runner
    report = runner.run(args.device, backends=tuple(args.backend or runner.BACKENDS),
                        write=not args.no_record)
    print(runner.tables(report, verbose=args.verbose))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
