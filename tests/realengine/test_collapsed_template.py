"""A collapsed chat template (`--jinja --chat-template gemma`) is caught as truncated.

The word ``gemma`` is taken as the literal template, so every chat renders as that word:
3 prompt tokens, HTTP 200, a fluent answer. ``/apply-template`` renders the same collapsed
prompt, so the server's own count agrees with its usage: planned = reported = 3, and the plain
planned-vs-reported comparison sees nothing. What gives it away while planning is that the
templated count does not grow with the filler (:mod:`kvwatch.canary.collapse`): the planner
then sends the canary sized by its content, and the 3 tokens of usage show the truncation.

With ``tokenizer: usage`` kvwatch sizes the prompt by characters (with its uncalibrated margin:
its calibration request also comes back as 3 tokens, which teaches nothing), so it plans
hundreds of tokens and the 3 reported are caught as truncated with no help.
"""

from __future__ import annotations

import pytest

from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.store.repository import Store
from tests.realengine.probes import llamacpp_entry, probe_rig

COLLAPSED_PROMPT_TOKENS = 3  # BOS + "gemma"


@pytest.mark.parametrize("kind", [ProbeKind.UNDER, ProbeKind.BASELINE])
async def test_a_collapsed_template_is_caught_as_truncated_with_the_server_tokenizer(
    llama_server_collapsed_url: str, sqlite_store: Store, kind: ProbeKind
) -> None:
    """tokenizer: server. The engine reads 3 of the ~2,000 tokens sent: truncated, critical."""
    entry = llamacpp_entry(llama_server_collapsed_url, name="collapsed")
    async with probe_rig([entry], sqlite_store) as rig:
        report = await rig.runner.run(rig.targets["collapsed"], kind)
    assert report.verdict is Verdict.TRUNCATED, report.reason
    assert report.reported_prompt_tokens == COLLAPSED_PROMPT_TOKENS
    assert report.status == 200


async def test_a_collapsed_template_is_caught_as_truncated_with_the_usage_tokenizer(
    llama_server_collapsed_url: str, sqlite_store: Store
) -> None:
    """tokenizer: usage. Planned from characters, the 3-token usage reads as a truncation."""
    entry = llamacpp_entry(
        llama_server_collapsed_url, name="collapsed-usage", tokenizer="usage", context_window=2048
    )
    async with probe_rig([entry], sqlite_store) as rig:
        report = await rig.runner.run(rig.targets["collapsed-usage"], ProbeKind.UNDER)
    assert report.verdict is Verdict.TRUNCATED, report.reason
    assert report.reported_prompt_tokens == COLLAPSED_PROMPT_TOKENS
    # Uncalibrated (the calibration request's 3 tokens are a finding, not a count to learn
    # from), the probe keeps the wide uncalibrated margin: hundreds of tokens, not 3.
    assert report.planned_prompt_tokens is not None and report.planned_prompt_tokens > 500
    assert report.status == 200
