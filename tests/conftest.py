"""Shared fixtures: a clean environment for settings, and helpers to run the CLI."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from mmd import accel, config, cpus

ROOT = Path(__file__).resolve().parent.parent

T = TypeVar("T")


@pytest.fixture(scope="session")
def sidecar_validator():
    """A JSON Schema validator for mmd's sidecars (docs/sidecar.schema.json, generated from mmd.record's records)."""
    import jsonschema

    from mmd.record import published

    schema = published.json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(autouse=True)
def _sidecars_follow_the_schema(request: pytest.FixtureRequest, sidecar_validator):
    """After each test that has a tmp_path: every sidecar written under it follows the published schema."""
    folder = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if folder is None:
        return
    import yaml

    for path in list(folder.rglob("*.timing.yaml")) + list(folder.rglob("*.error.yaml")):
        if path.is_symlink() or not path.is_file() or path.name.startswith("."):
            continue
        try:
            data = yaml.safe_load(path.read_bytes())
        except yaml.YAMLError:
            continue  # a test's own deliberately broken file
        if isinstance(data, dict) and data.get("mmd_version"):
            errors = sorted(sidecar_validator.iter_errors(data), key=str)
            assert not errors, f"{path.name} does not follow docs/sidecar.schema.json: {errors[0].message}"


#: An XDG_CONFIG_HOME with no mmd config in it: tests never read the caller's ~/.config/mmd/mmd.yaml.
#: Values that stress ``%6.2f``: zeros of both signs, ties and near-ties at the hundredths, the sub-cent
#: values that round to 0.00 or -0.00, the widths where a field grows, float32's extremes and subnormals.
#: The one list the text format's tests (the C emitter, the Python reference) draw from.
SPECIAL_VALUES = [
    0.0,
    0.125,
    0.375,
    2.675,
    -2.675,
    0.005,
    -0.005,
    0.015,
    -0.001,
    -0.004999,
    0.004999,
    1000.0,
    -100.0,
    -99.995,
    999.995,
    123456.78,
    -123456.78,
    1e20,
    -1e20,
    3e38,
    -3e38,
    1.5,
    99.99,
    -9999.99,
    10000000.0,
    1e-30,
    12345678.0,
    25000000000000.0,
    1000000000000000.0,
    999000000000000.0,
    0.5,
    -0.5,
    0.045,
    0.055,
    -1e-30,
    1.4e-45,
    -1.4e-45,
    3.4028235e38,
    -3.4028235e38,
]

NO_USER_CONFIG = str(ROOT / "tests" / "no-such-config-home")


@pytest.fixture(autouse=True)
def _no_mmd_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests see no MMD_* variables from the caller's shell, nor the caller's or the machine's config file."""
    for key in list(os.environ):
        if key.startswith("MMD_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("XDG_CONFIG_HOME", NO_USER_CONFIG)
    monkeypatch.setattr(config, "SYSTEM_CONFIG", Path(NO_USER_CONFIG) / "etc-mmd.yaml")


def mmd_env(base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The caller's environment without its MMD_* variables, mmd importable, then ``base`` and ``extra``.

    A process of a test reads no config file of the machine's or the caller's, on any machine: ``MMD_CONFIG``
    names an empty one (a test that means to read files gives its own), and the user's config home is empty.
    """
    full = {k: v for k, v in os.environ.items() if not k.startswith("MMD_")}
    full["XDG_CONFIG_HOME"] = NO_USER_CONFIG
    full["MMD_CONFIG"] = os.devnull
    full["PYTHONPATH"] = str(ROOT) + os.pathsep + full.get("PYTHONPATH", "")
    full.update(base or {})
    full.update(extra)
    return full


def wait_for(pred, timeout: float = 30.0, what: str = "condition"):
    """Poll ``pred`` until it is true and return its value; fail the test after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def alongside(main: Callable[[], T], drive: Callable[[], None], then: Callable[[], None], timeout: float = 30) -> T:
    """Run ``main()`` in this thread while ``drive()`` runs in another, which calls ``then()`` when it ends,
    failed or not (stopping or releasing what ``main`` waits on); return what ``main`` returned and re-raise
    what ``drive`` raised (pytest.fail raises a BaseException)."""
    failures: list[BaseException] = []

    def driver() -> None:
        try:
            drive()
        except BaseException as exc:
            failures.append(exc)
        finally:
            then()

    thread = threading.Thread(target=driver, daemon=True)
    thread.start()
    result = main()
    thread.join(timeout)
    if failures:
        raise failures[0]
    return result


def run_mmd(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120):
    """Run ``python -m mmd ARGS`` as a real process and return the CompletedProcess."""
    full_env = mmd_env({"MMD_LOG_FORMAT": "json", "MMD_BACKEND": "cpu"}, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "mmd", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


#: Prints ``%6.2f`` of each float32 given as hex bits: glibc's printf, the format's definition.
_C_PRINTF = r"""
#include <stdio.h>
#include <string.h>
int main(void) {
    unsigned int u;
    while (scanf("%x", &u) == 1) {
        float f; memcpy(&f, &u, 4);
        printf("%6.2f", (double)f);
    }
    printf("\n");
    return 0;
}
"""


@pytest.fixture(scope="session")
def c_printf(tmp_path_factory):
    """A function: float32 values → the bytes C's ``printf("%6.2f")`` prints for them (then a newline)."""
    import numpy as np

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    folder = tmp_path_factory.mktemp("cprintf")
    (folder / "p.c").write_text(_C_PRINTF)
    exe = folder / "p"
    subprocess.run([cc, "-O1", "-o", str(exe), str(folder / "p.c")], check=True)

    def run(vals) -> bytes:
        bits = np.ascontiguousarray(vals, dtype=np.float32).view(np.uint32).ravel()
        hexes = " ".join("%08x" % int(u) for u in bits)
        return subprocess.run([str(exe)], input=hexes.encode(), capture_output=True, check=True).stdout

    return run


class LoggedProcess:
    """A real process whose stdout and stderr go to a log file; ``stop`` signals, then kills if it must."""

    def __init__(self, argv: list[str], cwd: Path, log_path: Path, env: dict[str, str]) -> None:
        self.log_path = log_path
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def logs(self) -> str:
        return self.log_path.read_text()

    def events(self) -> list[dict]:
        """The JSON log lines so far (a line still being written is skipped)."""
        import contextlib
        import json

        out = []
        for line in self.logs().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.kill()

    def kill(self) -> None:
        """SIGKILL it if it still runs, and close its log (what a fixture's teardown does)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if not self.log.closed:
            self.log.close()


def run_file(src: Path, out: Path, backend, request=None, **settings):
    """One job through the real pipeline on ``backend``, as every driver runs one (JobResult).

    ``request`` (a MultiplyRequest) and ``settings`` give the job's settings;
    commits are not fsynced unless ``durable=True`` is given.
    """
    from mmd.config import Settings
    from mmd.job import describe
    from mmd.pipeline import run_job

    values: dict = {"backend": backend.name, "durable": False}
    if request is not None:
        values.update(kernel=request.kernel, tile=request.tile, memory=request.memory, text_path=request.text_path)
    values.update(settings)
    job = describe(Path(src), Path(out), Settings().with_values(values, "test"))
    return run_job(job, lambda _settings: backend)


def plain(result) -> dict:
    """A job result's record as its sidecar's plain data."""
    from mmd.record import as_dict

    return as_dict(result.record)


def blocks_of(monkeypatch: pytest.MonkeyPatch, elems: int) -> None:
    """The checks' blocks of rows at most ``elems`` elements: a thread's (mmd.cpus.BLOCK_ELEMS) and each of
    mmd.check.product's workers' (mmd.cpus.WORKER_BLOCK_ELEMS)."""
    monkeypatch.setattr(cpus, "BLOCK_ELEMS", elems)
    monkeypatch.setattr(cpus, "WORKER_BLOCK_ELEMS", elems)


@pytest.fixture(scope="module", params=["c", "numpy"])
def check_passes(request):
    """A module's tests through mmd._fastcheck's passes, then through the numpy ones (module-scoped:
    hypothesis refuses function-scoped fixtures); ``pytestmark = pytest.mark.usefixtures("check_passes")``."""
    if request.param == "c" and accel.fastcheck is None:
        pytest.skip("mmd._fastcheck is not built")
    old = accel.ON
    accel.ON = request.param == "c"
    yield request.param
    accel.ON = old
