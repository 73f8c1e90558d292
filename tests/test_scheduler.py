"""The scheduler on its own: no threads, no files, no processes."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mmd.daemon import Item, Load, Scheduler
from mmd.daemon.tunables import GROUP_INPUT_BYTES, MAX_GROUP
from mmd.spool import Claim

SMALL, BIG = 6_000, 200_000_000


def claim(name: str) -> Claim:
    return Claim("0123456789ab", name, 0, Path("/w") / name, Path("/o") / name, 0.0, resumed=True)


def names(assigned: list[tuple[int, Item]]) -> list[tuple[int, str]]:
    return [(w, item.name) for w, item in assigned]


def job_of(assigned: list[tuple[int, Item]], name: str) -> str:
    """The job id ``name`` was given out under."""
    return next(item.job_id for _, item in assigned if item.name == name)


def test_idle_workers_take_jobs_in_arrival_order():
    s = Scheduler(max_queue=100)
    for n in ("a", "b", "c"):
        assert s.offer(n, BIG)
    assert names(s.assign([Load(0, 0), Load(1, 0)])) == [(0, "a"), (1, "b")]
    assert s.waiting == 1 and s.held == 3
    assert s.assign([Load(0, 1, all_small=False), Load(1, 1, all_small=False)]) == [], "a big job waits for an idle one"
    assert names(s.assign([Load(0, 1, all_small=False), Load(1, 0)])) == [(1, "c")]


def test_small_jobs_are_given_in_groups_to_workers_with_only_small_ones():
    s = Scheduler(max_queue=1000)
    for i in range(3 * MAX_GROUP):
        s.offer(f"s{i:03d}", SMALL)
    out = s.assign([Load(0, 0), Load(1, 0)])
    per = {w: [i.name for wk, i in out if wk == w] for w in (0, 1)}
    assert len(per[0]) == len(per[1]) == MAX_GROUP, "both filled to a group, evenly"
    assert per[0][0] == "s000" and per[1][0] == "s001", "the first jobs go to idle workers first"
    assert s.waiting == MAX_GROUP


def test_a_big_job_in_hand_takes_no_company_and_small_ones_do_not_queue_behind_it():
    s = Scheduler(max_queue=100)
    s.offer("big", BIG)
    s.offer("small", SMALL)
    out = s.assign([Load(0, 0), Load(1, 1, all_small=False)])
    assert names(out) == [(0, "big")]
    s2 = Scheduler(max_queue=100)
    s2.offer("s1", SMALL)
    assert s2.assign([Load(0, 1, all_small=False)]) == [], "not behind a big job"
    assert names(s2.assign([Load(0, 1, all_small=False), Load(1, 3)])) == [(1, "s1")]


def test_unknown_sizes_are_big():
    assert (
        not Item("x").small
        and Item("x", size=GROUP_INPUT_BYTES).small
        and not Item("x", size=GROUP_INPUT_BYTES + 1).small
    )


def test_resumed_jobs_go_before_new_names():
    s = Scheduler(max_queue=100)
    s.offer("new", SMALL)
    s.resume([claim("old.txt")])
    out = s.assign([Load(0, 0)])
    assert [(w, i.name, i.claim is not None) for w, i in out] == [(0, "old.txt", True)]


def test_a_name_is_held_once_and_looked_at_again_when_offered_meanwhile():
    s = Scheduler(max_queue=100)
    assert s.offer("m", SMALL)
    assert not s.offer("m", SMALL), "held already"
    out = s.assign([Load(0, 0)])
    assert s.ended(job_of(out, "m")) is True, "completed again while in hand: offer once more"
    assert s.offer("m", SMALL)
    out = s.assign([Load(0, 0)])
    assert s.ended(job_of(out, "m")) is False


def test_broken_names_wait_until_forgiven():
    s = Scheduler(max_queue=100)
    s.offer("b", SMALL)
    out = s.assign([Load(0, 0)])
    s.ended(job_of(out, "b"), broken=True)
    assert s.is_broken("b") and not s.offer("b", SMALL)
    s.forgive()
    assert s.offer("b", SMALL)


def test_the_queue_is_bounded_and_refilled_at_half():
    s = Scheduler(max_queue=4)
    assert all(s.offer(f"n{i}", SMALL) for i in range(4))
    assert not s.offer("n4", SMALL) and s.backlog
    assert not s.refill_due()
    out = s.assign([Load(0, 0)])
    for name in ("n0", "n1"):
        s.ended(job_of(out, name))
    assert s.refill_due()


def test_a_pause_drops_waiting_names_but_keeps_resumes():
    s = Scheduler(max_queue=100)
    s.offer("a", SMALL)
    s.resume([claim("held.txt")])
    dropped = s.drop_waiting()
    assert [i.name for i in dropped] == ["a"]
    assert s.waiting == 1 and s.offer("a", SMALL), "a dropped name can be offered again after the pause"


@given(
    st.lists(st.sampled_from([SMALL, BIG, None]), max_size=60),
    st.lists(st.tuples(st.integers(0, MAX_GROUP + 2), st.booleans()), min_size=1, max_size=5),
)
def test_assignments_keep_the_rules(sizes, loads):
    """Whatever waits and whatever the workers hold: arrival order kept, no worker past a group, no job
    beside a big one, and nothing left waiting that an idle worker could take."""
    s = Scheduler(max_queue=1000)
    for i, size in enumerate(sizes):
        s.offer(f"j{i:03d}", size)
    start = [Load(w, n, small) for w, (n, small) in enumerate(loads)]
    out = s.assign(start)
    assert [i.name for _, i in out] == [f"j{i:03d}" for i in range(len(out))]
    for load in start:
        given_ = [i for w, i in out if w == load.worker]
        total = load.in_hand + len(given_)
        if load.in_hand == 0 and given_ and not given_[0].small:
            assert len(given_) == 1, "a big job goes alone"
        elif given_:
            assert total <= max(MAX_GROUP, 1) and all(i.small for i in given_[1 if load.in_hand == 0 else 0 :])
            if load.in_hand:
                assert load.all_small
    if s.waiting:
        after = {load.worker: load.in_hand + sum(1 for w, _ in out if w == load.worker) for load in start}
        assert all(n > 0 for n in after.values()), "a job waits while a worker is idle"


def test_a_flood_delays_another_submitters_job_by_about_one_job():
    """Mallory's 2,000 small jobs came first; Alice's one comes after. Once one of Mallory's has been charged,
    Alice's is the next given out, ahead of the rest of the flood."""
    s = Scheduler(max_queue=10_000, max_group=1)
    for i in range(2000):
        s.offer(f"m{i:04d}", SMALL, "mallory")
    out = s.assign([Load(0, 0)], now=0.0)
    assert names(out) == [(0, "m0000")]
    s.offer("alice.txt", SMALL, "alice")
    s.ended(job_of(out, "m0000"))
    s.charge("mallory", 0.002, now=0.01)
    assert names(s.assign([Load(0, 0)], now=0.01)) == [(0, "alice.txt")]
    assert [i.name for i in s.queued(now=0.01)][:1] == ["m0001"]


def test_the_least_used_submitter_goes_first_and_use_is_forgotten_over_time():
    from mmd.daemon.scheduler import USE_HALF_LIFE_S

    s = Scheduler(max_queue=100, max_group=1)
    s.charge("bob", 10.0, now=0.0)  # bob ran a long job
    s.charge("alice", 1.0, now=0.0)
    s.offer("b1", SMALL, "bob")
    s.offer("a1", SMALL, "alice")
    assert [i.name for i in s.queued(now=0.0)] == ["a1", "b1"]
    out = s.assign([Load(0, 0)], now=0.0)
    assert names(out) == [(0, "a1")]
    s.ended(job_of(out, "a1"))
    s.charge("alice", 20.0, now=1.0)  # now alice has used more
    assert names(s.assign([Load(0, 0)], now=1.0)) == [(0, "b1")]
    assert s.usage.of("bob", 3 * USE_HALF_LIFE_S) == pytest.approx(10.0 / 8)


def test_without_submitters_names_go_in_arrival_order():
    s = Scheduler(max_queue=100, max_group=1)
    for n in ("c", "a", "b"):
        s.offer(n, SMALL)
    out = []
    for _ in range(3):
        [(_, item)] = s.assign([Load(0, 0)])
        out.append(item.name)
        s.ended(item.job_id)
        s.charge(None, 1.0, now=0.0)
    assert out == ["c", "a", "b"]


def test_a_big_job_without_an_idle_worker_holds_back_no_one_elses_small_jobs():
    """Bob's big job is next by share, but both workers hold small jobs: one is left to drain for it (given
    nothing new), the other goes on with Alice's small ones; once the drained one is idle the big job has it."""
    s = Scheduler(max_queue=100)
    s.offer("big", BIG, "bob")
    for i in range(4):
        s.offer(f"a{i}", SMALL, "alice")
    s.charge("alice", 1.0, now=0.0)
    busy = [Load(0, 2), Load(1, 3)]
    out = s.assign(busy, now=0.0)
    assert {w for w, _ in out} == {1} and [i.name for _, i in out] == ["a0", "a1", "a2", "a3"]
    assert names(s.assign([Load(0, 0), Load(1, 7)], now=0.0)) == [(0, "big")]


def test_one_worker_and_a_big_job_next_waits_for_it_in_order():
    s = Scheduler(max_queue=100)
    s.offer("big", BIG, "bob")
    s.offer("a0", SMALL, "bob")
    assert s.assign([Load(0, 2)], now=0.0) == []
    assert names(s.assign([Load(0, 0)], now=0.0)) == [(0, "big")]


def test_a_drained_worker_goes_to_whoever_is_first_by_share():
    """Bob's third big job waits with worker 0 draining for it; when worker 0 is idle, Alice (who has used
    nothing) gets it before Bob (whose first big job was just charged)."""
    s = Scheduler(max_queue=100)
    for n in ("big1", "big2", "big3"):
        s.offer(n, BIG, "bob")
    s.offer("small", SMALL, "alice")
    out = s.assign([Load(0, 0), Load(1, 0)], now=0.0)
    assert names(out) == [(0, "big1"), (1, "big2")]
    assert s.assign([Load(0, 1, all_small=False), Load(1, 1, all_small=False)], now=0.0) == []
    s.ended(job_of(out, "big1"))
    s.charge("bob", 5.0, now=5.0)
    assert names(s.assign([Load(0, 0), Load(1, 1, all_small=False)], now=5.0)) == [(0, "small")]


def test_one_submitters_big_jobs_hold_no_more_workers_than_the_cap_and_a_classmate_finds_one():
    """Mallory drops as many big jobs as there are workers on an idle daemon: with a cap of one she gets one
    worker; Alice's small job, dropped after, takes the other at once. Her second big job goes once the first
    ends."""
    s = Scheduler(max_queue=100, max_workers=1)
    for name in ("big1", "big2"):
        s.offer(name, BIG, "mallory")
    out = s.assign([Load(0, 0), Load(1, 0)], now=0.0)
    assert names(out) == [(0, "big1")], "the second waits: mallory holds her one worker"
    s.offer("small", SMALL, "alice")
    assert names(s.assign([Load(0, 1, all_small=False), Load(1, 0)], now=0.0)) == [(1, "small")]
    s.ended(job_of(out, "big1"))
    assert names(s.assign([Load(0, 0), Load(1, 1)], now=0.0)) == [(0, "big2")]


def test_resumes_of_a_submitter_at_the_cap_hold_back_no_one_else():
    """Jobs taken back from .work go first, but a submitter's held there past the cap wait like their new
    ones, and the names of others go meanwhile."""
    s = Scheduler(max_queue=100, max_workers=1)
    s.resume([dataclasses.replace(claim(n), owner=os.getuid()) for n in ("r1.txt", "r2.txt")])
    s.offer("a.txt", BIG, "alice")
    out = s.assign([Load(0, 0), Load(1, 0), Load(2, 0)])
    assert names(out) == [(0, "r1.txt"), (1, "a.txt")]


@given(
    st.lists(st.tuples(st.sampled_from(["ann", "bob", "cy", None]), st.sampled_from([SMALL, BIG, None])), max_size=40),
    st.integers(1, 6),
    st.integers(1, 4),
    st.lists(st.integers(0, 5), min_size=1, max_size=6),
)
def test_no_submitter_holds_more_workers_with_big_jobs_than_the_cap(jobs, workers, cap, ends):
    """Whatever arrives and ends: no submitter's big jobs are in hand on more than ``cap`` workers, and a worker
    is left idle only while each submitter's next job is a big one and they are at the cap (their own later
    jobs wait behind it: each submitter's go in their order)."""
    s = Scheduler(max_queue=1000, max_workers=cap)
    for i, (who, size) in enumerate(jobs):
        s.offer(f"j{i:03d}", size, who)
    hands: dict[int, list[Item]] = {w: [] for w in range(workers)}
    for end in ends:
        out = s.assign([Load(w, len(h), all(i.small for i in h)) for w, h in hands.items()])
        for w, item in out:
            hands[w].append(item)
        big = Counter(i.submitter for h in hands.values() for i in h if not i.small)
        assert all(n <= cap for n in big.values())
        if any(not h for h in hands.values()):
            heads = {i.submitter: i for i in reversed(s.queued())}
            assert all(not i.small and big[i.submitter] == cap for i in heads.values()), "a worker idles for nothing"
        if hands[end % workers]:
            s.ended(hands[end % workers].pop(0).job_id)


def test_a_running_name_holds_back_only_its_own_submitters_next_file():
    """Bob's hw1.txt runs; Alice's hw1.txt is taken at once by the idle worker (keyed by submitter and name);
    Bob's own next hw1.txt waits until his first ends, then is looked at again."""
    s = Scheduler(max_queue=100)
    s.offer("hw1.txt", SMALL, "bob")
    out = s.assign([Load(0, 0), Load(1, 0)])
    assert s.offer("hw1.txt", SMALL, "alice"), "another student's file of the same name is not held back"
    assert names(s.assign([Load(0, 1), Load(1, 0)])) == [(1, "hw1.txt")]
    assert not s.offer("hw1.txt", SMALL, "bob")
    assert s.ended(job_of(out, "hw1.txt")) is True


def test_a_claim_given_back_waits_again_by_its_real_size_as_its_submitters_newest():
    """A small name whose claim found a big file (swapped by a rename): it waits again after the names already
    waiting (not first, as a resume), by its claim's size, and is given alone to an idle worker as a claim."""
    s = Scheduler(max_queue=100)
    s.offer("x.txt", SMALL, "alice")
    big = dataclasses.replace(claim("s.txt"), resumed=False, size=BIG)
    s.returned(big)
    assert [i.name for i in s.queued()] == ["x.txt", "s.txt"]
    assert names(s.assign([Load(0, 1), Load(1, 2)])) == [(0, "x.txt")], "the big one waits for an idle worker"
    out = s.assign([Load(0, 2), Load(1, 0)])
    assert [(w, i.name, i.claim) for w, i in out] == [(1, "s.txt", big)]
    assert out[0][1].job_id == big.job_id and not out[0][1].small


def test_one_submitters_waiting_files_are_capped_so_the_queue_keeps_room_for_others():
    """max_waiting: Mallory's flood takes 4 places of a queue of 10, the rest stay in the inbox; Alice's file,
    offered after, is taken; the queue is refilled once Mallory's part has drained to half."""
    s = Scheduler(max_queue=10, max_waiting=4)
    assert [s.offer(f"m{i}", SMALL, "mallory") for i in range(8)] == [True] * 4 + [False] * 4
    assert s.backlog and not s.full and not s.refill_due()
    assert s.offer("alice.txt", SMALL, "alice")
    out = s.assign([Load(0, 0)], now=0.0)
    for _, item in out[:2]:
        s.ended(item.job_id)
    assert s.refill_due()
    s.refilling()
    assert not s.backlog


def test_a_refill_takes_the_submitters_in_turn_least_used_first_not_by_age():
    s = Scheduler(max_queue=100)
    groups = {"mallory": ["m1", "m2", "m3"], "alice": ["a1"], "bob": ["b1", "b2"]}
    assert s.by_share(groups, now=0.0) == ["m1", "a1", "b1", "m2", "b2", "m3"]
    s.charge("mallory", 5.0, now=0.0)
    assert s.by_share(groups, now=0.0)[:3] == ["a1", "b1", "m1"]
