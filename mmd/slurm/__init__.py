"""Slurm job arrays: a folder of job files becomes one ``sbatch --array`` script, one task per file.

What is written (by default in ``OUTBOX/slurm/<timestamp>/``, a folder of its own for each
submission)::

    job.sbatch            the script: #SBATCH options, then one `mmd run` per array task
    job.sbatch.manifest   the input files, one absolute path per line (task i of the array
                          submitted with offset K reads line K+i+1)
    job.sbatch.outputs    the output each task writes, same line
    job.sbatch.jobs       after --submit: one line per array, "JOBID OFFSET COUNT"
    job.sbatch.kernel/    with --kernel-file: the kernel file's copy (and its NAME.kernel.yaml),
                          which every task runs (`mmd run --kernel-file`); made for this
                          submission alone, so a later one never changes what its tasks run
    logs/<array>_<task>.log

The package, by concept: :mod:`.script` (the options, checked, and the script's text),
:mod:`.folder` (the job files listed, the tasks planned, the files written), :mod:`.submission`
(``sbatch``, one array per ``MaxArraySize`` tasks) and :mod:`.status` (what became of each task).
Pure apart from :func:`list_jobs` and :func:`finished_before` (read the outbox), :func:`write`,
and :func:`submit`, :func:`max_array_size` and :func:`slurm_states` (run ``sbatch``,
``scontrol``, ``squeue``). Here are the calls the CLI, ``mmd grade --slurm`` and the tests use.
"""

from .folder import SCRIPTS_DIR, Written, finished_before, list_jobs, make_plan, plan_tasks, write
from .script import (
    PASSED_ENV,
    PASSED_OPTIONS,
    ArrayOptions,
    ArrayPlan,
    SubmitError,
    Task,
    check_options,
    manifest_bytes,
    render_script,
)
from .status import TaskState, find_submission, outcomes, parse_squeue, slurm_states
from .submission import DEFAULT_MAX_ARRAY_SIZE, chunks, max_array_size, sbatch_argv, submit

__all__ = [
    "DEFAULT_MAX_ARRAY_SIZE",
    "PASSED_ENV",
    "PASSED_OPTIONS",
    "SCRIPTS_DIR",
    "ArrayOptions",
    "ArrayPlan",
    "SubmitError",
    "Task",
    "TaskState",
    "Written",
    "check_options",
    "chunks",
    "find_submission",
    "finished_before",
    "list_jobs",
    "make_plan",
    "manifest_bytes",
    "max_array_size",
    "outcomes",
    "parse_squeue",
    "plan_tasks",
    "render_script",
    "sbatch_argv",
    "slurm_states",
    "submit",
    "write",
]
