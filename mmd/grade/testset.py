"""The instructor's data sets (TESTS): inputs in mmd's format and, where given, expected outputs, paired as
``mmd check`` pairs a folder (:func:`mmd.check.pairing.pair_folder`: ``x.txt`` with ``x.out``), each read
once for the whole class, and each kernel's product at a tile judged as ``mmd check`` judges that output.

A test's product is judged on the values its output would print (the product emitted in mmd's format and
read back, exactly as ``mmd check`` reads an output file): against the expected output where there is one
(``mmd check --expected``: 0.01 apart at most), else against the input's float64 product under the fp32
error model (``mmd check --inputs``), that product made once per test and kept. A product with a value that
is not finite prints no number (:func:`mmd.textformat.check_product`): it is wrong, never a wildcard.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import textformat, textoutput
from ..check import full
from ..check.compare import CheckReport
from ..check.pairing import pair_folder
from ..check.product import Float64Product, WholeRows, reference
from ..errors import InputFormatError, UnreadableError
from ..textcore import printable

#: mmd check's tolerance between two outputs (``mmd check --expected``).
EXPECTED_TOL = 0.01


@dataclass
class Test:
    """One data set: its input's A and B (float32, what kernels are given), and what their product is judged by."""

    name: str
    input: Path
    expected: Path | None
    a: np.ndarray
    b: np.ndarray
    #: The expected output's values, where one is given.
    want: np.ndarray | None
    #: The inputs' float64 product, where no expected output is (made once, kept for every kernel).
    product: Float64Product | None

    @property
    def shape(self) -> tuple[int, int, int]:
        (m, k), n = self.a.shape, self.b.shape[1]
        return m, k, n

    @property
    def reference(self) -> Path:
        return self.expected if self.expected is not None else self.input

    def judge(self, c: np.ndarray, precision: str = "fp32") -> CheckReport:
        """``c`` (a kernel's float32 product) as ``mmd check`` judges the output it prints. Raises
        ProductRangeError where a value is not finite."""
        textformat.check_product(c)
        printed = textoutput.parse_output(textformat.emit(c))
        if self.want is not None:
            return full.against_output(printed, self.want, EXPECTED_TOL)
        assert self.product is not None
        return full.against_product(WholeRows.of(printed), self.product, None, precision)


@dataclass(frozen=True)
class Unusable:
    """A file in TESTS that is no test: why, as ``mmd check`` would say it."""

    name: str
    reason: str


def load(folder: Path) -> tuple[list[Test], list[Unusable]]:
    """Every test in ``folder``, read now (inputs parsed once; products made once), and the files that are
    none: an expected output with no input, or an input or expected output that cannot be read.
    UnreadableError where ``folder`` cannot be listed."""
    if not folder.is_dir():
        raise UnreadableError(f"--tests {printable(str(folder))}: not a folder")
    tests, unusable = [], []
    for job in pair_folder(folder, folder, "inputs"):
        if job.reference is None:
            unusable.append(Unusable(job.name, f"{job.name}.out: an expected output with no input {job.name}.txt"))
            continue
        try:
            tests.append(_test(job.name, job.reference, job.output))
        except UnreadableError as exc:
            unusable.append(Unusable(job.name, exc.reason))
    return tests, unusable


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UnreadableError(f"{what} {printable(str(path))}: {exc.strerror}") from None


def _test(name: str, src: Path, expected: Path | None) -> Test:
    try:
        mats = textformat.parse(_read(src, "input"), dtype=np.float64)
    except InputFormatError as exc:
        raise UnreadableError(f"input {printable(str(src))}: {exc.reason}") from None
    a64, b64 = mats.a, mats.b
    a, b = a64.astype(np.float32), b64.astype(np.float32)  # the same values: the input's are float32's
    want = product = None
    if expected is not None:
        try:
            want = textoutput.parse_output(_read(expected, "expected output"))
        except InputFormatError as exc:
            raise UnreadableError(f"expected output {printable(str(expected))}: {exc.reason}") from None
        if want.shape != (a.shape[0], b.shape[1]):
            got = "x".join(map(str, want.shape))
            raise UnreadableError(
                f"expected output {printable(str(expected))}: shape {got}, but its input's product is "
                f"{a.shape[0]}x{b.shape[1]}"
            )
    else:
        product = Float64Product(a64, b64, reference(a64, b64))
    return Test(name, src, expected, a, b, want, product)
