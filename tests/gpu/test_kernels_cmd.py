"""`mmd kernels` on a GPU: the device's own limits, from the backend `open_backend` opens for it."""

from __future__ import annotations

import pytest

from ..conftest import run_mmd

pytestmark = pytest.mark.gpu


def test_kernels_names_the_gpu_and_checks_each_tile_against_its_limits(cuda_backend, tmp_path):
    r = run_mmd("kernels", cwd=tmp_path, env={"MMD_BACKEND": "cuda"})
    assert r.returncode == 0, r.stderr
    limits = cuda_backend.limits
    lines = r.stdout.splitlines()
    assert lines[0] == f"device 0: {cuda_backend.device_name()}"
    assert lines[1].startswith(f"limits: {limits.max_threads_per_block} threads, {limits.max_shared_per_block} bytes")
    naive = next(line for line in lines if line.startswith("naive "))
    refused = f"64 (tile 64 needs 4096 threads per block; this GPU allows {limits.max_threads_per_block})"
    assert naive.endswith(f"tiles 4, 8, 16, 32; refused: {refused}"), naive
