"""What a benchmark runs: cases (one kernel at one shape and tile), plans of them, and the named plans.

A kernel is a :class:`~mmd.kernelchoice.KernelChoice`: one of mmd's own, or a kernel file (``mmd bench
--kernel-file``), which runs through the same cases, checks and rows under its file's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import kernels as registry
from ..backends.base import Backend
from ..config import MEMORY_MODES
from ..kernelchoice import KernelChoice

#: The course's size sweep (at tile 32) and tile sweep (at 4096). Tile 64 is
#: in the sweep on purpose: it must come out refused, with its reason.
COURSE_SIZES: tuple[int, ...] = (32, 256, 512, 1024, 2048, 4096)
COURSE_TILES: tuple[int, ...] = (*registry.TILES, 64)
COURSE_SIZES_AT_TILE = 32
COURSE_TILES_AT_SIZE = 4096

#: The cpu backend is not run above this size unless the plan says otherwise.
CPU_MAX_SIZE = 2048

#: Noise at which the bench stops repeating a case in memory (``--noise``): 2 % of the median.
NOISE = 0.02
#: Timed calls at most per case in memory (``--max-repeats``).
MAX_REPEATS = 100

#: The accuracy sweep (``--accuracy``): M = N = ACCURACY_MN, K = 32, 64, ..., 8192.
ACCURACY_KS: tuple[int, ...] = tuple(32 * 2**i for i in range(9))
ACCURACY_MN = 1024


@dataclass(frozen=True)
class Case:
    """One kernel at one shape and tile (tile None for kernels that take none)."""

    choice: KernelChoice
    m: int
    k: int
    n: int
    tile: int | None
    #: Why this case is not run (decided by the plan), or None.
    skip: str | None = None

    @property
    def kernel(self) -> str:
        """The kernel's name: the registry's, or the kernel file's (``p1.cu``)."""
        return self.choice.name

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.m, self.k, self.n)

    def label(self) -> str:
        tile = f"tile {self.tile}" if self.tile is not None else "no tile"
        return f"{self.kernel} {tile} {self.m}x{self.k}x{self.n}"


@dataclass(frozen=True)
class Plan:
    """What to run.

    By default the plan has the course's shape: every size at tile
    ``sizes_at_tile``, and every tile at size ``tiles_at_size`` (the largest
    size when None). ``grid`` runs every size at every tile instead. Sizes
    are square (N×N times N×N). Kernels that use no tile (cublas, cpu) run
    once per size.
    """

    #: The kernels: choices, or registry names for short (:attr:`choices` has each as a KernelChoice).
    kernels: tuple[KernelChoice | str, ...]
    sizes: tuple[int, ...]
    tiles: tuple[int, ...]
    repeats: int = 5
    warmup: int = 1
    memory: str = "device"
    through_files: bool = False
    #: How ``--through-files`` jobs handle their text: auto, host or gpu (docs/textpath.md).
    text_path: str = "auto"
    sizes_at_tile: int = COURSE_SIZES_AT_TILE
    tiles_at_size: int | None = None
    grid: bool = False
    #: The cpu kernel is skipped above this size (None: no limit).
    cpu_max_size: int | None = CPU_MAX_SIZE
    seed: int = 0
    #: In memory: stop once the kernel median's noise is below this (a fraction: 0.02 = 2 %) ...
    noise: float = NOISE
    #: ... or after this many timed calls (never fewer than ``repeats``).
    max_repeats: int = MAX_REPEATS
    #: In memory: evict the L2 cache before each call's kernel phase (:attr:`MultiplyRequest.flush_l2`).
    flush_l2: bool = True
    #: After the timed cases, measure each kernel's error against float64 over K (:func:`run_accuracy`).
    accuracy: bool = False
    accuracy_mn: int = ACCURACY_MN
    accuracy_ks: tuple[int, ...] = ACCURACY_KS

    def __post_init__(self) -> None:
        named: dict[str, KernelChoice] = {}
        for choice in self.choices:  # KernelError naming the registry's choices for a name it lacks
            if named.setdefault(choice.name, choice) != choice:
                # rows, graphs and tables call a kernel file by its name: two files of one name would be one kernel
                raise ValueError(f"two kernel files are called {choice.name} ({named[choice.name].path}, "
                                 f"{choice.path}): rename one")  # fmt: skip
        if not self.kernels or not self.sizes or not self.tiles:
            raise ValueError("a plan needs at least one kernel, one size and one tile")
        if min(self.sizes) < 1 or min(self.tiles) < 1 or self.sizes_at_tile < 1:
            raise ValueError("sizes and tiles must be positive")
        if self.tiles_at_size is not None and self.tiles_at_size < 1:
            raise ValueError("tiles_at_size must be positive")
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError("repeats must be at least 1 and warmup at least 0")
        if self.max_repeats < 1 or not self.noise >= 0:
            raise ValueError("max_repeats must be at least 1 and noise at least 0")
        if self.accuracy_mn < 1 or not self.accuracy_ks or min(self.accuracy_ks) < 1:
            raise ValueError("the accuracy sweep's M = N and its K values must be positive")
        if self.memory not in MEMORY_MODES:
            raise ValueError(f"memory must be one of {', '.join(MEMORY_MODES)}, got {self.memory!r}")

    @property
    def choices(self) -> tuple[KernelChoice, ...]:
        """The kernels, without repeats, each a KernelChoice (a name: one of mmd's own)."""
        made = (k if isinstance(k, KernelChoice) else KernelChoice.builtin(k) for k in self.kernels)
        return tuple(dict.fromkeys(made))

    @property
    def kernel_files(self) -> tuple[KernelChoice, ...]:
        """The kernels that are files, in the order given."""
        return tuple(c for c in self.choices if c.is_file)

    @property
    def mode(self) -> str:
        return "files" if self.through_files else "memory"

    @property
    def adaptive(self) -> bool:
        """Whether cases repeat until their noise is low (in memory; through files each job costs seconds)."""
        return not self.through_files

    @property
    def cap(self) -> int:
        """The most timed calls one case makes: ``max_repeats`` in memory (at least ``repeats``), else ``repeats``."""
        return max(self.repeats, self.max_repeats) if self.adaptive else self.repeats

    def pairs(self) -> list[tuple[int, int]]:
        """(size, tile) pairs, sizes ascending, without repeats."""
        if self.grid:
            pairs = [(s, t) for s in self.sizes for t in self.tiles]
        else:
            at = self.tiles_at_size if self.tiles_at_size is not None else max(self.sizes)
            pairs = [(s, self.sizes_at_tile) for s in self.sizes] + [(at, t) for t in self.tiles]
        return sorted(set(pairs))

    def cases(self) -> list[Case]:
        """Every case, grouped by size (each size's inputs are made once): mmd's own kernels in registry order,
        then the kernel files in the order given."""
        given = self.choices
        order = {name: i for i, name in enumerate(registry.NAMES)}
        kernels = sorted(given, key=lambda c: (order.get(c.name, len(order)), given.index(c)))
        seen: set[tuple[KernelChoice, int, int | None]] = set()
        cases: list[Case] = []
        for size, tile in self.pairs():
            for choice in kernels:
                case_tile = tile if choice.uses_tile else None
                key = (choice, size, case_tile)
                if key in seen:
                    continue
                seen.add(key)
                skip = None
                if choice.on_host and self.cpu_max_size is not None and size > self.cpu_max_size:
                    skip = f"cpu above size {self.cpu_max_size} (raise --cpu-max-size to run it)"
                cases.append(Case(choice, size, size, size, case_tile, skip))
        return cases


#: The ladder's plan (``mmd bench --plan ladder``): the top of the fp32 road (``fast``), the tensor-core
#: rung (``tc1``, ``tc3``) and cuBLAS in both its modes, at the sizes where they differ. None takes a tile.
LADDER_KERNELS: tuple[str, ...] = ("fast", "tc1", "tc3", "cublas", "cublas_tf32")
LADDER_SIZES: tuple[int, ...] = (1024, 2048, 4096, 8192)

#: The named plans' kernels, sizes and tiles; any of them may be changed (``--kernels``, ``--sizes`` ...).
PLANS: dict[str, dict[str, Any]] = {
    "course": dict(
        kernels=registry.COURSE_KERNELS,
        sizes=COURSE_SIZES,
        tiles=COURSE_TILES,
        sizes_at_tile=COURSE_SIZES_AT_TILE,
        tiles_at_size=COURSE_TILES_AT_SIZE,
    ),
    "ladder": dict(
        kernels=LADDER_KERNELS,
        sizes=LADDER_SIZES,
        tiles=(COURSE_SIZES_AT_TILE,),
        sizes_at_tile=COURSE_SIZES_AT_TILE,
        tiles_at_size=None,
    ),
}


def named_plan(name: str, **changes: Any) -> Plan:
    """Plan ``name`` of :data:`PLANS` with ``changes`` (any :class:`Plan` field)."""
    return Plan(**{**PLANS[name], **changes})


def course_plan(**changes: Any) -> Plan:
    """The course's plan: sizes 32..4096 at tile 32, tiles 4..64 at 4096, the course's kernels."""
    return named_plan("course", **changes)


def ladder_plan(**changes: Any) -> Plan:
    """The ladder's plan: fast, tc1, tc3, cublas and cublas_tf32 at 1024, 2048, 4096 and 8192."""
    return named_plan("ladder", **changes)


def default_kernels(backend: Backend, plan: str = "course") -> tuple[str, ...]:
    """Plan ``plan``'s kernels on a GPU backend (the course's: :data:`mmd.kernels.COURSE_KERNELS`);
    on the cpu backend only ``cpu``, whatever the plan."""
    if backend.name == "cpu":
        return tuple(s.name for s in registry.REGISTRY.values() if s.kind == registry.HOST)
    kernels: tuple[str, ...] = PLANS[plan]["kernels"]
    return kernels


def backend_for(
    choice: KernelChoice, backend: Backend, host: Backend, files: Mapping[KernelChoice, Backend]
) -> Backend:
    """Where ``choice`` runs: a kernel file on its own backend in ``files`` (a process of its own per call), the
    host's kernel (``cpu``) on the host backend, the rest on ``backend``."""
    if choice.is_file:
        return files[choice]
    return host if choice.on_host else backend


def cannot_run(choice: KernelChoice, backend: Backend) -> str | None:
    """Why ``choice`` is skipped beside ``backend``: mmd's own GPU kernels need a GPU backend (a kernel file makes
    its own process on the GPU, whatever the backend)."""
    if choice.on_gpu and not choice.is_file and backend.name == "cpu":
        return f"{choice.name} needs a GPU backend; this run has the cpu backend"
    return None
