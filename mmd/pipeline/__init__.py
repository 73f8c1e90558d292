"""The job pipeline: read → parse → multiply → emit → commit output and sidecar.

* :mod:`.reading`: the input's bytes within limits, the header checked before any big allocation;
* :mod:`.textpaths`: parse, multiply and format, on the host or on the device;
* :mod:`.refusal`: a refused job's value and error sidecar;
* :mod:`.driver`: :func:`run_job`, the one driver every way in calls.
"""

from .driver import BackendFor, JobResult, kernel_file_backend, refuse, run_job
from .phases import PHASES, PhaseHook
from .reading import Limits, Room, check_header, check_output_size, limits_for, read_header, read_input
from .refusal import Refusal

__all__ = [
    "BackendFor",
    "JobResult",
    "PHASES",
    "PhaseHook",
    "Limits",
    "Refusal",
    "Room",
    "check_header",
    "check_output_size",
    "kernel_file_backend",
    "limits_for",
    "read_header",
    "read_input",
    "refuse",
    "run_job",
]
