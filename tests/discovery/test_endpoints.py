"""What a source lists made into endpoints with its template: names, fields and labels."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from kvwatch.canary.model import ProbeKind
from kvwatch.config import Config, parse_config
from kvwatch.config.discovery import DiscoverySource
from kvwatch.discovery.endpoints import endpoint_name, from_groups, from_models, merge
from kvwatch.discovery.formats import ListedModel, ListError, TargetGroup


def config(source: dict[str, Any], **top: Any) -> Config:
    return parse_config(yaml.safe_dump({"discovery": [source], **top}), source="<test>")


def fleet(**template: Any) -> tuple[DiscoverySource, Config]:
    cfg = config(
        {"name": "fleet", "http_sd": {"url": "http://sd:8080/targets"}, "template": template},
        defaults={"interval": "10m"},
    )
    return cfg.discovery[0], cfg


def test_a_target_becomes_an_endpoint_with_the_template_and_its_own_labels() -> None:
    """Template settings apply, defaults merge in, the target's labels go over the template's."""
    source, cfg = fleet(
        flavour="vllm", probes=["under", "capacity"], labels={"team": "a", "x": "1"}
    )
    group = TargetGroup(
        ("10.0.0.7:8000",),
        {"__kvwatch_model": "glm-5.3", "team": "b", "__meta_kubernetes_pod_name": "vllm-0"},
    )
    [spec] = from_groups(source, cfg.defaults, [group])
    assert spec.name == "fleet-10.0.0.7-8000"
    assert spec.url == "http://10.0.0.7:8000/v1"
    assert (spec.model, spec.flavour, spec.source) == ("glm-5.3", "vllm", "fleet")
    assert spec.probes == (ProbeKind.UNDER, ProbeKind.CAPACITY)
    assert spec.interval_seconds == 600.0
    # __meta_* labels are dropped, as Prometheus drops them after relabelling.
    assert dict(spec.labels) == {"team": "b", "x": "1"}
    assert (spec.context_window, spec.source_context_window) == (None, None)


def test_reserved_labels_set_name_flavour_path_scheme_and_the_sources_figures() -> None:
    """Each __kvwatch_* label maps onto its field; the window is the source's, not config."""
    source, cfg = fleet(context_window=None)
    labels = {
        "__kvwatch_name": "glm-prod",
        "__kvwatch_model": "glm-5.3",
        "__kvwatch_flavour": "sglang",
        "__kvwatch_path": "/serving/v1",
        "__kvwatch_context_window": "1048576",
        "__kvwatch_kv_pool_tokens": "681280",
        "__scheme__": "https",
    }
    [spec] = from_groups(source, cfg.defaults, [TargetGroup(("glm.internal:443",), labels)])
    assert (spec.name, spec.url, spec.flavour) == (
        "glm-prod",
        "https://glm.internal:443/serving/v1",
        "sglang",
    )
    assert (spec.context_window, spec.kv_pool_tokens) == (None, None)
    assert (spec.source_context_window, spec.source_kv_pool_tokens) == (1048576, 681280)


def test_a_templates_context_window_is_configuration_and_stays_beside_the_sources() -> None:
    """The template's window is the spec's own (it wins); the label's is kept as the source's."""
    source, cfg = fleet(context_window=65536)
    labels = {"__kvwatch_model": "m", "__kvwatch_context_window": "131072"}
    [spec] = from_groups(source, cfg.defaults, [TargetGroup(("h:1",), labels)])
    assert (spec.context_window, spec.source_context_window) == (65536, 131072)


@pytest.mark.parametrize(
    ("labels", "error"),
    [
        ({}, "needs the __kvwatch_model label"),
        (
            {"__kvwatch_model": "m", "__kvwatch_flavor": "vllm"},
            'unknown reserved label "__kvwatch_flavor"',
        ),
        (
            {"__kvwatch_model": "m", "__kvwatch_flavour": "triton"},
            "__kvwatch_flavour must be one of",
        ),
        (
            {"__kvwatch_model": "m", "__kvwatch_context_window": "128k"},
            "__kvwatch_context_window must be a positive integer",
        ),
        ({"__kvwatch_model": "m", "endpoint": "x"}, 'label "endpoint" is reserved'),
        ({"__kvwatch_model": "m", "a-b": "x"}, '"a-b" is not a valid label name'),
        ({"__kvwatch_model": "m", "__scheme__": "grpc"}, "__scheme__ must be http or https"),
        ({"__kvwatch_model": "m", "__kvwatch_name": "-x"}, "__kvwatch_name must be 1 to 63"),
    ],
)
def test_a_target_that_cannot_be_an_endpoint_refuses_the_list_naming_it(
    labels: dict[str, str], error: str
) -> None:
    """The error names the group and target and says what is wrong."""
    source, cfg = fleet()
    with pytest.raises(ListError, match=f'^group 1, target "h:1": {error}'):
        from_groups(source, cfg.defaults, [TargetGroup(("h:1",), labels)])


def test_two_targets_that_make_one_name_refuse_the_list() -> None:
    """Names must be unique within a source: a clash is an error, not a silent overwrite."""
    source, cfg = fleet()
    group = TargetGroup(("a:1", "b:1"), {"__kvwatch_model": "m", "__kvwatch_name": "same"})
    with pytest.raises(ListError, match='two targets make the endpoint "same"'):
        from_groups(source, cfg.defaults, [group])


def test_generated_names_are_sanitised_and_long_ones_cut_with_a_hash() -> None:
    """Unsafe characters become '-'; over 63 characters, a hash keeps two names apart."""
    assert endpoint_name("gw", "meta-llama/Llama 3.1:70b") == "gw-meta-llama-Llama-3.1-70b"
    first = endpoint_name("gw", "x" * 80 + "a")
    second = endpoint_name("gw", "x" * 80 + "b")
    assert len(first) == len(second) == 63
    assert first != second and first[:54] == second[:54]


def test_a_gateway_list_makes_endpoints_at_the_gateway_filtered_by_include_and_exclude() -> None:
    """Every kept model is probed at the gateway's url, with the window it lists."""
    cfg = config(
        {
            "name": "gw",
            "gateway": {
                "url": "http://litellm:4000",
                "api": "litellm",
                "include": ["glm-*", "qwen*"],
                "exclude": ["*-preview"],
            },
        }
    )
    listed = [
        ListedModel("glm-5.3", 200000),
        ListedModel("glm-6-preview", 1),
        ListedModel("qwen3", None),
        ListedModel("llama", 8192),
    ]
    specs = from_models(cfg.discovery[0], cfg.defaults, listed)
    assert [(s.name, s.url, s.model, s.source_context_window) for s in specs] == [
        ("gw-glm-5.3", "http://litellm:4000", "glm-5.3", 200000),
        ("gw-qwen3", "http://litellm:4000", "qwen3", None),
    ]


def test_static_endpoints_win_a_name_clash_and_the_discovered_one_is_set_aside() -> None:
    """merge keeps the static endpoint and reports the discovered one with its name."""
    source, cfg = fleet()
    static = parse_config(
        "endpoints: [{name: glm, url: 'http://a:1/v1', model: m}]", source="<t>"
    ).resolved_endpoints()
    group = TargetGroup(("b:1", "c:1"), {"__kvwatch_model": "m"})
    [clash] = from_groups(
        source,
        cfg.defaults,
        [TargetGroup(("b:1",), {"__kvwatch_model": "m", "__kvwatch_name": "glm"})],
    )
    others = from_groups(source, cfg.defaults, [group])
    kept, set_aside = merge(static, [clash, *others])
    assert [s.name for s in kept] == ["glm", "fleet-b-1", "fleet-c-1"]
    assert kept[0].url == "http://a:1/v1"
    assert set_aside == [clash]
