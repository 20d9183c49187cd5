"""The simulator's prefix cache, pure: 16-token blocks chained by hash, and the two ways its
faults serve wrong pages."""

from __future__ import annotations

from kvwatch.simulator.prefix import BLOCK_TOKENS, PrefixCache


def _pieces(prefix: str, n: int) -> list[str]:
    return [f" {prefix}{i}" for i in range(n)]


def test_a_repeated_prompt_is_served_in_whole_blocks_but_never_its_last_token() -> None:
    """64 tokens cached: the same 64 again hit 48 (the last block holds the last token)."""
    cache = PrefixCache(100)
    prompt = _pieces("a", 64)
    assert cache.lookup(prompt).tokens == 0
    cache.insert(prompt)
    hit = cache.lookup(prompt)
    assert (hit.tokens, hit.attended) == (48, "".join(prompt))
    assert cache.lookup(_pieces("a", 65)).tokens == 64


def test_a_prompt_that_departs_is_served_only_the_shared_blocks() -> None:
    """Shared first 40 tokens: two whole blocks (32) hit, the rest is computed."""
    cache = PrefixCache(100)
    cache.insert(_pieces("a", 64))
    other = _pieces("a", 40) + _pieces("b", 24)
    hit = cache.lookup(other)
    assert (hit.tokens, hit.attended) == (32, "".join(other))


def test_a_collision_serves_the_earlier_prompts_pages_past_where_they_part() -> None:
    """prefix_collision: after the two shared blocks the earlier prompt's blocks are served,
    so what is attended holds its text, not the new one's."""
    cache = PrefixCache(100)
    earlier = _pieces("a", 64)
    cache.insert(earlier)
    other = _pieces("a", 40) + _pieces("b", 24)
    hit = cache.lookup(other, collide=True)
    assert hit.tokens == 48
    assert hit.attended == "".join(earlier[:48] + other[48:])


def test_half_filled_pages_are_reused_empty_until_completed() -> None:
    """abort_reuse: pages cached before they are filled hold nothing past the filled blocks;
    completing the request fills them."""
    cache = PrefixCache(100)
    prompt = _pieces("a", 64)
    cache.insert(prompt, filled_blocks=2)
    hit = cache.lookup(prompt)
    assert hit.tokens == 48
    assert hit.attended == "".join(prompt[:32] + prompt[48:])
    cache.insert(prompt)
    assert cache.lookup(prompt).attended == "".join(prompt)


def test_the_least_recently_used_blocks_leave_first() -> None:
    """A cache of 4 blocks keeps the newest prompt's; the older one misses."""
    cache = PrefixCache(4)
    cache.insert(_pieces("a", 4 * BLOCK_TOKENS))
    cache.insert(_pieces("b", 4 * BLOCK_TOKENS))
    assert len(cache) == 4
    assert cache.lookup(_pieces("a", 4 * BLOCK_TOKENS + 1)).tokens == 0
    assert cache.lookup(_pieces("b", 4 * BLOCK_TOKENS + 1)).tokens == 4 * BLOCK_TOKENS
