"""What a GPU allows one launch, and the checks of a block and a grid against it.

:class:`DeviceLimits` is read from a device by :mod:`mmd.cuda.device`; :data:`COMMON_LIMITS` stands in
where no device can be asked. The checks are pure: given the numbers of a launch and the limits, they
raise :class:`~mmd.errors.TileError` with a one-line reason before anything is allocated. The registry's
kernels (:func:`mmd.kernels.check_launch`) and kernel files (:mod:`mmd.kernelfile.reading`) both use them,
so a refusal reads the same whoever wrote the kernel; a module of its own so that neither needs the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import TileError

#: The largest tile a setting may ask for, wherever it comes from (config, name,
#: flag): more than any GPU launches, so the device's own limit gives the
#: reason; this bound only keeps nonsense out of launch arithmetic.
MAX_TILE = 1024


@dataclass(frozen=True)
class DeviceLimits:
    """What a device allows one block; read from the device by :mod:`mmd.cuda.device`."""

    max_threads_per_block: int
    max_shared_per_block: int
    max_registers_per_block: int
    name: str = "unknown device"
    compute_capability: tuple[int, int] = (0, 0)
    total_memory: int = 0
    max_grid_x: int = 2**31 - 1
    max_grid_y: int = 65535
    #: Streaming multiprocessors (0: unknown); picks a fixed-block kernel's variant.
    multiprocessors: int = 0
    #: Shared memory a block may have when it opts in (static + dynamic); 0: only max_shared_per_block.
    max_shared_optin: int = 0
    #: How refusals word the limit: a real device's, or the common bound where no device was asked.
    allows: str = "this GPU allows"
    #: Bytes of L2 cache (0: unknown); the bench's L2 flush writes twice this.
    l2_cache_bytes: int = 0
    #: The PCI bus id (``0000:65:00.0``; empty: unknown): how the bench finds the GPU in nvidia-smi.
    pci_bus_id: str = ""

    @property
    def arch(self) -> str:
        """The nvcc architecture name, ``sm_90`` for compute capability 9.0."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"


#: Limits of every CUDA GPU since compute capability 3.0 (1024 threads, 48 KiB
#: of static shared memory, 64 Ki registers per block): for checks made where
#: no device can be asked, such as validating a tile on the command line.
COMMON_LIMITS = DeviceLimits(
    max_threads_per_block=1024,
    max_shared_per_block=48 * 1024,
    max_registers_per_block=64 * 1024,
    name="any CUDA GPU",
    allows="no CUDA GPU allows more than",
)


def check_tile(tile: object) -> int:
    """``tile`` as a whole number from 1 to :data:`MAX_TILE`, or TileError: the one check of a tile setting.

    Whether a device can launch it is :func:`mmd.kernels.check_launch`'s question.
    """
    if isinstance(tile, bool) or not isinstance(tile, int) or not 1 <= tile <= MAX_TILE:
        raise TileError(f"tile {tile!r} must be a whole number from 1 to {MAX_TILE}", details={"tile": tile})
    return tile


def check_block(
    what: str,
    name: str,
    threads: int,
    shared: int,
    dynamic_shared: int,
    limits: DeviceLimits,
    *,
    registers_per_thread: int | None = None,
    details: dict[str, object] | None = None,
) -> None:
    """Raise TileError when a block of ``threads`` threads with ``shared`` bytes of static and ``dynamic_shared``
    of dynamic shared memory (and ``registers_per_thread``, where known) cannot be launched under ``limits``.

    ``what`` is what asked for the block in the message (``tile 64``), ``name`` the kernel's name. The one
    home of these limits, for the registry's kernels (:func:`mmd.kernels.check_launch`) and kernel files alike.
    """
    details = dict(details or {})
    if threads > limits.max_threads_per_block:
        raise TileError(
            f"{what} needs {threads} threads per block; {limits.allows} {limits.max_threads_per_block}",
            details={**details, "threads": threads, "limit": limits.max_threads_per_block},
        )
    total = shared + dynamic_shared
    allowed = max(limits.max_shared_optin, limits.max_shared_per_block) if dynamic_shared else 0
    if shared > limits.max_shared_per_block or total > max(allowed, limits.max_shared_per_block):
        limit = max(allowed, limits.max_shared_per_block)
        raise TileError(
            f"{what} needs {total} bytes of shared memory per block for {name}; {limits.allows} {limit}",
            details={**details, "shared_bytes": total, "limit": limit},
        )
    if registers_per_thread is not None:
        registers = registers_per_thread * threads
        if registers > limits.max_registers_per_block:
            raise TileError(
                f"{what} needs {registers} registers per block "
                f"({registers_per_thread} per thread) for {name}; "
                f"{limits.allows} {limits.max_registers_per_block}",
                details={**details, "registers": registers, "limit": limits.max_registers_per_block},
            )


def check_grid_dims(name: str, m: int, n: int, tile: int, grid: tuple[int, int, int], limits: DeviceLimits) -> None:
    """Raise TileError when ``grid`` (an m×n output's blocks for kernel ``name`` at ``tile``) passes the device's."""
    gx, gy, _ = grid
    if gx > limits.max_grid_x or gy > limits.max_grid_y:
        raise TileError(
            f"a {m}×{n} result with {name} at tile {tile} needs a {gx}×{gy} grid of blocks; "
            f"{limits.allows} {limits.max_grid_x}×{limits.max_grid_y}",
            details={"kernel": name, "tile": tile, "grid": [gx, gy]},
        )
