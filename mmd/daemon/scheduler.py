"""The scheduler: which job goes to which worker next. No threads, no files, no clock of its own.

The server tells it what arrived (names with their sizes, jobs to resume)
and what ended; :meth:`Scheduler.assign` answers which waiting job goes to
which worker now, given each worker's load. The rules:

* jobs taken back from ``.work`` (resumed at start, held jobs after a pause,
  the batch-mates of a worker that died) go before any new name;
* new names go in the order they became complete;
* a worker with nothing in hand takes the next job, whatever its size; a
  worker that has only small jobs in hand may be given more small ones, up
  to :data:`~.common.MAX_GROUP` (it runs them one after another and commits
  them together); a big job waits for an idle worker, and a worker with a big
  job in hand is given nothing more, so that small jobs never queue behind a
  big one while another worker is free;
* at most ``max_queue`` names are held (waiting or in hand); the rest stay in
  the inbox (:attr:`Scheduler.backlog`), and the server rescans to refill
  once the count has drained to half.

A name is held once: offered again while it waits or runs (a file replaced
under the same name), it is looked at again when it ends (:meth:`ended`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from ..spool import Claim
from .common import GROUP_INPUT_BYTES, MAX_GROUP


@dataclass(frozen=True)
class Item:
    """A job the scheduler holds: an inbox ``name`` to claim, or a ``claim`` in ``.work`` to resume."""

    name: str
    claim: Claim | None = None
    #: The input's size in bytes where known (None: treated as big).
    size: int | None = None

    @property
    def small(self) -> bool:
        return self.size is not None and self.size <= GROUP_INPUT_BYTES


@dataclass(frozen=True)
class Load:
    """A worker as the scheduler sees it: how many jobs it has in hand, and whether all of them are small."""

    worker: int
    in_hand: int
    all_small: bool = True


class Scheduler:
    """Pull scheduling for the daemon's workers (see the module's docstring for the rules)."""

    def __init__(self, max_queue: int, max_group: int = MAX_GROUP) -> None:
        self.max_queue = max_queue
        self.max_group = max_group
        self._resumes: deque[Item] = deque()
        self._names: deque[Item] = deque()
        self._held: set[str] = set()  # names waiting or in hand
        self._again: set[str] = set()  # offered again while held: looked at once more when they end
        self._broken: set[str] = set()  # names whose claim failed: not offered until forgiven
        #: Names were left in the inbox because the queue was full (a rescan refills it).
        self.backlog = False

    # -- what arrives --
    def offer(self, name: str, size: int | None) -> bool:
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
        self._names.append(Item(name, size=size))
        return True

    def resume(self, claims: Iterable[Claim]) -> None:
        """Jobs in ``.work`` to run (or archive) again; they go before any new name."""
        for claim in claims:
            self._held.add(claim.name)
            self._resumes.append(Item(claim.name, claim=claim))

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
    def assign(self, loads: Iterable[Load]) -> list[tuple[int, Item]]:
        """Which waiting job goes to which worker now (worker index, item), in the order to send them."""
        room = {w.worker: [w.in_hand, w.all_small] for w in loads}
        out: list[tuple[int, Item]] = []
        while self._resumes or self._names:
            queue = self._resumes or self._names
            item = queue[0]
            idle = [w for w, (n, _) in room.items() if n == 0]
            if idle:
                worker = idle[0]
            elif item.small:
                fits = [(n, w) for w, (n, small) in room.items() if small and n < self.max_group]
                if not fits:
                    break
                worker = min(fits)[1]
            else:
                break
            queue.popleft()
            room[worker][0] += 1
            room[worker][1] = room[worker][1] and item.small
            out.append((worker, item))
        return out

    def drop_waiting(self) -> list[Item]:
        """Forget the jobs not yet given to a worker (a pause: new names stay in the inbox for the rescan after
        it; resumes are kept). Returns the names dropped."""
        dropped = list(self._names)
        self._names.clear()
        for item in dropped:
            self._held.discard(item.name)
            self._again.discard(item.name)
        return dropped

    def queued(self) -> list[Item]:
        """The jobs not yet given to a worker, in the order they will be (resumes first)."""
        return [*self._resumes, *self._names]

    def cancel(self, name: str) -> Item | None:
        """Take the waiting job ``name`` out of the queue (it will not be given to a worker); None when it is
        not waiting (in hand, or unknown)."""
        for queue in (self._resumes, self._names):
            for item in queue:
                if item.name == name:
                    queue.remove(item)
                    self._held.discard(name)
                    self._again.discard(name)
                    return item
        return None

    # -- what it holds --
    @property
    def waiting(self) -> int:
        """Jobs not yet given to a worker."""
        return len(self._resumes) + len(self._names)

    @property
    def held(self) -> int:
        """Names waiting or in hand (what max_queue bounds)."""
        return len(self._held)

    def refill_due(self) -> bool:
        """Whether a rescan should refill the queue: names were left in the inbox and it has drained to half."""
        return self.backlog and self.held <= self.max_queue // 2
