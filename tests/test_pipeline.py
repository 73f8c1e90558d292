"""The job pipeline end to end on the CPU backend: real files, exact bytes, sidecars, refusals."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import yaml

from mmd import sidecar, textformat
from mmd.backends import CpuBackend, MultiplyRequest
from mmd.backends.base import Product
from mmd.errors import TileError
from mmd.pipeline import Limits, run_job

REQ = MultiplyRequest(kernel="cpu", tile=32, memory="device")


def job(tmp_path, text: str | bytes, name="m.txt", backend=None, **kw):
    src = tmp_path / name
    src.write_bytes(text.encode() if isinstance(text, str) else text)
    out = tmp_path / (src.stem + ".out")
    return run_job(src, out, kw.pop("request", REQ), backend or CpuBackend(), durable=False, **kw), src, out


def test_square_job_bytes_and_sidecar(tmp_path):
    result, src, out = job(tmp_path, "2\n1 2\n3 4\n0.5 0\n0 -0.001\n")
    assert result.ok
    assert out.read_bytes() == b"2\n  0.50 -0.00\n  1.50 -0.00\n"
    rec = yaml.safe_load(sidecar.timing_path(out).read_text())
    assert rec["status"] == "ok"
    assert rec["input"] == {
        "name": "m.txt",
        "bytes": src.stat().st_size,
        "sha256": hashlib.sha256(src.read_bytes()).hexdigest(),
    }
    assert rec["output"]["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert rec["output"]["bytes"] == out.stat().st_size
    assert rec["shape"] == {"m": 2, "k": 2, "n": 2}
    assert rec["backend"] == "cpu" and rec["kernel"] == "cpu" and rec["tile"] is None
    t = rec["timings_ms"]
    assert list(t) == list(sidecar.TIMING_KEYS)
    for key in ("read", "parse", "kernel", "emit", "write", "overall"):
        assert t[key] is not None and t[key] >= 0
    for key in ("malloc", "h2d", "d2h", "free", "cuda", "compile"):
        assert t[key] is None
    assert t["overall"] >= t["parse"] + t["emit"]
    assert "gflops" in rec


def test_rectangular_and_one_by_one(tmp_path):
    rng = np.random.default_rng(3)
    a = (rng.integers(-999, 999, size=(3, 5)) / 100).astype(np.float32)
    b = (rng.integers(-999, 999, size=(5, 7)) / 100).astype(np.float32)
    text = "3 5 7\n" + " ".join(f"{x:.2f}" for x in a.ravel()) + "\n" + "\n".join(f"{x:.2f}" for x in b.ravel())
    result, _, out = job(tmp_path, text)
    assert result.ok
    assert out.read_bytes() == textformat.format_reference(a @ b)
    assert out.read_bytes().startswith(b"3 7\n")
    _, _, out = job(tmp_path, "1\n-3\n2.5\n", name="one.txt")
    assert out.read_bytes() == b"1\n -7.50\n"


@pytest.mark.parametrize(
    ("text", "needle", "line"),
    [
        ("", "the file is empty", 1),
        (" \r\n\t\n", "the file is whitespace only", 1),
        ("\ufeff", "the file is empty", 1),
        ("2\n1 2 3 4\n1 2 3\n", "expected 8 values", None),
        ("2\n1 2 3 4\n1 2 3 x\n", "'x'", 3),
        ("0\n", "header", 1),
        ("2 2\n1 2 3 4\n", "header", 1),
        ("2\n1 2 3 4\n5 6 7 nan\n", "nan", 3),
    ],
)
def test_refusals_write_error_sidecar_and_no_output(tmp_path, text, needle, line):
    result, _, out = job(tmp_path, text)
    assert not result.ok
    assert not out.exists()
    assert not sidecar.timing_path(out).exists()
    rec = yaml.safe_load(sidecar.error_path(out).read_text())
    assert rec["status"] == "error"
    assert needle in rec["error"]["reason"]
    if line is not None:
        assert rec["error"]["line"] == line
    assert rec["input"]["name"] == "m.txt"
    assert rec["output"]["written"] is False


def test_header_beyond_file_is_refused_before_allocating(tmp_path):
    result, _, out = job(tmp_path, "1000000 1000000 1000000\n1 2 3\n")
    assert not result.ok and "can hold at most" in result.error.reason
    assert not out.exists()


def test_memory_limit_refuses_before_parsing(tmp_path):
    text = "64\n" + "1 " * (2 * 64 * 64)
    result, _, _ = job(tmp_path, text, limits=Limits(max_memory_bytes=10_000))
    assert not result.ok and result.error.kind == "limit"
    assert "needs about" in result.error.reason and "limit is 10000" in result.error.reason


def test_file_size_limit(tmp_path):
    result, _, _ = job(tmp_path, "1\n2\n3\n", limits=Limits(max_file_bytes=3))
    assert not result.ok and result.error.kind == "limit"


def test_symlink_input_is_not_followed(tmp_path):
    target = tmp_path / "secret.txt"
    target.write_text("1\n2\n3\n")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    result = run_job(link, tmp_path / "link.out", REQ, CpuBackend(), durable=False)
    assert not result.ok and "cannot open" in result.error.reason


def test_backend_refusal_becomes_error_sidecar(tmp_path):
    class Refusing(CpuBackend):
        def multiply(self, a, b, request):
            raise TileError("tile 64 needs 4096 threads per block; this GPU allows 1024", {"tile": 64})

    result, _, out = job(tmp_path, "1\n2\n3\n", backend=Refusing())
    assert not result.ok
    rec = yaml.safe_load(sidecar.error_path(out).read_text())
    assert rec["error"]["kind"] == "tile" and rec["error"]["tile"] == 64
    assert "4096 threads" in rec["error"]["reason"]


def test_cuda_time_is_the_sum_of_the_five_phases(tmp_path):
    class FakeGpu(CpuBackend):
        name = "cuda"

        def multiply(self, a, b, request):
            phases = {"malloc": 1.0, "h2d": 2.0, "kernel": 3.0, "d2h": 4.0, "free": 5.0}
            return Product(a @ b, "tiled", 16, "device", "fake gpu", phases)

    result, _, _ = job(tmp_path, "1\n2\n3\n", backend=FakeGpu())
    assert result.ok
    t = result.record["timings_ms"]
    assert t["cuda"] == 15.0 and t["kernel"] == 3.0
    assert result.record["tile"] == 16


def test_extra_entries_reach_the_sidecar(tmp_path):
    _, _, out = job(tmp_path, "1\n2\n3\n", extra={"settings_from_name": {"tile": 16}})
    assert yaml.safe_load(sidecar.timing_path(out).read_text())["settings_from_name"] == {"tile": 16}


def test_sidecar_bytes_are_the_same_with_and_without_libyaml():
    import yaml

    record = {"status": "ok", "input": {"name": "ünï code.txt", "bytes": 3}, "timings_ms": {"parse": 1.5, "cuda": None}}
    plain = yaml.safe_dump(record, sort_keys=False, default_flow_style=False, allow_unicode=True).encode()
    assert sidecar.dumps(record) == plain


def test_max_dim_refuses_before_parsing(tmp_path):
    result, _, _ = job(tmp_path, "3 2 5\n" + "1 " * 16, limits=Limits(max_dim=4))
    assert not result.ok and result.error.kind == "limit"
    assert "exceeds the largest size allowed, 4" in result.error.reason


def test_a_file_that_keeps_growing_is_not_read_without_bound(tmp_path, monkeypatch):
    import os

    from mmd import pipeline

    src = tmp_path / "grow.txt"
    src.write_bytes(b"1\n2\n3\n" + b" " * (3 << 20))
    real_fstat = os.fstat

    def fstat_at_open(fd):
        # The size the file had when it was opened; a writer appended 3 MiB since.
        info = real_fstat(fd)
        return os.stat_result((*info[:6], 6, *info[7:]))

    monkeypatch.setattr(pipeline.os, "fstat", fstat_at_open)
    result = run_job(src, tmp_path / "grow.out", REQ, CpuBackend(), durable=False)
    assert not result.ok and result.error.kind == "limit" and "grew past" in result.error.reason


def test_durable_and_max_dim_settings(tmp_path):
    from mmd import config

    cfg = tmp_path / "c.yaml"
    cfg.write_text("durable: false\nmax_dim: 4096\n")
    s = config.load(cfg, environ={"MMD_DURABLE": "yes"})
    assert s.durable is True and s.max_dim == 4096
    import pytest as _pytest

    with _pytest.raises(config.ConfigError, match="durable must be bool"):
        config.load(cfg, environ={"MMD_DURABLE": "maybe"})
