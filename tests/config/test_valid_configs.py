"""Valid configurations load, expand, read their secrets and resolve to concrete endpoints."""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path

import pytest

from kvwatch.canary.model import ProbeKind
from kvwatch.config import Config, ConfigError, EndpointSpec, load_config, parse_config

VALID = Path(__file__).parent / "valid"
REPO = Path(__file__).parents[2]
ENDPOINT = """
endpoints:
  - name: glm-prod
    url: http://10.0.0.1:8000/v1
    model: glm-5.3
"""


def only_endpoint(config: Config) -> EndpointSpec:
    [spec] = config.resolved_endpoints()
    return spec


def test_it_loads_the_design_example_and_resolves_every_field() -> None:
    """DESIGN §7's example loads and its endpoint resolves with defaults merged in."""
    config = load_config(VALID / "design_example.yaml", env={"GLM_API_KEY": "sk-glm"})

    assert config.database == "sqlite:///kvwatch.db"
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", 9464)
    assert config.alertmanager.urls == ["http://127.0.0.1:9093"]
    spec = only_endpoint(config)
    assert spec.api_key is not None
    assert spec.api_key.get_secret_value() == "sk-glm"
    assert dataclasses.replace(spec, api_key=None) == EndpointSpec(
        name="glm-prod",
        url="http://10.0.0.1:8000/v1",
        flavour="openai",
        model="glm-5.3",
        context_window=1048576,
        kv_pool_tokens=681280,
        api_key=None,
        tokenizer="server",
        probes=(ProbeKind.UNDER, ProbeKind.OVER, ProbeKind.BASELINE),
        interval_seconds=1800.0,
        jitter_seconds=30.0,
        timeouts={
            ProbeKind.UNDER: 600.0,
            ProbeKind.OVER: 300.0,
            ProbeKind.BASELINE: 120.0,
            ProbeKind.CAPACITY: 30.0,
            ProbeKind.EDGE: 600.0,
            ProbeKind.BISECT: 600.0,
            ProbeKind.BURST: 300.0,
            ProbeKind.CACHE: 300.0,
            ProbeKind.BISECT: 600.0,
        },
        max_tokens=16,
        baseline_tokens=1536,
        stream=True,
        marker_depths=(0.0,),
        confirm=True,
        body_limit_bytes=4194304,
        labels={"team": "inference"},
        intervals={ProbeKind.UNDER: 1800.0, ProbeKind.OVER: 1800.0, ProbeKind.BASELINE: 1800.0},
        jitters={ProbeKind.UNDER: 30.0, ProbeKind.OVER: 30.0, ProbeKind.BASELINE: 30.0},
    )


def test_it_loads_the_reference_example_at_the_repository_root() -> None:
    """kvwatch.example.yaml, which documents every key, is itself a valid configuration."""
    config = load_config(REPO / "kvwatch.example.yaml", env={"GLM_API_KEY": "sk-glm"})
    assert [spec.name for spec in config.resolved_endpoints()] == ["glm-prod", "llama-local"]
    assert [source.name for source in config.discovery] == ["fleet"]


def test_it_uses_the_named_defaults_for_everything_left_out() -> None:
    """A file with one empty section gets the documented defaults everywhere."""
    config = parse_config("endpoints: []\n", env={})
    assert config.database == "sqlite:///kvwatch.db"
    assert config.listen == "127.0.0.1:9464"
    assert config.log_level == "info"
    assert config.alertmanager.urls == []
    assert config.alertmanager.resend_interval == 60.0
    assert config.alertmanager.timeout == 10.0
    assert config.defaults.interval == 900.0
    assert config.defaults.max_tokens == 32
    assert config.defaults.baseline_tokens == 1536
    assert config.defaults.jitter is None  # follows each endpoint's interval
    assert config.defaults.body_limit_bytes == 4194304
    assert config.resolved_endpoints() == []


def test_it_inherits_defaults_and_merges_timeouts_key_by_key() -> None:
    """An endpoint overriding one timeout keeps the other kinds from defaults."""
    text = (
        "defaults: {interval: 5m, jitter: 10s, stream: false, timeouts: {over: 1m}}\n"
        + ENDPOINT
        + "    timeouts: {under: 20m}\n    probes: [baseline]\n"
    )
    spec = only_endpoint(parse_config(text, env={}))
    assert spec.interval_seconds == 300.0
    assert spec.jitter_seconds == 10.0
    assert spec.stream is False
    assert spec.probes == (ProbeKind.BASELINE,)
    assert dict(spec.timeouts) == {
        ProbeKind.UNDER: 1200.0,
        ProbeKind.OVER: 60.0,
        ProbeKind.BASELINE: 120.0,
        ProbeKind.CAPACITY: 30.0,
        ProbeKind.EDGE: 600.0,
        ProbeKind.BISECT: 600.0,
        ProbeKind.BURST: 300.0,
        ProbeKind.CACHE: 300.0,
    }


def test_a_resolved_endpoint_cannot_be_changed() -> None:
    """EndpointSpec and its mappings are read-only, so tasks can share one safely."""
    spec = only_endpoint(parse_config(ENDPOINT + "    labels: {team: a}\n", env={}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.labels["team"] = "b"  # type: ignore[index]


@pytest.mark.parametrize(
    ("written", "env", "expanded"),
    [
        ("${MODEL:-glm-5.3}", {}, "glm-5.3"),
        ("${MODEL:-glm-5.3}", {"MODEL": ""}, "glm-5.3"),
        ("${MODEL:-glm-5.3}", {"MODEL": "qwen3"}, "qwen3"),
        ("${MODEL}", {"MODEL": "qwen3"}, "qwen3"),
        ("${FAMILY}-${SIZE:-7b}", {"FAMILY": "qwen"}, "qwen-7b"),
        ("cost$$5", {}, "cost$5"),
        ("$${NOT_A_VAR}", {}, "${NOT_A_VAR}"),
        ("price $5", {}, "price $5"),
    ],
)
def test_it_expands_environment_references(
    written: str, env: dict[str, str], expanded: str
) -> None:
    """${VAR}, ${VAR:-default} and $$ expand like a shell would, inside any string."""
    text = f'endpoints:\n  - name: a\n    url: http://a:1/v1\n    model: "{written}"\n'
    assert only_endpoint(parse_config(text, env=env)).model == expanded


def test_an_environment_value_cannot_add_yaml_structure() -> None:
    """A variable holding YAML stays one string value instead of becoming new keys."""
    spec = only_endpoint(
        parse_config(ENDPOINT + "    labels: {team: '${TEAM}'}\n", env={"TEAM": "x\nseverity: p1"})
    )
    assert dict(spec.labels) == {"team": "x\nseverity: p1"}


def test_it_reads_numbers_and_flags_from_environment_variables() -> None:
    """Expanded values are strings, yet numeric, boolean and duration fields accept them."""
    text = (
        ENDPOINT + "    context_window: ${WINDOW}\n    stream: ${STREAM}\n    interval: ${EVERY}\n"
    )
    spec = only_endpoint(
        parse_config(text, env={"WINDOW": "131072", "STREAM": "false", "EVERY": "90"})
    )
    assert (spec.context_window, spec.stream, spec.interval_seconds) == (131072, False, 90.0)


def test_it_reads_secret_files_relative_to_the_config_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """api_key_file and password_file resolve against the file's directory, not the cwd."""
    monkeypatch.chdir(tmp_path)
    config = load_config(VALID / "file_secrets.yaml", env={})
    spec = only_endpoint(config)
    assert spec.api_key is not None
    assert spec.api_key.get_secret_value() == "sk-from-file"
    auth = config.alertmanager.basic_auth
    assert auth is not None
    assert auth.password_file is not None
    assert auth.password_file.path == VALID / "secrets" / "alertmanager.pass"
    # Only one trailing newline is dropped: the file holds "am pass\n\n".
    assert auth.password_file.value.get_secret_value() == "am pass\n"
    assert config.alertmanager.urls == ["https://am-1.example.com", "https://am-2.example.com"]


def test_it_never_shows_secrets_in_reprs() -> None:
    """Keys, passwords, tokens and a database password stay out of repr() and str()."""
    text = (
        "database: postgresql+psycopg://kvwatch:db-pass-123@db/kvwatch\n"
        "alertmanager: {urls: [http://am:9093], bearer_token: tok-123}\n"
        + ENDPOINT
        + "    api_key: sk-123\n"
    )
    config = parse_config(text, env={})
    shown = repr(config) + str(config) + repr(config.resolved_endpoints())
    for secret in ("db-pass-123", "tok-123", "sk-123"):
        assert secret not in shown
    assert config.database == "postgresql+psycopg://kvwatch:db-pass-123@db/kvwatch"


def test_it_keeps_the_secret_file_path_but_not_its_content_in_reprs() -> None:
    """A file secret's repr names the file so a reader knows where the value came from."""
    config = load_config(VALID / "file_secrets.yaml", env={})
    shown = repr(config)
    assert "sk-from-file" not in shown
    assert "glm.key" in shown


def test_it_accepts_ipv6_and_named_hosts_for_listen() -> None:
    """listen takes a bracketed IPv6 address or a host name, each with a port."""
    ipv6 = parse_config("listen: '[::1]:9464'\n", env={})
    assert (ipv6.listen_host, ipv6.listen_port) == ("::1", 9464)
    named = parse_config("listen: kvwatch.internal:80\n", env={})
    assert (named.listen_host, named.listen_port) == ("kvwatch.internal", 80)


def test_the_replica_id_defaults_to_the_host_name() -> None:
    """Without `replica` the host name identifies this kvwatch; with it, the given id."""
    assert parse_config("log_level: debug\n", env={}).replica_id == socket.gethostname()
    assert parse_config("replica: kvwatch-b\n", env={}).replica_id == "kvwatch-b"


def test_a_region_is_optional_and_taken_from_the_environment() -> None:
    """Without `region` kvwatch is single-region; with it, any 1-63 chars of [A-Za-z0-9_.-]."""
    assert parse_config("log_level: debug\n", env={}).region is None
    assert parse_config("region: eu-west-1\n", env={}).region == "eu-west-1"
    assert parse_config("region: _a.B-9\n", env={}).region == "_a.B-9"
    assert parse_config(f"region: {'r' * 63}\n", env={}).region == "r" * 63
    expanded = parse_config("region: ${KVWATCH_REGION}\n", env={"KVWATCH_REGION": "us"})
    assert expanded.region == "us"


def test_an_endpoint_may_label_itself_region_only_without_multi_region_mode() -> None:
    """A static `region` label is the endpoint's own business until kvwatch sets one."""
    labelled = ENDPOINT + "    labels: {region: us}\n"
    assert only_endpoint(parse_config(labelled, env={})).labels == {"region": "us"}
    with pytest.raises(ConfigError) as caught:
        parse_config("region: eu\n" + labelled, env={})
    assert caught.value.errors == [
        "endpoints[0].labels.region: is reserved: kvwatch sets it when region is set"
    ]


def test_it_resolves_local_tokenizer_specs(tmp_path: Path) -> None:
    """hf: paths become absolute against the base directory; tiktoken encodings are checked."""
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}", encoding="utf-8")
    hf = parse_config(
        ENDPOINT + "    tokenizer: hf:tok/tokenizer.json\n", base_dir=tmp_path, env={}
    )
    assert only_endpoint(hf).tokenizer == f"hf:{tmp_path / 'tok' / 'tokenizer.json'}"
    tiktoken = parse_config(ENDPOINT + "    tokenizer: tiktoken:cl100k_base\n", env={})
    assert only_endpoint(tiktoken).tokenizer == "tiktoken:cl100k_base"
    with pytest.raises(ConfigError, match=r"unknown tiktoken encoding 'nope'"):
        parse_config(ENDPOINT + "    tokenizer: tiktoken:nope\n", env={})


def test_it_names_the_source_in_file_level_errors(tmp_path: Path) -> None:
    """A missing file, and errors in text given directly, name where the text came from."""
    missing = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as caught:
        load_config(missing)
    assert caught.value.errors == [f"{missing}: cannot read: No such file or directory"]
    with pytest.raises(ConfigError) as caught:
        parse_config("", source="inline")
    assert caught.value.errors == ["inline: the configuration is empty"]


def test_it_uses_the_process_environment_when_no_env_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without env=, ${VAR} reads os.environ, which is what `kvwatch run` relies on."""
    monkeypatch.setenv("KVWATCH_TEST_REPLICA", "from-env")
    assert parse_config("replica: ${KVWATCH_TEST_REPLICA}\n").replica_id == "from-env"


def test_a_zero_jitter_is_allowed():
    """jitter: 0s means probing exactly on the interval."""
    from kvwatch.config import parse_config

    config = parse_config(
        "endpoints:\n  - {name: a, url: 'http://h/v1', model: m, context_window: 4096,"
        " jitter: 0s}\n"
    )
    assert config.resolved_endpoints()[0].jitter_seconds == 0.0


@pytest.mark.parametrize(
    ("text", "interval", "jitter"),
    [
        ("defaults: {interval: 10s}\n" + ENDPOINT, 10.0, 1.0),
        ("defaults: {interval: 5s}\n" + ENDPOINT, 5.0, 0.5),
        (ENDPOINT + "    interval: 10s\n", 10.0, 1.0),
        (ENDPOINT + "    interval: 2m\n", 120.0, 12.0),
        (ENDPOINT, 900.0, 30.0),
    ],
    ids=["defaults-10s", "defaults-5s", "endpoint-10s", "endpoint-2m", "default-15m"],
)
def test_a_short_interval_alone_gets_a_jitter_that_follows_it(
    text: str, interval: float, jitter: float
) -> None:
    """Without a written jitter, the jitter is the smaller of 30 s and a tenth of the interval."""
    spec = only_endpoint(parse_config(text, env={}))
    assert (spec.interval_seconds, spec.jitter_seconds) == (interval, jitter)


def test_a_jitter_written_in_defaults_applies_to_an_endpoint_with_a_longer_interval() -> None:
    """A jitter the user wrote is kept as written, not capped to a tenth of the interval."""
    spec = only_endpoint(
        parse_config("defaults: {jitter: 50s}\n" + ENDPOINT + "    interval: 1m\n", env={})
    )
    assert spec.jitter_seconds == 50.0


def test_it_resolves_tenants_with_their_keys_from_env_and_files(tmp_path: Path) -> None:
    """Each tenant keeps its name and a secret key; without api_key the first one is default."""
    key_file = tmp_path / "globex.key"
    key_file.write_text("sk-globex\n", encoding="utf-8")
    path = tmp_path / "kvwatch.yaml"
    path.write_text(
        ENDPOINT
        + "    tenants:\n"
        + "      - name: acme\n"
        + "        api_key: ${ACME_KEY}\n"
        + "      - name: globex\n"
        + f"        api_key_file: {key_file}\n",
        encoding="utf-8",
    )
    spec = only_endpoint(load_config(path, env={"ACME_KEY": "sk-acme"}))
    assert [t.name for t in spec.tenants] == ["acme", "globex"]
    assert [t.api_key.get_secret_value() for t in spec.tenants] == ["sk-acme", "sk-globex"]
    assert "sk-acme" not in repr(spec) and "sk-globex" not in repr(spec)
    assert spec.default_tenant is not None and spec.default_tenant.name == "acme"


def test_it_loads_discovery_sources_with_their_templates_and_anchors_file_globs() -> None:
    """Each source kind loads; file_sd globs are anchored at the config's directory."""
    config = load_config(VALID / "discovery.yaml", env={})

    fleet, k8s, litellm = config.discovery
    assert (fleet.kind, k8s.kind, litellm.kind) == ("file_sd", "http_sd", "gateway")
    assert fleet.file_sd is not None
    assert fleet.file_sd.files == [str(VALID / "targets/*.json"), str(VALID / "targets/*.yaml")]
    assert (fleet.refresh_interval, k8s.refresh_interval, litellm.refresh_interval) == (
        300.0,
        30.0,
        60.0,
    )
    assert k8s.template.flavour == "vllm"
    assert k8s.template.probes == ["under", "over", "capacity"]
    assert litellm.gateway is not None
    assert litellm.gateway.exclude == ["*-preview"]
    assert litellm.template.api_key_file is not None
    assert [spec.name for spec in config.resolved_endpoints()] == ["glm-prod"]


def test_probes_send_w3c_traceparent_unless_told_otherwise() -> None:
    """No trace section: W3C in its own header; b3 goes in `b3`; a named header is used."""
    assert parse_config("endpoints: []\n", env={}).trace.model_dump() == {
        "format": "w3c",
        "header": None,
    }
    b3 = parse_config("trace: {format: b3}\n", env={}).trace
    assert (b3.format, b3.header) == ("b3", None)
    named = parse_config("trace: {header: X-Request-Trace}\n", env={}).trace
    assert (named.format, named.header) == ("w3c", "x-request-trace")


def test_burst_settings_inherit_from_defaults_and_an_endpoint_overrides_them() -> None:
    """burst: in defaults reaches every endpoint; an endpoint's own block replaces it."""
    text = (
        "defaults: {burst: {sizes: [5, 11], prompt_tokens: 256}}\n"
        "endpoints:\n"
        "  - {name: a, url: 'http://10.0.0.1:8000/v1', model: m, probes: [burst]}\n"
        "  - {name: b, url: 'http://10.0.0.2:8000/v1', model: m, burst: {sizes: [3]}}\n"
    )
    first, second = parse_config(text, env={}).resolved_endpoints()
    assert first.probes == (ProbeKind.BURST,)
    assert (first.burst_sizes, first.burst_prompt_tokens) == ((5, 11), 256)
    assert (second.burst_sizes, second.burst_prompt_tokens) == ((3,), 512)


def test_the_cache_probe_takes_its_document_size_and_returning_session_from_defaults() -> None:
    """cache: {document_tokens, return_after} in defaults, overridden per endpoint; the
    returning session is off unless asked for."""
    config = parse_config(
        "defaults:\n  cache: {document_tokens: 2000, return_after: 30m}\n"
        "endpoints:\n"
        "  - {name: a, url: 'http://h/v1', model: m, probes: [cache]}\n"
        "  - {name: b, url: 'http://h/v1', model: m, cache: {document_tokens: 512}}\n"
    )
    a, b = config.resolved_endpoints()
    assert (a.cache_document_tokens, a.cache_return_after) == (2000, 1800.0)
    assert (b.cache_document_tokens, b.cache_return_after) == (512, None)
    assert ProbeKind.CACHE in a.probes and ProbeKind.CACHE not in b.probes
