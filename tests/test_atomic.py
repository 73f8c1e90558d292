import hashlib
import os

import pytest

from mmd.atomic import Staged, write_atomic
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


def test_write_all_writes_every_byte_of_an_array_given_in_short_writes(tmp_path):
    """write_all counts what os.write wrote in bytes, also for a buffer of 4-byte floats (the kernel-file launch
    process is sent its operands so)."""
    import numpy as np

    from mmd.fileops import write_all

    class Short(FileOps):
        def write(self, fd: int, data: bytes | memoryview) -> int:
            return super().write(fd, memoryview(data)[:5])

    a = np.arange(7, dtype=np.float32)
    fd = os.open(tmp_path / "a", os.O_WRONLY | os.O_CREAT)
    try:
        write_all(Short(), fd, a.data)
    finally:
        os.close(fd)
    assert (tmp_path / "a").read_bytes() == a.tobytes()
