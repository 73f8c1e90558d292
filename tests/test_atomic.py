import hashlib
import os

import pytest

from mmd.atomic import write_atomic
from mmd.errors import OutputError


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
