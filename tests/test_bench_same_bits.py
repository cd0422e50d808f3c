"""bench/same_bits.py: digests compared on what both checkouts record."""

from __future__ import annotations

from bench.same_bits import compare


def _case(trajectory: str, full: str, **entries: str) -> dict:
    return {"trajectory": trajectory, "full": full, "entries": entries}


def test_a_new_entry_alone_leaves_the_trajectory_the_same() -> None:
    old = {"run": _case("t1", "f1", **{"last.pt/q_network": "a", "result.json/score": "b"})}
    new = {"run": _case("t2", "f2", **{"last.pt/q_network": "a", "result.json/score": "b",
                                       "result.json/best_step": "c"})}  # fmt: skip
    lines, differ = compare(old, new)
    assert not differ
    assert lines[0].startswith("run: same") and "result.json/best_step" in lines[0]


def test_a_changed_entry_both_hold_is_a_different_trajectory() -> None:
    old = {"run": _case("t1", "f1", **{"last.pt/q_network": "a", "result.json/score": "b"})}
    new = {"run": _case("t2", "f2", **{"last.pt/q_network": "z", "result.json/score": "b",
                                       "result.json/best_step": "c"})}  # fmt: skip
    lines, differ = compare(old, new)
    assert differ and lines == ["run: DIFFERENT: last.pt/q_network"]


def test_digests_without_entries_are_compared_whole() -> None:
    old = {"run": {"trajectory": "t1", "full": "f1"}, "gone": "failed: no such key"}
    new = {"run": {"trajectory": "t2", "full": "f2"}, "gone": {"trajectory": "x", "full": "y"}}
    lines, differ = compare(old, new)
    assert differ and "gone: not compared (failed: no such key)" in lines
    assert "run: DIFFERENT" in lines
