"""The daemon's metrics, in Prometheus' text format, for node_exporter's textfile collector.

Two ways out, either or both: the daemon rewrites ``metrics_file``
atomically (prometheus_client writes a temporary and renames it) every
``metrics_seconds`` and after each job, and node_exporter
(``--collector.textfile.directory``) exports it with the machine's own
metrics (``mmd status --metrics`` prints the same file); and with
``metrics_listen`` an HTTP server answers scrapes on a thread of its own
(:class:`ScrapeServer`), so a daemon that is gone fails its scrape. The
series by submitter (who submits, how often, for how long) are in the file
only, which the service's umask keeps from other accounts: the endpoint
answers anyone on the machine.

Made with the ``prometheus-client`` library: the format, escaping, the
histogram buckets' cumulative counts and a scrape's answer are its business.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    make_wsgi_app,
    write_to_textfile,
)

from .record import Tally

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication

# A `_created` series beside every counter and histogram doubles the series for a time Prometheus does not
# read (node_exporter's own metrics leave it out too); mmd_daemon_start_time_seconds says when counting began.
disable_created_metrics()

#: Connections the endpoint serves at once; one more is closed unanswered (Prometheus scrapes with one).
MAX_SCRAPES = 8
#: Seconds a scrape's connection may last from its accept, its request and its answer together (a scrape
#: sends its request at once and its answer takes milliseconds; Prometheus' own scrape timeout is 10 s).
SCRAPE_DEADLINE_S = 3.0

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
        self._server: ScrapeServer | None = None  # the HTTP endpoint's, while it serves
        #: What the endpoint answers; the file holds these and :attr:`private`.
        r = self.registry = CollectorRegistry()
        #: The file's alone: a class's jobs by who dropped them (a login: as many series as students), and the
        #: time each used, which no classmate may read.
        self.private = CollectorRegistry()
        self._file = CollectorRegistry()
        self._file.register(self.registry)
        self._file.register(self.private)
        # A refused job ran no kernel: it counts under kernel="" (which Prometheus reads as no label).
        self.jobs = Counter("mmd_jobs", "Jobs finished, by status and kernel", ["status", "kernel"], registry=r)
        self.errors = Counter("mmd_job_errors", "Refused jobs, by kind of refusal", ["kind"], registry=r)
        self.submitted = Counter(
            "mmd_submitter_jobs",
            "Jobs finished, by submitter (the input's owner) and status",
            ["submitter", "status"],
            registry=self.private,
        )
        self.used = Counter(
            "mmd_submitter_seconds",
            "Claim to commit (overall) of finished jobs, by submitter",
            ["submitter"],
            registry=self.private,
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
        """The file's metrics in Prometheus' text format (the endpoint's and the submitters')."""
        return generate_latest(self._file)

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
            write_to_textfile(str(self.path), self._file)

    def listen(self, host: str, port: int) -> tuple[str, int]:
        """Answer scrapes on ``host:port`` until :meth:`close`; the address it took (port 0: a free one).
        OSError when the address cannot be had."""
        server = self._server = ScrapeServer(host, port, make_wsgi_app(self.registry))
        threading.Thread(target=server.serve_forever, name="mmd-metrics", daemon=True).start()
        bound = server.server_address
        return str(bound[0]), int(bound[1])

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


class _Handler(WSGIRequestHandler):
    """A scrape's connection: each read and write within the deadline, and no access log (a line per scrape)."""

    timeout = SCRAPE_DEADLINE_S

    def log_message(self, format: str, *args: Any) -> None:
        pass


class ScrapeServer(ThreadingMixIn, WSGIServer):
    """The metrics endpoint's HTTP server: a thread per connection as prometheus_client's own, but at most
    ``limit`` connections at once (one more is closed at once, unanswered), each shut down ``deadline``
    seconds after its accept, whatever it sends or reads, and none of their failures printed.

    Written over the standard library because prometheus_client's server (``start_http_server``) bounds
    neither: any account on the machine held a descriptor of the daemon's per idle connection, and about
    1,000 of them took its last one. Its WSGI application (``make_wsgi_app``) answers each scrape.
    """

    daemon_threads = True
    block_on_close = False
    # Connections the kernel completes before they are accepted (no descriptor of ours until then): a burst of
    # connects is accepted (and, past the limit, closed) at once, not made to retry its SYN a second later.
    request_queue_size = 128

    def __init__(
        self,
        host: str,
        port: int,
        app: WSGIApplication,
        limit: int = MAX_SCRAPES,
        deadline: float = SCRAPE_DEADLINE_S,
    ) -> None:
        # An IPv6 host needs its family before the socket is made (prometheus_client looks it up the same way).
        self.address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        self.limit = limit
        self.deadline = deadline
        self._open: dict[Any, float] = {}  # connection → when it is shut down
        self._guard = threading.Lock()
        super().__init__((host, port), _Handler)
        self.set_app(app)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._guard:
            full = len(self._open) >= self.limit
            if not full:
                self._open[request] = time.monotonic() + self.deadline
        if full:
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._guard:
            self._open.pop(request, None)
        super().shutdown_request(request)

    def service_actions(self) -> None:
        """Shut down the connections past their deadline (a request sent a byte at a time, an answer never
        read): their threads' reads and writes end at once. Called between accepts, at least twice a second."""
        now = time.monotonic()
        with self._guard:
            late = [request for request, end in self._open.items() if end <= now]
        for request in late:
            with contextlib.suppress(OSError):
                request.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed (timed out, reset, shut down at its deadline) ends quietly: a failed
        scrape is the scraper's to see."""
