"""``kvwatch healthcheck``: ask a running kvwatch for /healthz, exit 0 (healthy) or 1.

It is the container image's HEALTHCHECK, so the image needs no curl or wget. It uses only
the standard library, and reads the ``listen`` address from the same configuration the
daemon runs with, so the check follows the daemon when its port changes.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import click

from kvwatch.config import ConfigError, load_config
from kvwatch.config.types import split_listen

# Docker treats exit 1 as unhealthy; 2 is reserved, so every failure is 1.
HEALTHY, UNHEALTHY = 0, 1


def probe_url(listen: str, path: str = "/healthz") -> str:
    """The URL a local client uses to reach a server bound to ``listen``.

    A wildcard bind address (0.0.0.0, ::) is not a destination, so it becomes the loopback
    address of the same family.
    """
    host, port = split_listen(listen)
    if host == "0.0.0.0":
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{path}"


def check(url: str, timeout: float) -> tuple[bool, str]:
    """GET ``url``; healthy only on a 2xx answer within ``timeout`` seconds."""
    # No proxy handler: an HTTP(S)_PROXY set in the container must not route loopback away.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as response:
            status: int = response.status
            body = response.read(200).decode("utf-8", "replace").strip()
    except urllib.error.HTTPError as exc:
        detail = exc.read(200).decode("utf-8", "replace").strip()
        return False, f"{url}: HTTP {exc.code} {detail}".rstrip()
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return False, f"{url}: {reason}"
    return 200 <= status < 300, f"{url}: HTTP {status} {body}".rstrip()


@click.command("healthcheck")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    envvar="KVWATCH_CONFIG",
    help="Configuration whose `listen` address is checked (default: ./kvwatch.yaml).",
)
@click.option("--url", default=None, help="Check this URL instead of the configured address.")
@click.option(
    "--path",
    "url_path",
    default="/healthz",
    show_default=True,
    help="/healthz (liveness) or /readyz (database reachable and migrated).",
)
@click.option("--timeout", default=5.0, show_default=True, help="Seconds to wait for an answer.")
def healthcheck(config_path: Path | None, url: str | None, url_path: str, timeout: float) -> None:
    """Check a running kvwatch over HTTP; exit 0 if healthy, 1 if not (for HEALTHCHECK)."""
    if url is None:
        try:
            config = load_config(config_path or Path("kvwatch.yaml"))
        except ConfigError as exc:
            for line in exc.errors:
                click.echo(line, err=True)
            raise SystemExit(UNHEALTHY) from None
        url = probe_url(config.listen, url_path)
    healthy, detail = check(url, timeout)
    click.echo(detail, err=not healthy)
    raise SystemExit(HEALTHY if healthy else UNHEALTHY)
