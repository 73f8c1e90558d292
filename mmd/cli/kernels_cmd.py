"""``mmd kernels [FILE]``: the registry's kernels, the tiles each accepts, and this GPU's limits; or a kernel file."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import progress
from ..errors import KernelFileError, MmdError, UnreadableError, UsageError
from ..launchlimits import COMMON_LIMITS, DeviceLimits
from .options import add_config_option, options_later


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "kernels",
        help="list kernels, valid tiles and the GPU's limits; --build compiles them all",
        description="List the registered kernels, the tiles each accepts on this GPU (or on any CUDA GPU where "
        "there is none) and where their sources are. With --build, compile every build of every kernel (each "
        "course tile, each tuned variant) and the text kernels with nvcc into the kernel cache, so that the "
        "daemon's first jobs load them instead of compiling; no GPU is needed for that (with --arch); with "
        "--configured too, only the settings' kernel at their tile and the text kernels. With FILE, a kernel file "
        "(.cu): what mmd understood of it (entry, signature, geometry), the tiles this GPU can launch and why any "
        "other is refused, and a compile at each into the kernel cache. Exit status 1 when a source is missing, a "
        "kernel file is refused or a build fails.",
    )
    options_later(p, _options)
    p.set_defaults(func=run)


def _options(p: argparse.ArgumentParser) -> None:
    from .. import kernels

    p.add_argument(
        "file",
        nargs="?",
        type=Path,
        help="a kernel file (.cu): print what mmd understood of it, the tiles this GPU can launch, and compile it",
    )
    p.add_argument("--device", type=int, default=0, help="CUDA device ordinal")
    p.add_argument("--tiles", type=int, nargs="+", default=[*kernels.TILES, 64], help="tiles to check")
    p.add_argument("--build", action="store_true", help="compile every build into the kernel cache")
    p.add_argument(
        "--configured",
        action="store_true",
        help="with --build: only what a daemon with these settings loads (their kernel at their tile, and the text "
        "kernels), as the service's installer builds them",
    )
    p.add_argument("--arch", help="target for --build, e.g. sm_90 (default: this GPU's)")
    p.add_argument("--cache", type=Path, help="cache folder for --build (default: the kernel_cache setting)")
    add_config_option(p)


def build(args: argparse.Namespace, limits: DeviceLimits) -> int:
    """Compile every build (``--configured``: the settings' kernel at their tile, and the text kernels) into the
    cache; one line per failure, a summary last."""
    from .. import config
    from ..cuda.builds import build_all, configured_builds, every_build
    from ..cuda.compiler import KernelCache

    arch = args.arch or (limits.arch if limits.compute_capability != (0, 0) else None)
    if arch is None:
        raise UsageError("no GPU here to take the architecture from: give --arch (sm_90 for an H100 or H200)")
    settings = config.load(args.config)
    folder = args.cache if args.cache is not None else config.kernel_cache_dir(settings)
    builds = configured_builds(arch, settings.kernel, settings.tile) if args.configured else every_build(arch)
    with progress.Count(f"building for {arch}", len(builds), shown=progress.on_terminal()) as count:
        results = build_all(KernelCache(folder), builds, done=lambda r: count.advance(r.build.label))
    for r in results:
        if r.error is not None:
            print(f"FAILED {r.build.label} ({r.build.arch}): {r.error}")
    compiled = sum(r.compiled for r in results)
    failed = sum(r.error is not None for r in results)
    cached = len(results) - compiled - failed
    where = folder if folder is not None else "no cache (kernel_cache: null)"
    print(f"{len(results)} builds for {arch}: {compiled} compiled, {cached} already cached, {failed} failed; {where}")
    return 1 if failed else 0


def _device_limits(device: int) -> tuple[DeviceLimits, str]:
    from ..backends import open_backend
    from ..backends.cuda import CudaBackend

    try:
        backend, _ = open_backend("cuda", device)
    except MmdError as exc:
        return COMMON_LIMITS, f"no GPU here ({exc.reason}); tiles checked against the limits of every CUDA GPU"
    try:
        assert isinstance(backend, CudaBackend)  # what open_backend("cuda") opens, or it raises
        return backend.limits, f"device {device}: {backend.device_name()}"
    finally:
        backend.close()


def describe_file(args: argparse.Namespace, limits: DeviceLimits, where: str) -> int:
    """What mmd understood of the kernel file ``args.file``, the tiles ``limits`` let it launch, and a compile at
    each of them into the kernel cache; exit status 1 where the file is refused or a compile fails."""
    from .. import config
    from ..kernelfile.nvrtc import compile_kernel
    from ..kernelfile.reading import read_kernel_file
    from . import paths

    try:
        path = paths.input_file(args.file)
    except UnreadableError as exc:
        raise UnreadableError(f"kernel file {exc.reason}") from None
    try:
        kf = read_kernel_file(path)
    except KernelFileError as exc:
        print(f"refused: {exc.reason}")
        return 1
    decl = kf.declaration
    params = ", ".join(f"{p.name} {role}" for p, role in zip(kf.kernel.parameters, kf.roles, strict=True))
    print(f"{kf.name}  sha256 {kf.sha256}")
    print(f"entry: {kf.kernel.name} (line {kf.kernel.line}), {kf.signature}: {params}")
    print(f"declared in: {kf.declared_in or 'nowhere (the defaults)'}")
    if kf.includes:
        print(f"includes: {', '.join(kf.includes)} (mmd's empty headers)")
    if decl.tile_macro is None:
        print("tile: no macro")
    elif kf.fixed_tile is not None:
        print(f"tile: {decl.tile_macro} fixed to {kf.fixed_tile.tile} on line {kf.fixed_tile.line}: that tile only")
    else:
        print(f"tile: -D{decl.tile_macro}=T")
    axes = "grid x over " + " and y over ".join(decl.grid)
    dynamic = decl.dynamic_shared_bytes.text
    extra = f", {dynamic} bytes of dynamic shared memory" if dynamic != "0" else ""
    print(f"geometry: block [{', '.join(e.text for e in decl.block)}] threads, {axes}{extra}")
    sizes = "padded to multiples of its block tile" if decl.multiples else "any sizes (it checks its bounds)"
    square = ", all three equal (one size, width)" if decl.square else ""
    print(f"sizes: {sizes}{square}; C zeroed before each launch")
    print(f"precision: {decl.precision}{'' if decl.exact else ' (not bit-exact on exact cases)'}")
    print(where)
    arch = args.arch or (limits.arch if limits.compute_capability != (0, 0) else "sm_90")
    settings = config.load(args.config)
    folder = args.cache if args.cache is not None else config.kernel_cache_dir(settings)
    failed = 0
    for tile in args.tiles:
        try:
            kf.check_launch(tile, limits)
        except MmdError as exc:
            print(f"tile {tile}: refused: {exc.reason}")
            continue
        rows, cols, depth = decl.block_shape(tile)
        x, y, z = decl.block_dims(tile)
        shape = f"block {x}x{y}x{z}, block tile {rows}x{cols} (K step {depth}), {decl.outputs(tile)} per thread"
        try:
            built = compile_kernel(kf, tile, arch, folder)
        except KernelFileError as exc:
            print(f"tile {tile}: {shape}; does not compile for {arch}: {exc.reason}")
            failed += 1
            continue
        how = "compiled" if built.compiled else "cached"
        print(f"tile {tile}: {shape}; {how} for {arch} as {built.symbol}")
        for warning in built.warnings:
            print(f"  {warning}")
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    from .. import config, kernels  # the registry: only for this command
    from ..resources import kernels_dir

    config.load(args.config)  # a config named but unreadable or wrong is refused, --build or not
    if args.configured and not args.build:
        raise UsageError("--configured says which builds --build compiles: give --build too")
    limits, where = _device_limits(args.device)
    if args.file is not None:
        if args.build:
            raise UsageError("--build compiles mmd's own kernels; a kernel file is compiled without it")
        return describe_file(args, limits, where)
    if args.build:
        return build(args, limits)
    print(where)
    print(
        f"limits: {limits.max_threads_per_block} threads, {limits.max_shared_per_block} bytes shared memory, "
        f"{limits.max_registers_per_block} registers per block"
    )
    print(f"sources: {kernels_dir()}")
    width = max(len(n) for n in kernels.NAMES)
    missing = 0
    for name in kernels.NAMES:
        spec = kernels.REGISTRY[name]
        if spec.source is not None and not spec.source.is_file():
            tiles = f"MISSING SOURCE {spec.source}"
            missing += 1
        elif spec.uses_tile:
            ok, refused = [], []
            for tile in args.tiles:
                try:
                    kernels.check_launch(spec, tile, limits)
                    ok.append(str(tile))
                except MmdError as exc:
                    refused.append(f"{tile} ({exc.reason})")
            tiles = "tiles " + ", ".join(ok) + (f"; refused: {'; '.join(refused)}" if refused else "")
        elif limits is COMMON_LIMITS and (spec.dynamic_shared_bytes or spec.min_compute_capability > (0, 0)):
            need = ".".join(map(str, spec.min_compute_capability))
            shared = spec.shared_bytes(0) + spec.dynamic_shared_bytes
            tiles = f"no tile; needs {spec.requirement or 'a newer GPU'} (compute capability {need}+)"
            if shared:  # a library's kernel (cuBLAS) sizes its own: nothing to say of it
                tiles += f", {shared} bytes of shared memory per block"
        else:
            try:
                kernels.check_launch(spec, 0, limits)
                tiles = "no tile"
            except MmdError as exc:
                tiles = f"not on this GPU: {exc.reason}"
        inexact = "" if spec.exact else "; not bit-exact: exact products (I·B, ties) may print differently"
        print(f"{name:<{width}}  {spec.kind:<7}  {tiles}\n{'':<{width}}  {spec.description}{inexact}")
    return 1 if missing else 0
