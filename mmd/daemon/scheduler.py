"""The scheduler: which job goes to which worker next. No threads, no files, no clock of its own.

The server tells it what arrived (names with their sizes and submitters,
jobs to resume), what ended and how long each took; :meth:`Scheduler.assign`
answers which waiting job goes to which worker now, given each worker's
load and the time. The rules:

* jobs taken back from ``.work`` (resumed at start, held jobs after a pause,
  the batch-mates of a worker that died) go before any new name;
* **fair share by use**: of the new names, the next is the oldest of the
  submitter (the input's owner) who has used the least worker time lately,
  a sum of each finished job's time that halves every
  :data:`USE_HALF_LIFE_S` (as Slurm's fair-share factor decays), then in
  the order they became complete; one submitter's flood delays another's
  job by about one job, and with no submitters (a personal inbox) names go
  in arrival order;
* a worker with nothing in hand takes the next job, whatever its size; a
  worker that has only small jobs in hand may be given more small ones, up
  to :data:`~.tunables.MAX_GROUP` (it runs them one after another and commits
  them together); a big job waits for an idle worker, and a worker with a big
  job in hand is given nothing more, so that small jobs never queue behind a
  big one while another worker is free;
* a big job that finds no idle worker does not hold back everyone's small
  ones: one worker is left to drain for it (given nothing new), and the
  others go on taking small jobs of the submitters after it; once drained,
  that worker goes to whoever is first by share;
* **a submitter's big jobs hold at most** ``max_workers`` **workers at once**
  (resumes included): nothing is preempted, so without it one student who
  drops as many big jobs as there are workers on an idle daemon would hold
  them all, and a classmate's small job would wait for the shortest; a big
  job past its submitter's cap waits (and has no worker drained for it);
* at most ``max_waiting`` names of one submitter are held (waiting or in
  hand), and ``max_queue`` of everyone's; the rest stay in the inbox
  (:attr:`Scheduler.backlog`), and the server rescans to refill once the
  queue, or that submitter's part of it, has drained to half. A refill is
  offered by share (:meth:`Scheduler.by_share`: the submitters in turn),
  not by age, so one student's flood leaves the queue room for everyone
  else's files.

A job is keyed by its submitter and name: one student's ``hw1.txt`` never
holds back another's. A key is held once: offered again while it waits or
runs (a file replaced under the same name), it is looked at again when it
ends (:meth:`ended`). The jobs given out are known by their job id (an
item's, chosen at its offer, or its claim's).
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import math
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from ..job import new_id
from ..spool import Candidate, Claim
from .tunables import GROUP_INPUT_BYTES, MAX_GROUP

T = TypeVar("T")
#: A job's key: (its submitter, its inbox name).
Key = tuple[str | None, str]

#: Seconds in which a submitter's past use counts half: long enough that a flood is remembered while it is
#: served, short enough that yesterday's work weighs nothing on today's queue.
USE_HALF_LIFE_S = 600.0


@dataclass(frozen=True)
class Item:
    """A job the scheduler holds: an inbox ``name`` to claim, or a ``claim`` in ``.work`` to resume."""

    name: str
    claim: Claim | None = None
    #: The input's size in bytes where known (None: treated as big).
    size: int | None = None
    #: Who dropped it (a login; None where not known: every such job shares one share).
    submitter: str | None = None
    #: Arrival order among the names (ties between submitters go to the older).
    seq: int = field(default=0, compare=False)
    #: The job id it is given out under: chosen at its offer, or its claim's.
    job_id: str = field(default_factory=new_id, compare=False)
    #: The inbox file as it was offered (inode, size, owner): its claim checks that it took that one.
    seen: Candidate | None = field(default=None, compare=False)

    @property
    def small(self) -> bool:
        return self.size is not None and self.size <= GROUP_INPUT_BYTES

    @property
    def key(self) -> Key:
        return self.submitter, self.name


@dataclass(frozen=True)
class Load:
    """A worker as the scheduler sees it: how many jobs it has in hand, and whether all of them are small."""

    worker: int
    in_hand: int
    all_small: bool = True


class Usage:
    """Each submitter's worker time, decayed: halves every ``half_life`` seconds (pure: the time is given)."""

    def __init__(self, half_life: float = USE_HALF_LIFE_S) -> None:
        self.half_life = half_life
        self._used: dict[str | None, tuple[float, float]] = {}  # submitter -> (seconds, as of)

    def charge(self, submitter: str | None, seconds: float, now: float) -> None:
        self._used[submitter] = (self.of(submitter, now) + max(0.0, seconds), now)

    def of(self, submitter: str | None, now: float) -> float:
        used, at = self._used.get(submitter, (0.0, now))
        return used * 0.5 ** ((now - at) / self.half_life)


def workers_per_submitter(setting: int | None, workers: int, class_mode: bool) -> int | None:
    """The cap on the workers one submitter's big jobs may hold (``max_workers_per_submitter``); null: half the
    workers, rounded up, on a class's box, none on a personal one (None: no cap)."""
    if setting is not None:
        return setting
    return max(1, math.ceil(workers / 2)) if class_mode else None


class Scheduler:
    """Pull scheduling for the daemon's workers (see the module's docstring for the rules)."""

    def __init__(
        self,
        max_queue: int,
        max_group: int = MAX_GROUP,
        usage: Usage | None = None,
        *,
        max_waiting: int | None = None,
        max_workers: int | None = None,
    ) -> None:
        self.max_queue = max_queue
        self.max_group = max_group
        self.usage = usage or Usage()
        #: The most keys one submitter may hold (waiting or in hand); None: only max_queue bounds them.
        self.max_waiting = max_waiting
        #: The most workers one submitter's big jobs may hold at once; None: no cap.
        self.max_workers = max_workers
        self._resumes: deque[Item] = deque()
        self._names: dict[str | None, deque[Item]] = {}  # by submitter, each in arrival order
        self._arrived = 0  # names offered so far: the next one's seq
        self._held: set[Key] = set()  # keys waiting or in hand
        self._per: Counter[str | None] = Counter()  # held keys by submitter
        self._again: set[Key] = set()  # offered again while held: looked at once more when they end
        self._broken: set[Key] = set()  # keys whose claim failed: not offered until forgiven
        self._in_hand: dict[str, Item] = {}  # given out, by job id
        self._big: Counter[str | None] = Counter()  # big jobs in hand, by submitter
        self._draining: int | None = None  # a worker given nothing new: a big job waits for it
        self._full = False  # names were left in the inbox because the queue was full
        self._capped: set[str | None] = set()  # submitters whose names were left in the inbox (max_waiting)

    def _hold(self, key: Key) -> None:
        if key not in self._held:
            self._held.add(key)
            self._per[key[0]] += 1

    def _release(self, key: Key) -> None:
        if key in self._held:
            self._held.discard(key)
            self._per[key[0]] -= 1
            if not self._per[key[0]]:
                del self._per[key[0]]

    def _arrive(self) -> int:
        self._arrived += 1
        return self._arrived - 1

    # -- what arrives --
    def offer(self, name: str, size: int | None, submitter: str | None = None, seen: Candidate | None = None) -> bool:
        """A complete inbox file (``seen``: as a stat saw it); False when it is not taken now (held already,
        broken, or the queue, or its submitter's part of it, is full)."""
        key = (submitter, name)
        if key in self._held:
            self._again.add(key)
            return False
        if key in self._broken:
            return False
        if self.max_waiting is not None and self._per[submitter] >= self.max_waiting:
            self._capped.add(submitter)
            return False
        if len(self._held) >= self.max_queue:
            self._full = True
            return False
        self._hold(key)
        item = Item(name, size=size, submitter=submitter, seq=self._arrive(), seen=seen)
        self._names.setdefault(submitter, deque()).append(item)
        return True

    def by_share(self, groups: Mapping[str | None, Sequence[T]], now: float) -> list[T]:
        """What to offer from a rescan: ``groups`` (each submitter's files, in the order to offer them) as one
        list, the submitters in turn (the least used first, else in ``groups``' order), so that a queue that
        fills up on the way has taken each submitter's first files before anyone's later ones."""
        order = sorted(groups, key=lambda submitter: self.usage.of(submitter, now))
        rounds = itertools.zip_longest(*(groups[submitter] for submitter in order))
        return [x for turn in rounds for x in turn if x is not None]

    def resume(self, claims: Iterable[Claim]) -> None:
        """Jobs in ``.work`` to run (or archive) again; they go before any new name."""
        for claim in claims:
            self._hold((claim.submitter, claim.name))
            # No size: each runs alone (as a big job does), so that one which kills its worker takes no
            # batch-mates with it.
            self._resumes.append(Item(claim.name, claim=claim, submitter=claim.submitter, job_id=claim.job_id))

    def returned(self, claim: Claim) -> None:
        """A job claimed for a name and not run, since the claim found another file there than the one offered
        (a small drop swapped for a big one): it waits again as its submitter's newest arrival, by its claim's
        size (to run alone when big, within the cap), not before the names as a resume does."""
        self._hold((claim.submitter, claim.name))
        item = Item(claim.name, claim=claim, size=claim.size, submitter=claim.submitter, seq=self._arrive(),
                    job_id=claim.job_id)  # fmt: skip
        self._names.setdefault(claim.submitter, deque()).append(item)

    def charge(self, submitter: str | None, seconds: float, now: float) -> None:
        """A job of ``submitter`` took ``seconds`` of a worker (counted toward their share)."""
        self.usage.charge(submitter, seconds, now)

    def _give(self, item: Item) -> None:
        self._in_hand[item.job_id] = item
        if not item.small:
            self._big[item.submitter] += 1

    def ended(self, job_id: str, *, broken: bool = False) -> bool:
        """Job ``job_id`` ended (or was not run); True when its name was completed again meanwhile and should
        be offered once more. ``broken``: its claim failed; not taken again until :meth:`forgive`."""
        item = self._in_hand.pop(job_id, None)
        if item is None:
            return False
        if not item.small:
            self._big[item.submitter] -= 1
            if not self._big[item.submitter]:
                del self._big[item.submitter]
        key = item.key
        self._release(key)
        if broken:
            self._broken.add(key)
        if key in self._again:
            self._again.discard(key)
            return not broken
        return False

    def arrivals(self) -> int:
        """A mark of this moment among the arrivals: every name offered from now on has a ``seq`` at or past it."""
        return self._arrived

    def waiting_before(self, mark: int, use: float, now: float) -> bool:
        """Whether a job waits that goes before a grader's window asked at ``mark`` (:meth:`arrivals`) by a grader
        whose use lately is ``use``: a resume, a name that arrived before the window was asked (between two windows
        every job queued meanwhile is served), or one whose submitter has used less (the fair share)."""
        if self._resumes:
            return True
        return any(q and (q[0].seq < mark or self.usage.of(q[0].submitter, now) < use) for q in self._names.values())

    def forgive(self) -> None:
        """Broken names may be tried again (at a rescan)."""
        self._broken.clear()

    def is_broken(self, name: str, submitter: str | None = None) -> bool:
        return (submitter, name) in self._broken

    # -- what goes out --
    def _by_share(self, now: float) -> list[deque[Item]]:
        """The submitters' queues with names waiting, least used first (then the oldest waiting name)."""
        queues = [q for q in self._names.values() if q]
        return sorted(queues, key=lambda q: self._share_key(q[0], now))

    def _share_key(self, item: Item, now: float) -> tuple[float, int]:
        """Which waiting name goes first: its submitter's use lately, then its arrival."""
        return self.usage.of(item.submitter, now), item.seq

    def _over_cap(self, item: Item) -> bool:
        """Whether ``item`` is a big job whose submitter's big jobs hold as many workers as one may."""
        return self.max_workers is not None and not item.small and self._big[item.submitter] >= self.max_workers

    def assign(self, loads: Iterable[Load], now: float = 0.0) -> list[tuple[int, Item]]:
        """Which waiting job goes to which worker now (worker index, item), in the order to send them; each is
        in hand from here until :meth:`ended` (by its ``job_id``)."""
        room = {w.worker: [w.in_hand, w.all_small] for w in loads}
        if self._draining not in room or room[self._draining][0] == 0:
            self._draining = None  # drained: its next job goes by share like any other's
        out: list[tuple[int, Item]] = []
        blocked: set[int] = set()  # queues whose first job waits (for a worker to drain, or under the cap)
        while True:
            queue = self._resumes
            item = next((i for i in self._resumes if not self._over_cap(i)), None)
            if item is None:  # resumes first, but none of a submitter at the cap holds back everyone else's
                found = next((q for q in self._by_share(now) if id(q) not in blocked), None)
                if found is None:
                    break
                queue, item = found, found[0]
                if self._over_cap(item):
                    blocked.add(id(queue))
                    continue
            idle = [w for w, (n, _) in room.items() if n == 0]
            worker: int | None = None
            if item.small:  # never on the worker left to drain for a big job
                idle = [w for w in idle if w != self._draining]
                fits = [
                    (n, w) for w, (n, small) in room.items() if small and n < self.max_group and w != self._draining
                ]
                worker = idle[0] if idle else min(fits)[1] if fits else None
            elif idle:
                worker = self._draining if self._draining in idle else idle[0]
                if worker == self._draining:
                    self._draining = None
            elif self._draining is None and len(room) > 1:
                self._draining = min(room, key=lambda w: (room[w][0], w))
            if worker is None:
                if queue is self._resumes:
                    break  # resumes keep their order
                blocked.add(id(queue))
                continue
            queue.remove(item)
            room[worker][0] += 1
            room[worker][1] = room[worker][1] and item.small
            self._give(item)
            out.append((worker, item))
        return out

    def drop_waiting(self) -> list[Item]:
        """Forget the new names not yet given to a worker (a pause: they stay in the inbox for the rescan after
        it; resumes and claimed jobs are kept). Returns the names dropped."""
        dropped: list[Item] = []
        for submitter, queue in self._names.items():
            dropped += (item for item in queue if item.claim is None)
            self._names[submitter] = deque(item for item in queue if item.claim is not None)
        for item in dropped:
            self._release(item.key)
            self._again.discard(item.key)
        return dropped

    def queued(self, now: float = 0.0, limit: int | None = None) -> list[Item]:
        """The jobs not yet given to a worker, in about the order they will be (resumes first, then by the
        submitters' shares as they stand); ``limit``: the first so many only (each submitter's queue is in
        order already: merged, never sorted whole)."""
        names = heapq.merge(*(q for q in self._names.values() if q), key=lambda item: self._share_key(item, now))
        return list(itertools.islice(itertools.chain(self._resumes, names), limit))

    def places(self, submitter: str | None, now: float = 0.0) -> list[tuple[int, Item]]:
        """``submitter``'s jobs not yet given to a worker, each with its place in :meth:`queued`'s order (1:
        next), at the cost of their own jobs and the number of submitters, never of the whole queue: what a
        student's status costs. Each queue is in :meth:`_share_key`'s order already, so another's queue goes
        wholly before theirs, wholly after, or (a tie of use) interleaved, where it is bisected by that key."""
        out = [(place, item) for place, item in enumerate(self._resumes, 1) if item.submitter == submitter]
        mine = self._names.get(submitter)
        if not mine:
            return out
        key = functools.partial(self._share_key, now=now)
        first, last = key(mine[0]), key(mine[-1])
        ahead = len(self._resumes)
        between: list[deque[Item]] = []  # others' queues whose names go among theirs
        for other, queue in self._names.items():
            if other == submitter or not queue:
                continue
            if key(queue[-1]) < first:
                ahead += len(queue)
            elif key(queue[0]) < last:
                between.append(queue)
        for index, item in enumerate(mine):
            earlier = sum(bisect.bisect_left(queue, key(item), key=key) for queue in between)
            out.append((ahead + earlier + index + 1, item))
        return out

    def cancel(self, name: str, submitter: str | None) -> Item | None:
        """Take ``submitter``'s waiting job ``name`` out of the queue (it will not be given to a worker); None
        when it is not waiting (in hand, or unknown). Looks at the resumes and that submitter's names only."""
        for queue in (self._resumes, self._names.get(submitter, deque())):
            for item in queue:
                if item.name == name and item.submitter == submitter:
                    queue.remove(item)
                    self._release(item.key)
                    self._again.discard(item.key)
                    return item
        return None

    # -- what it holds --
    @property
    def waiting(self) -> int:
        """Jobs not yet given to a worker."""
        return len(self._resumes) + sum(len(q) for q in self._names.values())

    @property
    def held(self) -> int:
        """Keys waiting or in hand (what max_queue bounds)."""
        return len(self._held)

    @property
    def full(self) -> bool:
        """Names were left in the inbox because the whole queue was full (max_queue)."""
        return self._full

    @property
    def backlog(self) -> bool:
        """Names were left in the inbox: the queue, or a submitter's part of it, was full (a rescan refills)."""
        return self._full or bool(self._capped)

    def refill_due(self) -> bool:
        """Whether a rescan should refill the queue: names were left in the inbox and the queue, or the part of
        it of a submitter who had files left there, has drained to half."""
        if self._full and self.held <= self.max_queue // 2:
            return True
        return self.max_waiting is not None and any(self._per[s] <= self.max_waiting // 2 for s in self._capped)

    def refilling(self) -> None:
        """A rescan offers the inbox again: what was left there is counted anew."""
        self._full = False
        self._capped.clear()
