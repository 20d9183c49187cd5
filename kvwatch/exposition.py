"""``GET /metrics`` in Prometheus' text format, rendered one series at a time (issue 25).

prometheus_client's ``generate_latest`` builds each family's samples into a list (a
``Sample`` and a label dict per series), renders every line of every family into another
list and joins them. At 1,000 endpoints (154,000 lines, a 14.5 MB body) one scrape held
52 MB of small Python objects at its peak (``python -m bench scrape``). Small objects live
in CPython's own arenas, which go back to the OS only when wholly empty; a scrape runs in a
web worker thread while the event loop keeps allocating long-lived objects, so every peak
left arenas pinned by a few survivors and RSS crept up with scrapes alone.

:func:`render` writes the same bytes (``tests/metrics/test_exposition.py`` compares them
with ``generate_latest`` on kvwatch's own registry, so an upgrade of the client that changes
either side fails the tests) from each family's series as the client's per-series generator
yields them, into one growing buffer flushed every ``_FLUSH`` lines: the only peak is the
body itself, in a few large blocks that malloc gives back when the response is sent.

Only the text format (0.0.4), which is what ``GET /metrics`` has always served, and only
what kvwatch's registry holds: a registry with ``target_info``, or a client without the
internals this reads, is rendered by ``generate_latest`` instead.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name
from prometheus_client.utils import floatToGoString

# Lines rendered before they are joined into the body: enough that joining is cheap, few
# enough that the small strings in flight stay a few hundred kB.
_FLUSH = 2048
# OpenMetrics-only series that the text format puts into gauge families of their own,
# after the family they belong to (as generate_latest does).
_TRAILING = ("_created", "_gsum", "_gcount")
# OpenMetrics types as the text format names them.
_TEXT_TYPE = {
    "info": "gauge",
    "stateset": "gauge",
    "gaugehistogram": "histogram",
    "unknown": "untyped",
}

Series = tuple[str, dict[str, str], float, Any]  # name, labels, value, timestamp


def render(registry: CollectorRegistry) -> bytes:
    """Everything ``registry`` holds, as ``generate_latest(registry)`` renders it."""
    collectors = _collectors(registry)
    if collectors is None:
        return generate_latest(registry)
    body = io.BytesIO()
    for collector in collectors:
        for name, documentation, mtype, series in _families(collector):
            _render_family(name, documentation, mtype, series, body)
    # BytesIO hands over its buffer without a copy when nothing else refers to it.
    return body.getvalue()


def _collectors(registry: CollectorRegistry) -> list[Any] | None:
    # The registry's own list of collectors, as its collect() copies it; None where this
    # client version keeps it elsewhere, or where target_info (an extra family that
    # collect() adds) is set.
    lock = getattr(registry, "_lock", None)
    names = getattr(registry, "_collector_to_names", None)
    if lock is None or not isinstance(names, dict) or getattr(registry, "_target_info", None):
        return None
    with lock:
        return list(names)


def _families(collector: Any) -> Iterator[tuple[str, str, str, Iterable[Series]]]:
    if isinstance(collector, MetricWrapperBase):
        # collect() would build the whole family (a Sample and a dict per series) before
        # returning it; _samples() yields them one at a time, from a copy of the children.
        family = collector._get_metric()  # type: ignore[no-untyped-call]
        prefix = collector._name
        series = ((prefix + s[0], s[1], s[2], s[3]) for s in collector._samples())
        yield family.name, family.documentation, family.type, series
        return
    for family in collector.collect():
        yield (
            family.name,
            family.documentation,
            family.type,
            ((s.name, s.labels, s.value, s.timestamp) for s in family.samples),
        )


def _render_family(
    name: str, documentation: str, mtype: str, series: Iterable[Series], body: io.BytesIO
) -> None:
    shown = name + "_total" if mtype == "counter" else name + "_info" if mtype == "info" else name
    help_text = documentation.replace("\\", r"\\").replace("\n", r"\n")
    lines = [
        f"# HELP {_metric_name(shown)} {help_text}\n",
        f"# TYPE {_metric_name(shown)} {_TEXT_TYPE.get(mtype, mtype)}\n",
    ]
    trailing: dict[str, list[str]] = {}
    trailing_names = {name + suffix: suffix for suffix in _TRAILING}
    for sample in series:
        suffix = trailing_names.get(sample[0])
        if suffix is not None:
            trailing.setdefault(suffix, []).append(_line(sample))
            continue
        lines.append(_line(sample))
        if len(lines) >= _FLUSH:
            body.write("".join(lines).encode())
            lines.clear()
    for suffix, extra in sorted(trailing.items()):
        lines.append(f"# HELP {_metric_name(name + suffix)} {help_text}\n")
        lines.append(f"# TYPE {_metric_name(name + suffix)} gauge\n")
        lines.extend(extra)
    body.write("".join(lines).encode())


def _line(sample: Series) -> str:
    name, labels, value, timestamp = sample
    if labels:
        pairs = ",".join(
            f'{_label_name(k)}="{_escape_value(v)}"' for k, v in sorted(labels.items())
        )
        labelstr = "{" + pairs + "}"
    else:
        labelstr = ""
    stamp = "" if timestamp is None else f" {int(float(timestamp) * 1000):d}"
    value_text = floatToGoString(value)  # type: ignore[no-untyped-call]
    return f"{_metric_name(name)}{labelstr} {value_text}{stamp}\n"


# Metric and label names are a few hundred at most, fixed by the code: the caches hold them
# all, so each is checked against the legacy character set once, not on every line.
@functools.lru_cache(maxsize=1024)
def _metric_name(name: str) -> str:
    return escape_metric_name(name)


@functools.lru_cache(maxsize=256)
def _label_name(name: str) -> str:
    return escape_label_name(name)


def _escape_value(value: str) -> str:
    if "\\" not in value and "\n" not in value and '"' not in value:
        return value
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
