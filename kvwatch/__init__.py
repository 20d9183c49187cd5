"""kvwatch: synthetic boundary canaries for LLM serving endpoints."""

__version__ = "0.1.0"
