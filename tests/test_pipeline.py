"""The job pipeline end to end on the CPU backend: real files, exact bytes, sidecars, refusals."""

from __future__ import annotations

import hashlib
import time

import numpy as np
import pytest
import yaml

from mmd import record, textformat, textoutput
from mmd.backends import CpuBackend, MultiplyRequest
from mmd.config import Settings
from mmd.job import describe
from mmd.pipeline import run_job
from mmd.record import writer

from .conftest import plain, run_file
from .fakes import cuda_backend

REQ = MultiplyRequest(kernel="cpu", tile=32, memory="device")


def job(tmp_path, text: str | bytes, name="m.txt", backend=None, request=REQ, **settings):
    src = tmp_path / name
    src.write_bytes(text.encode() if isinstance(text, str) else text)
    out = tmp_path / (src.stem + ".out")
    return run_file(src, out, backend or CpuBackend(), request, **settings), src, out


def test_square_job_bytes_and_sidecar(tmp_path):
    result, src, out = job(tmp_path, "2\n1 2\n3 4\n0.5 0\n0 -0.001\n")
    assert result.ok
    assert out.read_bytes() == b"2\n  0.50 -0.00\n  1.50 -0.00\n"
    rec = yaml.safe_load(record.timing_path(out).read_text())
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
    assert list(t) == list(record.TIMING_KEYS)
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
    assert not record.timing_path(out).exists()
    rec = yaml.safe_load(record.error_path(out).read_text())
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
    result, _, _ = job(tmp_path, text, max_memory_bytes=10_000)
    assert not result.ok and result.error.kind == "limit"
    assert "needs about" in result.error.reason and "limit is 10000" in result.error.reason


def test_file_size_limit(tmp_path):
    result, _, _ = job(tmp_path, "1\n2\n3\n", max_file_bytes=3)
    assert not result.ok and result.error.kind == "limit"


def test_symlink_input_is_not_followed(tmp_path):
    target = tmp_path / "secret.txt"
    target.write_text("1\n2\n3\n")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    result = run_file(link, tmp_path / "link.out", CpuBackend(), REQ)
    assert not result.ok and "cannot open" in result.error.reason


def test_backend_refusal_becomes_error_sidecar(tmp_path):
    backend, session = cuda_backend()
    result, _, out = job(tmp_path, "1\n2\n3\n", backend=backend, request=MultiplyRequest(kernel="tiled", tile=64))
    assert not result.ok and session.allocs == 0
    rec = yaml.safe_load(record.error_path(out).read_text())
    assert rec["error"]["kind"] == "tile" and rec["error"]["tile"] == 64
    assert "4096 threads" in rec["error"]["reason"]
    assert rec["backend"] == "cuda" and rec["requested"] == {"kernel": "tiled", "tile": 64, "memory": "device"}


def test_cuda_time_is_the_sum_of_the_five_phases(tmp_path):
    backend, _ = cuda_backend()
    host = MultiplyRequest(kernel="tiled", tile=16, text_path="host")
    result, _, _ = job(tmp_path, "1\n2\n3\n", backend=backend, request=host)
    assert result.ok
    rec = plain(result)
    t = rec["timings_ms"]
    assert t["cuda"] == 15.0 and t["kernel"] == 3.0 and t["compile"] == 42.0
    assert rec["tile"] == 16 and rec["text"] == {"path": "host"}


def test_name_settings_reach_the_job_and_its_sidecar(tmp_path):
    backend, _ = cuda_backend()
    result, _, out = job(tmp_path, "1\n2\n3\n", name="m@kernel=naive,tile=8.txt", backend=backend, request=None)
    assert result.ok and result.job.name_settings == {"kernel": "naive", "tile": 8}
    rec = yaml.safe_load(record.timing_path(out).read_text())
    assert rec["name_settings"] == {"kernel": "naive", "tile": 8}
    assert (rec["kernel"], rec["tile"]) == ("naive", 8)


def test_a_bad_name_is_refused_before_the_input_is_read(tmp_path):
    def no_backend(_settings):
        raise AssertionError("a refused job opens no backend")

    src = tmp_path / "a@kernel=bogus.txt"
    src.write_text("1\n2\n3\n")
    out = tmp_path / "a@kernel=bogus.out"
    result = run_job(describe(src, out, Settings(durable=False)), no_backend)
    assert not result.ok and result.error.kind == "jobname" and not out.exists()
    rec = yaml.safe_load(record.error_path(out).read_text())
    assert "unknown kernel 'bogus'" in rec["error"]["reason"] and "choose one of naive" in rec["error"]["reason"]
    assert rec["input"] == {"name": src.name, "bytes": src.stat().st_size}


def test_sidecar_bytes_are_the_same_with_and_without_libyaml():
    rec = record.TimingRecord(
        job="0123456789ab",
        input=record.FileFacts("ünï code.txt", 3, "ab"),
        output=record.FileFacts("o.out", 1, "cd"),
        shape=record.Shape(1, 1, 1),
        backend="cpu",
        kernel="cpu",
        tile=None,
        memory=None,
        device="cpu",
        requested=record.Requested("cpu", 32, "device"),
        timings_ms=record.timings({"parse": 1.5}),
        text=record.TextFacts("host"),
        gflops=None,
    )
    data = record.as_dict(rec)
    assert yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True).encode() == (
        writer.dumps(rec)
    )


def test_max_dim_refuses_before_parsing(tmp_path):
    result, _, _ = job(tmp_path, "3 2 5\n" + "1 " * 16, max_dim=4)
    assert not result.ok and result.error.kind == "limit"
    assert "exceeds the largest size allowed, 4" in result.error.reason


def test_a_file_that_keeps_growing_is_not_read_without_bound(tmp_path, monkeypatch):
    import os

    from mmd.pipeline import reading

    src = tmp_path / "grow.txt"
    src.write_bytes(b"1\n2\n3\n" + b" " * (3 << 20))
    real_fstat = os.fstat

    def fstat_at_open(fd):
        # The size the file had when it was opened; a writer appended 3 MiB since.
        info = real_fstat(fd)
        return os.stat_result((*info[:6], 6, *info[7:]))

    monkeypatch.setattr(reading.os, "fstat", fstat_at_open)
    result = run_file(src, tmp_path / "grow.out", CpuBackend(), REQ)
    assert not result.ok and result.error.kind == "limit" and "grew past" in result.error.reason


def test_durable_and_max_dim_settings(tmp_path):
    from mmd import config

    cfg = tmp_path / "c.yaml"
    cfg.write_text("durable: false\nmax_dim: 4096\n")
    s = config.load(cfg, environ={"MMD_DURABLE": "yes"})
    assert s.durable is True and s.max_dim == 4096
    with pytest.raises(config.ConfigError, match="MMD_DURABLE must be bool"):
        config.load(cfg, environ={"MMD_DURABLE": "maybe"})


def _peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


@pytest.mark.serial  # a wall-clock bound and the peak memory: alone on the machine
@pytest.mark.parametrize("head", [b"", b"2\n1 2 3 4 5 6 7 8\n"], ids=["all-zero", "valid-header"])
def test_a_2gb_sparse_file_is_refused_unread(tmp_path, head):
    """Issue 15: a 2 GB sparse file was read whole (12-14 s, 2.1 GB) before line 1 was checked.

    All zero bytes (``truncate -s 2G``): the header, from the first bytes, is refused. A valid header
    before 2 GB of zeros: the size cannot match 8 values, refused from the size alone.
    """
    import time

    src = tmp_path / "sparse.txt"
    with open(src, "wb") as fh:
        fh.write(head)
        fh.truncate(2 << 30)
    before = _peak_rss_bytes()
    t0 = time.perf_counter()
    result = run_file(src, tmp_path / "sparse.out", CpuBackend(), REQ)
    took = time.perf_counter() - t0
    grew = _peak_rss_bytes() - before
    assert not result.ok and result.error.kind == ("input" if not head else "limit"), result.error
    assert took < 2.0, f"took {took:.2f} s to refuse"
    assert grew < 100 << 20, f"peak memory grew by {grew >> 20} MB"
    if head:
        assert "8 values" in result.error.reason and "max_bytes_per_value" in result.error.reason
    assert plain(result)["input"]["bytes"] == 2 << 30


def test_a_file_bigger_than_its_values_can_take_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from mmd.pipeline import reading

    def no_read(*args, **kwargs):
        raise AssertionError("the body was read")

    monkeypatch.setattr(reading, "read_input", no_read)
    monkeypatch.setattr("mmd.pipeline.driver.read_input", no_read)
    body = b"1 2 3 4 5 6 7 8" + b" " * (2 << 20)  # 8 values: 64 bytes each plus 1 MiB at most
    result, _, _ = job(tmp_path, b"2\n" + body)
    assert not result.ok and result.error.kind == "limit"
    assert "2x2x2" in result.error.reason and "max_bytes_per_value" in result.error.reason
    assert result.error.details["max_bytes_per_value"] == 64
    assert plain(result)["shape"] == {"m": 2, "k": 2, "n": 2}  # known from the header, though refused unread
    # the bound is a setting; null: none (the grammar itself allows any run of blanks)
    monkeypatch.undo()
    ok, _, out = job(tmp_path, b"2\n" + body, name="n.txt", max_bytes_per_value=None)
    assert ok.ok and out.read_bytes() == b"2\n 19.00 22.00\n 43.00 50.00\n"


def test_blank_lines_before_the_header_through_the_pipeline(tmp_path):
    result, _, out = job(tmp_path, "\n\r\n  \n2\n1 2\n3 4\n1 0\n0 1\n")
    assert result.ok, result.error
    assert out.read_bytes() == b"2\n  1.00  2.00\n  3.00  4.00\n"
    bad, _, _ = job(tmp_path, "\n\n2\n1 2\n3 x\n1 0\n0 1\n", name="bad.txt")
    assert not bad.ok and bad.error.details["line"] == 5 and bad.error.reason.startswith("line 5:")


def test_the_input_size_limit_defaults_to_the_memory_limit(tmp_path):
    result, _, _ = job(tmp_path, "1\n2\n3\n" + " " * 100, max_memory_bytes=64)
    assert not result.ok and result.error.kind == "limit"
    assert "the limit is 64" in result.error.reason and "max_file_bytes" in result.error.reason


@pytest.mark.parametrize(
    ("text", "first"),
    [
        ("1\n3e38\n10\n", "row 1, col 1: inf"),  # beyond float32
        ("1 2 1\n3e38 3e38\n3e38\n-3e38\n", "row 1, col 1: nan"),  # inf - inf
        ("2\n3e38 3e38 0 1\n10 0 0 1\n", "row 1, col 1: inf"),  # 1 of 4: 3e38·10
    ],
)
def test_a_product_that_is_not_finite_is_refused(tmp_path, text, first):
    result, _, out = job(tmp_path, text)
    assert not result.ok and not out.exists() and not record.timing_path(out).exists()
    rec = yaml.safe_load(record.error_path(out).read_text())
    assert rec["status"] == "error" and rec["error"]["kind"] == "overflow"
    assert rec["error"]["reason"].startswith("the product holds values that are not finite, ")
    assert rec["error"]["reason"].endswith(f" of {rec['shape']['m'] * rec['shape']['n']} (first at {first})")


FLT_MAX = float(np.finfo(np.float32).max)


def identity_times(mat: np.ndarray) -> str:
    """An input I·M: its product is M exactly, whatever M holds (no product of two values but by 0 and 1)."""
    m = mat.shape[0]
    eye = " ".join("1" if i == j else "0" for i in range(m) for j in range(m))
    return f"{m} {m} {mat.shape[1]}\n{eye}\n" + " ".join(repr(float(v)) for v in mat.reshape(-1)) + "\n"


def test_every_finite_product_is_written_as_printf_writes_it_and_checks_as_right(tmp_path, c_printf):
    """Fields of up to 39 digits before the point (FLT_MAX), negative too: printf's bytes; mmd check reads them."""
    mat = np.array([[FLT_MAX, -FLT_MAX, 1e13], [123456789012345.0, -1e20, 0.125]], np.float32)
    result, _, out = job(tmp_path, identity_times(mat))
    assert result.ok, result.error
    text = out.read_bytes()
    assert text == b"2 3\n" + b"\n".join(c_printf(row)[:-1] for row in mat) + b"\n"
    assert (
        text.split(b"\n")[1]
        == b"340282346638528859811704183484516925440.00-340282346638528859811704183484516925440.009999999827968.00"
    )
    assert textoutput.parse_output(text).tolist() == [[float(b"%.2f" % float(v)) for v in row] for row in mat]
    assert result.record.output.bytes == len(text)


def wide_input(m: int = 5800, n: int = 5800) -> bytes:
    """An ``m 1 n`` input: a column times a row, so a 64 KB file whose product is m·n fields (200 MB here)."""
    return b"%d 1 %d\n" % (m, n) + b"1.250 " * m + b"1.25 " * n


def test_the_least_output_a_shape_makes_is_what_the_emitter_writes():
    least = textformat.output_bytes_at_least
    for m, n in ((1, 1), (3, 7), (7, 3), (64, 64)):
        assert least(m, n) == len(textformat.emit(np.zeros((m, n), np.float32)))
        assert least(m, n) < len(textformat.emit(np.full((m, n), 1000.0, np.float32)))
    assert least(5800, 5800) == 201_845_805
    assert least(8192, 8192) == 402_661_381  # 6-byte fields; the course's values take 7 (470 MB)


def row_times(m: int, values: list[float]) -> bytes:
    """An ``m 1 n`` input: a column of ones times a row of ``values``, so every row of the product is ``values``."""
    return b"%d 1 %d\n" % (m, len(values)) + b"1 " * m + b" ".join(b"%r" % v for v in values) + b"\n"


#: A 40x40 output of 12-byte fields: 19243 bytes, where 6-byte ones, all its header shows, make 9643.
WIDE_40 = row_times(40, [123456789.0] * 40)


def test_an_output_of_wide_fields_over_max_output_bytes_is_refused_at_its_real_size_before_it_is_written(tmp_path):
    assert textformat.output_bytes_at_least(40, 40) == 9643
    result, _, out = job(tmp_path, WIDE_40, max_output_bytes=15000)
    assert not result.ok and result.error.kind == "limit"
    assert result.error.reason == (
        "line 1: a 40x1x40 product makes an output of 19243 bytes; the limit is 15000 (max_output_bytes)"
    )
    assert result.error.details == {"line": 1, "output_bytes": 19243, "max_output_bytes": 15000}
    assert not out.exists() and not record.timing_path(out).exists() and record.error_path(out).exists()
    assert result.record.timings_ms.kernel is not None  # judged once the product was known
    ok, _, out = job(tmp_path, WIDE_40, name="fits.txt", max_output_bytes=19243)
    assert ok.ok and len(out.read_bytes()) == 19243


def test_one_wide_field_is_judged_by_the_exact_size_not_the_bound(tmp_path):
    """One 43-byte field (-FLT_MAX) among 6-byte ones: the bound (every field 43 bytes) is over the limit, the
    output is not."""
    src = row_times(40, [-FLT_MAX] + [1.0] * 39)
    exact = textformat.output_bytes_at_least(40, 40) + 40 * 37
    assert textformat.check_product(np.array([[-FLT_MAX] + [1.0] * 39] * 40, np.float32)).at_most > 60000
    result, _, out = job(tmp_path, src, max_output_bytes=exact)
    assert result.ok, result.error
    assert len(out.read_bytes()) == exact
    refused, _, _ = job(tmp_path, src, name="one.txt", max_output_bytes=exact - 1)
    assert refused.error.details["output_bytes"] == exact


def test_the_room_and_the_class_ratio_are_judged_at_the_real_size_too(tmp_path):
    """The daemon's room (a submitter's quota, the disk's reserve) and class mode's ratio, the same numbers
    the header was judged by."""
    from mmd.pipeline import Room

    src = tmp_path / "r.txt"
    src.write_bytes(WIDE_40)
    room = Room(15000, "your outputs take 5000 of your 20000 bytes (max_submitter_bytes)", "max_submitter_bytes")
    settings = Settings().with_values({"backend": "cpu", "durable": False}, "test")
    result = run_job(describe(src, tmp_path / "r.out", settings), lambda _s: CpuBackend(), room=room)
    assert not result.ok and result.error.kind == "limit"
    assert result.error.reason == (
        "line 1: a 40x1x40 product makes an output of 19243 bytes; your outputs take 5000 of your 20000 bytes "
        "(max_submitter_bytes)"
    )
    assert result.error.details == {
        "line": 1,
        "output_bytes": 19243,
        "room_bytes": 15000,
        "setting": "max_submitter_bytes",
    }
    assert not (tmp_path / "r.out").exists()
    state = tmp_path / "state"
    floor = {"class_mode": True, "state_dir": str(state), "output_ratio_floor_bytes": 15000}
    result, _, out = job(tmp_path, WIDE_40, name="c.txt", **floor)
    assert not result.ok and result.error.details["output_bytes"] == 19243 and not out.exists()
    assert "in class mode an output may be at most 16 times its input" in result.error.reason


def test_the_device_path_s_output_is_judged_at_its_real_size(tmp_path):
    backend, _ = cuda_backend()
    gpu = MultiplyRequest(kernel="tiled", tile=16, memory="device", text_path="gpu")
    result, _, out = job(tmp_path, WIDE_40, backend=backend, request=gpu, max_output_bytes=15000)
    assert not result.ok and result.error.details == {"line": 1, "output_bytes": 19243, "max_output_bytes": 15000}
    assert not out.exists()
    ok, _, out = job(tmp_path, WIDE_40, name="g.txt", backend=backend, request=gpu, max_output_bytes=19243)
    assert ok.ok and plain(ok)["text"]["path"] == "gpu" and len(out.read_bytes()) == 19243


def test_an_output_over_max_output_bytes_is_refused_from_its_header_before_any_work(tmp_path):
    src = wide_input(20000, 20000)  # 160 KB in, 2.4 GB out
    result, _, out = job(tmp_path, src)
    assert not result.ok and result.error.kind == "limit"
    assert result.error.reason == (
        "line 1: a 20000x1x20000 product makes an output of at least 2400020006 bytes; "
        "the limit is 1073741824 (max_output_bytes)"
    )
    assert result.error.details == {"line": 1, "output_bytes": 2400020006, "max_output_bytes": 1073741824}
    assert not out.exists() and result.record.timings_ms.read is None and result.record.timings_ms.kernel is None
    assert job(tmp_path, wide_input(64, 64), max_output_bytes=None)[0].ok


def test_in_class_mode_a_small_input_cannot_make_a_huge_output(tmp_path):
    """A 64 KB input whose product is 200 MB: at most 16 times its input or 8 MiB in class mode."""
    src = wide_input()
    assert len(src) == 63_812
    state = tmp_path / "state"
    result, _, out = job(tmp_path, src, class_mode=True, state_dir=str(state))
    assert not result.ok and result.error.kind == "limit"
    assert result.error.reason == (
        "line 1: a 5800x1x5800 product makes an output of at least 201845805 bytes, 3163 times its input's "
        "63812; in class mode an output may be at most 16 times its input or 8388608 bytes, whichever is larger "
        "(max_output_ratio, output_ratio_floor_bytes)"
    )
    assert result.error.details == {
        "line": 1,
        "output_bytes": 201845805,
        "input_bytes": 63812,
        "max_output_ratio": 16.0,
        "output_ratio_floor_bytes": 8388608,
    }
    assert not out.exists() and result.record.timings_ms.read is None
    ratio_1000 = wide_input(2000, 2000)  # 22 KB in, 24 MB out
    assert job(tmp_path, ratio_1000, name="class.txt", class_mode=True, state_dir=str(state))[0].error.kind == "limit"
    assert job(tmp_path, ratio_1000, name="personal.txt")[0].ok, "outside class mode only max_output_bytes holds"
    small = wide_input(1000, 1000)  # 11 KB in, 6 MB out: under the 8 MiB floor
    assert job(tmp_path, small, name="small.txt", class_mode=True, state_dir=str(state))[0].ok


@pytest.mark.parametrize("refused", [False, True])
def test_turnaround_counts_from_the_arrival_overall_from_the_start(tmp_path, monkeypatch, refused):
    """Issue 48: a sidecar's turnaround_ms is the job's time from its input's arrival (wall clock) to the record's
    making, beside overall, which keeps counting from the job's start (the claim)."""
    src = tmp_path / "m.txt"
    src.write_text("1\n2\n3\n" if not refused else "1\n2\n")
    now = 1_800_000_000.0
    monkeypatch.setattr("mmd.pipeline.driver.time.time", lambda: now)
    settings = Settings(backend="cpu", kernel="cpu", durable=False)
    j = describe(src, tmp_path / "m.out", settings, started=0.0, arrived=now - 2.5)
    result = run_job(j, lambda s: CpuBackend())
    assert result.ok is not refused
    rec = yaml.safe_load(result.sidecar.read_text())
    assert rec["turnaround_ms"] == 2500.0
    assert rec["timings_ms"]["overall"] > 1e6, "overall still counts from started (perf_counter 0: long ago)"
    unknown = describe(src, tmp_path / "n.out", settings, started=0.0)
    assert "turnaround_ms" not in yaml.safe_load(run_job(unknown, lambda s: CpuBackend()).sidecar.read_text()), (
        "no arrival known (a job an earlier daemon claimed): no field"
    )


def test_a_job_without_a_given_start_arrives_at_its_start(tmp_path):
    """`mmd run`'s job (no start given): it arrives when it starts, so turnaround_ms holds overall and the
    sidecar's making; a daemon's job (its claim's start given) arrives only when told."""
    before = time.time()
    j = describe(tmp_path / "m.txt", tmp_path / "m.out", Settings())
    assert j.arrived is not None and before <= j.arrived <= time.time()
    assert describe(tmp_path / "m.txt", tmp_path / "m.out", Settings(), started=1.0).arrived is None
    assert describe(tmp_path / "m.txt", tmp_path / "m.out", Settings(), started=1.0, arrived=5.0).arrived == 5.0
    _, _, out = job(tmp_path, "1\n2\n3\n")
    rec = yaml.safe_load(record.timing_path(out).read_text())
    assert rec["turnaround_ms"] >= rec["timings_ms"]["overall"]


def test_an_interruption_after_the_output_is_written_and_before_its_sidecar_leaves_no_temporary(tmp_path, monkeypatch):
    # mmd run turns SIGTERM (scancel, Slurm's time limit) into SystemExit wherever it lands: between the
    # output's write and the sidecar's, its temporary must go too (a real Slurm's scancel once left one)
    from mmd.pipeline import driver

    def interrupted() -> str:
        raise SystemExit(143)

    monkeypatch.setattr(driver.record, "now_iso", interrupted)
    with pytest.raises(SystemExit):
        job(tmp_path, "2\n1 2\n3 4\n0.5 0\n0 -0.001\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.txt"]
