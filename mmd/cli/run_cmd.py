"""``mmd run INPUT``: one job through the pipeline."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import progress
from ..errors import ExitStatus, UnreadableError, UsageError
from . import paths
from .options import EXIT_FAILED, EXIT_OK, add_job_options, configure_logs, job_flags, options_later

if TYPE_CHECKING:
    from .. import config
    from ..oneshot import OneShot


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="multiply one input file",
        description="Run one job: INPUT → OUTPUT + sidecar. Settings in INPUT's name (NAME@kernel=aplus.txt) "
        "apply as they do in the daemon; a flag may repeat them, never contradict them. An existing OUTPUT is "
        "not replaced without --force. Exit status: 0 done, 1 the job was refused (its error sidecar says why), "
        "2 bad usage, an input that cannot be read or an output that exists. INPUT - reads the standard input "
        "and, without -o, writes the product to the standard output (no sidecar is kept).",
    )
    options_later(p, _options)
    p.set_defaults(func=run, ends_process=True)


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", type=Path, help="matrix text file; - for the standard input")
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        help="output path (default: <stem>.out beside INPUT); - for the standard output (no sidecar is kept)",
    )
    p.add_argument("-f", "--force", action="store_true", help="replace an existing output")
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress bar (one is drawn on stderr on a terminal for large inputs)",
    )
    add_job_options(p)
    p.add_argument(
        "--kernel-file",
        type=Path,
        metavar="K.cu",
        help="run the __global__ kernel of this .cu file (docs/kernels.md), at --tile, in a process of its own",
    )


def _paths(args: argparse.Namespace) -> tuple[Path, Path | None]:
    """INPUT (``-``: the standard input) and OUTPUT (None: the standard output), or UsageError: no error
    sidecar is written for a job that cannot even start."""
    piped = paths.is_standard(args.input)
    src = args.input if piped else paths.input_file(args.input)
    if paths.is_standard(args.output) or (piped and args.output is None):
        return src, None  # a product read from a pipe goes on down it, unless -o names a file
    output: Path = args.output or src.with_suffix(".out")
    if not piped and output.resolve() == src.resolve():
        given = "-o names" if args.output else f"the default output {output.name} is"
        raise UsageError(f"{given} the input {src} itself; choose another output path")
    paths.output_file(output)
    if os.path.lexists(output) and not args.force:
        # a second run must not lose the first's product unasked; a new name (as the daemon gives) would
        # leave a script that reads OUTPUT reading the old one
        raise UsageError(f"{output} exists; give --force to replace it, or -o another path")
    return src, output


#: The name of a job read from the standard input (``mmd run -``).
STDIN = "stdin"

#: Inputs from this size on show their phases on a terminal (a 1024×1024 pair is about 13.6 MB; below
#: that a job ends too soon for a bar to be read).
SHOWN_FROM_BYTES = 8 << 20
#: The job's phases as its progress bar names them (the host path formats the output as it writes it).
PHASES = {"read": "read", "parse": "parse", "multiply": "multiply", "emit": "emit and write"}


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(ExitStatus.TERMINATED)


def run(args: argparse.Namespace) -> int:
    from .. import config

    # scancel and Slurm's time limit send SIGTERM (SIGKILL only KillWait later): unwinding as an
    # exception lets the output's commit remove its hidden temporary, so nothing half-written stays.
    signal.signal(signal.SIGTERM, _terminated)
    base = config.load(args.config)
    flags = job_flags(args)
    settings = base.with_values({k: v for k, v in flags.items() if v is not None}, config.COMMAND_LINE)  # bad: usage
    src, output = _paths(args)
    _check_kernel_file(args)
    if not paths.is_standard(src):
        return _run_file(args, src, output, base, flags, settings, shown=str(src))
    # The pipeline reads files (their size first, then their bytes, as the daemon's do): the standard input
    # becomes one, in a private folder that goes when the job is done; messages and the sidecar call it stdin.
    with tempfile.TemporaryDirectory(prefix="mmd-run-") as folder:
        return _run_file(args, paths.from_stdin(Path(folder) / STDIN), output, base, flags, settings, shown=STDIN)


def _check_kernel_file(args: argparse.Namespace) -> None:
    """UsageError for a --kernel-file that cannot be read, or beside a flag that asks for another kernel."""
    if args.kernel_file is None:
        return
    if args.kernel is not None:
        raise UsageError("give --kernel (one of mmd's own) or --kernel-file, not both")
    if args.backend == "cpu":
        raise UsageError("a kernel file runs on a GPU: drop --backend cpu")
    try:
        paths.input_file(args.kernel_file)
    except UnreadableError as exc:
        raise UnreadableError(f"--kernel-file {exc.reason}") from None


def _run_file(
    args: argparse.Namespace,
    src: Path,
    output: Path | None,
    base: config.Settings,
    flags: dict[str, Any],
    settings: config.Settings,
    shown: str,
) -> int:
    """The job of ``src``, called ``shown`` in what is printed."""
    from ..oneshot import OneShot

    # started before numpy and the pipeline are imported, so that the GPU's context, or the kernel file's launch
    # process, is made beside those imports; args.exiting: the process ends with this command (mmd.cli.main),
    # and what the job holds is left to its end
    with OneShot(settings, src, args.kernel_file, release=not args.exiting) as shot:
        configure_logs(base, quiet=not args.verbose)
        return _run_to(shot, shown, output, base, flags, bar=_shows_bar(args, src))


def _run_to(
    shot: OneShot, shown: str, output: Path | None, base: config.Settings, flags: dict[str, Any], bar: bool
) -> int:
    if output is not None:
        return _run(shot, shown, output, base, flags, show=True, bar=bar)
    # -o -: the job is written as every job is, into a private folder, and its product copied out, so that
    # the pipeline's commit stays the one way a job's output is made; its sidecar goes with the folder.
    with tempfile.TemporaryDirectory(prefix="mmd-run-") as folder:
        product = Path(folder) / shot.src.with_suffix(".out").name
        status = _run(shot, shown, product, base, flags, show=False, bar=bar)
        if status == EXIT_OK:
            with open(product, "rb") as fh:
                paths.to_stdout(iter(lambda: fh.read(1 << 20), b""))
        return status


def _shows_bar(args: argparse.Namespace, src: Path) -> bool:
    """A progress bar for a large input on a terminal, unless --quiet or -v (whose log lines tell the same)."""
    return progress.on_terminal(quiet=args.quiet or args.verbose) and src.stat().st_size >= SHOWN_FROM_BYTES


def _run(
    shot: OneShot,
    shown: str,
    output: Path,
    base: config.Settings,
    flags: dict[str, Any],
    show: bool,
    bar: bool,
) -> int:
    """Run the job, ``shown`` its input's name in a refusal; ``show``: print where its output and sidecar are
    (else print only a refusal); ``bar``: draw its phases on stderr."""
    from ..record import TimingRecord

    job = shot.describe(output, base, flags)
    with progress.Steps(f"mmd run {shot.src.name}", PHASES, shown=bar) as steps:
        result = shot.run(job, steps.step)
    if not isinstance(result.record, TimingRecord):
        assert result.error is not None
        where = "not kept" if not show else "not written" if result.sidecar_failed else str(result.sidecar)
        print(f"mmd run: {shown}: {result.error.reason} (error sidecar: {where})", file=sys.stderr)
        return EXIT_FAILED
    if show:
        rec = result.record
        t = rec.timings_ms
        tile = f" tile {rec.tile}" if rec.tile is not None else ""
        print(
            f"{output}  ({rec.shape.m}x{rec.shape.k}x{rec.shape.n}, {rec.backend} {rec.kernel}{tile}, "
            f"kernel {t.kernel:.3f} ms, overall {t.overall:.1f} ms)"
        )
        print(result.sidecar)
    return EXIT_OK
