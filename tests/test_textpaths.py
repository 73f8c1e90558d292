"""The pipeline's two text paths, with the fake GPU: which one a job takes, what it records, same refusals."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import yaml

from mmd.backends import CpuBackend, MultiplyRequest
from mmd.pipeline import Limits, read_input
from mmd.pipeline.textpaths import GPU_TEXT_MIN_BYTES, DeviceTextPath, HostTextPath, choose

from .conftest import plain, run_file
from .fakes import cuda_backend

GPU = MultiplyRequest(kernel="tiled", tile=16, text_path="gpu")


def run(tmp_path, text: bytes, backend, request=GPU):
    src = tmp_path / "m.txt"
    src.write_bytes(text)
    out = tmp_path / "m.out"
    return run_file(src, out, backend, request), out


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


def test_a_file_its_header_read_took_whole_is_not_read_again(tmp_path, monkeypatch):
    """A small file (up to the header's window) is read once; its bytes, hash and limits are as a second
    read's would be, into a caller's buffer too. A bigger one is read again after its header."""
    from mmd.atomic import StreamHash
    from mmd.errors import LimitError
    from mmd.pipeline import reading

    opened = []
    real_open = reading._open
    monkeypatch.setattr(reading, "_open", lambda path: opened.append(path) or real_open(path))
    small, big = tmp_path / "small.txt", tmp_path / "big.txt"
    small.write_bytes(b"2\n1 2 3 4\n5 6 7 8\n")
    big.write_bytes(b"2\n1 2 3 4\n5 6 7 8\n" + b" " * (1 << 16))
    for path, reads in ((small, 1), (big, 2)):
        opened.clear()
        head = reading.read_header(path, Limits())
        hasher = StreamHash()
        assert bytes(read_input(path, Limits(), hasher=hasher, head=head)) == path.read_bytes()
        assert hasher.hexdigest() == hashlib.sha256(path.read_bytes()).hexdigest()
        assert len(opened) == reads, path.name
        buffer = bytes(read_input(path, Limits(), into=lambda size: np.zeros(size, np.uint8), head=head))
        assert buffer == path.read_bytes()
    head = reading.read_header(small, Limits())
    small.write_bytes(small.read_bytes() + b" " * 100)  # grew after its first read: as one read would find it
    assert read_input(small, Limits(), head=head) == head.whole
    with pytest.raises(LimitError, match="max_file_bytes"):
        read_input(small, Limits(max_memory_bytes=10), head=head)


def test_choose_takes_the_device_path_when_the_backend_has_one():
    backend, _ = cuda_backend()
    assert isinstance(choose(backend, GPU, 10), DeviceTextPath)
    assert isinstance(choose(backend, MultiplyRequest(text_path="host"), GPU_TEXT_MIN_BYTES), HostTextPath)
    assert isinstance(choose(CpuBackend(), MultiplyRequest(text_path="gpu"), GPU_TEXT_MIN_BYTES), HostTextPath)


def test_auto_chooses_the_host_path_for_a_small_input_so_it_is_read_into_no_page_locked_buffer():
    backend, _ = cuda_backend()
    auto = MultiplyRequest()
    small, big = choose(backend, auto, GPU_TEXT_MIN_BYTES - 1), choose(backend, auto, GPU_TEXT_MIN_BYTES)
    assert isinstance(small, HostTextPath) and small.input_buffer() is None
    assert isinstance(big, DeviceTextPath) and big.input_buffer() is not None


def test_device_path_runs_and_records_its_parts(tmp_path):
    backend, session = cuda_backend()
    result, out = run(tmp_path, b"2\r\n1 2\r\n3 4\r\n0.5 0 0 -0.001", backend)
    assert result.ok and session.text.calls == 1
    assert out.read_bytes() == b"2\n  0.50 -0.00\n  1.50 -0.00\n"
    rec = yaml.safe_load(result.sidecar.read_text())
    assert rec["text"] == {
        "path": "gpu", "parse_gpu": 0.5, "emit_gpu": 0.25, "host_parse": False, "exotic_runs": 0
    }  # fmt: skip
    t = rec["timings_ms"]
    assert t["cuda"] == 15.0 and t["emit"] == 8.0 and t["parse"] >= 7.0
    assert t["compile"] == 42.0 + 12.0  # the kernel and the text kernels, built for this first job
    assert t["overall"] >= t["read"]


def test_device_path_hands_other_memory_modes_to_the_host_path(tmp_path):
    backend, session = cuda_backend()
    result, out = run(tmp_path, b"1\n2\n3\n", backend, MultiplyRequest(kernel="tiled", tile=16, memory="pitched"))
    assert result.ok and session.text.calls == 0 and out.read_bytes() == b"1\n  6.00\n"
    assert plain(result)["text"] == {"path": "host"}
    result, _ = run(tmp_path, b"1\n2\n3\n", backend, MultiplyRequest(kernel="tiled", tile=16, text_path="host"))
    assert result.ok and session.text.calls == 0 and plain(result)["text"] == {"path": "host"}


def test_device_path_errors_are_the_host_parsers(tmp_path):
    backend, _ = cuda_backend()
    gpu, out = run(tmp_path, b"2\n1 2\n3 x4\n1 2 3 4\n", backend)
    host, _ = run(tmp_path, b"2\n1 2\n3 x4\n1 2 3 4\n", CpuBackend(), MultiplyRequest(kernel="cpu"))
    assert not gpu.ok and not out.exists()
    assert plain(gpu)["error"] == plain(host)["error"] and plain(gpu)["error"]["line"] == 3


def test_auto_leaves_a_small_input_to_the_host_and_takes_a_big_one_to_the_device(tmp_path):
    backend, session = cuda_backend()
    auto = MultiplyRequest(kernel="tiled", tile=16)
    small, out = run(tmp_path, b"2\n1 2\n3 4\n0.5 0 0 -0.001", backend, auto)
    assert small.ok and session.text.calls == 0 and plain(small)["text"] == {"path": "host"}
    assert out.read_bytes() == b"2\n  0.50 -0.00\n  1.50 -0.00\n"
    n = 160  # 2·160² values of "-d.dd " and more: over GPU_TEXT_MIN_BYTES
    values = np.random.default_rng(3).integers(-999, 999, 2 * n * n) / 100
    text = f"{n}\n".encode() + " ".join(f"{v:.2f}" for v in values).encode()
    assert len(text) >= GPU_TEXT_MIN_BYTES
    big, _ = run(tmp_path, text, backend, auto)
    assert big.ok and session.text.calls == 1 and plain(big)["text"]["path"] == "gpu"
