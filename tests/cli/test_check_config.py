"""`kvwatch check-config` and `kvwatch run` refuse bad configs with exact messages."""

from __future__ import annotations

import subprocess

from tests.helpers.processes import kvwatch_cmd

GATED = """
endpoints:
  - name: glm-prod
    url: http://127.0.0.1:9/v1
    model: glm-5.3
    context_window: 1048576
    kv_pool_tokens: 681280
"""


def run(*args: str, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run(kvwatch_cmd(*args), capture_output=True, text=True, cwd=cwd, timeout=60)


def test_check_config_refuses_a_window_larger_than_the_kv_pool(tmp_path):
    """The capacity gate: exit 1 with the endpoint's numbers and name on the line."""
    (tmp_path / "kvwatch.yaml").write_text(GATED)
    result = run("check-config", cwd=tmp_path)
    assert result.returncode == 1
    assert (
        "glm-prod: context_length 1048576 exceeds KV pool 681280 tokens; refusing to start"
        in result.stderr.splitlines()
    )


def test_run_refuses_to_start_on_the_capacity_gate(tmp_path):
    """`kvwatch run` applies the same gate before it serves anything."""
    (tmp_path / "kvwatch.yaml").write_text(GATED)
    result = run("run", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().endswith(
        "glm-prod: context_length 1048576 exceeds KV pool 681280 tokens; refusing to start"
    )
    assert not (tmp_path / "kvwatch.db").exists()


def test_check_config_accepts_a_good_config(tmp_path):
    """A valid config exits 0 and says how many endpoints it holds."""
    (tmp_path / "kvwatch.yaml").write_text(GATED.replace("681280", "1048576"))
    result = run("check-config", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "SUCCESS: 1 endpoints" in result.stdout


def test_check_config_names_the_key_path_of_every_error(tmp_path):
    """Errors are `<key path>: <sentence>` lines on stderr, exit 1."""
    (tmp_path / "bad.yaml").write_text(GATED.replace("1048576", "-3").replace("model:", "modle:"))
    result = run("check-config", "--config", "bad.yaml", cwd=tmp_path)
    assert result.returncode == 1
    assert "endpoints[0].context_window: must be a positive integer" in result.stderr
    assert "endpoints[0].modle: unknown key" in result.stderr


def test_a_missing_config_file_is_a_clear_error(tmp_path):
    """--config naming a missing file says so."""
    result = run("check-config", "--config", "nope.yaml", cwd=tmp_path)
    assert result.returncode == 1
    assert "nope.yaml" in result.stderr


def test_check_config_live_refuses_an_engine_whose_pool_is_below_its_window(tmp_path):
    """--live asks each engine for its window and pool and applies the same gate."""
    from tests.helpers.processes import simulator_process

    endpoints = (
        "name=glm,window=1048576,kv_pool=681280,flavour=sglang",
        "name=ok,window=8192,flavour=sglang",
    )
    with simulator_process(*endpoints, log=tmp_path / "sim.log") as sim:
        (tmp_path / "kvwatch.yaml").write_text(
            "endpoints:\n"
            f"  - {{name: glm, url: '{sim}/glm/v1', model: sim-1, flavour: sglang}}\n"
            f"  - {{name: ok, url: '{sim}/ok/v1', model: sim-1, flavour: sglang}}\n"
        )
        result = run("check-config", "--live", cwd=tmp_path)
    assert result.returncode == 1
    assert (
        "glm: engine reports context_length 1048576 exceeds KV pool 681280 tokens; "
        "refusing to start" in result.stderr.splitlines()
    )
    assert "ok: window 8192, KV pool 8192: OK" in result.stdout


def test_check_config_names_each_endpoint_whose_engine_cannot_enforce_a_limit(tmp_path):
    """An Ollama endpoint gets a NOTE naming it: its over probe cannot see a refusal."""
    from click.testing import CliRunner

    from kvwatch.cli import main

    path = tmp_path / "kvwatch.yaml"
    path.write_text(
        GATED.replace("681280", "1048576")
        + "  - {name: llama-local, url: 'http://127.0.0.1:11434', model: llama3.2,"
        " flavour: ollama, context_window: 8192, tokenizer: usage}\n"
    )
    result = CliRunner().invoke(main, ["check-config", "--config", str(path)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"Checking {path}",
        "  SUCCESS: 2 endpoints",
        "  NOTE: llama-local: flavour ollama cannot enforce a context limit (it truncates an"
        " over-long prompt instead of refusing it): its over probe reports over_truncated"
        " (info, never a page), not a refusal",
    ]


def test_check_config_lists_each_discovery_source_with_its_kind_and_interval(tmp_path):
    """Sources are named, not fetched: the check reads the file only."""
    config = GATED.replace("681280", "1048576") + (
        "discovery:\n"
        "  - name: fleet\n"
        "    file_sd: {files: [targets/*.json]}\n"
        "  - name: k8s\n"
        "    http_sd: {url: 'http://127.0.0.1:9/targets', refresh_interval: 30s}\n"
    )
    (tmp_path / "kvwatch.yaml").write_text(config)
    result = run("check-config", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "  DISCOVERY: fleet (file_sd, every 5m)" in lines
    assert "  DISCOVERY: k8s (http_sd, every 30s)" in lines


def test_check_config_says_how_to_enable_cache_reporting_on_each_cache_endpoint(tmp_path):
    """An endpoint with the cache probe gets a NOTE naming its engine's flag; others none."""
    (tmp_path / "kvwatch.yaml").write_text(
        "endpoints:\n"
        "  - {name: v, url: 'http://10.0.0.1:8000/v1', model: m, flavour: vllm, probes: [cache]}\n"
        "  - {name: s, url: 'http://10.0.0.2:8000/v1', model: m, flavour: sglang,"
        " probes: [cache]}\n"
        "  - {name: l, url: 'http://10.0.0.3:8000/v1', model: m, flavour: llamacpp,"
        " probes: [cache]}\n"
        "  - {name: plain, url: 'http://10.0.0.4:8000/v1', model: m, flavour: vllm}\n"
    )
    result = run("check-config", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stdout.splitlines() if "NOTE:" in line]
    assert len(notes) == 3
    assert "v: vLLM caches prefixes by default" in notes[0]
    assert "--enable-prompt-tokens-details" in notes[0]
    assert "s: SGLang" in notes[1] and "--enable-cache-report" in notes[1]
    assert "l: llama.cpp's server caches the prompt by default" in notes[2]
    assert all("cache_not_exercised (info, never a page)" in n for n in notes)
