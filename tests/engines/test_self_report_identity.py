"""Each engine's self-report carries the facts that identify its deployment."""

from __future__ import annotations

import httpx
import pytest

from kvwatch.fingerprint import fingerprint_of
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import Flavour, SimEndpoint
from kvwatch.store.repository import Store
from tests.helpers.targets import config_for, sim_endpoint_entry, targets_and_runner

# The identity fields each flavour reports, beside model, window and pool.
EXPECTED = {
    Flavour.VLLM: {"model_root", "process_start", "version"},
    Flavour.SGLANG: {"model_path", "version"},
    Flavour.LLAMACPP: {"build_info", "model_path"},
    Flavour.TGI: {"max_input_tokens", "sha", "version"},
    Flavour.OLLAMA: {"digest", "version"},
}


@pytest.mark.parametrize("flavour", list(EXPECTED))
async def test_a_redeploy_changes_the_fingerprint_and_a_second_read_does_not(
    flavour: Flavour, store: Store, db_url: str
) -> None:
    """The self-report's identity fields are there; two reads of an unchanged engine give
    the same fingerprint; a redeploy (new version, new process) gives another."""
    endpoint = SimEndpoint("e", window=4096, flavour=flavour)
    async with run_simulator([endpoint]) as sim, httpx.AsyncClient() as client:
        entry = sim_endpoint_entry(sim, "e", flavour=flavour.value, probes=["capacity"])
        config = config_for([entry], database=db_url)
        targets, _, _ = targets_and_runner(config, store, client)
        engine = targets["e"].engine
        first = fingerprint_of(await engine.discover())
        again = fingerprint_of(await engine.discover())
        await client.put(f"{sim.base_url}/e/_sim/fingerprint", json={"version": "9.9.9"})
        redeployed = fingerprint_of(await engine.discover())
    assert EXPECTED[flavour] <= set(first), first
    assert first == again
    assert redeployed != first
    changed = {k for k in set(first) | set(redeployed) if first.get(k) != redeployed.get(k)}
    assert changed & {"version", "build_info", "sha", "digest", "process_start"}
