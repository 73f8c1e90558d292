"""The benchmark loop: run a plan of cases, check each result once, time every phase, write CSV and YAML.

A *case* is one kernel at one shape and one tile. For each case the inputs
are random (seeded by the shape, so every kernel multiplies the same
matrices), the first call's result is checked against the float64 product,
``warmup`` calls are thrown away and then calls are measured; every phase
gets its median, min and max (``compile``, which happens once per kernel and
tile and so usually in the warm-up, is kept from whichever call built the
kernel). A case ends in one of these statuses:

``ok``
    checked and timed.
``wrong``
    the result is outside its tolerance (fp32's, or TF32's for the kernels the
    registry marks ``tf32``); not timed, and the run fails
    (``BenchRun.ok`` is False, ``mmd bench`` exits 1).
``refused``
    the backend refused it with a reason (a :class:`~mmd.errors.MmdError`:
    tile 64 needs 4096 threads per block); this is the graceful failure the
    course asks for, not a failure of the run.
``skipped``
    not run, with the reason (a GPU kernel on the cpu backend, the cpu
    backend above ``cpu_max_size``).
``error``
    anything else raised: a bug; the run fails.

Two modes. ``memory`` calls ``backend.multiply`` directly; its ``overall`` is
the wall time of that call. ``files`` (``through_files``) runs each call as a
real job through :func:`mmd.pipeline.run_job` on text files in a temporary
folder, so the phases are the ones a grader sees: read, parse, the CUDA
phases, emit, write and overall; it makes exactly ``repeats`` timed calls.

In memory the timing follows nvbench: the L2 cache is flushed between the
copies and the kernel of every call (``flush_l2``), calls go on from
``repeats`` until the kernel median's noise (:func:`median_noise`) is under
``noise`` or ``max_repeats`` calls are made, and the SM clock, the GPU's
processes and the machine's load are read while they run
(:class:`ClockSampler`), so a throttled case, and one that ran on a busy
machine, is flagged.

Results are rewritten after every case, so an interrupted run keeps what it
measured: ``<out>/<timestamp>/results.csv`` (one row per case) and
``results.yaml`` (the same rows, the plan and the environment).

The package, by concept: :mod:`.plan` (cases and plans), :mod:`.rows` (the
typed rows and their columns), :mod:`.checking` (inputs and the check),
:mod:`.stats` (medians, quartiles and noise), :mod:`.clock` (the GPU
through NVML, and the load),
:mod:`.machine` (the environment), :mod:`.runner` (the loop),
:mod:`.accuracy` (the accuracy sweep), :mod:`.results` (the files) and
:mod:`.progress` (what is shown while it runs).
"""

from . import clock
from .accuracy import ACCURACY_REFERENCES, accuracy_inputs, accuracy_kernels, error_stats, run_accuracy
from .checking import check_product, make_inputs
from .clock import LOW_CLOCK, THROTTLE_REASONS, ClockReader, ClockSample, ClockSampler, Nvml
from .machine import environment
from .plan import (
    ACCURACY_KS,
    ACCURACY_MN,
    COURSE_SIZES,
    COURSE_SIZES_AT_TILE,
    COURSE_TILES,
    COURSE_TILES_AT_SIZE,
    CPU_MAX_SIZE,
    LADDER_KERNELS,
    LADDER_SIZES,
    MAX_REPEATS,
    NOISE,
    PLANS,
    Case,
    Plan,
    course_plan,
    default_kernels,
    ladder_plan,
    named_plan,
)
from .progress import NullProgress, Progress, ProgressSink, describe_accuracy, describe_row
from .results import BenchRun, new_folder, write_results
from .rows import (
    ACCURACY_COLUMNS,
    COLUMNS,
    FAILING,
    PHASES,
    STATUSES,
    AccuracyRow,
    BenchRow,
    Quartiles,
    Spread,
    from_cells,
    to_cells,
    to_csv,
)
from .runner import run_plan
from .stats import median_noise, phase_quartiles, phase_stats

__all__ = [
    "ACCURACY_COLUMNS",
    "ACCURACY_KS",
    "ACCURACY_MN",
    "ACCURACY_REFERENCES",
    "COLUMNS",
    "COURSE_SIZES",
    "COURSE_SIZES_AT_TILE",
    "COURSE_TILES",
    "COURSE_TILES_AT_SIZE",
    "CPU_MAX_SIZE",
    "FAILING",
    "LADDER_KERNELS",
    "LADDER_SIZES",
    "LOW_CLOCK",
    "MAX_REPEATS",
    "NOISE",
    "PHASES",
    "PLANS",
    "STATUSES",
    "THROTTLE_REASONS",
    "AccuracyRow",
    "BenchRow",
    "BenchRun",
    "Case",
    "ClockReader",
    "ClockSample",
    "ClockSampler",
    "NullProgress",
    "Nvml",
    "Plan",
    "Progress",
    "ProgressSink",
    "Quartiles",
    "Spread",
    "accuracy_inputs",
    "accuracy_kernels",
    "check_product",
    "clock",
    "course_plan",
    "default_kernels",
    "describe_accuracy",
    "describe_row",
    "environment",
    "error_stats",
    "from_cells",
    "ladder_plan",
    "make_inputs",
    "median_noise",
    "named_plan",
    "new_folder",
    "phase_quartiles",
    "phase_stats",
    "run_accuracy",
    "run_plan",
    "to_cells",
    "to_csv",
    "write_results",
]
