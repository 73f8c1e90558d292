"""A job's bytes shared with a kernel file's launch process: an anonymous memory file both processes map.

The operands or the input's text go to the launch process, and the product or the output's text come
back, without a pipe's copies: one side fills a mapping of a memory file (``memfd_create``), hands its
descriptor over the control socket (``SCM_RIGHTS``), and the other maps the same pages. A memory file
rather than :mod:`multiprocessing.shared_memory`: it has no name in ``/dev/shm`` that another user
could open or a killed process could leave behind, and it goes with its last descriptor and mapping.

numpy is imported where arrays are made: starting a launch process (:mod:`.launch`) imports nothing heavy.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


class Shared:
    """A memory file of ``nbytes`` (new), or the one behind ``fd`` (received: this object owns ``fd``), mapped
    (``populate``: its pages made at once).

    Arrays from :meth:`array` are views of the mapping and keep it alive after :meth:`close`."""

    def __init__(
        self, nbytes: int = 0, fd: int | None = None, *, writable: bool = True, populate: bool = False
    ) -> None:
        if fd is None:
            fd = os.memfd_create("mmd-job", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, nbytes)
            except OSError:
                os.close(fd)
                raise
        self.fd = fd
        self.nbytes = os.fstat(fd).st_size
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        # populate: the pages are made now (on the caller's thread), not as a reader first touches them
        flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if populate else 0)
        self._map = mmap.mmap(fd, self.nbytes, flags=flags, prot=prot) if self.nbytes else None  # mmap refuses 0

    def array(self, offset: int, shape: int | tuple[int, ...], dtype: Any = "float32") -> np.ndarray:
        """A view of ``shape`` × ``dtype`` at byte ``offset`` (checked against the file's size)."""
        import numpy as np

        count = int(np.prod(shape))
        size = count * np.dtype(dtype).itemsize
        if offset < 0 or offset + size > self.nbytes:
            raise ValueError(f"{size} bytes at {offset} are past the shared memory's {self.nbytes}")
        if self._map is None:
            return np.empty(shape, dtype)
        return np.frombuffer(self._map, dtype, count, offset).reshape(shape)

    def bytes_at(self, offset: int, nbytes: int) -> memoryview:
        """``nbytes`` bytes at ``offset``, as a memoryview of the mapping."""
        return self.array(offset, nbytes, "uint8").data.cast("B")

    def holds(self, view: np.ndarray | memoryview) -> bool:
        """Whether ``view`` lies inside this mapping (then it need not be copied to be shared)."""
        import numpy as np

        if self._map is None:
            return False
        whole = np.frombuffer(self._map, np.uint8)
        start = whole.__array_interface__["data"][0]
        there = np.frombuffer(view, np.uint8) if isinstance(view, memoryview) else view.view(np.uint8).reshape(-1)
        at = there.__array_interface__["data"][0]
        return start <= at and at + there.nbytes <= start + whole.nbytes

    def offset_of(self, view: np.ndarray | memoryview) -> int:
        """The byte offset of ``view`` (one :meth:`holds`) in the mapping."""
        import numpy as np

        whole = np.frombuffer(self._map, np.uint8) if self._map is not None else np.empty(0, np.uint8)
        there = np.frombuffer(view, np.uint8) if isinstance(view, memoryview) else view.view(np.uint8).reshape(-1)
        return int(there.__array_interface__["data"][0] - whole.__array_interface__["data"][0])

    def address(self) -> int:
        """Where the (writable) mapping lies in this process, for a driver to page-lock it there (0: empty)."""
        if self._map is None:
            return 0
        # a ctypes view, dropped at once: a view still alive would keep the mapping from closing
        return ctypes.addressof(ctypes.c_char.from_buffer(self._map))

    def close(self) -> None:
        """Close the descriptor; the mapping goes once no array uses it. Idempotent."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Operands:
    """An ``arrays`` job's memory file, laid out as the launch process reads it: A (m×k) at 0, B (k×n) after
    it, room for C (m×n) after B; ``a``, ``b``, ``c`` are views of it (its pages made at once: ``populate``).

    A caller that makes its operands here (``mmd grade``'s fresh inputs, made ahead on a thread of their own)
    spares the launch the copy into a new memory file: :meth:`of` finds them again from the arrays alone, as
    long as this object lives. Each product lands in its own memory file's C, so a product still being checked
    is never overwritten by the next launch's."""

    def __init__(self, m: int, k: int, n: int) -> None:
        sizes = (m * k * 4, k * n * 4, m * n * 4)
        self.shared = Shared(sum(sizes), populate=True)
        self.a = self.shared.array(0, (m, k))
        self.b = self.shared.array(sizes[0], (k, n))
        self.c = self.shared.array(sizes[0] + sizes[1], (m, n))
        _LAID_OUT[id(self.a)] = self

    @staticmethod
    def of(a: np.ndarray, b: np.ndarray) -> Operands | None:
        """The live Operands whose A and B are ``a`` and ``b`` themselves (not copies, not views of them)."""
        found = _LAID_OUT.get(id(a))
        return found if found is not None and found.a is a and found.b is b else None

    def close(self) -> None:
        """Close the descriptor (the arrays keep the mapping while they are used). Idempotent."""
        self.shared.close()


#: Operands by their A's id, while they live (an id is checked against the array itself: ids are reused).
_LAID_OUT: weakref.WeakValueDictionary[int, Operands] = weakref.WeakValueDictionary()
