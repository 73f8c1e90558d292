"""Progress on a terminal (mmd/progress.py): the phases of `mmd run` and `mmd gen` drawn by rich at 80
columns on a terminal, and nothing at all where stderr is not one or with --quiet."""

from __future__ import annotations

import io
import re
import sys

from mmd import progress
from mmd.cli import gen_cmd, main, run_cmd


class Terminal(io.StringIO):
    """A stderr that says it is a terminal (what rich draws on it is kept to read back)."""

    def isatty(self) -> bool:
        return True


def shown(text: str) -> list[str]:
    """What a terminal of that width showed, line by line: the control sequences taken out."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    return [line for line in text.replace("\r", "\n").splitlines() if line.strip()]


def drawn(text: str, title: str) -> bool:
    """Whether a bar of ``title`` was drawn: rich's control sequences or its title."""
    return "\x1b[" in text or title in text


def on_terminal(monkeypatch) -> Terminal:
    """From here on in the test, stderr is an 80-column terminal (in the test's body: pytest sets its own
    stderr again as each phase of a test starts); the CLI's logs are left alone."""
    monkeypatch.setattr("mmd.logs.configure", lambda *args, **kwargs: None)
    monkeypatch.setenv("COLUMNS", "80")
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    return term


def test_steps_name_each_phase_within_the_width():
    term = Terminal()
    steps = {"read": "read", "parse": "parse", "multiply": "multiply", "emit": "emit and write"}
    with progress.Steps("mmd run " + "x" * 60 + ".txt", steps, shown=True, stream=term, width=80) as bar:
        assert bar.title == "mmd run xxxxxxxxxxxxxxx…"  # a long file name leaves the phase room
        for name in ("claimed", "read", "parse", "multiply", "emit"):  # "claimed" is not one of its steps
            bar.step(name)
        bar.note("119 MB")
    lines = shown(term.getvalue())
    assert any("read" in line and "0/4" in line for line in lines), lines
    assert any("multiply" in line and "2/4" in line for line in lines)
    assert any("emit and write" in line and "3/4" in line for line in lines)
    assert any(line.endswith("emit and write: 119 MB") for line in lines), lines
    assert all(len(line) <= 80 for line in lines), "wider than the terminal"


def test_steps_not_shown_draw_nothing():
    term = Terminal()
    with progress.Steps("mmd run", {"read": "read"}, shown=False, stream=term) as bar:
        bar.step("read")
        bar.note("1 MB")
    assert term.getvalue() == ""


def test_gen_of_a_large_size_shows_its_progress_on_a_terminal(tmp_path, monkeypatch, capsys):
    terminal = on_terminal(monkeypatch)
    monkeypatch.setattr(gen_cmd, "SHOWN_FROM_VALUES", 2 * 40 * 40)  # a 40×40 pair stands for a large one
    assert main(["gen", "40", "--seed", "1", "-o", str(tmp_path / "a.txt")]) == 0
    lines = shown(terminal.getvalue())
    assert any(line.startswith("mmd gen 40x40x40") and "draw A and B" in line for line in lines), lines
    assert any("write" in line and "1/2" in line for line in lines)
    assert all(len(line) <= 80 for line in lines)
    assert capsys.readouterr().out.startswith(f"{tmp_path / 'a.txt'} (40x40x40, ")  # stdout as before
    # below the size, with --quiet, or where stderr is no terminal: nothing on stderr
    for argv in (["gen", "39"], ["gen", "40", "--quiet"]):
        terminal.seek(0)
        terminal.truncate()
        assert main([*argv, "-o", str(tmp_path / f"{len(argv)}.txt")]) == 0
        assert not drawn(terminal.getvalue(), "mmd gen"), argv


def test_gen_to_a_pipe_draws_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gen_cmd, "SHOWN_FROM_VALUES", 0)
    assert main(["gen", "8", "-o", str(tmp_path / "b.txt")]) == 0
    assert capsys.readouterr().err == ""  # pytest's stderr is not a terminal


def test_run_of_a_large_input_shows_its_phases_on_a_terminal(tmp_path, monkeypatch, capsys):
    terminal = on_terminal(monkeypatch)
    assert main(["gen", "24", "--seed", "2", "-o", str(tmp_path / "m.txt"), "--quiet"]) == 0
    size = (tmp_path / "m.txt").stat().st_size
    monkeypatch.setattr(run_cmd, "SHOWN_FROM_BYTES", size)  # this input stands for a large one
    assert main(["run", str(tmp_path / "m.txt"), "--backend", "cpu"]) == 0
    lines = shown(terminal.getvalue())
    for phase, done in (("read", 0), ("parse", 1), ("multiply", 2), ("emit and write", 3)):
        assert any(line.startswith("mmd run m.txt") and f"{done}/4" in line and phase in line for line in lines), (
            phase,
            lines,
        )
    assert all(len(line) <= 80 for line in lines)
    assert f"{tmp_path / 'm.out'}  (24x24x24, cpu" in capsys.readouterr().out  # stdout as before
    # a smaller input, --quiet, or -v (whose log lines tell the phases): nothing drawn
    monkeypatch.setattr(run_cmd, "SHOWN_FROM_BYTES", size + 1)
    for argv in (["run", "--force"], ["run", "--force", "--quiet"], ["run", "--force", "-v"]):
        if argv[-1] != "--force":
            monkeypatch.setattr(run_cmd, "SHOWN_FROM_BYTES", 0)
        terminal.seek(0)
        terminal.truncate()
        assert main([*argv, str(tmp_path / "m.txt"), "--backend", "cpu"]) == 0
        # no bar (a log line an earlier test pointed structlog here may be, which is not the bar's)
        assert not drawn(terminal.getvalue(), "mmd run"), argv


def test_kernels_build_counts_its_builds_on_a_terminal(tmp_path, monkeypatch, capsys):
    """`mmd kernels --build` compiled for seconds without a word: on a terminal it counts its builds."""
    from mmd.cuda.builds import every_build

    fake = tmp_path / "bin" / "nvcc"  # fails at once: the builds are counted all the same, and quickly
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'nvcc: this is not the real one' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "none"))
    total = len(every_build("sm_80"))
    term = on_terminal(monkeypatch)
    assert main(["kernels", "--build", "--arch", "sm_80", "--cache", str(tmp_path / "cache")]) == 1
    lines = shown(term.getvalue())
    assert any(line.startswith("building for sm_80") and f"{total}/{total}" in line for line in lines), lines
    assert all(len(line) <= 80 for line in lines), "wider than the terminal"
    assert capsys.readouterr().out.endswith(f"{total} builds for sm_80: 0 compiled, 0 already cached, {total} failed; "
                                            f"{tmp_path / 'cache'}\n")  # fmt: skip
    monkeypatch.setattr(sys, "stderr", plain := io.StringIO())  # not a terminal: nothing drawn
    assert main(["kernels", "--build", "--arch", "sm_80", "--cache", str(tmp_path / "cache")]) == 1
    assert plain.getvalue() == ""
