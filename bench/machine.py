"""A one-line description of the machine a benchmark ran on (figures mean little without it)."""

from __future__ import annotations

import os
import platform


def describe() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (
        f"{os.cpu_count()} cores ({model}), Python {platform.python_version()}, {platform.system()}"
    )
