"""mmd's own cache of compiled kernels (mmd.cuda.compiler.KernelCache), with the compiler faked: runs without CUDA."""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from mmd import config
from mmd.cuda.builds import build_all, configured_builds, every_build
from mmd.cuda.compiler import KernelCache, macro_options
from mmd.resources import kernels_dir

CUBIN = b"\x7fELF fake cubin " + bytes(range(256)) * 64


def fake_build(calls: list | None = None, delay: float = 0.0, payload: bytes = CUBIN):
    def build(source, options, arch, include_dirs):
        if calls is not None:
            calls.append((source, tuple(options), arch))
        time.sleep(delay)
        return payload + source.encode()

    return build


def cache(folder, calls=None, version="nvcc 12.4", **kw) -> KernelCache:
    return KernelCache(folder, build=fake_build(calls, **kw), version=lambda: version)


def test_compiles_once_then_loads(tmp_path):
    calls: list = []
    c = cache(tmp_path / "k", calls)
    cubin, built = c.get("src", ["-O3"], "sm_90")
    assert built and cubin == CUBIN + b"src"
    again, built = cache(tmp_path / "k", calls).get("src", ["-O3"], "sm_90")  # a new process, same folder
    assert not built and again == cubin and len(calls) == 1
    assert [p.suffix for p in (tmp_path / "k").iterdir()] == [".cubin"], "no temporaries left"


def test_key_covers_source_options_arch_version_and_headers(tmp_path):
    headers = tmp_path / "inc"
    headers.mkdir()
    (headers / "common.cuh").write_text("#define X 1\n")
    c = cache(tmp_path / "k")
    base = c.key("src", ["-O3"], "sm_90", [headers])
    assert c.key("src2", ["-O3"], "sm_90", [headers]) != base
    assert c.key("src", ["-O2"], "sm_90", [headers]) != base
    assert c.key("src", ["-O3"], "sm_80", [headers]) != base
    assert cache(tmp_path / "k", version="nvcc 13.0").key("src", ["-O3"], "sm_90", [headers]) != base
    (headers / "common.cuh").write_text("#define X 2\n")
    assert c.key("src", ["-O3"], "sm_90", [headers]) != base
    assert c.key("src", ["-O3"], "sm_90", [headers]) == c.key("src", ["-O3"], "sm_90", [headers])


def test_editing_a_header_a_kernel_includes_changes_its_key(tmp_path):
    """tc1.cu and tc3.cu share kernels/tc_common.cuh: a stale cubin must not survive an edit of it."""
    kernels = tmp_path / "kernels"
    shutil.copytree(kernels_dir(), kernels)
    c = cache(tmp_path / "k")
    included = set()
    for source in sorted(kernels.glob("*.cu")):
        text = source.read_text(encoding="utf-8")
        for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, re.MULTILINE):
            header = kernels / name
            # the key hashes the headers in the include folder itself, not below it
            assert header.is_file() and header.parent == kernels, f"{source.name} includes {name}: not beside it"
            before = c.key(text, ["-O3"], "sm_90", [kernels])
            header.write_text(header.read_text(encoding="utf-8") + "\n/* edited */\n", encoding="utf-8")
            assert c.key(text, ["-O3"], "sm_90", [kernels]) != before, f"{source.name}'s key ignores {name}"
            included.add(name)
    assert "tc_common.cuh" in included


def test_every_build_is_keyed_on_the_kernel_headers():
    seen: list = []

    class Spy(KernelCache):
        def get(self, source, options, arch, include_dirs=(), refresh=False):
            seen.append([Path(d) for d in include_dirs])
            return b"", True

    builds = [b for b in every_build("sm_90") if b.source.name in ("tc1.cu", "tc3.cu")]
    assert builds and all(r.error is None for r in build_all(Spy(None), builds, workers=1))
    assert len(seen) == len(builds) and all(kernels_dir() in dirs for dirs in seen)


@pytest.mark.parametrize("damage", ["truncated", "flipped", "empty", "garbage"])
def test_a_damaged_entry_is_rebuilt(tmp_path, damage):
    calls: list = []
    c = cache(tmp_path / "k", calls)
    cubin, _ = c.get("src", [], "sm_90")
    (entry,) = (tmp_path / "k").iterdir()
    data = entry.read_bytes()
    entry.write_bytes(
        {
            "truncated": data[: len(data) // 2],
            "flipped": data[:-1] + bytes([data[-1] ^ 1]),
            "empty": b"",
            "garbage": b"not a cache entry",
        }[damage]
    )
    again, built = c.get("src", [], "sm_90")
    assert built and again == cubin and len(calls) == 2
    assert KernelCache.read(entry) == cubin, "the rebuilt entry replaced the damaged one"


def test_disabled_cache_writes_nothing(tmp_path):
    calls: list = []
    c = cache(None, calls)
    assert c.get("src", [], "sm_90")[1] and c.get("src", [], "sm_90")[1]
    assert len(calls) == 2


def test_an_unwritable_cache_only_costs_compile_time(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cubin, built = cache(blocker / "k").get("src", [], "sm_90")
    assert built and cubin == CUBIN + b"src"


def _fill(folder: str, go, results, log: str) -> None:
    def build(source, options, arch, include_dirs):
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        time.sleep(0.3)  # long enough that every process asks while the first compiles
        return CUBIN + source.encode()

    c = KernelCache(folder, build=build, version=lambda: "v")
    go.wait()
    cubin, built = c.get("src", ["-O3"], "sm_90")
    results.put((cubin == CUBIN + b"src", built))


def test_processes_asking_for_one_missing_entry_at_once_compile_it_once(tmp_path):
    """A daemon's workers all start at once and all want the same kernels: one process compiles each, the
    others wait for it and load its cubin (issue 48: not every worker compiling the same kernel)."""
    folder, log = tmp_path / "k", tmp_path / "builds.log"
    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    go, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_fill, args=(str(folder), go, results, str(log))) for _ in range(6)]
    for p in procs:
        p.start()
    go.set()
    got = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert all(ok for ok, _ in got), "each process got the whole cubin"
    assert len(log.read_text().splitlines()) == 1, "compiled once, by one process"
    assert sum(built for _, built in got) == 1
    files = sorted(folder.iterdir())
    assert [f.suffix for f in files] == [".cubin"], f"one entry, no temporaries or locks left: {files}"
    assert KernelCache.read(files[0]) == CUBIN + b"src"


def test_kernel_cache_setting(tmp_path):
    assert config.kernel_cache_dir(config.Settings(), {"XDG_CACHE_HOME": "/x"}).as_posix() == "/x/mmd/kernels"
    # under systemd's CacheDirectory= (the first folder when it lists several)
    systemd = {"CACHE_DIRECTORY": "/var/cache/mmd:/var/cache/other", "XDG_CACHE_HOME": "/x"}
    assert config.kernel_cache_dir(config.Settings(), systemd).as_posix() == "/var/cache/mmd/kernels"
    assert config.kernel_cache_dir(config.load(None, environ={"MMD_KERNEL_CACHE": "null"})) is None
    assert config.kernel_cache_dir(config.Settings(kernel_cache=str(tmp_path))) == tmp_path


def test_macro_options_are_sorted_so_the_key_does_not_depend_on_order():
    assert macro_options({"TILE": 16, "BM": 64}) == ("-DBM=64", "-DTILE=16", "-O3")


def test_every_build_holds_the_build_an_architecture_launches_in_a_kernel_s_place():
    """A daemon's first tc1 job on sm_90 must find its TMA build in the cache `mmd kernels --build` filled."""
    tc1 = [b for b in every_build("sm_90") if b.source.name == "tc1.cu"]
    assert [b.defines.get("TMA", 0) for b in tc1] == [0, 1] and {b.arch for b in tc1} == {"sm_90a"}
    assert [b.defines.get("TMA", 0) for b in every_build("sm_80") if b.source.name == "tc1.cu"] == [0]


def test_configured_builds_are_the_settings_kernel_at_their_tile_and_the_text_kernels():
    """What the installer builds into the service's cache: what a daemon with its settings loads, no more."""
    text = ["text_parse.cu", "text_emit.cu"]
    assert [b.label for b in configured_builds("sm_90", "tiled", 16)] == ["tiled tile 16", *text]
    fast = [b.label for b in every_build("sm_90") if b.source.name == "fast.cu"]
    assert [b.label for b in configured_builds("sm_90", "fast", 32)] == [*fast, *text], "every variant, no tile"
    tc1 = configured_builds("sm_90", "tc1", 32)
    assert [b.defines.get("TMA", 0) for b in tc1 if b.source.name == "tc1.cu"] == [0, 1], "the TMA build and its own"
    assert [b.label for b in configured_builds("sm_90", "cublas", 32)] == text
    assert {b.arch for b in configured_builds("sm_80", "tiled", 32)} == {"sm_80"}


def test_kernels_build_configured_fills_the_cache_with_the_settings_kernel(tmp_path, monkeypatch, capsys):
    """`mmd kernels --build --configured` (the installer's step) builds the settings' kernel at their tile and the
    text kernels, and nothing else; a second run finds them all cached."""
    from mmd.cli import main
    from mmd.errors import ExitStatus

    fake = tmp_path / "bin" / "nvcc"  # writes a cubin of its own where it is told
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done\necho cubin > "$out"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    monkeypatch.setenv("MMD_CONFIG", os.devnull)
    monkeypatch.setenv("MMD_KERNEL", "tiled")
    monkeypatch.setenv("MMD_TILE", "16")
    cache = tmp_path / "cache"
    argv = ["kernels", "--build", "--configured", "--arch", "sm_90", "--cache", str(cache)]
    assert main(argv) == 0
    assert capsys.readouterr().out.endswith(f"3 builds for sm_90: 3 compiled, 0 already cached, 0 failed; {cache}\n")
    assert len(list(cache.glob("*.cubin"))) == 3
    assert main(argv) == 0
    assert capsys.readouterr().out.endswith(f"3 builds for sm_90: 0 compiled, 3 already cached, 0 failed; {cache}\n")
    assert main(["kernels", "--configured"]) == ExitStatus.USAGE
    assert "give --build too" in capsys.readouterr().err
