"""The inbox folder as the main process follows it: watched by an observer, and served anew when it is deleted and
made again.

The folder is known by its device and inode. When it is gone the daemon
waits for it; when another folder stands at its path the spool's folders
are made again there, the lock is taken again (another daemon may have
taken the new folder meanwhile: then this one cannot serve) and the new
folder is watched.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterator
from typing import Any, Literal

from ..config import Settings
from ..spool import Spool
from .lock import SpoolLock
from .messages import Hint
from .observer import Watcher, make_observer


class Inbox:
    """The inbox folder being served: its identity and its observer."""

    def __init__(self, spool: Spool, lock: SpoolLock, post: Callable[[Hint], None], log: Any) -> None:
        self.spool = spool
        self.lock = lock
        #: Where a polling observer posts its hints.
        self.post = post
        self.log = log
        #: The observer (None: there is none, as with ``--once``).
        self.watcher: Watcher | None = None
        self._ident: tuple[int, int] | None = None  # (st_dev, st_ino) of the folder served
        self._gone = False

    def served(self) -> None:
        """The folder at the inbox's path now is the one served (at the start, once it is made and locked)."""
        self._ident = _identity(self.spool.shared.inbox)

    @contextlib.contextmanager
    def watched(self, settings: Settings) -> Iterator[str]:
        """Watch the inbox while the context lasts; gives the kind of observer used."""
        kind = self._watch(settings)
        try:
            yield kind
        finally:
            self._unwatch()

    def check(self, settings: Settings) -> Literal["gone", "remade"] | None:
        """Look whether the folder at the inbox's path is still the one served: None when it is (or is still
        gone), ``"gone"`` the first time it is not there, ``"remade"`` once another stands there, now served:
        the spool's folders made, the lock taken again (SpoolError: another daemon has it), watched anew."""
        ident = _identity(self.spool.shared.inbox)
        if ident == self._ident:
            return None
        if ident is None:
            gone, self._gone = self._gone, True
            if gone:
                return None
            self.log.error("the inbox is gone; waiting for it to be made again", inbox=str(self.spool.shared.inbox))
            return "gone"
        self.log.warning("the inbox was made again; serving the new folder", inbox=str(self.spool.shared.inbox))
        self._gone, self._ident = False, ident
        self.spool.shared.forget_folders()
        self.spool.shared.prepare()
        self.lock.release()
        self.lock.acquire()
        if self.watcher is not None:
            self._unwatch()
            self._watch(settings)
        return "remade"

    def _watch(self, settings: Settings) -> str:
        self.watcher, kind = make_observer(settings.observer, self.spool.shared.inbox, self.post, settings.poll_seconds,
                                           self.log)  # fmt: skip
        return kind

    def _unwatch(self) -> None:
        watcher, self.watcher = self.watcher, None
        if watcher is not None:
            watcher.stop()
            with contextlib.suppress(RuntimeError):
                watcher.join(timeout=5)


def _identity(folder: os.PathLike[str]) -> tuple[int, int] | None:
    """(st_dev, st_ino) of ``folder`` (None: it is not a folder, or not there)."""
    try:
        info = os.stat(folder)
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISDIR(info.st_mode) else None
