"""Markers: CSPRNG-drawn, recognisable, and matched through presentation noise."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from kvwatch.canary import markers


def test_a_new_marker_has_the_fixed_shape_and_sixty_bits():
    """Markers are KVW- plus 12 Crockford symbols (60 bits ≥ the 48 DESIGN asks for)."""
    marker = markers.new_marker()
    assert re.fullmatch(
        r"KVW-[0-9A-HJKMNP-TV-Z]{4}-[0-9A-HJKMNP-TV-Z]{4}-[0-9A-HJKMNP-TV-Z]{4}", marker
    )
    assert markers.BITS >= 48


def test_markers_do_not_repeat_over_many_draws():
    """Ten thousand draws give ten thousand distinct markers."""
    assert len({markers.new_marker() for _ in range(10_000)}) == 10_000


def test_it_finds_a_marker_through_case_spacing_and_punctuation_noise():
    """Lower case, spaces instead of dashes, markdown and a trailing full stop still match."""
    marker = "KVW-7F3K-9QX2-M4TD"
    for answer in (
        "KVW-7F3K-9QX2-M4TD",
        "The code is kvw-7f3k-9qx2-m4td.",
        "**KVW 7F3K 9QX2 M4TD**",
        "`KVW7F3K9QX2M4TD`",
        "KVW-7F3K-9QX2-M4TD\n",
        "kvw–7f3k–9qx2–m4td",  # en dashes
    ):
        assert markers.contains_marker(answer, marker), answer


def test_it_does_not_accept_a_marker_with_one_symbol_wrong():
    """Content is strict: one wrong symbol is not the marker."""
    assert not markers.contains_marker("KVW-7F3K-9QX2-M4TE", "KVW-7F3K-9QX2-M4TD")
    assert not markers.contains_marker("KVW-7F3K-9QX2", "KVW-7F3K-9QX2-M4TD")
    assert not markers.contains_marker("", "KVW-7F3K-9QX2-M4TD")


def test_crockford_look_alikes_are_read_as_their_digits():
    """O, I and L in an answer read as 0, 1 and 1, as Crockford base32 intends."""
    assert markers.contains_marker("KVW-7F3K-9QX2-M4TO", "KVW-7F3K-9QX2-M4T0")
    assert markers.contains_marker("KVW-1F3K-9QX2-M4T0", "KVW-IF3K-9QX2-M4TO")


def test_it_lists_every_marker_shaped_code_in_an_answer_once():
    """Foreign-marker detection sees all codes in order, without duplicates."""
    answer = "KVW-AAAA-BBBB-CCCC then kvw aaaa bbbb cccc and KVW-1111-2222-3333."
    assert markers.markers_in_answer(answer) == ["AAAABBBBCCCC", "111122223333"]


@given(st.text(max_size=200), st.text(max_size=200))
def test_a_planted_marker_is_always_found_whatever_surrounds_it(before, after):
    """Property: a marker between arbitrary texts (separated by a space) is found."""
    marker = markers.new_marker()
    assert markers.contains_marker(f"{before} {marker} {after}", marker)


@given(st.text(alphabet=st.characters(blacklist_characters="KVWkvw"), max_size=300))
def test_text_without_the_prefix_never_matches(text):
    """Property: no marker is found in text that cannot spell the KVW prefix."""
    assert markers.markers_in_answer(text) == []


_SYMBOL = st.sampled_from(markers.ALPHABET)


@st.composite
def any_marker(draw: st.DrawFn) -> str:
    """Any well-formed marker, with the rare ones that begin again with K, V, W made common."""
    start = draw(st.sampled_from(["", "K", "KV", "KVW", "KVWK", "KVWKV", "KVWKVW"]))
    rest = draw(st.lists(_SYMBOL, min_size=12 - len(start), max_size=12 - len(start)))
    symbols = start + "".join(rest)
    return f"KVW-{symbols[0:4]}-{symbols[4:8]}-{symbols[8:12]}"


def test_a_marker_whose_first_group_starts_with_kvw_is_still_found():
    """Regression: KVW-KVWF-… (one marker in 32,768) was read as missing and paged."""
    marker = "KVW-KVWF-Z7TC-AQMH"
    assert markers.contains_marker(f"The code is {marker}.", marker)
    assert markers.canonical(markers.canonical(marker)) == "KVWFZ7TCAQMH"


def test_a_stray_kvw_before_the_marker_does_not_hide_it():
    """Candidates overlap: "KVW KVW-7F3K-…" still yields the real code."""
    assert markers.contains_marker("KVW: KVW-7F3K-9QX2-M4TD", "KVW-7F3K-9QX2-M4TD")


@given(any_marker(), st.text(max_size=100), st.text(max_size=100))
def test_every_well_formed_marker_is_found_and_canonical_is_idempotent(marker, before, after):
    """Property: over all 2**60 markers, a planted one is found and canonical() is stable."""
    assert markers.contains_marker(f"{before} {marker} {after}", marker)
    body = markers.canonical(marker)
    assert markers.canonical(body) == body
    assert body in markers.markers_in_answer(marker)
