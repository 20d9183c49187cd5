"""Scale: one kvwatch replica monitoring a fleet of simulated endpoints (issue 8, issue 13).

Two real processes: ``kvwatch simulate --fleet N`` serves N healthy virtual endpoints (windows
spread over 2,048-8,192 tokens, so neither side spends its time tokenizing megabytes), and
``kvwatch run`` monitors all of them from a config written to a temp dir, on SQLite and then
on a fresh PostgreSQL database created on the test server. The schedule is compressed to
``--interval`` (60 s) with ``--jitter`` (interval - 1 s: runs spread over the whole minute, as
the default 30 s jitter spreads them over half of a 15 min interval).

Two modes, each one command:

* ``python -m bench.scale`` (the default): the saturation point. The offered rate (endpoints
  x kinds / interval, three kinds every 20 s) steps up through ``--steps`` probes/s, each step
  a fresh kvwatch, simulator and database for ``--duration`` (90) seconds, until lag p99 first
  exceeds 1 s; printed per database with a row per step. No step that would end past ``--budget``
  (330 s) per database starts, so both take at most about 11 minutes.
* ``python -m bench.scale --fixed [--endpoints 1000] [--probes under,over,baseline]
  [--duration 600]``: one fleet at one rate (issue 8's measurement; three kinds on 1,000
  endpoints once a minute is 50 probes/s).

Measured from kvwatch's own ``probe`` log lines, ``/proc`` and the database:

* scheduling lag: ``lag_seconds`` = probe start - the time APScheduler meant it to run
  (slot + jitter), p50 / p99 / max, over every scheduled probe, and after the first
  interval (start-up: endpoints registered, first runs spread) — the figure the target and
  the saturation point use;
* kvwatch RSS: peak (VmHWM) and at the end (VmRSS); CPU: (utime + stime), per probe and per
  second of wall time;
* probes per second offered and achieved (slots run in the measured window / its length);
* lost (a slot of the measured window with no finished probe) and duplicate (a slot with
  more than one first probe) results, counted in the database;
* database write latency (``store_write_seconds``) p50 / p99.

Targets: lag p99 <= 1 s, RSS <= 250 MB, 0 lost, 0 duplicates.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from bench import exit_on_sigterm
from bench.machine import describe
from kvwatch.simulator.fleet import DEMO_MODEL, scale_fleet
from kvwatch.simulator.spec import SimEndpoint

DEFAULT_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
LAG_P99_TARGET = 1.0
RSS_TARGET_MB = 250.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: a value that was measured, not an interpolation."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def windowed_fleet(count: int, windows: str) -> list[SimEndpoint]:
    """``scale_fleet`` of ``count`` endpoints with windows spread over ``windows``, the
    ``--fleet-window`` option's ``LOW-HIGH``."""
    low, high = map(int, windows.split("-"))
    return scale_fleet(count, low, high)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (fields 14 and 15 of /proc/PID/stat, after the comm)."""
    with open(f"/proc/{pid}/stat") as f:
        after_comm = f.read().rsplit(")", 1)[1].split()
    return (int(after_comm[11]) + int(after_comm[12])) / CLK_TCK


def postgres_cpu_seconds() -> float:
    """CPU of every running PostgreSQL server process on this machine (the database's share
    of the two cores; a backend that exits between two readings takes its share with it)."""
    total = 0.0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "comm").read_text().strip() == "postgres":
                total += cpu_seconds(int(proc.name))
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited while we looked
    return total


def status_mb(pid: int, *keys: str) -> dict[str, float]:
    """The fields ``keys`` of ``/proc/PID/status`` (sizes in kB there), in MB, read at once."""
    values: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in keys:
                values[key] = int(rest.split()[0]) / 1024
    return values


def memory_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MB."""
    values = status_mb(pid, "VmRSS", "VmHWM")
    return values["VmRSS"], values["VmHWM"]


@contextlib.contextmanager
def simulator(endpoints: int, windows: str, tmp: Path) -> Iterator[tuple[str, int]]:
    """``kvwatch simulate --fleet N`` in its own process; yields (base URL, pid)."""
    port = free_port()
    errors = open(tmp / "simulator.err", "w")  # noqa: SIM115 - closed below, after the process
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvwatch",
            "simulate",
            "--listen",
            f"127.0.0.1:{port}",
            "--fleet",
            str(endpoints),
            "--fleet-window",
            windows,
        ],
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        if "simulator on" not in first:
            raise RuntimeError(f"simulator did not start: {first!r}")
        # Keep draining its stdout so the pipe never fills and blocks it.
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        errors.close()


@contextlib.contextmanager
def database(kind: str, tmp: Path, server_url: str) -> Iterator[str]:
    """A fresh, empty database URL: a SQLite file, or a new database on the server."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp / 'kvwatch.db'}"
        return
    server = make_url(server_url)
    admin = create_engine(server, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    name = f"kvwatch_scale_{secrets.token_hex(4)}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@dataclass
class Options:
    endpoints: int
    duration: float
    interval: float
    jitter: float
    probes: list[str]
    windows: str
    db: str
    postgres: str
    keep_logs: bool
    fixed: bool = False
    steps: list[float] = field(default_factory=list)
    budget: float = 330.0


@dataclass
class Result:
    db: str
    wall: float
    lags: list[float] = field(default_factory=list)
    steady_lags: list[float] = field(default_factory=list)
    writes: list[float] = field(default_factory=list)
    verdicts: dict[str, int] = field(default_factory=dict)
    probes: int = 0
    peak_mb: float = 0.0
    end_mb: float = 0.0
    cpu: float = 0.0
    sim_cpu: float = 0.0
    db_cpu: float = 0.0  # PostgreSQL server processes (0 on SQLite: it runs inside kvwatch)
    loadavg: str = ""
    expected: int = 0  # slots of the measured window
    lost: int = 0
    duplicates: int = 0
    window_seconds: float = 0.0

    @property
    def steady_p99(self) -> float | None:
        return percentile(self.steady_lags, 99) if self.steady_lags else None

    steady_finished: int = 0  # probes finished after the first interval
    steady_seconds: float = 0.0

    @property
    def achieved(self) -> float:
        """Probes finished per second after the first interval (start-up is over)."""
        return self.steady_finished / self.steady_seconds if self.steady_seconds else 0.0

    @property
    def cpu_per_probe_ms(self) -> float:
        return 1000 * self.cpu / self.probes if self.probes else math.nan


def write_config(opts: Options, tmp: Path, sim_url: str, db_url: str) -> Path:
    fleet = windowed_fleet(opts.endpoints, opts.windows)
    config = {
        "database": db_url,
        "listen": f"127.0.0.1:{free_port()}",
        "replica": "bench-scale",
        "log_level": "info",
        "defaults": {
            "interval": f"{opts.interval:g}s",
            "jitter": f"{opts.jitter:g}s",
        },
        "endpoints": [
            {
                "name": e.name,
                "url": f"{sim_url}/{e.name}/v1",
                "model": DEMO_MODEL,
                "flavour": "vllm",
                "context_window": e.window,
                "tokenizer": "server",
                "probes": opts.probes,
            }
            for e in fleet
        ],
    }
    path = tmp / "kvwatch.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_one(opts: Options, db_kind: str) -> Result:
    tmp = Path(tempfile.mkdtemp(prefix=f"kvwatch-scale-{db_kind}-"))
    with (
        simulator(opts.endpoints, opts.windows, tmp) as (sim_url, sim_pid),
        database(db_kind, tmp, opts.postgres) as db_url,
    ):
        config = write_config(opts, tmp, sim_url, db_url)
        log_path = tmp / "kvwatch.log"
        sim_cpu0 = cpu_seconds(sim_pid)
        db_cpu0 = postgres_cpu_seconds() if db_kind == "postgres" else 0.0
        with open(log_path, "w") as log, open(tmp / "kvwatch.err", "w") as err:
            start = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-m", "kvwatch", "run", "--config", str(config)],
                stdout=log,
                stderr=err,
            )
            result = Result(db=db_kind, wall=0.0, loadavg=Path("/proc/loadavg").read_text())
            started = time.time()
            try:
                while time.monotonic() - start < opts.duration:
                    if proc.poll() is not None:
                        raise RuntimeError(
                            f"kvwatch exited {proc.returncode}: "
                            f"{(tmp / 'kvwatch.err').read_text()[-2000:]}"
                        )
                    time.sleep(1.0)
                    rss, hwm = memory_mb(proc.pid)
                    result.end_mb, result.peak_mb = rss, max(result.peak_mb, hwm)
                result.cpu = cpu_seconds(proc.pid)
                result.wall = time.monotonic() - start
                result.sim_cpu = cpu_seconds(sim_pid) - sim_cpu0
                if db_kind == "postgres":
                    result.db_cpu = postgres_cpu_seconds() - db_cpu0
            finally:
                stopped = time.time()
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            count_slots(db_url, result, opts, started, stopped)
    read_log(log_path, result, opts.interval)
    result.steady_finished = finished_between(log_path, started + opts.interval, stopped)
    result.steady_seconds = stopped - started - opts.interval
    if opts.keep_logs:
        print(f"# logs kept in {tmp}", file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def count_slots(db_url: str, result: Result, opts: Options, started: float, stopped: float) -> None:
    """Lost and duplicate results, from the database: every (endpoint, kind) must have
    exactly one finished first probe (not a confirmation) for each slot of the measured
    window: from the first slot after one interval (first runs are spread over it) to the
    last slot that was due at least 5 s before kvwatch was stopped."""
    interval = int(opts.interval)
    first = math.ceil((started + opts.interval) / interval) * interval
    last = math.floor((stopped - opts.interval - 5) / interval) * interval
    if last < first:
        return
    engine = create_engine(db_url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                text(
                    "SELECT endpoint, kind, slot, count(*) FROM probes "
                    "WHERE state = 'done' AND confirms_probe_id IS NULL AND slot IS NOT NULL "
                    "GROUP BY endpoint, kind, slot"
                )
            ).all()
    finally:
        engine.dispose()
    runs = {(str(e), str(k), int(s)): int(n) for e, k, s, n in rows}
    slots = range(first, last + 1, interval)
    fleet = windowed_fleet(opts.endpoints, opts.windows)
    expected = [(e.name, k, s) for e in fleet for k in opts.probes for s in slots]
    result.expected = len(expected)
    result.lost = sum(1 for key in expected if key not in runs)
    result.duplicates = sum(n - 1 for n in runs.values() if n > 1)
    result.window_seconds = len(slots) * opts.interval


def finished_between(path: Path, since: float, until: float) -> int:
    """Probe lines logged between two epoch times."""
    count = 0
    with open(path) as f:
        for line in f:
            if line.startswith("{") and '"event": "probe"' in line:
                at = datetime.fromisoformat(json.loads(line)["timestamp"]).timestamp()
                count += since <= at < until
    return count


def read_log(path: Path, result: Result, warmup: float) -> None:
    first: float | None = None
    with open(path) as f:
        for line in f:
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            if event.get("event") != "probe":
                continue
            result.probes += 1
            verdict = str(event.get("verdict"))
            result.verdicts[verdict] = result.verdicts.get(verdict, 0) + 1
            if event.get("store_write_seconds") is not None:
                result.writes.append(float(event["store_write_seconds"]))
            lag = event.get("lag_seconds")
            if lag is None:
                continue
            result.lags.append(float(lag))
            slot = float(event.get("slot") or 0)
            first = slot if first is None else min(first, slot)
            # After the first interval: start-up (registration, first runs) is over.
            if slot >= first + warmup:
                result.steady_lags.append(float(lag))


def lag_line(label: str, lags: list[float]) -> str:
    if not lags:
        return f"{label}: no scheduled probes"
    return (
        f"{label}: p50 {percentile(lags, 50):.3f} s, p99 {percentile(lags, 99):.3f} s, "
        f"max {max(lags):.3f} s (n={len(lags)})"
    )


def report(opts: Options, r: Result) -> None:
    print(f"## {r.db}  (load average at start: {r.loadavg.split()[0:3]})")
    print(lag_line("scheduling lag, all", r.lags))
    print(lag_line("scheduling lag, after 1st interval", r.steady_lags))
    print(
        f"kvwatch RSS: peak {r.peak_mb:.0f} MB, end {r.end_mb:.0f} MB; "
        f"CPU {r.cpu / r.wall * 100:.0f}% of one core ({r.cpu:.0f} s over {r.wall:.0f} s)"
    )
    print(f"simulator CPU {r.sim_cpu / r.wall * 100:.0f}% of one core")
    if r.db == "postgres":
        print(f"PostgreSQL server CPU {r.db_cpu / r.wall * 100:.0f}% of one core")
    print(
        f"probes: {r.probes} in {r.wall:.0f} s = {r.probes / r.wall:.1f}/s "
        f"(schedule: {opts.endpoints * len(opts.probes) / opts.interval:.1f}/s); "
        f"verdicts {dict(sorted(r.verdicts.items()))}"
    )
    if r.writes:
        print(
            f"database write (store_write_seconds): p50 {percentile(r.writes, 50) * 1000:.1f} ms,"
            f" p99 {percentile(r.writes, 99) * 1000:.1f} ms"
        )
    print(
        f"CPU per probe: {r.cpu_per_probe_ms:.1f} ms; slots in the measured window: "
        f"{r.expected}, lost {r.lost}, duplicates {r.duplicates}"
    )
    p99 = r.steady_p99
    lag_ok = p99 is not None and p99 <= LAG_P99_TARGET
    rss_ok = r.peak_mb <= RSS_TARGET_MB
    print(
        f"targets: lag p99 (after 1st interval) <= {LAG_P99_TARGET:g} s "
        f"{'met' if lag_ok else 'NOT met'}; RSS <= {RSS_TARGET_MB:g} MB "
        f"{'met' if rss_ok else 'NOT met'}; lost {r.lost}, duplicates {r.duplicates}"
    )
    print(TABLE_HEADER)
    print(table_row(offered(opts), r))


TABLE_HEADER = (
    "| db | offered /s | achieved /s | lag p50 s | lag p99 s | RSS peak MB "
    "| CPU ms/probe | lost | dup | load |\n|---|---|---|---|---|---|---|---|---|---|"
)


def offered(opts: Options) -> float:
    return opts.endpoints * len(opts.probes) / opts.interval


def table_row(rate: float, r: Result) -> str:
    lags = r.steady_lags
    p50 = f"{percentile(lags, 50):.2f}" if lags else "-"
    p99 = f"{percentile(lags, 99):.2f}" if lags else "-"
    load = " ".join(r.loadavg.split()[0:3])
    return (
        f"| {r.db} | {rate:.1f} | {r.achieved:.1f} | {p50} | {p99} | {r.peak_mb:.0f} "
        f"| {r.cpu_per_probe_ms:.1f} | {r.lost} | {r.duplicates} | {load} |"
    )


def saturation(opts: Options, db_kind: str) -> None:
    """Step the offered rate up until lag p99 first exceeds the target; print each step."""
    print(f"## {db_kind}: saturation (three kinds every {opts.interval:g} s)")
    print(TABLE_HEADER)
    last_ok: tuple[float, Result] | None = None
    began = time.monotonic()
    for rate in opts.steps:
        # A step takes its duration plus start-up and a graceful stop (~15 s).
        if last_ok and time.monotonic() - began + opts.duration + 15 > opts.budget:
            print(
                f"saturation ({db_kind}): time budget ({opts.budget:g} s) spent; lag p99 <= "
                f"{LAG_P99_TARGET:g} s up to {last_ok[0]:.1f} probes/s offered "
                f"({last_ok[1].achieved:.1f} achieved), higher rates not tried"
            )
            return
        endpoints = max(1, round(rate * opts.interval / len(opts.probes)))
        step = dataclasses.replace(opts, endpoints=endpoints, duration=opts.duration)
        r = run_one(step, db_kind)
        print(table_row(offered(step), r), flush=True)
        p99 = r.steady_p99
        if p99 is None or p99 > LAG_P99_TARGET or r.lost or r.duplicates:
            below = (
                f"{last_ok[0]:.1f} offered ({last_ok[1].achieved:.1f} achieved) held it"
                if last_ok
                else "no step held it"
            )
            print(
                f"saturation ({db_kind}): lag p99 first exceeds {LAG_P99_TARGET:g} s at "
                f"{offered(step):.1f} probes/s offered ({r.achieved:.1f} achieved); {below}"
            )
            return
        last_ok = (offered(step), r)
    assert last_ok is not None
    print(
        f"saturation ({db_kind}): not reached; lag p99 <= {LAG_P99_TARGET:g} s up to "
        f"{last_ok[0]:.1f} probes/s offered ({last_ok[1].achieved:.1f} achieved)"
    )


def parse(argv: list[str]) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--fixed",
        action="store_true",
        help="one fleet at one rate (--endpoints, --probes, --interval, --duration) instead "
        "of stepping the rate up to the saturation point",
    )
    parser.add_argument("--endpoints", type=int, default=1000, help="--fixed: fleet size")
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds per database (--fixed; default 600) or per step (default 90)",
    )
    parser.add_argument(
        "--interval", type=float, default=None, help="default: 60 s --fixed, 20 s stepping"
    )
    parser.add_argument("--jitter", type=float, default=None, help="default: interval - 1 s")
    parser.add_argument(
        "--probes", default=None, help="default: baseline --fixed, under,over,baseline stepping"
    )
    parser.add_argument(
        "--steps",
        default="25,35,45,55,70",
        help="offered probes/s to step through, in order, until lag p99 exceeds 1 s",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=330.0,
        help="seconds per database for stepping: no step that would end past it starts",
    )
    parser.add_argument("--fleet-window", default="2048-8192")
    parser.add_argument("--db", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument(
        "--postgres", default=os.environ.get("KVWATCH_TEST_POSTGRES_URL", DEFAULT_POSTGRES)
    )
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    interval = args.interval if args.interval is not None else (60.0 if args.fixed else 20.0)
    duration = args.duration if args.duration is not None else (600.0 if args.fixed else 90.0)
    probes = args.probes or ("baseline" if args.fixed else "under,over,baseline")
    return Options(
        endpoints=args.endpoints,
        duration=duration,
        interval=interval,
        jitter=args.jitter if args.jitter is not None else interval - 1,
        probes=[p.strip() for p in probes.split(",") if p.strip()],
        windows=args.fleet_window,
        db=args.db,
        postgres=args.postgres,
        keep_logs=args.keep_logs,
        fixed=args.fixed,
        steps=[float(x) for x in args.steps.split(",") if x.strip()],
        budget=args.budget,
    )


def main(argv: list[str] | None = None) -> None:
    # ``python -m bench scale ARGS`` passes its own argv on; ``python -m bench.scale ARGS`` too.
    if argv is None:
        argv = sys.argv[2:] if sys.argv[1:2] == ["scale"] else sys.argv[1:]
    opts = parse(argv)
    print(f"# scale — {describe()}")
    kinds = ",".join(opts.probes)
    dbs = ("sqlite", "postgres") if opts.db == "both" else (opts.db,)
    if not opts.fixed:
        print(
            f"# saturation: offered {', '.join(f'{r:g}' for r in opts.steps)} probes/s "
            f"({kinds} every {opts.interval:g} s, jitter {opts.jitter:g} s, fleet sized to "
            f"the rate), {opts.duration:g} s per step, until lag p99 > {LAG_P99_TARGET:g} s"
        )
        for db_kind in dbs:
            saturation(opts, db_kind)
        return
    print(
        f"# {opts.endpoints} simulated endpoints (windows {opts.windows}), probes "
        f"{kinds} every {opts.interval:g} s, jitter {opts.jitter:g} s, "
        f"{opts.duration:g} s per database; kvwatch run and kvwatch simulate as subprocesses"
    )
    for db_kind in dbs:
        report(opts, run_one(opts, db_kind))


if __name__ == "__main__":
    exit_on_sigterm()
    main()
