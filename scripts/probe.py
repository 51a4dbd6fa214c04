#!/usr/bin/env python3
"""One driver for the device probes: ``python3 scripts/probe.py <routine> [options]``.

Each routine answers one question that the sweeps do not: it builds its points through
kosmos_bench.spec (an inline sweep; ``--set NAME=VALUE`` fills its ``kosmos:`` section, so any
configuration field a sweep file takes works here), makes runners through the public interface
(``impl.prepare``, ``runner.run / check / run_traced / close``), prints one fixed-width line per
measurement and, with ``--out FILE.parquet``, appends its rows there.

    timeline  one traced call: where the workgroups' time goes (roles, idle windows, by tenths)
    b2b       variants of one point timed back to back in one process, interleaved, fresh inputs
    copy      the fabric's copy alone: time, bandwidth, beside the GEMM; --sm: SM pulls over PCIe
    tail      the call past its last landed byte (traced) and past copy alone (timed)

Run from the repository root on the GPU machine; ``python3 scripts/probe.py <routine> --help``
lists a routine's options.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROUTINES = ("timeline", "b2b", "copy", "tail")


def parser() -> argparse.ArgumentParser:
    if str(HERE) not in sys.path:  # scripts/probes/ is a namespace package beside this file
        sys.path.insert(0, str(HERE))
    from probes.common import add_point_args

    ap = argparse.ArgumentParser(prog="probe.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n\n")[2:3]))
    sub = ap.add_subparsers(dest="routine", required=True, metavar="ROUTINE")
    for name in ROUTINES:
        mod = importlib.import_module(f"probes.{name}")
        sp = sub.add_parser(name, help=mod.__doc__.splitlines()[0].partition(": ")[2], description=mod.__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        add_point_args(sp)
        mod.add_arguments(sp)
        sp.set_defaults(run=mod.run)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
