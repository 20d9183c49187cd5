"""End to end: garbage served over HTTP by the hostile server is never judged a pass."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.canary.verdicts import judge
from kvwatch.engines.clients import build_http_client
from kvwatch.engines.openai import OpenAIEngine
from tests.fuzz.strategies import garbage_bodies, plan
from tests.helpers.hostile import hostile_server


async def verdicts_for(bodies: list[bytes], stream: bool) -> list[tuple[Verdict, str]]:
    async with hostile_server() as server, build_http_client() as client:
        server.garbage = {str(i): body for i, body in enumerate(bodies)}

        async def one(key: str) -> tuple[Verdict, str]:
            engine = OpenAIEngine(
                client, base_url=server.url_for(f"garbage-{key}"), model="m", api_key=None
            )
            probe = plan(ProbeKind.UNDER)
            ex = await engine.chat(probe.messages, max_tokens=16, stream=stream, timeout=10)
            judgement = judge(probe, ex)
            return judgement.verdict, judgement.reason

        return await asyncio.gather(*(one(key) for key in server.garbage))


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(garbage_bodies, min_size=1, max_size=25), st.booleans())
def test_garbage_answers_over_http_never_pass(bodies: list[bytes], stream: bool) -> None:
    """Random bytes, JSON shapes, marker-less completions and SSE, all served with 200."""
    for verdict, reason in asyncio.run(verdicts_for(bodies, stream)):
        assert verdict is not Verdict.PASS, reason
        assert reason
