"""Run benchmarks by name: ``python -m bench [planner ...]`` (no name: all)."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = ("planner", "calibration", "detection", "history", "soak", "scale", "served")


def main(argv: list[str]) -> int:
    names = argv or list(BENCHMARKS)
    for name in names:
        if name not in BENCHMARKS:
            print(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}", file=sys.stderr)
            return 2
    for name in names:
        importlib.import_module(f"bench.{name}").main()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
