"""``mmd bench``: run the course's benchmark plan (or a smaller one) and write results.csv/yaml."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UnreadableError, UsageError
from . import paths
from .options import add_config_option, options_later, settings_from

if TYPE_CHECKING:
    from ..kernelchoice import KernelChoice


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="time kernels over sizes and tiles",
        description=(
            "Run a benchmark plan: by default the course's (sizes 32..4096 at tile 32, tiles 4..64 at 4096, "
            "the course's kernels); --plan ladder: fast, tc1, tc3, cublas and cublas_tf32 at 1024..8192. "
            "--kernel-file K.cu runs a kernel file through the same plan (only the kernel files, unless --kernels "
            "names mmd's own beside them). Each case is checked once against a float64 product, then timed. "
            "Writes OUT/<timestamp>/results.csv and results.yaml; exits 1 if any result is wrong."
        ),
    )
    options_later(p, _options)
    p.set_defaults(func=run)


def _options(p: argparse.ArgumentParser) -> None:
    from .. import bench, config  # the plans' defaults: only for this command (or its help)
    from .. import kernels as registry

    p.add_argument(
        "--plan",
        choices=tuple(bench.PLANS),
        default="course",
        help="the plan whose kernels, sizes and tiles the options below change (default: %(default)s)",
    )
    add_config_option(p)
    p.add_argument("--backend", choices=config.CHOICES["backend"], help="where GPU kernels run (default: auto)")
    p.add_argument("--device", type=int, help="CUDA device ordinal")
    p.add_argument(
        "--kernels",
        nargs="+",
        choices=registry.NAMES,
        metavar="KERNEL",
        help=f"kernels to run, of {', '.join(registry.NAMES)} (default: the plan's, none beside --kernel-file; "
        "only cpu on the cpu backend)",
    )
    p.add_argument(
        "--kernel-file",
        action="append",
        type=Path,
        default=[],
        metavar="K.cu",
        help="also run the __global__ kernel of this .cu file (docs/kernels.md), named by its file name, each call "
        "in a process of its own; repeat for several (P1.cu P2.cu PLAST.cu)",
    )
    p.add_argument(
        "--sizes", nargs="+", type=int, metavar="N", help="square sizes (default: the plan's: course 32 256 ... 4096)"
    )
    p.add_argument("--tiles", nargs="+", type=int, metavar="T", help="tiles (default: the plan's: course 4 8 16 32 64)")
    p.add_argument(
        "--sizes-at-tile",
        type=int,
        default=bench.COURSE_SIZES_AT_TILE,
        metavar="T",
        help="the tile every size runs at (default: %(default)s)",
    )
    p.add_argument(
        "--tiles-at-size",
        type=int,
        metavar="N",
        help="the size every tile runs at (default: 4096 for the course's sizes, else the largest size)",
    )
    p.add_argument("--grid", action="store_true", help="run every size at every tile instead")
    p.add_argument(
        "--repeats",
        type=int,
        default=5,
        metavar="N",
        help="timed calls per case: at least N in memory, exactly N through files (default: %(default)s)",
    )
    p.add_argument(
        "--noise",
        type=_percent,
        default=bench.NOISE,
        metavar="PCT",
        help="in memory, repeat until the kernel median's noise (half its 95%% confidence interval) is under "
        "PCT percent (default: 2)",
    )
    p.add_argument(
        "--max-repeats",
        type=int,
        default=bench.MAX_REPEATS,
        metavar="N",
        help="in memory, at most N timed calls per case (default: %(default)s)",
    )
    p.add_argument(
        "--no-flush-l2",
        dest="flush_l2",
        action="store_false",
        help="do not evict the L2 cache before each kernel (in memory; default: flush, as nvbench does)",
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed calls first (default: %(default)s)")
    p.add_argument("--memory", choices=config.CHOICES["memory"], help="device memory mode (default: from config)")
    p.add_argument(
        "--through-files",
        action="store_true",
        help="run each call as a real job on text files (read, parse, CUDA, emit, write) instead of in memory",
    )
    p.add_argument(
        "--cpu-max-size",
        type=int,
        default=bench.CPU_MAX_SIZE,
        metavar="N",
        help="skip the cpu kernel above this size; 0: no limit (default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=0, help="input seed (default: %(default)s)")
    p.add_argument("--out", type=Path, default=Path("bench"), help="results root (default: %(default)s)")
    p.add_argument(
        "--accuracy",
        action="store_true",
        help="afterwards, measure each kernel's max and RMS relative error against float64 over K "
        "(and cuBLAS's in both modes): accuracy.csv and accuracy.yaml in the results folder",
    )
    p.add_argument(
        "--accuracy-mn",
        type=int,
        default=bench.ACCURACY_MN,
        metavar="N",
        help="the accuracy sweep's M = N (default: %(default)s)",
    )
    p.add_argument(
        "--accuracy-ks",
        nargs="+",
        type=int,
        default=bench.ACCURACY_KS,
        metavar="K",
        help="the accuracy sweep's K values (default: 32 64 ... 8192)",
    )
    p.add_argument("--report", action="store_true", help="render the report into <results>/report afterwards")
    p.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("RUN_A", "RUN_B"),
        help="run nothing: print each case's B/A ratios of two runs' medians (results folders, results.csv "
        "or results.yaml) with their noise, and whether B is faster, slower or within noise",
    )


def _percent(text: str) -> float:
    """``2`` or ``2%`` → 0.02."""
    try:
        value = float(text.strip().removesuffix("%")) / 100.0
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"a percentage must be at least 0, got {text!r}")
    return value


def _kernel_files(args: argparse.Namespace) -> list[KernelChoice]:
    """Each --kernel-file read and guarded, before anything runs (UsageError: unreadable or beside --backend cpu;
    KernelFileError: one mmd refuses, with its one-line reason)."""
    from ..kernelchoice import KernelChoice

    if args.kernel_file and args.backend == "cpu":
        raise UsageError("a kernel file runs on a GPU: drop --backend cpu")
    choices = []
    for path in args.kernel_file:
        try:
            paths.input_file(path)
        except UnreadableError as exc:
            raise UnreadableError(f"--kernel-file {exc.reason}") from None
        choices.append(KernelChoice.of_file(path))
    return choices


def run(args: argparse.Namespace) -> int:
    from .. import bench, config, logs
    from ..backends import open_backend
    from ..backends.cuda import CudaBackend
    from ..kernelchoice import KernelChoice

    if args.compare:
        from .. import report

        print(report.compare(*args.compare).text(), end="")
        return 0
    if args.report:  # said before the benchmark runs, not after
        from ..report.figures import require_matplotlib

        require_matplotlib()
    files = _kernel_files(args)
    settings = settings_from(args)
    if settings.log_level == "info":  # one "job done" line per call would bury the progress display
        logs.configure(settings.log_format, "warning")
    backend, note = open_backend(settings.backend, settings.device, config.kernel_cache_dir(settings))
    if note:
        print(f"mmd bench: {note}", file=sys.stderr)
    try:
        own = args.kernels or (() if files else bench.default_kernels(backend, args.plan))
        changes: dict[str, Any] = {"kernels": (*(KernelChoice.builtin(name) for name in own), *files)}
        if args.sizes:
            changes.update(sizes=tuple(args.sizes), tiles_at_size=args.tiles_at_size)  # None: the largest size
        elif args.tiles_at_size is not None:
            changes["tiles_at_size"] = args.tiles_at_size
        if args.tiles:
            changes["tiles"] = tuple(args.tiles)
        try:
            plan = bench.named_plan(
                args.plan,
                **changes,
                repeats=args.repeats,
                warmup=args.warmup,
                memory=args.memory or settings.memory,
                text_path=settings.text_path,
                through_files=args.through_files,
                sizes_at_tile=args.sizes_at_tile,
                grid=args.grid,
                cpu_max_size=args.cpu_max_size or None,
                seed=args.seed,
                noise=args.noise,
                max_repeats=args.max_repeats,
                flush_l2=args.flush_l2,
                accuracy=args.accuracy,
                accuracy_mn=args.accuracy_mn,
                accuracy_ks=tuple(args.accuracy_ks),
            )
        except ValueError as exc:
            print(f"mmd bench: {exc}", file=sys.stderr)
            return 2
        paths.output_folder(args.out)  # before a case is run
        clock = None
        if isinstance(backend, CudaBackend):
            clock = bench.Nvml.find(settings.device, backend.limits.pci_bus_id)
        result = bench.run_plan(
            plan, backend, out=args.out, progress=bench.Progress(sys.stderr), clock=clock, settings=settings
        )
    finally:
        backend.close()
    print(result.csv_path)
    print(result.yaml_path)
    if result.accuracy:
        print(result.accuracy_csv_path)
        print(result.accuracy_yaml_path)
    for row in result.failures:
        print(f"mmd bench: FAILED {bench.describe_row(row)}", file=sys.stderr)
    if args.report:
        from .. import report

        rendered = report.render(result.folder, result.folder / "report")
        for path in rendered.files:
            print(path)
    return 0 if result.ok else 1
