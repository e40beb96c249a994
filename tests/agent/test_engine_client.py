"""The engine client's version check: the release an engine reports against the pool's pin, a local label aside."""

from __future__ import annotations

import pytest

from agent.engine_client import release, version_matches

CASES = [
    # name, reported, pinned, matches
    ("the same release", "0.33.0", "0.33.0", True),
    ("vLLM's CPU build against the pin", "0.32.0", "0.33.0", False),
    ("a local label is no other release", "0.33.0+cpu", "0.33.0", True),
    ("a local label on another release", "0.32.0+cpu", "0.33.0", False),
    ("a leading v", "v0.33.0", "0.33.0", True),
    ("a development build is another release", "0.33.1.dev12+g1234abc", "0.33.1", False),
    ("no answer yet", None, "0.33.0", None),
]


@pytest.mark.parametrize(("reported", "pinned", "matches"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_an_engine_matches_its_pin_when_the_releases_are_equal(
    reported: str | None, pinned: str, matches: bool | None
) -> None:
    assert version_matches(reported, pinned) is matches


def test_the_release_drops_only_the_local_label() -> None:
    assert release(" 0.32.0+cpu ") == "0.32.0" and release("0.33.0rc1") == "0.33.0rc1"
