"""Zero-config mode: simulated endpoints (one healthy, the rest faulty) monitored into SQLite.

A newcomer runs ``kvwatch run`` with no configuration and sees every verdict appear within a
minute; the same fleet is what ``kvwatch simulate`` serves for game days.
"""

from __future__ import annotations

import yaml

from kvwatch.config import Config, parse_config
from kvwatch.config.sections import DEFAULT_PROBES
from kvwatch.daemon import Daemon
from kvwatch.simulator.fleet import BURST_DEMO, CACHE_DEMO, ESTIMATED, demo_fleet
from kvwatch.simulator.server import run_simulator

DEMO_INTERVAL = "20s"
DEMO_DOCUMENT_TOKENS = 1024
# Where demo mode keeps its history, in the working directory: the history commands
# (results, show, served-window) read it there when no configuration is given.
DEMO_DATABASE_FILE = "kvwatch.db"
DEMO_DATABASE = f"sqlite:///{DEMO_DATABASE_FILE}"


def _probes(name: str) -> list[str]:
    """The default probes, and the opt-in ones the demo shows on this endpoint."""
    return [
        *DEFAULT_PROBES,
        *(["burst"] if name in BURST_DEMO else []),
        *(["cache"] if name in CACHE_DEMO else []),
    ]


def demo_config(urls: dict[str, tuple[str, str, int, str]], database: str) -> Config:
    """A config monitoring each simulated endpoint (url, model, window, flavour) by name.

    The KV pool is deliberately not configured: the faulty endpoints advertise more window
    than their pool, which the capacity gate would (rightly) refuse to start with.
    """
    doc = {
        "database": database,
        "listen": "127.0.0.1:9464",
        "defaults": {"interval": DEMO_INTERVAL, "jitter": "2s"},
        "endpoints": [
            {
                "name": name,
                "url": url,
                "model": model,
                "context_window": window,
                "flavour": flavour,
                # As if behind a gateway without a tokenize route: tokens are estimated.
                **({"tokenizer": "usage"} if name == ESTIMATED else {}),
                # The burst probe is opt-in: on the healthy endpoint (passes) and the one
                # whose batches mix answers (burst_leak); so is the cache probe: healthy
                # passes, the cache faults are cache_corrupt, no prefix cache is
                # cache_not_exercised.
                **({"probes": _probes(name)} if name in BURST_DEMO | CACHE_DEMO else {}),
                # A small document keeps the demo's cache cycles quick.
                **(
                    {"cache": {"document_tokens": DEMO_DOCUMENT_TOKENS}}
                    if name in CACHE_DEMO
                    else {}
                ),
            }
            for name, (url, model, window, flavour) in urls.items()
        ],
    }
    return parse_config(yaml.safe_dump(doc), source="<demo>")


async def run_demo(*, grace_seconds: float, database: str = DEMO_DATABASE) -> None:
    import structlog

    log = structlog.get_logger("kvwatch.demo")
    fleet = demo_fleet()
    async with run_simulator(fleet) as sim:
        urls = {
            ep.name: (sim.url_for(ep.name), ep.model, ep.window, ep.flavour.value) for ep in fleet
        }
        log.info(
            "demo_mode",
            hint="no kvwatch.yaml found: monitoring simulated endpoints; see README to configure",
            simulator=sim.base_url,
            endpoints={ep.name: ep.fault.value for ep in fleet},
            ui="http://127.0.0.1:9464/",
        )
        daemon = Daemon(demo_config(urls, database), grace_seconds=grace_seconds)
        daemon.install_signal_handlers()
        await daemon.run()
