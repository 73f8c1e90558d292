"""``mmd kernels``: the registry's kernels, the tiles each accepts, and this GPU's limits."""

from __future__ import annotations

import argparse

from .. import kernels
from ..errors import MmdError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("kernels", help="list kernels, valid tiles and the GPU's limits")
    p.add_argument("--device", type=int, default=0, help="CUDA device ordinal")
    p.add_argument("--tiles", type=int, nargs="+", default=[*kernels.TILES, 64], help="tiles to check")
    p.set_defaults(func=run)


def _device_limits(device: int) -> tuple[kernels.DeviceLimits, str]:
    try:
        from ..gpu import GpuSession

        session = GpuSession(device)
    except MmdError as exc:
        return kernels.COMMON_LIMITS, f"no GPU here ({exc.reason}); tiles checked against {kernels.COMMON_LIMITS.name}"
    try:
        return session.limits, f"device {device}: {session.device_name()}"
    finally:
        session.close()


def run(args: argparse.Namespace) -> int:
    limits, where = _device_limits(args.device)
    print(where)
    print(
        f"limits: {limits.max_threads_per_block} threads, {limits.max_shared_per_block} bytes shared memory, "
        f"{limits.max_registers_per_block} registers per block"
    )
    width = max(len(n) for n in kernels.NAMES)
    for name in kernels.NAMES:
        spec = kernels.REGISTRY[name]
        if spec.uses_tile:
            ok, refused = [], []
            for tile in args.tiles:
                try:
                    kernels.check_launch(spec, tile, limits)
                    ok.append(str(tile))
                except MmdError as exc:
                    refused.append(f"{tile} ({exc.reason})")
            tiles = "tiles " + ", ".join(ok) + (f"; refused: {'; '.join(refused)}" if refused else "")
        else:
            tiles = "no tile"
        print(f"{name:<{width}}  {spec.kind:<7}  {tiles}\n{'':<{width}}  {spec.description}")
    return 0
