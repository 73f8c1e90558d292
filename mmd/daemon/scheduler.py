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
  to :data:`~.common.MAX_GROUP` (it runs them one after another and commits
  them together); a big job waits for an idle worker, and a worker with a big
  job in hand is given nothing more, so that small jobs never queue behind a
  big one while another worker is free;
* a big job that finds no idle worker does not hold back everyone's small
  ones: one worker is left to drain for it (given nothing new), and the
  others go on taking small jobs of the submitters after it; once drained,
  that worker goes to whoever is first by share;
* at most ``max_queue`` names are held (waiting or in hand); the rest stay in
  the inbox (:attr:`Scheduler.backlog`), and the server rescans to refill
  once the count has drained to half.

A name is held once: offered again while it waits or runs (a file replaced
under the same name), it is looked at again when it ends (:meth:`ended`).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..spool import Claim
from .common import GROUP_INPUT_BYTES, MAX_GROUP

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

    @property
    def small(self) -> bool:
        return self.size is not None and self.size <= GROUP_INPUT_BYTES


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


class Scheduler:
    """Pull scheduling for the daemon's workers (see the module's docstring for the rules)."""

    def __init__(self, max_queue: int, max_group: int = MAX_GROUP, usage: Usage | None = None) -> None:
        self.max_queue = max_queue
        self.max_group = max_group
        self.usage = usage or Usage()
        self._resumes: deque[Item] = deque()
        self._names: dict[str | None, deque[Item]] = {}  # by submitter, each in arrival order
        self._arrivals = itertools.count()
        self._held: set[str] = set()  # names waiting or in hand
        self._again: set[str] = set()  # offered again while held: looked at once more when they end
        self._broken: set[str] = set()  # names whose claim failed: not offered until forgiven
        self._draining: int | None = None  # a worker given nothing new: a big job waits for it
        #: Names were left in the inbox because the queue was full (a rescan refills it).
        self.backlog = False

    # -- what arrives --
    def offer(self, name: str, size: int | None, submitter: str | None = None) -> bool:
        """A complete inbox file; False when it is not taken now (held already, broken, or the queue is full)."""
        if name in self._held:
            self._again.add(name)
            return False
        if name in self._broken:
            return False
        if len(self._held) >= self.max_queue:
            self.backlog = True
            return False
        self._held.add(name)
        item = Item(name, size=size, submitter=submitter, seq=next(self._arrivals))
        self._names.setdefault(submitter, deque()).append(item)
        return True

    def took(self, name: str) -> None:
        """A worker claimed inbox file ``name`` on its own (a watch): in hand from now, no longer waiting."""
        for queue in self._names.values():
            for item in queue:
                if item.name == name:
                    queue.remove(item)
                    break
        self._held.add(name)

    def resume(self, claims: Iterable[Claim]) -> None:
        """Jobs in ``.work`` to run (or archive) again; they go before any new name."""
        for claim in claims:
            self._held.add(claim.name)
            # No size: each runs alone (as a big job does), so that one which kills its worker takes no
            # batch-mates with it.
            self._resumes.append(Item(claim.name, claim=claim, submitter=claim.submitter))

    def charge(self, submitter: str | None, seconds: float, now: float) -> None:
        """A job of ``submitter`` took ``seconds`` of a worker (counted toward their share)."""
        self.usage.charge(submitter, seconds, now)

    def ended(self, name: str, *, broken: bool = False) -> bool:
        """The job of ``name`` ended (or was not run); True when the name was completed again meanwhile and
        should be offered once more. ``broken``: its claim failed; not taken again until :meth:`forgive`."""
        self._held.discard(name)
        if broken:
            self._broken.add(name)
        if name in self._again:
            self._again.discard(name)
            return not broken
        return False

    def forgive(self) -> None:
        """Broken names may be tried again (at a rescan)."""
        self._broken.clear()

    def is_broken(self, name: str) -> bool:
        return name in self._broken

    # -- what goes out --
    def _by_share(self, now: float) -> list[deque[Item]]:
        """The submitters' queues with names waiting, least used first (then the oldest waiting name)."""
        queues = [q for q in self._names.values() if q]
        return sorted(queues, key=lambda q: self._share_key(q[0], now))

    def _share_key(self, item: Item, now: float) -> tuple[float, int]:
        """Which waiting name goes first: its submitter's use lately, then its arrival."""
        return self.usage.of(item.submitter, now), item.seq

    def assign(self, loads: Iterable[Load], now: float = 0.0) -> list[tuple[int, Item]]:
        """Which waiting job goes to which worker now (worker index, item), in the order to send them."""
        room = {w.worker: [w.in_hand, w.all_small] for w in loads}
        if self._draining not in room or room[self._draining][0] == 0:
            self._draining = None  # drained: its next job goes by share like any other's
        out: list[tuple[int, Item]] = []
        blocked: set[int] = set()  # queues whose first job is big and waits for a worker to drain
        while True:
            queue: deque[Item] | None = self._resumes or next(
                (q for q in self._by_share(now) if id(q) not in blocked), None
            )
            if queue is None:
                break
            item = queue[0]
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
            queue.popleft()
            room[worker][0] += 1
            room[worker][1] = room[worker][1] and item.small
            out.append((worker, item))
        return out

    def drop_waiting(self) -> list[Item]:
        """Forget the jobs not yet given to a worker (a pause: new names stay in the inbox for the rescan after
        it; resumes are kept). Returns the names dropped."""
        dropped = [item for queue in self._names.values() for item in queue]
        self._names.clear()
        for item in dropped:
            self._held.discard(item.name)
            self._again.discard(item.name)
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
        student's status costs."""
        out = [(place, item) for place, item in enumerate(self._resumes, 1) if item.submitter == submitter]
        mine = self._names.get(submitter)
        if not mine:
            return out
        use = self.usage.of(submitter, now)
        ahead = len(self._resumes)
        tied: list[deque[Item]] = []  # submitters whose use equals theirs: their names go by arrival
        for other, queue in self._names.items():
            if other != submitter and queue:
                theirs = self.usage.of(other, now)
                if theirs < use:
                    ahead += len(queue)
                elif theirs == use:
                    tied.append(queue)
        for index, item in enumerate(mine):
            earlier = sum(bisect.bisect_left(queue, item.seq, key=lambda i: i.seq) for queue in tied)
            out.append((ahead + earlier + index + 1, item))
        return out

    def cancel(self, name: str, submitter: str | None) -> Item | None:
        """Take ``submitter``'s waiting job ``name`` out of the queue (it will not be given to a worker); None
        when it is not waiting (in hand, or unknown). Looks at the resumes and that submitter's names only."""
        for queue in (self._resumes, self._names.get(submitter, deque())):
            for item in queue:
                if item.name == name and item.submitter == submitter:
                    queue.remove(item)
                    self._held.discard(name)
                    self._again.discard(name)
                    return item
        return None

    # -- what it holds --
    @property
    def waiting(self) -> int:
        """Jobs not yet given to a worker."""
        return len(self._resumes) + sum(len(q) for q in self._names.values())

    @property
    def held(self) -> int:
        """Names waiting or in hand (what max_queue bounds)."""
        return len(self._held)

    def refill_due(self) -> bool:
        """Whether a rescan should refill the queue: names were left in the inbox and it has drained to half."""
        return self.backlog and self.held <= self.max_queue // 2
