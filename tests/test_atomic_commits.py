"""Files written outside the pipeline reach their names as the job's do (mmd.atomic): whole, by one rename of a
temporary named by :func:`mmd.atomic.temporary_name`, with their final mode from the temporary's creation on.

Each test watches the renames onto the file's name: a file written in place (``write_text``) has none, and
one whose mode is set after its rename shows the wider mode at the rename."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

from mmd import atomic
from mmd.bench import rows
from mmd.check import collect, lateness
from mmd.errors import OutputError
from mmd.grade import array
from mmd.grade.grader import GradePlan
from mmd.kernelfile.store import VERSIONS_DIR, KernelStore
from mmd.slurm import ArrayOptions


@dataclass(frozen=True)
class Renamed:
    """One rename onto a name: the temporary's name, the file's permission bits and bytes as they went."""

    temporary: str
    mode: int
    data: bytes | None  # None for a symbolic link


@pytest.fixture
def renames(monkeypatch: pytest.MonkeyPatch) -> dict[Path, list[Renamed]]:
    """Every ``os.replace`` and ``os.rename`` of the test, by the name renamed onto."""
    seen: dict[Path, list[Renamed]] = {}

    def watching(real):
        def rename(src, dst, *args, **kwargs):
            info = os.lstat(src)
            data = None if stat.S_ISLNK(info.st_mode) else Path(src).read_bytes()
            seen.setdefault(Path(dst), []).append(Renamed(Path(src).name, stat.S_IMODE(info.st_mode), data))
            return real(src, dst, *args, **kwargs)

        return rename

    monkeypatch.setattr(os, "replace", watching(os.replace))
    monkeypatch.setattr(os, "rename", watching(os.rename))
    return seen


@pytest.fixture
def open_umask():
    """A umask that takes nothing away, so that a file's mode is what its writer asked for."""
    old = os.umask(0)
    yield
    os.umask(old)


def _one_temporary(renames: dict[Path, list[Renamed]], path: Path) -> Renamed:
    [done] = renames[path]
    assert atomic.temporary_pid(done.temporary) == os.getpid(), done.temporary
    return done


def test_a_collection_s_record_is_the_grader_s_alone_from_its_first_instant(tmp_path, renames, open_umask):
    src = tmp_path / "handin"
    (src / "alice").mkdir(parents=True)
    (src / "alice" / "t.out").write_bytes(b"1 1\n  1.00\n")
    dest = tmp_path / "collected"
    collect.collect(src, dest)
    record = dest / lateness.MANIFEST_NAME
    done = _one_temporary(renames, record)
    assert done.mode == 0o600 and done.data == record.read_bytes()
    assert stat.S_IMODE(record.stat().st_mode) == 0o600


def test_a_kept_kernel_is_private_from_its_first_instant_and_its_link_moves_under_the_one_scheme(
    tmp_path, renames, open_umask
):
    store = KernelStore(tmp_path / "kernels")
    first = store.keep("alice", "k", b"__global__ void k() {}\n", b"mmd: {}\n")
    for path in first.written:
        done = _one_temporary(renames, path)
        assert done.mode == 0o600 and done.data == path.read_bytes()
    link = store.folder("alice") / "k.cu"
    assert _one_temporary(renames, link).data is None
    second = store.keep("alice", "k", b"__global__ void k() { }\n", None)
    assert second.version != first.version and len(renames[link]) == 2
    assert store.pick("alice", "k") == second.path.resolve()
    assert os.readlink(link) == os.path.join(VERSIONS_DIR, second.version, "k.cu")
    assert sorted(os.listdir(store.folder("alice"))) == [VERSIONS_DIR, "k.cu"]  # no temporary left


def test_a_link_replaced_atomically_takes_a_leftover_s_place_and_leaves_nothing_when_it_fails(tmp_path):
    link = tmp_path / "k.cu"
    leftover = tmp_path / atomic.temporary_name(link.name)
    leftover.symlink_to("elsewhere")  # a crashed process with this pid left it
    atomic.link_atomic(link, "v/1/k.cu")
    assert os.readlink(link) == "v/1/k.cu" and sorted(os.listdir(tmp_path)) == ["k.cu"]
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "full").mkdir()  # a folder in the way: rename refuses it
    with pytest.raises(OutputError, match="cannot write"):
        atomic.link_atomic(tmp_path / "taken" / "full", "v/1/k.cu")
    assert os.listdir(tmp_path / "taken") == ["full"]


def test_a_grading_array_s_request_reaches_its_name_whole(tmp_path, renames):
    student = tmp_path / "class" / "alice"
    student.mkdir(parents=True)
    request = array.Request(tmp_path / "class", tmp_path / "tests", False, None, GradePlan())
    folder = tmp_path / "array"
    array.write(request, [("alice", student)], folder, ArrayOptions())
    path = folder / array.REQUEST_NAME
    assert _one_temporary(renames, path).data == path.read_bytes()
    assert array.gather(folder)[0] == request


def test_the_bench_doc_s_tables_are_rewritten_whole(tmp_path, renames):
    doc = tmp_path / "bench.md"
    blocks = [f"{rows.BEGIN.format(name=name)}\nSTALE TABLE\n{rows.END.format(name=name)}\n" for name in rows.TABLES]
    doc.write_text("# bench\n" + "".join(blocks), encoding="utf-8")
    assert rows.main([str(doc)]) == 0
    assert _one_temporary(renames, doc).data == doc.read_bytes()
    assert "STALE TABLE" not in doc.read_text(encoding="utf-8")
