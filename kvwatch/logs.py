"""structlog set-up: one JSON object per line on stdout (or another stream), tracebacks
without locals."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog


def configure(level: str = "info", *, json: bool = True, stream: TextIO | None = None) -> None:
    numeric = logging.getLevelNamesMapping()[level.upper()]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            # format_exc_info renders a plain traceback: no frame locals, so an API key in
            # a local variable can never reach the log.
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stdout),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=numeric, stream=sys.stderr, format="%(name)s %(message)s")
    # httpx logs every request line at INFO (URLs may carry credentials); uvicorn's access
    # log would drown the probe lines.
    for noisy in ("httpx", "httpcore", "uvicorn.access", "apscheduler"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
