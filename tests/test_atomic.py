import contextlib
import errno
import hashlib
import os

import pytest

from mmd.atomic import Spares, Staged, write_atomic
from mmd.errors import OutputError
from mmd.fileops import FileOps


def test_writes_whole_file_with_hash(tmp_path):
    target = tmp_path / "out.txt"
    w = write_atomic(target, [b"abc", b"", b"def"])
    assert target.read_bytes() == b"abcdef"
    assert (w.bytes, w.sha256) == (6, hashlib.sha256(b"abcdef").hexdigest())
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_replace_false_never_overwrites(tmp_path):
    target = tmp_path / "out.txt"
    target.write_bytes(b"old")
    with pytest.raises(FileExistsError):
        write_atomic(target, [b"new"], replace=False)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_failure_mid_write_leaves_nothing(tmp_path):
    target = tmp_path / "out.txt"

    def chunks():
        yield b"partial"
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputError, match="No space left on device"):
        write_atomic(target, chunks())
    assert list(tmp_path.iterdir()) == []


def test_unwritable_folder_is_output_error(tmp_path):
    if os.geteuid() == 0:
        target = tmp_path / "missing-dir" / "out.txt"  # root ignores modes: use a missing folder
    else:
        folder = tmp_path / "ro"
        folder.mkdir(mode=0o500)
        target = folder / "out.txt"
    with pytest.raises(OutputError, match="cannot write"):
        write_atomic(target, [b"x"])


def test_large_chunks_hash_the_same_as_inline(tmp_path):
    import numpy as np

    chunks = [np.random.default_rng(i).bytes(size) for i, size in enumerate((3 << 20, 10, 2 << 20, 5 << 20))]
    w = write_atomic(tmp_path / "big.bin", chunks, durable=False)
    joined = b"".join(chunks)
    assert w.sha256 == hashlib.sha256(joined).hexdigest() and w.bytes == len(joined)
    assert (tmp_path / "big.bin").read_bytes() == joined


def test_a_link_planted_at_the_temporary_name_is_not_written_through(tmp_path):
    target = tmp_path / "out.txt"
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / f".out.txt.{os.getpid()}.tmp").symlink_to(victim)
    write_atomic(target, [b"result"])
    assert victim.read_bytes() == b"precious"
    assert target.read_bytes() == b"result" and not target.is_symlink()


# -- spares: unnamed files made ahead, which a commit writes and names instead of making an inode --

KINDS = (".out", ".timing.yaml")


def _unnamed_in(folder) -> list[int]:
    """The inodes of the unnamed files this process holds open in ``folder`` (O_TMPFILE: ``folder/#<inode>``)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(f"{folder}/#") and target.endswith(" (deleted)"):
                found.append(int(target[len(f"{folder}/#") : -len(" (deleted)")]))
    return sorted(found)


def test_a_commit_takes_the_spares_made_ahead_and_no_reader_sees_them(tmp_path):
    spares = Spares(KINDS)
    spares.fill(tmp_path)
    made = _unnamed_in(tmp_path)
    assert len(made) == 2 and os.listdir(tmp_path) == [], "a spare has no name"
    staged = Staged(spares=spares)
    staged.write(tmp_path / "m.out", [b"out"])
    staged.write(tmp_path / "m.timing.yaml", [b"side"])
    staged.write(tmp_path / "m.error.yaml", [b"no spare of its kind"])
    assert sorted(os.listdir(tmp_path)) == [f".m.error.yaml.{os.getpid()}.tmp"], "the spares are named at publish"
    staged.publish()
    assert (tmp_path / "m.out").read_bytes() == b"out" and (tmp_path / "m.timing.yaml").read_bytes() == b"side"
    assert sorted([(tmp_path / "m.out").stat().st_ino, (tmp_path / "m.timing.yaml").stat().st_ino]) == made
    assert sorted(os.listdir(tmp_path)) == ["m.error.yaml", "m.out", "m.timing.yaml"]
    assert _unnamed_in(tmp_path) == [], "named and closed"
    staged = Staged(spares=spares)  # none left: the temporary is made, as without spares
    staged.write(tmp_path / "n.out", [b"n"])
    staged.publish()
    assert (tmp_path / "n.out").read_bytes() == b"n"


def test_a_spare_is_named_only_once_its_commit_has_synced_it(tmp_path):
    """(On ext4 without a journal a file's first fsync after a new name writes its folder too.)"""
    steps: list[str] = []

    class Recording(FileOps):
        def fsync(self, fd: int) -> None:
            steps.append("fsync")
            super().fsync(fd)

        def link_unnamed(self, fd: int, dst) -> None:
            steps.append(f"name {dst.name}")
            super().link_unnamed(fd, dst)

        def replace(self, src, dst) -> None:
            steps.append(f"rename {dst.name}")
            super().replace(src, dst)

    spares = Spares(KINDS, ops=Recording())
    spares.fill(tmp_path)
    assert steps == [], "made, not synced: it has no name to sync"
    staged = Staged(spares=spares, ops=spares.ops)
    staged.write(tmp_path / "m.out", [b"out"])
    staged.write(tmp_path / "m.timing.yaml", [b"side"])
    staged.publish()
    tmp_out, tmp_yaml = (f".{n}.{os.getpid()}.tmp" for n in ("m.out", "m.timing.yaml"))
    assert steps == ["fsync", "fsync", f"name {tmp_out}", "rename m.out", f"name {tmp_yaml}", "rename m.timing.yaml"]


def test_a_watcher_of_the_folder_sees_a_file_made_from_a_spare_arrive_by_a_rename(tmp_path):
    """As every commit's file: tools (and the benchmarks) wait for ``IN_MOVED_TO`` of a sidecar."""
    from inotify_simple import INotify, flags

    spares = Spares(KINDS)
    spares.fill(tmp_path)
    with INotify() as watch:
        watch.add_watch(tmp_path, flags.MOVED_TO)
        staged = Staged(spares=spares)
        staged.write(tmp_path / "m.out", [b"out"])
        staged.publish()
        assert [e.name for e in watch.read(timeout=1000)] == ["m.out"]


def test_a_name_taken_meanwhile_is_replaced_or_refused_as_a_temporary_would_be(tmp_path):
    spares = Spares(KINDS[:1])
    spares.fill(tmp_path)
    (tmp_path / "m.out").write_bytes(b"old")
    (tmp_path / "n.out").write_bytes(b"old")
    staged = Staged(spares=spares)
    staged.write(tmp_path / "m.out", [b"new"])
    staged.publish()
    assert (tmp_path / "m.out").read_bytes() == b"new"
    spares.fill(tmp_path)
    staged = Staged(spares=spares)
    staged.write(tmp_path / "n.out", [b"new"], replace=False)
    with pytest.raises(FileExistsError):
        staged.publish()
    assert (tmp_path / "n.out").read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["m.out", "n.out"] and _unnamed_in(tmp_path) == []


@pytest.mark.parametrize("durable", [True, False])
def test_a_group_commit_names_its_spares_after_its_one_sync(tmp_path, durable):
    spares = Spares(KINDS[:1])
    spares.fill(tmp_path)
    staged = Staged(spares=spares, group=True, durable=durable)
    for stem in "abc":
        staged.write(tmp_path / f"{stem}.out", [stem.encode()])
    staged.publish()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == {"a.out": b"a", "b.out": b"b", "c.out": b"c"}
    assert _unnamed_in(tmp_path) == []


@pytest.mark.parametrize("fails", ["fsync", "link_unnamed"])
def test_a_spare_whose_commit_fails_leaves_nothing_named_or_open(tmp_path, fails):
    class Failing(FileOps):
        def fsync(self, fd: int) -> None:
            if fails == "fsync":
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            super().fsync(fd)

        def link_unnamed(self, fd: int, dst) -> None:
            if fails == "link_unnamed":
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dst))
            super().link_unnamed(fd, dst)

    spares = Spares(KINDS[:1], ops=Failing())
    spares.fill(tmp_path)
    staged = Staged(spares=spares, ops=spares.ops)
    staged.write(tmp_path / "m.out", [b"out"])
    with pytest.raises(OutputError, match=os.strerror(errno.EIO if fails == "fsync" else errno.EROFS)):
        staged.publish()
    assert os.listdir(tmp_path) == [] and _unnamed_in(tmp_path) == []


def test_a_spare_is_taken_only_in_its_own_folder_and_filling_elsewhere_moves_them(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    spares = Spares(KINDS)
    spares.fill(a)
    write_atomic(b / "x.out", [b"x"])
    Staged(spares=spares).write(b / "y.out", [b"y"])
    assert len(_unnamed_in(a)) == 2, "a commit in another folder makes its own temporary"
    spares.fill(b)
    assert _unnamed_in(a) == [] and len(_unnamed_in(b)) == 2
    spares.drop()
    assert _unnamed_in(b) == []


def test_fill_stops_when_work_waits(tmp_path):
    spares = Spares(KINDS)
    calls = []
    spares.fill(tmp_path, stop=lambda: len(calls.append(1) or calls) > 1)
    assert len(_unnamed_in(tmp_path)) == 1
    spares.drop()


def test_without_unnamed_files_there_are_no_spares_and_commits_make_their_temporaries(tmp_path):
    class NoTmpfile(FileOps):  # NFS, or a system without O_TMPFILE
        def open_unnamed(self, folder, mode: int = 0o644) -> int:
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP), str(folder))

    spares = Spares(KINDS, ops=NoTmpfile())
    spares.fill(tmp_path)
    staged = Staged(spares=spares)
    staged.write(tmp_path / "m.out", [b"out"])
    assert os.listdir(tmp_path) == [f".m.out.{os.getpid()}.tmp"]
    staged.publish()
    assert os.listdir(tmp_path) == ["m.out"] and (tmp_path / "m.out").read_bytes() == b"out"


def test_a_file_made_from_a_spare_has_its_folders_default_acl_as_one_made_there(tmp_path):
    """A class's outputs are readable by their submitter through their folder's default ACL."""
    from mmd import acl

    try:
        acl.share_folder(tmp_path, [65534], [])
    except OSError:
        pytest.skip("no ACLs on this filesystem")
    spares = Spares(KINDS)
    spares.fill(tmp_path)
    staged = Staged(spares=spares)
    staged.write(tmp_path / "m.out", [b"out"])
    staged.publish()
    write_atomic(tmp_path / "n.out", [b"n"])
    assert acl.readers(tmp_path / "m.out") == acl.readers(tmp_path / "n.out") == ({65534}, set())
    assert os.stat(tmp_path / "m.out").st_mode == os.stat(tmp_path / "n.out").st_mode


def test_a_commit_syncs_every_file_before_it_renames_any_and_starts_their_writeback_as_they_are_written(tmp_path):
    """A job's output goes to disk while its sidecar is made: the fsyncs at publish wait for less. Each file is
    still fsynced, in order, before the first rename; a group's files are left to its one sync instead."""
    steps: list[tuple[str, str]] = []

    class Recording(FileOps):
        def start_writeback(self, fd: int) -> None:
            steps.append(("start_writeback", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
            super().start_writeback(fd)

        def fsync(self, fd: int) -> None:
            steps.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
            super().fsync(fd)

        def replace(self, src, dst) -> None:
            steps.append(("replace", dst.name))
            super().replace(src, dst)

    staged = Staged(ops=Recording())
    staged.write(tmp_path / "m.out", [b"out"])
    staged.write(tmp_path / "m.timing.yaml", [b"yaml"])
    tmp_out, tmp_yaml = (f".{n}.{os.getpid()}.tmp" for n in ("m.out", "m.timing.yaml"))
    assert steps == [("start_writeback", tmp_out), ("start_writeback", tmp_yaml)]
    staged.publish()
    assert steps[2:] == [("fsync", tmp_out), ("fsync", tmp_yaml), ("replace", "m.out"), ("replace", "m.timing.yaml")]
    assert (tmp_path / "m.out").read_bytes() == b"out"

    steps.clear()
    group = Staged(group=True, ops=Recording())
    group.write(tmp_path / "n.out", [b"n"])
    assert steps == []
    group.publish()
    assert [s for s, _ in steps] == ["fsync", "replace"]
