"""kvwatch's configuration: the YAML schema, loading, and the capacity gate.

``check-config`` and ``run`` need two calls::

    config = load_config(path)            # raises ConfigError with every problem found
    for line in capacity_violations(config):
        ...                               # refuse to start
"""

from kvwatch.config.capacity import capacity_message, capacity_violations, exceeds_capacity
from kvwatch.config.durations import DurationError, format_duration, parse_duration
from kvwatch.config.errors import ConfigError
from kvwatch.config.loader import load_config, parse_config
from kvwatch.config.model import Config
from kvwatch.config.resolve import EndpointSpec, TenantSpec

__all__ = [
    "Config",
    "ConfigError",
    "DurationError",
    "EndpointSpec",
    "TenantSpec",
    "capacity_message",
    "capacity_violations",
    "exceeds_capacity",
    "format_duration",
    "load_config",
    "parse_config",
    "parse_duration",
]
