"""The benchmark's GPU readings through the real NVML (nvidia-ml-py), on the GPU the CUDA backend opened."""

from __future__ import annotations

import numpy as np
import pytest

from mmd import bench
from mmd.backends import MultiplyRequest

pytestmark = pytest.mark.gpu


def test_nvml_finds_the_cuda_backends_gpu_by_bus_id_and_reads_its_clock_and_this_process(cuda_backend):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    reader = bench.Nvml.find(0, cuda_backend.limits.pci_bus_id)
    assert reader is not None, "NVML did not find the GPU"
    a = np.ones((256, 256), dtype=np.float32)
    cuda_backend.multiply(a, a, MultiplyRequest(kernel="tiled", tile=16))  # this process holds a context
    sample = reader.read()
    assert sample is not None and sample.sm_mhz is not None and sample.sm_mhz > 0
    assert sample.max_sm_mhz is not None and sample.max_sm_mhz >= sample.sm_mhz
    assert sample.processes is not None and sample.processes >= 1
    with bench.ClockSampler(reader, interval=0.05) as sampler:
        cuda_backend.multiply(a, a, MultiplyRequest(kernel="tiled", tile=16))
    summary = sampler.summary()
    assert summary["sm_clock_mhz"] > 0 and summary["gpu_processes"] >= 1 and summary["load_avg"] is not None
