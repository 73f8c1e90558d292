"""The real GpuSession and its parts, over the stand-in driver (tests/fakegpu/pycuda), in a process of its own.

The stand-in's device memory is host memory and its ``square`` kernel computes C += A·B, so a job through
the parts (``session.memory``, ``session.modules``, ``session.stream``) gives a checkable product; the
session's rules (one thread, nothing after close, close once) are checked the same way. tests/gpu runs the
parts on a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.integration

FAKE_GPU = str(ROOT / "tests" / "fakegpu")


def run_with_fake_driver(code: str) -> None:
    """Run ``code`` in a fresh interpreter whose pycuda is the stand-in; it fails by raising."""
    env = {**os.environ, "PYTHONPATH": FAKE_GPU + os.pathsep + str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_job_through_the_sessions_parts_gives_the_product_and_times_its_phases():
    run_with_fake_driver(
        """
        import numpy as np
        from mmd.cuda.session import GpuSession

        session = GpuSession(0)
        assert session.device.name() == "Fake GPU (sm_90)"
        assert session.device.limits.l2_cache_bytes == 50 << 20
        assert session.device.mem_info() == (70 << 30, 80 << 30)
        a = np.arange(16, dtype=np.float32).reshape(4, 4)
        b = np.eye(4, dtype=np.float32)[::-1] * 2
        function = session.modules.load_cubin(b"\\x7fELF stand-in", "square", "PPPi")
        timer = session.stream.phase_timer()
        with timer.phase("malloc"):
            da, db, dc = (session.memory.alloc("device", 4, 4) for _ in range(3))
            session.memory.fill(dc, 0.0)
        with timer.phase("h2d", follows=True):
            session.memory.upload(da, a, "a")
            session.memory.upload(db, b, "b")
        with timer.phase("kernel", follows=True):
            session.stream.launch(function, (1, 1, 1), (4, 4, 1), (da.ptr, db.ptr, dc.ptr, np.int32(4)), 0)
        session.stream.synchronize()
        out = session.memory.host_empty((4, 4), np.float32, slot="c")
        assert session.memory.is_pinned(out) and session.memory.pinned_bytes() >= out.nbytes
        with timer.phase("d2h", follows=True):
            session.memory.download(dc, "c", out=out)
        with timer.phase("free", follows=True):
            for matrix in (da, db, dc):
                session.memory.free(matrix)
        assert np.array_equal(out, a @ b), out
        assert set(timer.elapsed_ms()) == {"malloc", "h2d", "kernel", "d2h", "free"}
        session.close()
        """
    )


def test_the_session_is_used_in_the_thread_that_opened_it_and_not_after_close():
    run_with_fake_driver(
        """
        import threading
        from mmd.cuda.session import GpuSession
        from mmd.errors import CudaError

        session = GpuSession(0)
        raised = []

        def elsewhere():
            try:
                session.memory.alloc("device", 2, 2)
            except CudaError as exc:
                raised.append(exc.reason)

        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        assert raised == [
            "the CUDA session was opened in another thread; open, use and close it in one thread"
        ], raised
        session.memory.free(session.memory.alloc("device", 2, 2))  # its own thread may
        session.close()
        session.close()  # a second close does nothing
        for use in (
            lambda: session.memory.alloc("device", 2, 2),
            lambda: session.modules.load_cubin(b"\\x7fELF", "square", "PPPi"),
            lambda: session.memory.host_empty(4),
        ):
            try:
                use()
            except CudaError as exc:
                assert exc.reason == "the CUDA session is closed", exc.reason
            else:
                raise AssertionError("a closed session was used")
        """
    )
