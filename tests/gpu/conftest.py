"""GPU tests: one CUDA backend for the whole run, skipped cleanly without pycuda or a GPU."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``gpu`` marker here too, so this folder runs on its own."""
    config.addinivalue_line("markers", "gpu: needs pycuda and a CUDA GPU (skipped elsewhere)")


@pytest.fixture(scope="session")
def cuda_backend():
    """A CudaBackend on device 0, or a skip saying why there is none."""
    pytest.importorskip("pycuda", reason="pycuda is not installed")
    from mmd import config
    from mmd.backends.cuda import CudaBackend
    from mmd.errors import BackendUnavailable

    try:  # the kernel cache `mmd kernels --build` fills: no test waits for nvcc
        backend = CudaBackend(device=0, kernel_cache=config.kernel_cache_dir(config.Settings()))
    except BackendUnavailable as exc:
        pytest.skip(f"no usable GPU: {exc}")
    yield backend
    backend.close()
