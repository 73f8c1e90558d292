"""The daemon's metrics, in Prometheus' text format, for node_exporter's textfile collector.

Two ways out, either or both: the daemon rewrites ``metrics_file``
atomically (prometheus_client writes a temporary and renames it) every
``metrics_seconds`` and after each job, and node_exporter
(``--collector.textfile.directory``) exports it with the machine's own
metrics (``mmd status --metrics`` prints the same file); and with
``metrics_listen`` prometheus_client's own HTTP server answers scrapes on a
thread of its own, so a daemon that is gone fails its scrape.

Made with the ``prometheus-client`` library: the format, escaping and the
histogram buckets' cumulative counts are its business.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    start_http_server,
    write_to_textfile,
)

from .record import Tally

# A `_created` series beside every counter and histogram doubles the series for a time Prometheus does not
# read (node_exporter's own metrics leave it out too); mmd_daemon_start_time_seconds says when counting began.
disable_created_metrics()

#: Seconds: from a 32×32 job (milliseconds) to a long 8192 job on the CPU (minutes).
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class Metrics:
    """Counters, gauges and histograms of one daemon; :meth:`write` puts them in the file (throttled)."""

    def __init__(self, path: Path | None, every: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.every = every
        self._clock = clock
        self._written = float("-inf")
        self._lock = threading.Lock()
        self._server: Any = None  # the HTTP endpoint's server, while it serves
        r = self.registry = CollectorRegistry()
        # A refused job ran no kernel: it counts under kernel="" (which Prometheus reads as no label).
        self.jobs = Counter("mmd_jobs", "Jobs finished, by status and kernel", ["status", "kernel"], registry=r)
        self.errors = Counter("mmd_job_errors", "Refused jobs, by kind of refusal", ["kind"], registry=r)
        # A class's jobs by who dropped them (a login: as many series as students), and the time each used.
        self.submitted = Counter(
            "mmd_submitter_jobs",
            "Jobs finished, by submitter (the input's owner) and status",
            ["submitter", "status"],
            registry=r,
        )
        self.used = Counter(
            "mmd_submitter_seconds",
            "Claim to commit (overall) of finished jobs, by submitter",
            ["submitter"],
            registry=r,
        )
        self.duration = Histogram(
            "mmd_job_duration_seconds", "Claim to committed output (overall)", buckets=DURATION_BUCKETS, registry=r
        )
        self.phases = Histogram(
            "mmd_job_phase_seconds", "Each phase of finished jobs", ["phase"], buckets=DURATION_BUCKETS, registry=r
        )
        self.bytes_in = Counter("mmd_input_bytes", "Bytes of input read by finished jobs", registry=r)
        self.bytes_out = Counter("mmd_output_bytes", "Bytes of output committed", registry=r)
        self.queue = Gauge("mmd_queue_jobs", "Jobs queued in the daemon (claimed or about to be)", registry=r)
        self.waiting = Gauge("mmd_inbox_jobs", "Job files waiting in the inbox at the last look", registry=r)
        self.oldest = Gauge("mmd_oldest_waiting_seconds", "Age of the oldest job file waiting in the inbox", registry=r)
        self.gpu_memory = Gauge("mmd_gpu_memory_used_bytes", "Device memory in use, per device", ["device"], registry=r)
        self.started = Gauge("mmd_daemon_start_time_seconds", "When this daemon started (Unix time)", registry=r)
        self.up = Gauge("mmd_up", "1 while the daemon serves", registry=r)
        # A daemon killed with SIGKILL leaves its last file behind, mmd_up 1 included: only the file's
        # age tells it is dead, so the file says when it was written and how often it should be.
        self.updated = Gauge("mmd_last_update_timestamp_seconds", "When this file was written (Unix time)", registry=r)
        self.interval = Gauge(
            "mmd_metrics_interval_seconds", "How often this file is rewritten (metrics_seconds)", registry=r
        )
        self.interval.set(every)
        self.started.set_to_current_time()

    def job_ended(self, t: Tally) -> None:
        """Count a finished job by its :class:`Tally`."""
        status = "ok" if t.ok else "error"
        self.jobs.labels(status, t.kernel).inc()
        if t.ok:
            self.bytes_out.inc(t.output_bytes)
        else:
            self.errors.labels(t.error_kind).inc()
        self.bytes_in.inc(t.input_bytes)
        if t.submitter is not None:
            self.submitted.labels(t.submitter, status).inc()
        if t.overall_ms is not None:
            self.duration.observe(t.overall_ms / 1e3)
            if t.submitter is not None:
                self.used.labels(t.submitter).inc(t.overall_ms / 1e3)
        for phase, ms in t.phases_ms:
            self.phases.labels(phase).observe(ms / 1e3)

    def text(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)

    def write(self, force: bool = False) -> None:
        """Rewrite the file if one is set and ``every`` seconds have passed (or ``force``)."""
        if self.path is None:
            return
        with self._lock:
            now = self._clock()
            if not force and now - self._written < self.every:
                return
            self._written = now
            self.updated.set_to_current_time()
            write_to_textfile(str(self.path), self.registry)

    def listen(self, host: str, port: int) -> None:
        """Answer scrapes on ``host:port`` until :meth:`close` (OSError when the address cannot be had)."""
        self._server, _thread = start_http_server(port, addr=host, registry=self.registry)

    def close(self) -> None:
        """Stop answering scrapes."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def due_in(self) -> float | None:
        """Seconds until the next periodic write (None: no file)."""
        if self.path is None:
            return None
        return max(0.0, self._written + self.every - self._clock())
