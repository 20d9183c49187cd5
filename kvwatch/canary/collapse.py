"""Does the serving stack's chat template keep the user's text? Pure: no I/O.

A chat template that drops the conversation (llama.cpp started with ``--jinja --chat-template
gemma`` renders every chat as the literal word ``gemma``: 3 tokens) makes the engine's own
count agree with its usage, so planned and reported prompt tokens match and the prompt cut is
invisible to the usual comparison. It shows while planning: the templated count of the canary
must grow by about as many tokens as the filler added, and a template that swallows the text
leaves it (nearly) unchanged. Such a template is a truncation by the serving stack.
"""

from __future__ import annotations

# Below this many filler tokens the comparison says nothing: BPE merges at the joins between
# the template, the fixed text and the filler move a count by a few tokens either way.
MIN_TEXT_TOKENS = 32
# A template that keeps the text grows by about the text's own count (measured on llama.cpp
# with Gemma 3: exactly, by the planner's first verification). Half is far from both cases:
# a template that keeps most of the text passes, one that keeps little of it does not.
KEPT_FRACTION = 0.5


def template_swallows_content(count_empty: int, count_with_text: int, text_tokens: int) -> bool:
    """Whether adding ``text_tokens`` tokens of text grew the templated prompt by too little.

    ``count_empty`` is the engine's count of the canary without filler, ``count_with_text``
    its count with filler worth ``text_tokens`` tokens (counted piece by piece, untemplated).
    """
    if text_tokens < MIN_TEXT_TOKENS:
        return False
    grew = count_with_text - count_empty
    return grew < text_tokens * KEPT_FRACTION


def swallowed_reason(count_empty: int, count_with_text: int, text_tokens: int) -> str:
    """One line for the probe's reason: what the template did to the canary's text."""
    return (
        f"the chat template drops the prompt's text: adding {text_tokens} tokens of filler "
        f"changed the templated prompt from {count_empty} to {count_with_text} tokens"
    )
