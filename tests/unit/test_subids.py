"""The subordinate id planner (shim/kooi/hoststate/subids.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kooi.hoststate import subids

RUNNER = [{"name": "kooi-runner", "count": 65536}]


def ranges_of(text):
    return [(n, s, c) for _, _, n, s, c in subids.parse(text) if n]


def test_fresh_file_gets_one_range():
    text, r = subids.plan("", RUNNER)
    assert text == "kooi-runner:100000:65536\n"
    assert r == {"kooi-runner": (100000, 65536)}


def test_duplicates_from_useradd_are_repaired_and_others_preserved():
    before = "# comment\nalice:100000:65536\nkooi-runner:165536:65536\nkooi-runner:231072:65536\nbob:296608:65536\n"
    text, r = subids.plan(before, RUNNER)
    assert text == "# comment\nalice:100000:65536\nkooi-runner:165536:65536\nbob:296608:65536\n"
    assert r["kooi-runner"] == (165536, 65536)


def test_idempotent():
    once, _ = subids.plan("alice:100000:65536\n", RUNNER + [{"name": "kooi-remap", "count": 200000}])
    twice, _ = subids.plan(once, RUNNER + [{"name": "kooi-remap", "count": 200000}])
    assert once == twice


def test_overlapping_range_is_moved_not_the_unmanaged_one():
    text, r = subids.plan("alice:100000:65536\nkooi-runner:120000:65536\n", RUNNER)
    assert "alice:100000:65536" in text
    assert r["kooi-runner"] == (165536, 65536)


def test_undersized_range_grows_in_place_when_free():
    _, r = subids.plan("kooi-runner:300000:1000\n", RUNNER)
    assert r["kooi-runner"] == (300000, 65536)


def test_range_containing_an_account_id_is_moved():
    _, r = subids.plan("kooi-runner:100000:65536\n", RUNNER, reserved={100500})
    assert not (r["kooi-runner"][0] <= 100500 < sum(r["kooi-runner"]))


def test_explicit_start_conflicting_with_unmanaged_entry_fails():
    with pytest.raises(subids.SubidError, match="overlaps the unmanaged entry alice"):
        subids.plan("alice:100000:65536\n", [{"name": "kooi-runner", "start": 150000}])


def test_explicit_start_is_kept():
    _, r = subids.plan("kooi-runner:100000:65536\n", [{"name": "kooi-runner", "start": 500000}])
    assert r["kooi-runner"] == (500000, 65536)


@pytest.mark.parametrize("users,msg", [
    ([{"name": "x", "count": 1000}], "below the minimum"),
    ([{"name": "x", "start": 5}], "must be an integer"),
    ([{"name": "x"}, {"name": "x"}], "listed twice"),
    ([{"name": "a:b"}], "invalid user name"),
])
def test_bad_input_is_refused(users, msg):
    with pytest.raises(subids.SubidError, match=msg):
        subids.plan("", users)


def test_malformed_line_is_refused_with_its_number():
    with pytest.raises(subids.SubidError, match="line 2"):
        subids.plan("alice:100000:65536\ngarbage\n", RUNNER)


entry = st.tuples(st.sampled_from(["alice", "bob", "carol", "kooi-runner", "kooi-remap"]),
                  st.integers(100000, 2_000_000), st.integers(1, 300000))


@settings(max_examples=300, deadline=None)
@given(st.lists(entry, max_size=8), st.sets(st.integers(0, 2_500_000), max_size=5))
def test_property_managed_ranges_never_overlap_and_unmanaged_lines_survive(entries, reserved):
    before = "".join(f"{n}:{s}:{c}\n" for n, s, c in entries)
    users = [{"name": "kooi-runner"}, {"name": "kooi-remap", "count": 131072}]
    text, r = subids.plan(before, users, reserved)
    after = ranges_of(text)
    # every unmanaged line survives, in order
    assert [e for e in after if e[0] not in r] == [e for e in entries if e[0] not in r]
    # exactly one range per managed user, large enough, overlapping nothing else
    for name, (s, c) in r.items():
        assert [e for e in after if e[0] == name] == [(name, s, c)]
        assert c >= 65536 and s >= 100000
        assert not any(s <= i < s + c for i in reserved)
        for other, s2, c2 in after:
            if other != name:
                assert s + c <= s2 or s2 + c2 <= s, (name, other)
    assert subids.plan(text, users, reserved)[0] == text
