"""Run benchmarks by name: ``python -m bench [planner ...]`` (no name: all).

``python -m bench NAME --option ...``: options after one name go to that benchmark.
"""

from __future__ import annotations

import importlib
import sys

from bench import exit_on_sigterm

BENCHMARKS = (
    "planner",
    "calibration",
    "detection",
    "history",
    "soak",
    "scale",
    "served",
    "memory",
    "changes",
    "scrape",
    "tokenids",
)
# Benchmarks whose main() takes its command-line options (the others take none).
WITH_OPTIONS = ("history", "scale", "memory", "scrape", "tokenids")


def main(argv: list[str]) -> int:
    first_option = next((i for i, a in enumerate(argv) if a.startswith("-")), len(argv))
    names, options = argv[:first_option] or list(BENCHMARKS), argv[first_option:]
    for name in names:
        if name not in BENCHMARKS:
            print(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}", file=sys.stderr)
            return 2
    if options and (len(names) != 1 or names[0] not in WITH_OPTIONS):
        print(
            f"options go to one benchmark of {', '.join(WITH_OPTIONS)}: "
            "python -m bench NAME --option ...",
            file=sys.stderr,
        )
        return 2
    exit_on_sigterm()
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        if name in WITH_OPTIONS:
            module.main(options)
        else:
            module.main()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
