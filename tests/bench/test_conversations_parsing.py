"""bench/conversations.py's pure parts: how a text is cut, how a bystander's gap is found, how (b)'s users and
their figures come out, how a failed request stops its siblings (no server runs here)."""

from __future__ import annotations

import asyncio

import pytest

from bench.conversations import USER_TURNS, cut_to_tokens, gather_all, largest_gap, summarize_b, user_script


def test_a_text_is_cut_at_the_line_break_before_the_limit_token():
    text = "one two\nthree four\nfive"
    offsets = [(0, 3), (4, 7), (8, 13), (14, 18), (19, 23)]
    assert cut_to_tokens(text, offsets, 3) == "one two"  # token 3 ("four") is on the second line
    assert cut_to_tokens(text, offsets, 4) == "one two\nthree four"


def test_a_text_shorter_than_the_limit_is_refused():
    with pytest.raises(ValueError, match="fewer than 5"):
        cut_to_tokens("a b", [(0, 1), (2, 3)], 5)


def test_the_largest_gap_is_the_one_that_overlaps_the_window():
    times = [0.0, 0.1, 0.2, 1.5, 1.6, 3.0]
    assert largest_gap(times, start=0.15, end=1.55) == (0.2, 1.5)  # it spans the whole window
    assert largest_gap(times, start=1.52, end=1.58) == (1.5, 1.6)  # the 1.4 s gap after 1.6 is outside
    assert largest_gap(times, start=5.0, end=6.0) == (5.0, 5.0)


def test_a_user_is_the_same_for_the_same_seed_and_distinct_from_the_others():
    assert user_script(0, 0, 3, "s") == user_script(0, 0, 3, "s")
    scripts = [user_script(0, 0, u, "s") for u in range(16)]
    assert len({s["system"] for s in scripts}) == 16
    assert user_script(1, 0, 3, "s")["think_s"] != user_script(0, 0, 3, "s")["think_s"]
    assert all(0.5 <= t <= 2.0 for s in scripts for t in s["think_s"])
    assert all(len(s["turns"]) == len(USER_TURNS) for s in scripts)
    again = user_script(0, 0, 3, "again")  # a repeated round: the same user under another session tag
    assert again["think_s"] == user_script(0, 0, 3, "s")["think_s"] and again["system"].startswith("Session again-3.")


def test_many_users_figures_pool_every_user_and_round_per_turn():
    def turn(ttft_s, cached):
        return {"ttft_s": ttft_s, "cached_tokens": cached, "prompt_tokens": 100, "completion_tokens": 4}

    user = [turn(0.1 * (i + 1), 10 * i) for i in range(len(USER_TURNS))]
    rounds = [{"users": [user, user], "tokens_per_s": 12.34, "seconds": 10.0}]
    summary = summarize_b(rounds)
    assert summary["per_turn"][1] == {
        "ttft_p50_ms": 100.0, "ttft_p99_ms": 100.0, "cached_tokens_mean": 0, "prompt_tokens_mean": 100,
    }  # fmt: skip
    assert summary["per_turn"][8]["cached_tokens_mean"] == 70
    assert summary["ttft_p99_ms"] == 800.0
    assert summary["tokens_per_s"] == [12.3]


def test_one_failed_task_cancels_the_others_and_its_error_is_raised():
    async def run() -> bool:
        async def fail():
            await asyncio.sleep(0.01)
            raise KeyError("ttft_s")

        slow = asyncio.ensure_future(asyncio.sleep(60))
        with pytest.raises(KeyError):
            await gather_all([asyncio.ensure_future(fail()), slow])
        return slow.cancelled()

    assert asyncio.run(run())
