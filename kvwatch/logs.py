"""structlog set-up: one JSON object per line on stdout (or another stream), the standard
library's records (Alembic, uvicorn) included, tracebacks without locals."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

_HANDLER = "kvwatch"


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
    # Libraries log through the standard library (Alembic's migrations, uvicorn, APScheduler):
    # their records are rendered by the same processors, as JSON lines on the same stream,
    # so a log pipeline sees one format. A record names its library as ``logger``.
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                renderer,
            ],
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.format_exc_info,
            ],
        )
    )
    # Replace only the handler an earlier call installed (a reload, a second command in one
    # process); handlers others installed (a test runner's capture) stay.
    handler.set_name(_HANDLER)
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    # httpx logs every request line at INFO (URLs may carry credentials); uvicorn's access
    # log would drown the probe lines.
    for noisy in ("httpx", "httpcore", "uvicorn.access", "apscheduler", "alembic.runtime.plugins"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
