"""The window a target's canaries are planned against: configured, else discovered once."""

from __future__ import annotations

from kvwatch.canary.sizing import served_window
from kvwatch.limits import MAX_PLAUSIBLE_WINDOW
from kvwatch.probe.model import Target
from kvwatch.probe.reported import engine_report


class WindowUnknown(Exception):
    pass


async def window_of(target: Target) -> int:
    """The target's window, discovered and kept in its state on first use."""
    state = target.state
    if state.window is None:
        state.window = target.spec.context_window
    if state.window is None:
        found = await engine_report(target)
        if found.context_window is None:
            raise WindowUnknown(
                "context_window is not configured and the engine does not report it"
            )
        if found.context_window > MAX_PLAUSIBLE_WINDOW:
            raise WindowUnknown(
                f"the engine reports a window of {found.context_window} tokens, which no "
                "engine serves; configure context_window"
            )
        state.window = served_window(
            found.context_window,
            rule=target.engine.rule,
            max_prompt_tokens=found.max_prompt_tokens,
            max_tokens=target.spec.max_tokens,
        )
    return state.window
