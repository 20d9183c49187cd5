"""`kvwatch probe` as a pre-deploy gate: exit 0 only on healthy verdicts (issue 13)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from kvwatch.cli import main
from tests.helpers.processes import simulator_process


def _probe_over(tmp_path: Path, entry: str, name: str) -> tuple[int, dict[str, object]]:
    config = tmp_path / f"{name}.yaml"
    config.write_text(
        f"database: sqlite:///{tmp_path / 'kvwatch.db'}\nendpoints:\n  - {{{entry}}}\n"
    )
    result = CliRunner().invoke(
        main, ["probe", name, "--kind", "over", "--output", "json", "--config", str(config)]
    )
    first = json.loads(result.stdout.splitlines()[0])
    return result.exit_code, first


def test_probe_exits_0_on_a_healthy_ollama_whose_over_prompt_is_cut(tmp_path: Path) -> None:
    """Ollama cuts the over prompt as documented: over_truncated is healthy, so the gate
    passes; an engine that accepts an over-long prompt still fails it."""
    endpoints = (
        "name=ol,window=4096,flavour=ollama",
        "name=vl,window=4096,flavour=vllm,fault=accept_over_limit",
    )
    with simulator_process(*endpoints, log=tmp_path / "sim.log") as sim:
        ollama_exit, ollama = _probe_over(
            tmp_path,
            f"name: ol, url: '{sim}/ol', model: sim-1, flavour: ollama, context_window: 4096,"
            " tokenizer: usage",
            "ol",
        )
        vllm_exit, vllm = _probe_over(
            tmp_path,
            f"name: vl, url: '{sim}/vl/v1', model: sim-1, flavour: vllm, context_window: 4096",
            "vl",
        )
    assert (ollama_exit, ollama["verdict"]) == (0, "over_truncated")
    # tokenizer: usage only estimates the plan, so the read count is bounded, not exact.
    assert ollama["reported_prompt_tokens"] <= 4096
    assert (vllm_exit, vllm["verdict"]) == (1, "over_accepted")


def test_probe_kind_burst_gates_on_the_batch_path(tmp_path: Path) -> None:
    """`kvwatch probe NAME --kind burst`: exit 0 on a healthy batch, 1 (burst_leak) on one
    that swaps answers; `kvwatch show` then lists each request."""
    with simulator_process(
        "name=ok,window=4096",
        "name=mixed,window=4096,fault=batch_mix,batch_mix_at=3",
        log=tmp_path / "sim.log",
    ) as sim:
        outcomes = {}
        for name in ("ok", "mixed"):
            config = tmp_path / f"{name}.yaml"
            config.write_text(
                f"database: sqlite:///{tmp_path / 'kvwatch.db'}\nendpoints:\n"
                f"  - {{name: {name}, url: '{sim}/{name}/v1', model: sim-1, context_window: 4096,"
                " confirm: false, burst: {sizes: [3]}}\n"
            )
            result = CliRunner().invoke(
                main,
                ["probe", name, "--kind", "burst", "--output", "json", "--config", str(config)],
            )
            first = json.loads(result.stdout.splitlines()[0])
            outcomes[name] = (result.exit_code, first["verdict"])
        shown = CliRunner().invoke(main, ["show", str(first["probe_id"]), "--config", str(config)])
    assert outcomes == {"ok": (0, "pass"), "mixed": (1, "burst_leak")}
    # `kvwatch show` lists the requests: the solo one right, each member holding another's.
    assert "  request solo" in shown.stdout and " RIGHT: animal " in shown.stdout
    assert shown.stdout.count(" LEAK: animal ") == 3
    assert "holds the marker of request 2" in shown.stdout


def test_probe_kind_cache_gates_on_the_prefix_cache_path(tmp_path: Path) -> None:
    """`kvwatch probe NAME --kind cache`: exit 0 on a healthy cache, 1 (cache_corrupt) on one
    whose entries collide; `kvwatch show` then lists each step with its cached tokens."""
    with simulator_process(
        "name=ok,window=4096",
        "name=collides,window=4096,fault=prefix_collision",
        log=tmp_path / "sim.log",
    ) as sim:
        outcomes = {}
        for name in ("ok", "collides"):
            config = tmp_path / f"{name}.yaml"
            config.write_text(
                f"database: sqlite:///{tmp_path / 'kvwatch.db'}\nendpoints:\n"
                f"  - {{name: {name}, url: '{sim}/{name}/v1', model: sim-1, context_window: 4096,"
                " confirm: false, cache: {document_tokens: 512}}\n"
            )
            result = CliRunner().invoke(
                main,
                ["probe", name, "--kind", "cache", "--output", "json", "--config", str(config)],
            )
            first = json.loads(result.stdout.splitlines()[0])
            outcomes[name] = (result.exit_code, first["verdict"])
        shown = CliRunner().invoke(main, ["show", str(first["probe_id"]), "--config", str(config)])
    assert outcomes == {"ok": (0, "pass"), "collides": (1, "cache_corrupt")}
    assert "  step cold     A " in shown.stdout and " RIGHT" in shown.stdout
    assert "  step control  A" in shown.stdout
    assert ", gave the code of A " in shown.stdout
