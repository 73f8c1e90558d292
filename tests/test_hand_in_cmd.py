"""``mmd hand-in NAME.cu``: checked here, then dropped in the inbox by the upload recipe (docs/operations.md)."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

from mmd import fileops
from mmd.cli import main

from .conftest import ROOT, run_mmd
from .test_handins import P1

EXAMPLES = ROOT / "docs" / "examples"


@pytest.fixture
def inbox(tmp_path: Path) -> Path:
    (tmp_path / "inbox").mkdir()
    (tmp_path / "p1.cu").write_text(P1)
    return tmp_path / "inbox"


@pytest.mark.integration  # runs mmd as a real process
def test_a_hand_in_leaves_its_file_alone_at_its_name_readable_by_the_service_only(inbox):
    r = run_mmd("hand-in", "p1.cu", "--inbox", str(inbox), cwd=inbox.parent)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert sorted(p.name for p in inbox.iterdir()) == ["p1.cu"]  # no .part left
    info = (inbox / "p1.cu").stat()
    assert stat.S_IMODE(info.st_mode) == 0o640 and stat.S_ISREG(info.st_mode) and info.st_nlink == 1
    assert (inbox / "p1.cu").read_text() == P1
    assert r.stdout.strip().endswith("p1.handin.yaml"), r.stdout


def test_a_folder_at_the_name_is_refused_and_receives_nothing(inbox, capfd):
    (inbox / "p1.cu").mkdir()  # a classmate's squat
    assert main(["hand-in", str(inbox.parent / "p1.cu"), "--inbox", str(inbox)]) == 1
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "p1.cu: that name is held in the inbox" in err, err
    assert sorted(p.name for p in inbox.iterdir()) == ["p1.cu"] and not any((inbox / "p1.cu").iterdir())


def test_a_forbidden_include_is_refused_here_with_its_line_and_nothing_is_dropped(inbox, capfd):
    (inbox.parent / "p1.cu").write_text('// a kernel\n#include "/etc/shadow"\n' + P1)
    assert main(["hand-in", str(inbox.parent / "p1.cu"), "--inbox", str(inbox)]) == 1
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mmd hand-in: p1.cu:2: "), err
    assert list(inbox.iterdir()) == []


def test_a_declaration_lands_first_under_its_kernel_s_stem(inbox, capfd, monkeypatch):
    shutil.copy(EXAMPLES / "notebook.cu", inbox.parent / "p2.cu")
    shutil.copy(EXAMPLES / "notebook.kernel.yaml", inbox.parent / "mine.yaml")
    named: list[str] = []
    link = fileops.FileOps.link

    def recorded(self: fileops.FileOps, src: Path, dst: Path) -> None:
        named.append(dst.name)
        link(self, src, dst)

    monkeypatch.setattr(fileops.FileOps, "link", recorded)
    argv = ["hand-in", str(inbox.parent / "p2.cu"), "--declaration", str(inbox.parent / "mine.yaml")]
    assert main([*argv, "--inbox", str(inbox)]) == 0, capfd.readouterr().err
    assert named == ["p2.kernel.yaml", "p2.cu"]
    assert sorted(p.name for p in inbox.iterdir()) == ["p2.cu", "p2.kernel.yaml"]
    assert (inbox / "p2.kernel.yaml").read_bytes() == (EXAMPLES / "notebook.kernel.yaml").read_bytes()
    assert stat.S_IMODE((inbox / "p2.kernel.yaml").stat().st_mode) == 0o640


def test_without_its_declaration_a_declared_kernel_is_refused_here(inbox, capfd):
    shutil.copy(EXAMPLES / "notebook.cu", inbox.parent / "p2.cu")
    assert main(["hand-in", str(inbox.parent / "p2.cu"), "--inbox", str(inbox)]) == 1
    assert capfd.readouterr().err.startswith("mmd hand-in: p2.cu:")
    assert list(inbox.iterdir()) == []


def test_a_declaration_whose_kernel_cannot_land_is_taken_back(inbox, capfd):
    shutil.copy(EXAMPLES / "notebook.cu", inbox.parent / "p2.cu")
    shutil.copy(EXAMPLES / "notebook.kernel.yaml", inbox.parent / "p2.kernel.yaml")  # beside it: taken
    (inbox / "p2.cu").mkdir()
    assert main(["hand-in", str(inbox.parent / "p2.cu"), "--inbox", str(inbox)]) == 1
    assert "p2.cu: that name is held" in capfd.readouterr().err
    assert sorted(p.name for p in inbox.iterdir()) == ["p2.cu"]  # no declaration waits for another's p2.cu
