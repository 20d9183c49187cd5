"""The token-counting interface, defined in the pure core (:mod:`kvwatch.canary.counting`)."""

from kvwatch.canary.counting import TokenCounter

__all__ = ["TokenCounter"]
