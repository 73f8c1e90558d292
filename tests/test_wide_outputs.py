"""Wide fields through real processes: `mmd run`, `mmd check` and a one-shot daemon write every finite
float32 as printf writes it, read it back, and judge an output's limits at its real size."""

from __future__ import annotations

import os
from functools import partial

import numpy as np
import pytest
import yaml

from mmd import config, daemon, textformat, textoutput

from .conftest import run_mmd

#: Real processes and daemons: left out of `make quick`, run by `make test`.
pytestmark = pytest.mark.integration

FLT_MAX = float(np.finfo(np.float32).max)
#: A product of the widest fields: FLT_MAX's 39 digits before the point, negatives, 10^13 and on.
WIDEST = np.array([[FLT_MAX, -FLT_MAX], [1e13, 123456789012345.0]], np.float32)
#: A 40x40 output of 12-byte fields: 19243 bytes, where its header shows 9643 at the least.
WIDE_40 = b"40 1 40\n" + b"1 " * 40 + b" ".join([b"123456789.0"] * 40) + b"\n"


def identity_times(mat: np.ndarray) -> bytes:
    """An input I·M, whose product is M exactly."""
    m = mat.shape[0]
    eye = " ".join("1" if i == j else "0" for i in range(m) for j in range(m))
    return (f"{m} {m} {mat.shape[1]}\n{eye}\n" + " ".join(repr(float(v)) for v in mat.reshape(-1)) + "\n").encode()


def error_of(folder, stem: str) -> dict:
    return yaml.safe_load((folder / f"{stem}.error.yaml").read_text())["error"]


def test_run_writes_the_widest_fields_as_printf_and_check_passes_them(tmp_path, c_printf):
    src = tmp_path / "w.txt"
    src.write_bytes(identity_times(WIDEST))
    r = run_mmd("run", str(src))
    assert r.returncode == 0, r.stderr
    out = tmp_path / "w.out"
    assert out.read_bytes() == b"2\n" + c_printf(WIDEST[0])[:-1] + b"\n" + c_printf(WIDEST[1])
    assert out.read_bytes().split(b"\n")[1] == (
        b"340282346638528859811704183484516925440.00-340282346638528859811704183484516925440.00"
    )
    r = run_mmd("check", str(out), "--input", str(src))
    assert r.returncode == 0 and "format ok; ok: 2x2 values, 0 outside tolerance" in r.stdout, r.stdout + r.stderr
    r = run_mmd("check", str(out), "--input", str(src), "--quick")
    assert r.returncode == 0 and "format ok; ok (quick)" in r.stdout, r.stdout + r.stderr
    spoilt = tmp_path / "spoilt.out"
    spoilt.write_bytes(out.read_bytes().replace(b"123456788103168.00", b"123456788103169.00"))
    r = run_mmd("check", str(spoilt), "--input", str(src))
    assert r.returncode == 1
    assert r.stdout == (
        f"FORMAT: {spoilt}: line 3, column 17: value '123456788103169.00' is not a float32 as printf writes it\n"
    )


def test_run_refuses_an_output_over_max_output_bytes_at_its_real_size(tmp_path):
    src = tmp_path / "wide.txt"
    src.write_bytes(WIDE_40)
    r = run_mmd("run", str(src), env={"MMD_MAX_OUTPUT_BYTES": "15000"})
    assert r.returncode == 1 and "Traceback" not in r.stderr
    error = error_of(tmp_path, "wide")
    assert error["kind"] == "limit" and error["output_bytes"] == 19243 and error["max_output_bytes"] == 15000
    assert error["reason"] == (
        "line 1: a 40x1x40 product makes an output of 19243 bytes; the limit is 15000 (max_output_bytes)"
    )
    assert not (tmp_path / "wide.out").exists()
    assert run_mmd("run", str(src), env={"MMD_MAX_OUTPUT_BYTES": "19243"}).returncode == 0
    assert len((tmp_path / "wide.out").read_bytes()) == 19243


def test_a_one_shot_daemon_writes_wide_fields_and_judges_the_real_size(tmp_path):
    inbox, outbox = tmp_path / "in", tmp_path / "out"
    inbox.mkdir()
    outbox.mkdir()
    (inbox / "widest.txt").write_bytes(identity_times(WIDEST))
    (inbox / "wide.txt").write_bytes(WIDE_40)
    (inbox / "inf.txt").write_bytes(b"1\n3e38\n10\n")
    env = {"MMD_MAX_OUTPUT_BYTES": "15000", "MMD_QUIET_SECONDS": "0.05"}
    r = run_mmd("serve", "--once", "--inbox", str(inbox), "--outbox", str(outbox), cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    widest = (outbox / "widest.out").read_bytes()
    assert widest == textformat.format_reference(WIDEST)
    assert textoutput.parse_output(widest).tolist() == WIDEST.astype(np.float64).tolist()
    error = error_of(outbox, "wide")
    assert error["kind"] == "limit" and error["output_bytes"] == 19243 and not (outbox / "wide.out").exists()
    assert error_of(outbox, "inf")["kind"] == "overflow"


def disk_free(free: int) -> None:
    """In a daemon's worker: the outbox's disk has ``free`` bytes free (as statvfs tells it)."""
    real = os.statvfs

    def statvfs(path: str | os.PathLike[str]) -> os.statvfs_result:
        st = tuple(real(path))
        return os.statvfs_result((*st[:4], free // st[1], *st[5:]))

    os.statvfs = statvfs


def test_the_disk_reserve_is_kept_at_the_output_s_real_size(tmp_path):
    """min_free_bytes: the room a worker found before the job (16384 bytes here) judges the real output too."""
    inbox, outbox = tmp_path / "in", tmp_path / "out"
    inbox.mkdir()
    outbox.mkdir()
    (inbox / "wide.txt").write_bytes(WIDE_40)
    (inbox / "widest.txt").write_bytes(identity_times(WIDEST))
    settings = config.Settings(inbox=inbox, outbox=outbox, backend="cpu", min_free_bytes=1 << 20, quiet_seconds=0.05)
    assert daemon.Daemon(settings, worker_setup=partial(disk_free, (1 << 20) + 16384)).serve(once=True) == 0
    error = error_of(outbox, "wide")
    assert error["kind"] == "limit" and error["setting"] == "min_free_bytes" and error["output_bytes"] == 19243
    assert error["room_bytes"] == 16384 and "for everyone" in error["reason"]
    assert not (outbox / "wide.out").exists()
    assert (outbox / "widest.out").read_bytes() == textformat.format_reference(WIDEST)
