import hashlib
import os
import stat

import pytest

from mmd.atomic import NAME_MAX, Staged, temporary_name, temporary_pid, write_atomic
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


def test_a_big_outputs_writeback_starts_as_each_slice_is_written_not_only_at_its_end(tmp_path):
    """The disk writes a big output's first megabytes while the rest is still copied in: at publish, its fsync
    waits for the tail only. Every byte arrives, in order, however the chunks fall across the slices."""
    from mmd.atomic import WRITEBACK_SLICE

    events: list[tuple[str, int]] = []

    class Recording(FileOps):
        def write(self, fd: int, data: bytes | memoryview) -> int:
            done = super().write(fd, data)
            events.append(("write", done))
            return done

        def start_writeback(self, fd: int) -> None:
            events.append(("start_writeback", os.fstat(fd).st_size))
            super().start_writeback(fd)

    body = os.urandom(3 * WRITEBACK_SLICE + 12345)
    chunks = [body[: WRITEBACK_SLICE // 2], body[WRITEBACK_SLICE // 2 :]]
    staged = Staged(ops=Recording())
    staged.write(tmp_path / "big.out", chunks)
    started = [size for what, size in events if what == "start_writeback"]
    assert started == [WRITEBACK_SLICE, 2 * WRITEBACK_SLICE, 3 * WRITEBACK_SLICE, len(body)]
    assert max(done for what, done in events if what == "write") <= WRITEBACK_SLICE
    staged.publish()
    assert (tmp_path / "big.out").read_bytes() == body

    events.clear()
    Staged(durable=False, ops=Recording()).write(tmp_path / "loose.out", chunks)
    assert [what for what, _ in events if what == "start_writeback"] == []


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


# ---------------------------------------------------------------------------
# the one helper's guarantees


class Watching(FileOps):
    """Fails the ``fail_at``-th file operation (0: none) with ENOSPC; before each operation, checks that the
    destination holds the old bytes or the whole new ones (``None``: no file)."""

    def __init__(self, target, allowed, fail_at: int = 0) -> None:
        self.target, self.allowed, self.fail_at, self.calls, self.failed = target, allowed, fail_at, 0, ""

    def _step(self, op: str = "") -> None:
        seen = self.target.read_bytes() if self.target.exists() else None
        assert seen in self.allowed, f"a reader saw {seen!r}"
        self.calls += 1
        if self.calls == self.fail_at:
            self.failed = op
            raise OSError(28, "No space left on device")

    def open_exclusive(self, path, mode=0o644):
        self._step("open_exclusive")
        return super().open_exclusive(path, mode)

    def write(self, fd, data):
        self._step("write")
        return super().write(fd, data)

    def start_writeback(self, fd):
        self._step("start_writeback")
        super().start_writeback(fd)

    def fsync(self, fd):
        self._step("fsync")
        super().fsync(fd)

    def close(self, fd):
        self._step("close")
        super().close(fd)

    def replace(self, src, dst):
        self._step("replace")
        super().replace(src, dst)

    def link(self, src, dst):
        self._step("link")
        super().link(src, dst)

    def unlink(self, path):
        self._step("unlink")
        super().unlink(path)


@pytest.mark.parametrize("replace", [True, False])
@pytest.mark.parametrize("durable", [True, False])
def test_the_destination_is_the_old_file_or_the_whole_new_one_whichever_operation_fails(tmp_path, durable, replace):
    """At every step of a commit, and after a failure at any one of them, a reader finds the old file (none, for
    a commit that never replaces) or the whole new one, and no temporary is left."""
    target = tmp_path / "out.txt"
    old = None if not replace else b"old result\n"
    new = b"new result, longer than the old\n" * 1000
    chunks = [new[:1000], new[1000:]]
    whole = Watching(target, {old, new})
    if old is not None:
        target.write_bytes(old)
    write_atomic(target, chunks, durable=durable, replace=replace, ops=whole)
    assert target.read_bytes() == new and os.listdir(tmp_path) == ["out.txt"]
    for fail_at in range(1, whole.calls + 1):
        target.unlink(missing_ok=True)
        if old is not None:
            target.write_bytes(old)
        ops = Watching(target, {old, new}, fail_at)
        try:
            write_atomic(target, chunks, durable=durable, replace=replace, ops=ops)
        except OutputError as exc:
            assert isinstance(exc.__cause__, OSError) and exc.__cause__.errno == 28
        except OSError as exc:  # a refused link, as it is: the caller's to judge (a name taken, no hard links)
            assert not replace and ops.failed == "link" and exc.errno == 28
        else:  # only the unlink of the temporary once it is linked: published, the temporary a second name of it
            assert not replace and ops.failed == "unlink" and target.read_bytes() == new
            [left] = set(os.listdir(tmp_path)) - {"out.txt"}
            assert os.path.samefile(tmp_path / left, target)
            continue
        ops._step()  # once more, after the failure
        assert os.listdir(tmp_path) == (["out.txt"] if target.exists() else []), f"failing call {fail_at}"


def test_two_commits_of_one_name_at_once_in_one_process_never_mix(tmp_path):
    """A second commit of a name while the first is still in its temporary (another thread, a staged job) takes
    a temporary of its own: neither takes the other's for a dead process's leftover, and the destination is
    always one of them whole."""
    target = tmp_path / "out.txt"
    first = Staged()
    first.write(target, [b"first, whole\n"])

    def second_chunks():
        yield b"second, "
        first.publish()  # the first is published while the second is half written
        assert target.read_bytes() == b"first, whole\n"
        yield b"whole\n"

    write_atomic(target, second_chunks())
    assert target.read_bytes() == b"second, whole\n"
    assert os.listdir(tmp_path) == ["out.txt"]


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o644, 0o755])
def test_the_file_has_the_permission_bits_the_caller_asks_from_its_creation_on(tmp_path, mode):
    """The mode is the temporary's from its open (a reader never meets wider bits and a chmod after), less the
    umask; the old file's bits are not kept."""
    target = tmp_path / "out.txt"
    target.write_bytes(b"old")
    target.chmod(0o666)
    opened = []

    class Looking(FileOps):
        def write(self, fd: int, data: bytes | memoryview) -> int:
            opened.append(stat.S_IMODE(os.fstat(fd).st_mode))
            return super().write(fd, data)

    old_umask = os.umask(0o022)
    try:
        write_atomic(target, [b"new"], mode=mode, ops=Looking())
        assert stat.S_IMODE(target.stat().st_mode) == opened[0] == mode & ~0o022
        os.umask(0o077)
        write_atomic(target, [b"newer"], mode=mode)
        assert stat.S_IMODE(target.stat().st_mode) == mode & ~0o077
    finally:
        os.umask(old_umask)
    assert write_atomic(tmp_path / "plain", [b"x"]) and stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o644


def test_the_temporary_name_is_hidden_in_the_destinations_folder_and_says_whose_it_is():
    """``.<name>[.<n>][.<host>].<pid>.tmp``, the leading dot only where the name is not hidden already; the
    sweep reads the pid back, and a host's sweep only its own."""
    assert temporary_name("m.out", host="", pid=42) == ".m.out.42.tmp"
    assert temporary_name(".mmd-state.json", host="", pid=42) == ".mmd-state.json.42.tmp"
    assert temporary_name("m.out", host="node0", pid=42, serial=2) == ".m.out.2.node0.42.tmp"
    long = temporary_name("é" * 120, host="node0", pid=42)
    assert len(long.encode()) <= NAME_MAX and long.startswith(".") and long.endswith(".node0.42.tmp")
    for name in (".m.out.42.tmp", ".m.out.2.node0.42.tmp", long, ".mmd-state.json.42.tmp"):
        assert temporary_pid(name) == 42
    assert temporary_pid(".m.out.node0.42.tmp", host="node0") == 42
    assert temporary_pid(".m.out.node1.42.tmp", host="node0") is None
    for name in ("m.out", ".m.out", "m.out.42.tmp", ".notes.tmp", ".m.out.42.tmp~"):
        assert temporary_pid(name) is None


def test_a_leftover_temporary_of_this_pid_is_replaced_and_none_is_left_after_a_commit(tmp_path):
    """A killed process with this pid left its temporary: the next commit of the name writes a new one."""
    target = tmp_path / "out.txt"
    (tmp_path / temporary_name("out.txt")).write_bytes(b"a killed writer's half")
    write_atomic(target, [b"whole"])
    assert target.read_bytes() == b"whole" and os.listdir(tmp_path) == ["out.txt"]
