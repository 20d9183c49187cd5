"""kvwatch benchmarks: `python -m bench NAME` (or `make bench` for all of them)."""
