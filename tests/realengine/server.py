"""Starting llama-server for tests and experiments: where the binary is, how it is run."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.helpers.processes import free_port, stop, wait_for

LLAMA_SERVER_VERSION = "11434.0.0"
WINDOW = 2048
TEMPLATE_FILE = Path(__file__).with_name("gemma3-chat-template.jinja")
BUILD_SCRIPT = Path(__file__).parents[2] / "scripts" / "build-llama-server.sh"
# Gemma template from a file: the GGUF carries none, and the ChatML fallback yields debris.
GEMMA_TEMPLATE_ARGS = ("--jinja", "--chat-template-file", str(TEMPLATE_FILE))
# With jinja on, "gemma" is the literal template text: every prompt collapses to 3 tokens.
COLLAPSED_TEMPLATE_ARGS = ("--jinja", "--chat-template", "gemma")


def cached_binary() -> Path:
    """Where the build script leaves the binary (``$KVWATCH_CACHE`` or ~/.cache/kvwatch)."""
    root = Path(os.environ.get("KVWATCH_CACHE", Path.home() / ".cache" / "kvwatch"))
    return root / f"llama-server-{LLAMA_SERVER_VERSION}" / "llama-server"


def binary_runs(binary: Path) -> bool:
    """Whether ``binary --version`` succeeds (a native build on this VM dies with SIGILL)."""
    try:
        done = subprocess.run(
            [str(binary), "--version"], capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@contextmanager
def llama_server(
    binary: Path, model: Path, *extra: str, log: Path, slots: int = 1
) -> Iterator[str]:
    """``llama-server`` on a free loopback port, window 2048 per slot, ``slots`` slots (one by
    default), two threads.

    Yields its base URL once ``/health`` answers 200; terminates it (then kills) on exit.
    """
    port = free_port()
    args = [
        str(binary),
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        # llama-server splits --ctx-size among its slots: each slot's window stays WINDOW.
        "--ctx-size",
        str(WINDOW * slots),
        "--parallel",
        str(slots),
        "--threads",
        "2",
        "--threads-batch",
        "2",
        # --fit may resize unset parameters to the device's memory: keep the server as asked.
        "--fit",
        "off",
        *extra,
    ]
    # LLAMA_ARG_* variables override flags silently; a developer's own settings must not
    # change the window or template under test.
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    with log.open("ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"llama-server exited with {proc.returncode}; see {log}")
        try:
            return httpx.get(f"{base}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for("llama-server /health", healthy, timeout=120, every=0.5)
        yield base
    finally:
        stop(proc, timeout=10)
