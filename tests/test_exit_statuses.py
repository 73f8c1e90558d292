"""Every sub-command's error paths end in the README's exit-status table: one line on stderr, never a traceback.

The walk runs :func:`mmd.cli.main` in this process on real files (a real process each would cost the quick
tier half a second a case); tests/test_cli.py runs the few that need a process of their own.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from mmd.bench import COLUMNS
from mmd.cli import COMMANDS, main
from mmd.errors import ExitStatus

from .conftest import ROOT

USAGE, FAILED, CONFIG, NOT_SERVING = ExitStatus.USAGE, ExitStatus.FAILED, ExitStatus.CONFIG, ExitStatus.NOT_SERVING


@pytest.fixture
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with a valid input ``m.txt``, a job folder, a plain file and a FIFO."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MMD_BACKEND", "cpu")
    monkeypatch.setenv("MMD_LOG_FORMAT", "json")
    (tmp_path / "m.txt").write_text("2\n1 2\n3 4\n1 0\n0 1\n")
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "j.txt").write_text("1\n2\n3\n")
    (tmp_path / "plain").write_text("not a folder\n")
    (tmp_path / "bad.cu").write_text("not a kernel\n")
    (tmp_path / "notresults.csv").write_text("this,is\nnot,mmd\n")
    (tmp_path / "results.csv").write_text(",".join(COLUMNS) + "\n")  # mmd bench's columns, no rows
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "socketless.yaml").write_text(f"control_socket: {tmp_path / 'nobody.sock'}\n")
    return tmp_path


#: (what, argv, status, a piece of the message). ``{fifo}``: the FIFO; ``/dev/null``: a character device.
#: `mmd grade --service` of a class (the options it needs, as an error path gives them).
GRADE_SERVICE = ["grade", "jobs", "--tests", "jobs", "--service"]

CASES: list[tuple[str, list[str], int, str]] = [
    # -- usage: the command line is wrong or incomplete --
    ("no command", [], USAGE, "usage: mmd"),
    ("unknown command", ["nope"], USAGE, "invalid choice"),
    ("unknown option", ["--foo"], USAGE, "mmd: unrecognized arguments: --foo"),
    ("help: unknown command", ["help", "nope"], USAGE, "invalid choice"),
    ("run: no input", ["run"], USAGE, "required"),
    ("run: bad tile", ["run", "m.txt", "--tile", "x"], USAGE, "invalid int"),
    ("run: unknown kernel", ["run", "m.txt", "--kernel", "nope"], USAGE, "kernel"),
    ("gen: size 0", ["gen", "0", "-o", "g.txt"], USAGE, "positive"),
    ("gen: no size", ["gen", "-o", "g.txt"], USAGE, "give either N or --shape"),
    ("gen: empty range", ["gen", "3", "--range", "5", "1", "-o", "g.txt"], USAGE, "range"),
    ("check: no output", ["check"], USAGE, "required"),
    ("collect: no folders", ["collect"], USAGE, "required"),
    ("kernels: bad flag", ["kernels", "--frob"], USAGE, "unrecognized"),
    ("hand-in: no file", ["hand-in"], USAGE, "required"),
    ("serve: bad observer", ["serve", "--observer", "x"], USAGE, "invalid choice"),
    ("status: bad flag", ["status", "--frob"], USAGE, "unrecognized"),
    ("cancel: no job", ["cancel"], USAGE, "required"),
    ("rm: no name", ["rm"], USAGE, "required"),
    ("submit: no folder", ["submit"], USAGE, "required"),
    ("submit: bad time", ["submit", "--slurm", "jobs", "--time", "x"], USAGE, "--time"),
    ("submit: bad parallel", ["submit", "--slurm", "jobs", "--max-parallel", "0"], USAGE, "--max-parallel"),
    ("bench: size 0", ["bench", "--backend", "cpu", "--sizes", "0"], USAGE, "positive"),
    ("report: no results", ["report"], USAGE, "required"),
    ("config: bad flag", ["config", "--frob"], USAGE, "unrecognized"),
    ("completion: unknown shell", ["completion", "fish"], USAGE, "invalid choice"),
    # -- a path named on the command line that cannot be used as given --
    ("run: missing input", ["run", "nope.txt"], USAGE, "no such file"),
    ("run: a folder", ["run", "jobs"], USAGE, "is a folder"),
    ("run: a device", ["run", "/dev/null"], USAGE, "not a regular file"),
    ("run: a FIFO", ["run", "{fifo}"], USAGE, "not a regular file"),
    ("run: output folder missing", ["run", "m.txt", "-o", "nodir/m.out"], USAGE, "does not exist"),
    ("run: output folder a file", ["run", "m.txt", "-o", "plain/m.out"], USAGE, "not a folder"),
    ("gen: output folder missing", ["gen", "3", "-o", "nodir/g.txt"], USAGE, "does not exist"),
    ("gen: output a folder", ["gen", "3", "-o", "jobs"], USAGE, "is a folder"),
    ("check: missing output", ["check", "nope.out", "--input", "m.txt"], USAGE, "nope.out"),
    ("collect: missing hand-in", ["collect", "nope", "graded"], USAGE, "nope: No such file"),
    ("collect: hand-in a file", ["collect", "plain", "graded"], USAGE, "not a folder"),
    ("collect: copy exists", ["collect", "jobs", "plain"], USAGE, "exists: collect into a new folder"),
    ("grade: no kernels", ["grade"], USAGE, "give KERNELS and --tests TESTS"),
    ("grade: kernels a file", ["grade", "plain", "--tests", "jobs"], USAGE, "not a folder of students' folders"),
    ("grade: tests missing", ["grade", "jobs", "--tests", "nope"], USAGE, "/nope: not a folder"),
    ("grade: bad deadline", ["grade", "jobs", "--tests", "jobs", "--deadline", "x"], USAGE, "not an ISO 8601 time"),
    ("grade: not a gather folder", ["grade", "--gather", "jobs"], USAGE, "not an mmd grade --slurm folder"),
    ("grade --service: with --slurm", [*GRADE_SERVICE, "--slurm", "s"], USAGE, "not with --slurm"),
    ("hand-in: missing file", ["hand-in", "nope.cu", "--inbox", "jobs"], USAGE, "nope.cu: no such file"),
    ("hand-in: not NAME.cu", ["hand-in", "m.txt", "--inbox", "jobs"], USAGE, "a hand-in is NAME.cu"),
    ("hand-in: mmd's own name", ["hand-in", "naive.cu", "--inbox", "jobs"], USAGE, "one of mmd's own kernels"),
    ("hand-in: inbox missing", ["hand-in", "bad.cu"], USAGE, "the inbox inbox: no such folder"),
    ("status: inbox a file", ["status", "--inbox", "plain"], USAGE, "not a folder"),
    ("status: inbox missing", ["status", "--inbox", "nope"], USAGE, "no such folder"),
    ("submit: folder missing", ["submit", "--slurm", "nope/"], USAGE, "no such folder"),
    ("submit: folder a file", ["submit", "--slurm", "plain"], USAGE, "not a folder"),
    ("report: missing", ["report", "nope"], USAGE, "no such file or folder"),
    ("report: not results", ["report", "m.txt"], USAGE, "results.csv"),
    ("report: not mmd's csv", ["report", "notresults.csv"], USAGE, "notresults.csv"),
    ("report: folder of nothing", ["report", "jobs"], USAGE, "holds no"),
    ("bench --compare: missing", ["bench", "--compare", "nope", "nope2"], USAGE, "no such file or folder"),
    # -- configuration --
    ("run: missing config", ["run", "m.txt", "--config", "nope.yaml"], CONFIG, "cannot read config"),
    ("status: config a folder", ["status", "--config", "jobs"], CONFIG, "cannot read config"),
    ("kernels: missing config", ["kernels", "--config", "nope.yaml"], CONFIG, "cannot read config"),
    ("serve: inbox missing", ["serve", "--inbox", "nope", "--once"], CONFIG, "does not exist"),
    ("bench: missing config", ["bench", "--config", "nope.yaml"], CONFIG, "cannot read config"),
    ("hand-in: missing config", ["hand-in", "bad.cu", "--config", "nope.yaml"], CONFIG, "cannot read config"),
    ("config: missing config", ["config", "--config", "nope.yaml"], CONFIG, "cannot read config"),
    ("cancel: no control socket", ["cancel", "m.txt"], CONFIG, "no control_socket is set"),
    ("rm: no control socket", ["rm", "m.out"], CONFIG, "no control_socket is set"),
    ("grade --service: no control socket", GRADE_SERVICE, CONFIG, "no control_socket is set"),
    # -- no daemon answers --
    ("cancel: nobody answers", ["cancel", "m.txt", "--config", "{socketless}"], NOT_SERVING, "no daemon answers"),
    ("rm: nobody answers", ["rm", "m.out", "--config", "{socketless}"], NOT_SERVING, "no daemon answers"),
    ("grade --service: nobody answers", [*GRADE_SERVICE, "--config", "{socketless}"], NOT_SERVING, "no daemon answers"),
    # -- the command ran and failed --
    ("gen: beyond memory", ["gen", "100000", "-o", "huge.txt"], FAILED, "memory"),
    ("submit: outbox under a file", ["submit", "--slurm", "jobs", "--outbox", "plain/out"], FAILED, "cannot write"),
    ("bench: out under a file", ["bench", "--backend", "cpu", "--sizes", "8", "--out", "plain/b"], FAILED, "cannot"),
    ("report: out under a file", ["report", "{results}", "--out", "plain/r"], FAILED, "cannot make"),
    ("hand-in: not a kernel", ["hand-in", "bad.cu", "--inbox", "jobs"], FAILED, "bad.cu: no __global__ function"),
    ("grade: no GPU", ["grade", "jobs", "--tests", "jobs"], FAILED, "mmd grade: "),
]


@pytest.mark.parametrize(("argv", "status", "needle"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_error_path_ends_in_its_status_and_one_line(place, capfd, argv, status, needle):
    argv = [
        a.replace("{fifo}", str(place / "fifo"))
        .replace("{results}", "results.csv")
        .replace("{socketless}", "socketless.yaml")
        for a in argv
    ]
    before = sorted(p.name for p in place.rglob("*"))
    try:
        got = main(argv)
    except SystemExit as exc:  # argparse's own refusals
        got = exc.code if isinstance(exc.code, int) else 1
    err = capfd.readouterr().err
    assert got == status, err
    assert "Traceback" not in err and needle in err, err
    if argv:  # `mmd` alone shows its whole help
        assert len(err.splitlines()) == 1, err
    if status != ExitStatus.OK:
        assert sorted(p.name for p in place.rglob("*")) == before, "a refused command wrote nothing"
    assert not Path("/dev/null.error.yaml").exists(), "nothing is ever written beside a device"


def test_a_refused_job_exits_1_with_its_error_sidecar(place, capfd):
    (place / "bad.txt").write_text("2\n1 2 3\n")
    assert main(["run", "bad.txt"]) == FAILED
    assert "line" in capfd.readouterr().err and (place / "bad.error.yaml").is_file()


def test_every_sub_command_is_walked():
    walked = {c[1][0] for c in CASES if c[1] and c[1][0] in COMMANDS}
    assert walked == set(COMMANDS)


def test_the_readme_has_one_exit_status_table_naming_every_status():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Exit statuses", 1)[1].split("\n## ", 1)[0]
    rows = {int(m) for m in re.findall(r"^\| \*\*(\d+)\*\* \|", table, re.M)}
    assert rows == {int(s) for s in ExitStatus}
