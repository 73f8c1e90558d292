"""The GPU text path's CPU-side pieces: the kernels compile, the pipeline hook, reading into page-locked memory.

The kernels themselves run in tests/gpu/test_gputext.py; here a fake text
backend stands in for the cuda one, so the hook's choices, timings and
sidecar entries are checked without a GPU.
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import yaml

from mmd import gputext, kernels, textformat
from mmd.backends import CpuBackend
from mmd.backends.base import MultiplyRequest, TextBackend, TextProduct
from mmd.pipeline import Limits, read_input, run_job, text_path_for

NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("source", [gputext.PARSE_SOURCE, gputext.EMIT_SOURCE], ids=lambda p: p.name)
def test_text_kernels_compile_for_sm90(source, tmp_path):
    defines = [f"-D{k}={v}" for k, v in gputext.DEFINES.items()]
    done = subprocess.run(
        [NVCC, "-arch=sm_90", "-cubin", "-O3", *defines, "-o", str(tmp_path / "k.cubin"), str(source)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    entries = gputext.PARSE_ENTRIES if source == gputext.PARSE_SOURCE else gputext.EMIT_ENTRIES
    text = source.read_text()
    for name in entries:
        assert f"{name}(" in text, name


def test_text_kernels_are_not_matmul_kernels():
    registered = {spec.source_file for spec in kernels.REGISTRY.values() if spec.source_file}
    assert not set(gputext.TEXT_KERNEL_FILES) & registered
    for name in gputext.TEXT_KERNEL_FILES:
        assert (kernels.KERNELS_DIR / name).is_file()


def test_fits_keeps_offsets_within_int32():
    head = textformat.parse_header(b"4096\n")
    assert gputext.fits(head, 185_000_000)
    assert not gputext.fits(head, 2**31 + 10)
    big = textformat.parse_header(b"20000\n")  # 4e8 fields of up to MAX_FIELD_BYTES
    assert not gputext.fits(big, 10**9)
    assert gputext.header_line(3, 3) == b"3\n" and gputext.header_line(2, 5) == b"2 5\n"


def test_read_input_into_a_callers_buffer(tmp_path):
    src = tmp_path / "m.txt"
    src.write_bytes(b"2\n1 2 3 4\n5 6 7 8\n")
    asked = []

    def into(size):
        asked.append(size)
        return np.zeros(size + 7, np.uint8)

    data = read_input(src, Limits(), into=into)
    assert isinstance(data, memoryview) and bytes(data) == src.read_bytes() and asked == [src.stat().st_size]
    assert read_input(src, Limits()) == src.read_bytes()


class FakeTextBackend(CpuBackend):
    """The CPU backend plus the text protocol, through textformat (what the GPU must equal)."""

    name = "fake-text"

    def __init__(self, accept: bool = True) -> None:
        self.accept = accept
        self.calls = 0
        self.buffers = 0

    def accepts_text(self, header, nbytes, request):
        return self.accept

    def host_bytes(self, nbytes):
        self.buffers += 1
        return np.empty(nbytes, np.uint8)

    def multiply_text(self, data, header, request):
        self.calls += 1
        matrices = textformat.parse(data, header)
        c = matrices.a @ matrices.b
        timings = {"malloc": 1.0, "h2d": 2.0, "kernel": 3.0, "d2h": 4.0, "free": 5.0}
        return TextProduct(
            c=c, kernel="fake", tile=None, memory="device", device="fake", timings_ms=timings,
            chunks=list(textformat.emit_chunks(c)), stage_ms={"parse": 7.0, "multiply": 3.0, "emit": 8.0},
            text={"parse_gpu": 0.5, "emit_gpu": 0.25},
        )  # fmt: skip


CPU_REQUEST = MultiplyRequest(kernel="cpu")


def run(tmp_path, text: bytes, backend, request=CPU_REQUEST):
    src = tmp_path / "m.txt"
    src.write_bytes(text)
    out = tmp_path / "m.out"
    return run_job(src, out, request, backend, durable=False), out


def test_hook_takes_the_text_path_and_records_its_parts(tmp_path):
    backend = FakeTextBackend()
    assert isinstance(backend, TextBackend) and not isinstance(CpuBackend(), TextBackend)
    result, out = run(tmp_path, b"2\r\n1 2\r\n3 4\r\n0.5 0 0 -0.001", backend)
    assert result.ok and backend.calls == 1 and backend.buffers == 1
    assert out.read_bytes() == b"2\n  0.50 -0.00\n  1.50 -0.00\n"
    rec = yaml.safe_load(result.sidecar.read_text())
    assert rec["text"] == {"path": "gpu", "parse_gpu": 0.5, "emit_gpu": 0.25}
    t = rec["timings_ms"]
    assert t["cuda"] == 15.0 and t["emit"] == 8.0 and t["parse"] >= 7.0
    assert t["overall"] >= t["read"]


def test_hook_falls_back_to_the_host_path(tmp_path):
    backend = FakeTextBackend(accept=False)
    result, out = run(tmp_path, b"1\n2\n3\n", backend)
    assert result.ok and backend.calls == 0 and out.read_bytes() == b"1\n  6.00\n"
    assert result.record["text"] == {"path": "host"}
    backend = FakeTextBackend()
    result, _ = run(tmp_path, b"1\n2\n3\n", backend, MultiplyRequest(kernel="cpu", text_path="host"))
    assert result.ok and backend.calls == 0 and result.record["text"] == {"path": "host"}
    assert text_path_for(CpuBackend(), MultiplyRequest(text_path="gpu")) == "host"


def test_text_path_errors_are_the_host_parsers(tmp_path):
    result, out = run(tmp_path, b"2\n1 2\n3 x4\n1 2 3 4\n", FakeTextBackend())
    assert not result.ok and not out.exists()
    assert result.record["error"]["line"] == 3
