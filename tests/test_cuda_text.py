"""The GPU text path's CPU-side pieces (mmd.cuda.text): the kernels compile, offsets fit, the header line.

The kernels themselves run in tests/gpu/test_gputext.py; the pipeline's use
of the path, with the fake GPU, is in tests/test_textpaths.py.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from mmd import kernels, textformat
from mmd.cuda import text
from mmd.resources import kernels_dir

NVCC = shutil.which("nvcc")
SOURCES = text.SOURCES


@pytest.mark.integration  # nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name", list(SOURCES))
def test_text_kernels_compile_for_sm90(name, tmp_path):
    defines, entries = SOURCES[name]
    source = kernels_dir() / name
    done = subprocess.run(
        [NVCC, "-arch=sm_90", "-cubin", "-O3", *(f"-D{k}={v}" for k, v in defines.items()), "-o",
         str(tmp_path / "k.cubin"), str(source)],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    source_text = source.read_text()
    for entry in entries:
        assert f"{entry}(" in source_text, entry


def test_text_kernels_are_not_matmul_kernels():
    registered = {spec.source_file for spec in kernels.REGISTRY.values() if spec.source_file}
    assert not set(kernels.TEXT_KERNEL_FILES) & registered
    for name in kernels.TEXT_KERNEL_FILES:
        assert (kernels_dir() / name).is_file()


def test_fits_keeps_offsets_within_int32():
    head = textformat.parse_header(b"4096\n")
    assert text.fits(head, 185_000_000)
    assert not text.fits(head, 2**31 + 10)
    big = textformat.parse_header(b"20000\n")  # 4e8 fields of up to MAX_FIELD_BYTES
    assert not text.fits(big, 10**9)
    assert text.header_line(3, 3) == b"3\n" and text.header_line(2, 5) == b"2 5\n"
