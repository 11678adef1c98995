"""naig.monitor.detectors on 4 real gloo processes (tests/monitor_persistent_ranks.py): a persistent
×2 rank named within 10 steps on every rank, a resumed monitor deciding as the uninterrupted one, and
the two-rank rules in a 2-rank group."""

from __future__ import annotations

import pytest

from tests.conftest import run_ranks


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    return run_ranks("tests.monitor_persistent_ranks", tmp_path_factory.mktemp("persistent"), timeout=300)


def _named(run: list[dict], world: int) -> dict[int, list[int]]:
    """step → the ranks every rank's view names (asserting the views agree)."""
    out = {}
    for row in run:
        views = row["views"]
        assert all(v == views[0] for v in views), row
        if any(views[0]):
            out[row["step"]] = [r for r in range(world) if views[0][r]]
    return out


def test_a_persistent_x2_rank_is_named_within_10_steps_on_every_rank(ranks: dict) -> None:
    onset, bad = ranks["onset"], ranks["bad_rank"]
    named = _named(ranks["runs"]["persistent"], ranks["world"])
    assert not [s for s in named if s < onset], named  # no false alarm before the fault
    hits = sorted(s for s, r in named.items() if bad in r)
    assert hits and hits[0] <= onset + 10, named
    assert all(r == [bad] for r in named.values()), named  # no other rank named


def test_a_resumed_monitor_decides_as_the_uninterrupted_one(ranks: dict) -> None:
    whole, resumed = ranks["runs"]["whole"], ranks["runs"]["resumed"]
    assert [(r["step"], r["views"], r["describe"]) for r in resumed] == [
        (r["step"], r["views"], r["describe"]) for r in whole]
    cut = ranks["cut"]
    assert resumed[cut]["step"] == cut + 1  # the resumed monitor continued the count
    # a change that began before the cut is named after it: the CUSUM state crossed the restart
    carried = [r for r in whole[cut:] if any(s <= cut for s in r["since"].values())]
    assert carried and all("cusum" in r["describe"] for r in carried), [r["describe"] for r in whole[cut:]]


def test_two_ranks_name_a_spike_and_a_scaled_norm_by_the_norm_only(ranks: dict) -> None:
    onset = ranks["onset"]
    run = ranks["runs"]["two"]
    named = _named(run, 2)
    assert onset in named and named[onset] == [1], named
    assert not [s for s in named if s < onset], named
    texts = [r["describe"] for r in run if r["step"] in named]
    assert not [t for t in texts if any(w in t for w in ("cos", "distance", "energy", "cusum"))], texts
    assert all("norm transient" in t for t in texts), texts
