"""The simulated engine's prefix cache, pure: 16-token blocks chained by hash, as vLLM's
automatic prefix caching keeps them, and the two ways the cache faults serve wrong pages.

A block is cached under the hash of its tokens and its parent's hash, so a hit needs the
whole prefix up to it to match. A request is served the longest chain of cached blocks
that its prompt starts with, but never its last token: the engine must compute at least one
token to get the next one's logits (vLLM caps a hit at ``prompt_len - 1``, in whole blocks).
The cached blocks' *stored* text is what the model attends to there, so a cache that serves
wrong pages changes the answer exactly as it would on a real engine.

Faults:

- ``prefix_collision``: once the prompt departs from a cached chain, the cache goes on
  serving that chain's later pages (of the earlier document that shared only the first part)
  as if they matched: a colliding or stale entry (vLLM #6023, tenstorrent/vllm #415).
- ``abort_reuse``: a streamed request's pages enter the cache before they are filled, and are
  completed only when its answer is; an aborted request leaves them half-filled, and a later
  request with the same prefix reuses them (SGLang PR #28374).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

BLOCK_TOKENS = 16
# The hash of the empty prefix: the parent of every prompt's first block.
_ROOT = 0


@dataclass(slots=True)
class _Block:
    text: str  # what the block's pages hold (the tokens' text, or less when half-filled)
    parent: int
    children: list[int] = field(default_factory=list)  # most recently written last


@dataclass(frozen=True, slots=True)
class Hit:
    """What a prompt is served: ``tokens`` from the cache, and the text attended to."""

    tokens: int
    attended: str


class PrefixCache:
    """Cached blocks of one endpoint, least recently used first out."""

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max(1, max_blocks)
        self._blocks: OrderedDict[int, _Block] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, pieces: Sequence[str], *, collide: bool = False) -> Hit:
        """The cached prefix of a prompt of ``pieces`` (one token each)."""
        limit = (len(pieces) - 1) // BLOCK_TOKENS
        parent, served = _ROOT, list[_Block]()
        for i in range(limit):
            key = _key(parent, pieces, i)
            block = self._blocks.get(key)
            if block is None:
                if collide and served:
                    served += self._later(parent, limit - len(served))
                break
            self._blocks.move_to_end(key)
            served.append(block)
            parent = key
        rest = "".join(pieces[len(served) * BLOCK_TOKENS :])
        return Hit(len(served) * BLOCK_TOKENS, "".join(b.text for b in served) + rest)

    def insert(self, pieces: Sequence[str], *, filled_blocks: int | None = None) -> None:
        """Cache every whole block of ``pieces``; with ``filled_blocks``, only that many hold
        their tokens and the later ones are left empty (pages allocated, never written)."""
        parent = _ROOT
        for i in range(len(pieces) // BLOCK_TOKENS):
            key = _key(parent, pieces, i)
            filled = filled_blocks is None or i < filled_blocks
            text = "".join(pieces[i * BLOCK_TOKENS : (i + 1) * BLOCK_TOKENS]) if filled else ""
            block = self._blocks.get(key)
            if block is None:
                block = _Block(text, parent)
                self._blocks[key] = block
                owner = self._blocks.get(parent)
                if owner is not None:
                    owner.children.append(key)
            else:
                block.text = text
                self._blocks.move_to_end(key)
            parent = key
        while len(self._blocks) > self.max_blocks:
            key, gone = self._blocks.popitem(last=False)
            owner = self._blocks.get(gone.parent)
            if owner is not None and key in owner.children:
                owner.children.remove(key)

    def _later(self, parent: int, n: int) -> list[_Block]:
        """Up to ``n`` blocks after ``parent`` along its most recently written children: the
        earlier document a colliding entry serves."""
        out: list[_Block] = []
        block = self._blocks.get(parent)
        while block is not None and block.children and len(out) < n:
            key = block.children[-1]
            block = self._blocks.get(key)
            if block is None:
                break
            out.append(block)
        return out


def _key(parent: int, pieces: Sequence[str], i: int) -> int:
    return hash((parent, tuple(pieces[i * BLOCK_TOKENS : (i + 1) * BLOCK_TOKENS])))
