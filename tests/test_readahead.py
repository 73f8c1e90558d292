"""mmd.readahead: the reads ``mmd check`` starts before it imports numpy give the very results of a check
without them, faults and their order included, and are used where they succeed."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

from mmd import readahead, textcore, textformat
from mmd.check import jobs
from mmd.check.results import Options, Result, Status
from mmd.cli import main
from mmd.generate import input_chunks, random_matrix

from .conftest import blocks_of

pytestmark = pytest.mark.skipif(not textcore.USE_FASTTEXT, reason="mmd._fasttext is not built or switched off")


def _in_body(text: bytes, old: bytes, new: bytes, skip: int = 0) -> bytes:
    """``text`` with the first ``old`` past its header line (and ``skip`` more bytes) made ``new``."""
    at = text.index(old, text.index(b"\n") + 1 + skip)
    return text[:at] + new + text[at + len(old) :]


def _files(tmp_path: Path, m: int = 40, k: int = 30, n: int = 50) -> dict[str, Path]:
    """Inputs, outputs and expected outputs, right and spoiled in every way grading tells apart."""
    rng = np.random.default_rng(5)
    a, b = random_matrix(rng, m, k), random_matrix(rng, k, n)
    files = {
        "in": b"".join(input_chunks(a, b, square=False)),
        "in_bad": b"3\n1 2\n",
        "in_other": b"".join(input_chunks(a[:, :4], b[:4, :7], square=False)),
        "in_nan": _in_body(b"".join(input_chunks(a, b, square=False)), b" ", b" nan "),
        "out": textformat.emit(a @ b),
    }
    text = files["out"]
    lines = text.split(b"\n")
    wrong = (a @ b).astype(np.float32)
    wrong[4, 0] = 999.99
    files["out_wrong"] = textformat.emit(wrong)
    files["out_format"] = text.replace(b"\n", b"\r\n", 1)  # line 1 ends in CR LF
    files["out_body"] = _in_body(text, b".", b",", 40)  # a field of row 1 in another format
    files["out_tail"] = text + b"  1.00\n"  # bytes after the last row
    files["out_short"] = text[: text.index(b"\n") + 1] + lines[1] + b"\n"  # a header that promises more rows
    files["out_header"] = b"x\n" + text
    files["out_copy"] = text
    files["out_near"] = text[:-2] + (b"1\n" if text[-2:-1] != b"1" else b"2\n")
    files["out_format_copy"] = files["out_format"]
    paths = {}
    for name, data in files.items():
        paths[name] = tmp_path / (name + (".txt" if name.startswith("in") else ".out"))
        paths[name].write_bytes(data)
    return paths


OK, MISMATCH, FORMAT, ERROR = Status.OK, Status.MISMATCH, Status.FORMAT, Status.ERROR
EXPECTED = Options(against="expected")
#: (output, reference, options, status): every case below runs with reads ahead and without
CASES = [
    ("out", "in", Options(), OK),
    ("out", "in", Options(quick=True), OK),
    ("out", "in", Options(tol=0.0), MISMATCH),
    ("out_wrong", "in", Options(), MISMATCH),
    ("out_wrong", "in", Options(quick=True), MISMATCH),
    ("out_format", "in", Options(), FORMAT),
    ("out_format", "in_bad", Options(quick=True), FORMAT),
    ("out_body", "in", Options(), FORMAT),
    ("out_body", "in", Options(quick=True), FORMAT),
    ("out_tail", "in", Options(), FORMAT),
    ("out", "out_body", EXPECTED, ERROR),
    ("out_body", "out", EXPECTED, FORMAT),
    ("out_tail", "out", EXPECTED, FORMAT),
    ("out", "out_tail", EXPECTED, ERROR),
    ("out_short", "in", Options(), FORMAT),
    ("out_header", "in", Options(), FORMAT),
    ("out", "in_bad", Options(), ERROR),
    ("out", "in_nan", Options(), ERROR),
    ("out", "in_other", Options(), MISMATCH),
    ("out", "in_other", Options(quick=True), MISMATCH),
    ("out", "out_copy", EXPECTED, OK),
    ("out", "out_copy", Options(against="expected", tol=-1.0), MISMATCH),
    ("out", "out_near", EXPECTED, OK),
    ("out", "out_wrong", EXPECTED, MISMATCH),
    ("out_format", "out_format_copy", EXPECTED, FORMAT),
    ("out", "out_format", EXPECTED, ERROR),
    ("out", "missing", Options(), ERROR),
    ("out", "missing", EXPECTED, ERROR),
]


def _plain(r: Result) -> Result:
    return dataclasses.replace(r, seconds=0.0)


def _ahead(out: Path, ref: Path, options: Options) -> readahead.ReadAhead:
    return readahead.start(out, ref, options.against, wide=not options.quick)


@pytest.mark.parametrize("blocks", [False, True], ids=["whole", "rows"])
@pytest.mark.parametrize("mapped", [False, True], ids=["read", "mapped"])
@pytest.mark.parametrize(("out", "ref", "options", "status"), CASES)
def test_reads_ahead_give_the_same_results(tmp_path, monkeypatch, out, ref, options, status, mapped, blocks):
    """Every case with the files read or mapped, and with the checks' blocks whole or a row each (then
    two outputs that differ are not read ahead, as the check would not hold them whole)."""
    if mapped:
        monkeypatch.setattr(textcore, "MAP_BYTES", 1)
    if blocks:
        blocks_of(monkeypatch, 1)
    paths = _files(tmp_path)
    paths["missing"] = tmp_path / "missing.txt"
    output, reference = paths[out], paths[ref]
    want = jobs.check_file(output, reference, options).results[0]
    with _ahead(output, reference, options) as ahead:
        got = jobs.check_file(output, reference, options, ahead).results[0]
    assert _plain(got) == _plain(want)
    assert want.status is status, want.reason


def test_values_read_ahead_are_textformat_s_bits(tmp_path):
    paths = _files(tmp_path, 70, 90, 60)
    for wide, device, dtype in ((True, False, np.float64), (True, True, np.float64), (False, False, np.float32)):
        with readahead.start(paths["out"], paths["in"], "inputs", wide, device) as ahead:
            got_out = ahead.output_values(paths["out"])
            got_in = ahead.input_values(paths["in"], wide)
            assert got_in is not None
            assert ahead.input_values(paths["in"], not wide) is None  # another type: read again
            assert ahead.output_values(paths["in"]) is None and ahead.input_values(paths["out"], wide) is None
            assert got_in.shape == (70, 90, 60)
            mats = textformat.parse(paths["in"].read_bytes(), dtype=dtype)
            vals = np.frombuffer(got_in.buffer, dtype)
            assert vals.tobytes() == mats.a.tobytes() + mats.b.tobytes()
            del vals
            # the full check reads the output a block at a time beside numpy's product, not ahead;
            # beside another device's product, whole
            assert (got_out is None) == (wide and not device)
            if got_out is not None:
                assert got_out.shape == (70, 60)
                out = np.frombuffer(got_out.buffer, np.float64).reshape(70, 60)
                want_out = textformat.parse_output(paths["out"].read_bytes())
                assert out.tobytes() == want_out.tobytes()
                del out


def test_a_check_uses_what_was_read_ahead(tmp_path, monkeypatch):
    """Where the reads succeed, grading parses nothing again (and checks no output again)."""
    paths = _files(tmp_path)

    def refuse(*args, **kwargs):
        raise AssertionError("read again")

    for name in ("parse", "parse_output", "check_output", "output_blocks"):
        monkeypatch.setattr(textformat, name, refuse)
    for options in (Options(), Options(quick=True)):
        with _ahead(paths["out"], paths["in"], options) as ahead:
            assert jobs.check_file(paths["out"], paths["in"], options, ahead).results[0].status is Status.OK
    options = Options(against="expected")
    with _ahead(paths["out"], paths["out_copy"], options) as ahead:
        r = jobs.check_file(paths["out"], paths["out_copy"], options, ahead).results[0]
    assert (r.status, r.max_error) == (Status.OK, 0.0)
    with _ahead(paths["out"], paths["out_near"], options) as ahead:  # both read whole, values and all
        assert ahead.expected_values(paths["out"], paths["out_near"]) is not None
        r = jobs.check_file(paths["out"], paths["out_near"], options, ahead).results[0]
    assert r.status is Status.OK and 0 < r.max_error <= 0.02


class _Failing:
    """mmd._fasttext whose parsers fail as a machine might (no memory for their threads)."""

    @staticmethod
    def parse_output_values(*args):
        raise MemoryError

    parse_values = parse_output_values

    @staticmethod
    def same_bytes(x, y):
        return bytes(x) == bytes(y)


@pytest.mark.parametrize(("out", "ref", "options", "status"), [c for c in CASES if c[1] != "missing"])
def test_failed_reads_leave_the_check_to_grading(tmp_path, monkeypatch, out, ref, options, status):
    paths = _files(tmp_path)
    output, reference = paths[out], paths[ref]
    want = jobs.check_file(output, reference, options).results[0]
    monkeypatch.setattr(textcore, "fasttext", _Failing)  # while the reads run
    with _ahead(output, reference, options) as ahead:
        assert ahead.output_values(output) is None and ahead.input_values(reference, not options.quick) is None
        differ = options.against == "expected" and output.read_bytes() != reference.read_bytes()
        assert ahead.same_output(output, reference) is (False if differ else None)  # memcmp needs no parser
        monkeypatch.undo()  # the reads are done: grading's own parse as ever
        got = jobs.check_file(output, reference, options, ahead).results[0]
    assert _plain(got) == _plain(want) and want.status is status


@pytest.mark.parametrize(
    ("options", "replaced", "by", "status"),
    [(Options(quick=True), "out", "out_format", Status.FORMAT), (Options(), "in", "in_bad", Status.ERROR)],
    ids=["output", "input"],
)
def test_a_file_replaced_after_its_read_is_checked_as_read(tmp_path, options, replaced, by, status):
    """The check reads the bytes the values came from: mmd writes outputs by rename, so a mapping keeps
    them (the full check reads its output a block at a time beside the product's, not ahead)."""
    paths = _files(tmp_path)
    with _ahead(paths["out"], paths["in"], options) as ahead:
        assert ahead.mapped(paths[replaced]) is not None
        shutil.copy(paths[by], tmp_path / "new")
        (tmp_path / "new").replace(paths[replaced])
        r = jobs.check_file(paths["out"], paths["in"], options, ahead).results[0]
    assert r.status is Status.OK
    assert jobs.check_file(paths["out"], paths["in"], options).results[0].status is status


def test_read_ahead_beside_numpy_s_import_or_where_cores_are_left(monkeypatch):
    monkeypatch.setattr(textcore, "WORKERS", 2)
    for cores, imports_numpy, useful in ((2, True, True), (2, False, False), (3, False, True), (16, True, True)):
        monkeypatch.setattr(readahead, "usable_cores", lambda cores=cores: cores)
        assert readahead.useful(imports_numpy) is useful, (cores, imports_numpy)
    monkeypatch.setattr(textcore, "USE_FASTTEXT", False)
    assert not readahead.useful(True)


@pytest.mark.parametrize(("out", "ref", "options", "status"), [c for c in CASES if c[1] != "missing"])
def test_mmd_check_prints_the_same_with_reads_ahead(tmp_path, monkeypatch, capsys, out, ref, options, status):
    """The command, in this process, with and without its reads ahead (``readahead.useful`` decides)."""
    paths = _files(tmp_path)
    argv = ["check", str(paths[out])]
    argv += ["--input", str(paths[ref])] if options.against == "inputs" else ["--expected", str(paths[ref])]
    argv += ["--quick", f"--seed={options.seed}"] if options.quick else []  # one seed for both runs
    argv += [f"--tol={options.tol}"] if options.tol is not None else []
    printed, started, real = [], [], readahead.start
    monkeypatch.setattr(readahead, "start", lambda *a, **k: started.append(a) or real(*a, **k))
    for useful in (False, True):
        monkeypatch.setattr(readahead, "useful", lambda imports_numpy, useful=useful: useful)
        started.clear()
        code = main(argv)
        assert len(started) == useful
        printed.append((code, capsys.readouterr()))
    assert printed[0] == printed[1]
    assert printed[0][0] == {OK: 0, MISMATCH: 1, FORMAT: 1, ERROR: 2}[status]


def test_outputs_whose_bytes_differ_are_not_compared_again(tmp_path, monkeypatch):
    paths = _files(tmp_path)
    options = Options(against="expected")
    with _ahead(paths["out"], paths["out_near"], options) as ahead:
        assert ahead.same_output(paths["out"], paths["out_near"]) is False
        monkeypatch.setattr(textcore, "same_bytes", lambda x, y: pytest.fail("compared again"))
        r = jobs.check_file(paths["out"], paths["out_near"], options, ahead).results[0]
    assert r.status is Status.OK and 0 < r.max_error <= 0.02
