"""The command line as a user meets it: real processes, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import yaml

from mmd import textformat

from .conftest import ROOT, mmd_env, run_mmd


@pytest.mark.integration  # runs mmd as a real process
def test_gen_run_check_round_trip(tmp_path):
    src = tmp_path / "m.txt"
    r = run_mmd("gen", "--shape", "9", "13", "7", "--seed", "5", "-o", str(src))
    assert r.returncode == 0, r.stderr
    mats = textformat.parse(src.read_bytes())
    assert mats.a.shape == (9, 13) and mats.b.shape == (13, 7)
    assert np.count_nonzero(mats.a) == mats.a.size and np.count_nonzero(mats.b) == mats.b.size
    r = run_mmd("run", str(src))
    assert r.returncode == 0, r.stderr
    out = tmp_path / "m.out"
    assert out.read_bytes() == textformat.format_reference(mats.a @ mats.b)
    assert yaml.safe_load((tmp_path / "m.timing.yaml").read_text())["status"] == "ok"
    r = run_mmd("check", str(out), "--input", str(src))
    assert r.returncode == 0 and "format ok" in r.stdout and "ok:" in r.stdout


@pytest.mark.integration  # runs mmd as a real process
def test_gen_is_reproducible_with_a_seed(tmp_path):
    for name in ("a.txt", "b.txt"):
        assert run_mmd("gen", "16", "--seed", "1", "-o", str(tmp_path / name)).returncode == 0
    assert (tmp_path / "a.txt").read_bytes() == (tmp_path / "b.txt").read_bytes()
    assert (tmp_path / "a.txt").read_bytes().startswith(b"16\n")


@pytest.mark.integration  # runs mmd as a real process
def test_run_refusal_is_one_line_and_nonzero(tmp_path):
    src = tmp_path / "bad.txt"
    src.write_text("2\n1 2 3\n4 x 6\n")
    r = run_mmd("run", str(src))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("mmd run:")]
    assert len(lines) == 1 and "line 3" in lines[0] and "'x'" in lines[0]
    assert not (tmp_path / "bad.out").exists()
    assert (tmp_path / "bad.error.yaml").exists()


@pytest.mark.integration  # runs mmd as a real process
def test_check_catches_a_wrong_value_and_a_bad_format(tmp_path):
    src = tmp_path / "m.txt"
    src.write_text("2\n1 2\n3 4\n1 0\n0 1\n")
    good = tmp_path / "good.out"
    good.write_bytes(b"2\n  1.00  2.00\n  3.00  4.00\n")
    assert run_mmd("check", str(good), "--input", str(src)).returncode == 0
    wrong = tmp_path / "wrong.out"
    wrong.write_bytes(b"2\n  1.00  2.00\n  3.00  4.50\n")
    r = run_mmd("check", str(wrong), "--input", str(src))
    assert r.returncode == 1 and "MISMATCH" in r.stdout and "row 2 col 2" in r.stdout
    badfmt = tmp_path / "badfmt.out"
    badfmt.write_bytes(b"2\n1.00 2.00\n  3.00  4.00\n")
    r = run_mmd("check", str(badfmt), str(good))
    assert r.returncode == 1 and "FORMAT" in r.stdout
    assert run_mmd("check", str(good), str(good)).returncode == 0


@pytest.mark.integration  # runs mmd as a real process
def test_a_header_size_of_thousands_of_digits_is_an_input_refusal_in_one_line(tmp_path):
    """int() raised ValueError on it: a traceback from `mmd run`, an 'internal error' from the daemon."""
    src = tmp_path / "big.txt"
    src.write_text("9" * 5000 + "\n1 2\n")
    r = run_mmd("run", str(src), "-o", str(tmp_path / "out.txt"), "--backend", "cpu")
    assert r.returncode == 1 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    assert "more than 19 digits" in r.stderr
    refusal = yaml.safe_load((tmp_path / "out.error.yaml").read_text())
    assert refusal["error"]["kind"] == "input" and refusal["error"]["line"] == 1


@pytest.mark.integration  # runs mmd as a real process
def test_usage_errors_are_one_line(tmp_path):
    r = run_mmd("run")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = run_mmd("run", str(tmp_path / "missing.txt"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no such file" in r.stderr
    assert list(tmp_path.iterdir()) == [], "no error sidecar for an input that does not exist"
    r = run_mmd("run", str(tmp_path))
    assert r.returncode == 2 and "is a folder" in r.stderr and list(tmp_path.iterdir()) == []
    (tmp_path / "j.txt").write_text("1\n2\n3\n")
    r = run_mmd("run", str(tmp_path / "j.txt"), "-o", str(tmp_path / "nodir" / "x.out"))
    assert (
        r.returncode == 2 and "does not exist" in r.stderr and sorted(p.name for p in tmp_path.iterdir()) == ["j.txt"]
    )
    r = run_mmd("run", str(tmp_path / "j.txt"), "-o", str(tmp_path / "j.txt"))
    assert r.returncode == 2 and "-o names the input" in r.stderr
    r = run_mmd("run", str(tmp_path / "x.txt"), "--tile", "abc")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = run_mmd("gen", "-o", str(tmp_path / "g.txt"))
    assert r.returncode != 0 and "give either N or --shape" in r.stderr


@pytest.mark.integration  # runs mmd as a real process
def test_bad_config_is_one_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tiel: 3\n")
    src = tmp_path / "m.txt"
    src.write_text("1\n2\n3\n")
    r = run_mmd("run", str(src), "--config", str(cfg))
    assert r.returncode == 78 and "unknown setting 'tiel'" in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1


@pytest.mark.integration  # runs mmd as a real process
def test_cuda_backend_without_gpu_is_refused_cleanly(tmp_path):
    src = tmp_path / "m.txt"
    src.write_text("1\n2\n3\n")
    r = run_mmd("run", str(src), "--backend", "cuda")
    # On CI there is no pycuda: a clean refusal. On a GPU machine it simply works.
    assert "Traceback" not in r.stderr
    if r.returncode != 0:
        assert "pycuda" in r.stderr or "CUDA" in r.stderr


@pytest.mark.integration  # runs mmd as a real process
def test_cuda_asked_where_it_cannot_run_is_refused_before_the_job(tmp_path):
    """--backend cuda (or MMD_BACKEND=cuda) without pycuda is the command line's fault: exit 2, nothing written.
    A file whose own name asks for cuda is a job the input asked for: refused with its error sidecar."""
    import importlib.util

    if importlib.util.find_spec("pycuda") is not None:
        pytest.skip("pycuda is installed: cuda may run here")
    (tmp_path / "m.txt").write_text("1\n2\n3\n")
    asked = [(["--backend", "cuda"], {}), ([], {"MMD_BACKEND": "cuda"}), (["-o", "-", "--backend", "cuda"], {})]
    for args, env in asked:
        r = run_mmd("run", "m.txt", *args, cwd=tmp_path, env=env)
        assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, (args, r.stderr)
        assert r.stderr.startswith("mmd run: the cuda backend cannot run here: pycuda is not installed"), r.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["m.txt"], "no sidecar for a usage error"
    (tmp_path / "n@backend=cuda.txt").write_text("1\n2\n3\n")
    r = run_mmd("run", "n@backend=cuda.txt", cwd=tmp_path, env={"MMD_BACKEND": "auto"})
    assert r.returncode == 1 and (tmp_path / "n@backend=cuda.error.yaml").exists(), r.stderr


@pytest.mark.integration  # runs mmd as a real process
def test_a_successful_run_prints_its_result_and_nothing_on_stderr(tmp_path):
    src = tmp_path / "m.txt"
    src.write_text("1\n2\n3\n")
    r = run_mmd("run", str(src), env={"MMD_BACKEND": "auto", "MMD_LOG_LEVEL": "info"})
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.splitlines() == [
        f"{tmp_path / 'm.out'}  " + r.stdout.split("  ", 1)[1].splitlines()[0],
        str(tmp_path / "m.timing.yaml"),
    ]
    rec = yaml.safe_load((tmp_path / "m.timing.yaml").read_text())
    if rec["backend"] == "cpu":  # falling back is normal: said at info, seen with -v
        r = run_mmd("run", str(src), "-v", "--force", env={"MMD_BACKEND": "auto"})
        assert r.returncode == 0 and "using the cpu backend" in r.stderr


@pytest.mark.integration  # runs mmd as a real process
def test_run_refuses_a_bad_name_as_the_daemon_does(tmp_path):
    src = tmp_path / "a@kernel=bogus.txt"
    src.write_text("1\n2\n3\n")
    r = run_mmd("run", str(src))
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert "unknown kernel 'bogus'" in r.stderr and "choose one of naive" in r.stderr
    err = yaml.safe_load((tmp_path / "a@kernel=bogus.error.yaml").read_text())
    assert err["error"]["kind"] == "jobname" and not (tmp_path / "a@kernel=bogus.out").exists()


@pytest.mark.integration  # runs mmd as a real process
def test_run_takes_the_backend_from_the_name_without_trying_the_gpu(tmp_path):
    src = tmp_path / "b@backend=cpu.txt"
    src.write_text("1\n2\n3\n")
    # a GPU backend that cannot even be imported: the job must never ask for it
    r = run_mmd("run", str(src), "-v", env={"MMD_BACKEND": "cuda", "MMD_CUBLAS": "/nonexistent", "PYTHONPATH": ""})
    assert r.returncode == 0, r.stderr
    assert "backend fallback" not in r.stderr and "pycuda" not in r.stderr
    rec = yaml.safe_load((tmp_path / "b@backend=cpu.timing.yaml").read_text())
    assert rec["backend"] == "cpu" and rec["name_settings"] == {"backend": "cpu"}


@pytest.mark.integration  # runs mmd as a real process
def test_a_flag_may_repeat_a_name_setting_never_contradict_it(tmp_path):
    src = tmp_path / "c@tile=8.txt"
    src.write_text("1\n2\n3\n")
    assert run_mmd("run", str(src), "--tile", "8").returncode == 0
    r = run_mmd("run", str(src), "--tile", "16", "--force")
    assert r.returncode == 1 and "the file name sets tile=8 but the command line gives --tile 16" in r.stderr


@pytest.mark.integration  # runs mmd as a real process
def test_python_dash_m_and_version():
    r = run_mmd("--version")
    assert r.returncode == 0 and r.stdout.startswith("mmd ")


def test_job_request_and_limits_carry_every_job_setting(tmp_path):
    from pathlib import Path

    from mmd import config
    from mmd.job import describe
    from mmd.pipeline import limits_for

    s = config.Settings().replace(kernel="aplus", tile=16, memory="pitched", text_path="host", max_dim=100)
    r = describe(Path("m.txt"), Path("m.out"), s).request
    assert (r.kernel, r.tile, r.memory, r.text_path) == ("aplus", 16, "pitched", "host")
    r = describe(Path("m.txt"), Path("m.out"), s, flags={"tile": 8, "backend": "cpu", "kernel": None}).request
    assert (r.kernel, r.tile) == ("aplus", 8)
    limits = limits_for(s)
    assert limits.max_dim == 100 and limits.max_memory_bytes == config.physical_memory_bytes()


@pytest.mark.integration  # runs mmd as a real process
def test_an_unknown_flag_is_reported_by_its_sub_command(tmp_path):
    r = run_mmd("serve", "--frob", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("mmd serve: unrecognized arguments: --frob")
    assert r.stderr.count("\n") == 1 and "mmd serve --help" in r.stderr
    r = run_mmd("--frob", "run", "x.txt", cwd=tmp_path)  # before the sub-command: the top parser's own
    assert r.returncode == 2 and r.stderr.startswith("mmd: ")


@pytest.mark.integration
def test_make_demo_twice_shows_the_job_it_just_ran(tmp_path):
    """Issue 15: run twice, the demo showed the first run's sidecar (the new job went to sample.1.*)."""
    import shutil
    import sys

    shutil.copy(ROOT / "scripts" / "demo.sh", tmp_path / "demo.sh")
    env = mmd_env(MMD=f"{sys.executable} -m mmd", MMD_BACKEND="cpu")
    runs = [
        subprocess.run(["sh", "demo.sh"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        for _ in range(2)
    ]
    for r in runs:
        assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "outbox/sample.timing.yaml" in runs[0].stdout
    assert "outbox/sample.1.timing.yaml" in runs[1].stdout and "outbox/sample.1.out" in runs[1].stdout
    shown = yaml.safe_load(runs[1].stdout.split("outbox/sample.1.timing.yaml:\n", 1)[1])
    assert shown == yaml.safe_load((tmp_path / "outbox" / "sample.1.timing.yaml").read_text())


@pytest.mark.integration  # runs mmd as a real process
def test_kernels_without_a_gpu_names_no_gpu_s_limits(tmp_path):
    """Issue 15: with no GPU `mmd kernels` said "this GPU allows 1024"; the limits are every CUDA GPU's then."""
    r = run_mmd("kernels", cwd=tmp_path, env={"MMD_BACKEND": "auto"})
    assert r.returncode == 0 and r.stderr == ""
    if "no GPU here" not in r.stdout:
        pytest.skip("a GPU is here: its own limits are shown")
    assert "this GPU allows" not in r.stdout and "no CUDA GPU allows more than 1024" in r.stdout


@pytest.mark.integration  # runs mmd as a real process
def test_kernels_say_shared_memory_only_where_a_kernel_needs_some(tmp_path):
    """cublas_tf32 was said to need "0 bytes of shared memory per block"."""
    r = run_mmd("kernels", cwd=tmp_path, env={"MMD_BACKEND": "auto"})
    assert r.returncode == 0, r.stderr
    if "no GPU here" not in r.stdout:
        pytest.skip("a GPU is here: its own limits are checked instead")
    lines = {line.split()[0]: line for line in r.stdout.splitlines() if line and not line.startswith(" ")}
    assert lines["cublas_tf32"].endswith("no tile; needs TF32 tensor cores (compute capability 8.0+)"), lines
    assert "bytes of shared memory per block" in lines["tc1"]


def test_a_sub_command_s_options_are_added_when_it_is_parsed_or_shown():
    from mmd import bench, kernels
    from mmd.cli import build_parser

    shown = build_parser().commands["bench"]  # type: ignore[attr-defined]
    assert "--accuracy-ks" in shown.format_help() and "--plan" in shown.format_usage()
    args = build_parser().parse_args(["bench", "--plan", "ladder", "--sizes", "64"])
    assert args.plan == "ladder" and args.sizes == [64] and args.max_repeats == bench.MAX_REPEATS
    assert build_parser().parse_args(["kernels"]).tiles == [*kernels.TILES, 64]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--plan", "nope"])


@pytest.mark.integration  # runs mmd as a real process
def test_dash_means_stdout_for_gen_and_run(tmp_path):
    r = run_mmd("gen", "4", "--seed", "3", "-o", "-", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == "" and list(tmp_path.iterdir()) == []
    assert run_mmd("gen", "4", "--seed", "3", "-o", str(tmp_path / "m.txt")).returncode == 0
    assert r.stdout == (tmp_path / "m.txt").read_text()
    r = run_mmd("run", "m.txt", "-o", "-", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == "" and sorted(p.name for p in tmp_path.iterdir()) == ["m.txt"]
    mats = textformat.parse((tmp_path / "m.txt").read_bytes())
    assert r.stdout.encode() == textformat.format_reference(mats.a @ mats.b)


@pytest.mark.integration  # runs mmd as a real process
def test_a_second_run_does_not_replace_the_first_output_unless_forced(tmp_path):
    src = tmp_path / "x.txt"
    src.write_text("1\n2\n3\n")
    assert run_mmd("run", str(src)).returncode == 0
    (tmp_path / "x.out").write_text("the first run's product\n")
    r = run_mmd("run", str(src))
    assert r.returncode == 2 and "exists; give --force" in r.stderr and r.stderr.count("\n") == 1
    assert (tmp_path / "x.out").read_text() == "the first run's product\n"
    assert run_mmd("run", str(src), "--force").returncode == 0
    assert (tmp_path / "x.out").read_text() == "1\n  6.00\n"


@pytest.mark.integration  # runs mmd as a real process
def test_mmd_alone_prints_its_commands():
    r = run_mmd()
    assert r.returncode == 2 and r.stdout == "" and "usage: mmd" in r.stderr and "Traceback" not in r.stderr
    assert all(name in r.stderr for name in ("run", "gen", "check", "serve", "status"))


@pytest.mark.integration  # runs mmd as a real process
def test_run_on_a_device_or_fifo_refuses_and_writes_nothing_beside_it(tmp_path):
    """As root, `mmd run /dev/null` wrote /dev/null.error.yaml; a FIFO hung the run."""
    import os

    os.mkfifo(tmp_path / "f.txt")
    for path in ("/dev/null", str(tmp_path / "f.txt")):
        r = run_mmd("run", path, timeout=30)
        assert r.returncode == 2 and "not a regular file" in r.stderr and r.stderr.count("\n") == 1
    assert not os.path.exists("/dev/null.error.yaml") and os.listdir(tmp_path) == ["f.txt"]


@pytest.mark.integration  # runs mmd as a real process
def test_a_stray_mmd_variable_is_one_warning_line_not_a_failure(tmp_path):
    src = tmp_path / "m.txt"
    src.write_text("1\n2\n3\n")
    r = run_mmd("run", str(src), env={"MMD_TILES": "16"})
    warning = "mmd: warning: MMD_TILES is not an mmd setting; ignored (did you mean MMD_TILE?)\n"
    assert r.returncode == 0 and r.stderr == warning
    r = run_mmd("run", str(src), "--force", env={"MMD_TILE": "abc"})
    assert r.returncode == 78 and r.stderr == "mmd run: configuration: environment: MMD_TILE must be int, got 'abc'\n"


@pytest.mark.integration  # runs mmd as a real process
def test_help_is_plain_text_and_names_every_option():
    r = run_mmd("status", "--help")
    assert r.returncode == 0 and "``" not in r.stdout and ":class:" not in r.stdout
    gen = run_mmd("gen", "--help").stdout
    assert "--range LO HI values are drawn from LO to HI" in " ".join(gen.split())


def test_the_license_file_is_the_one_the_package_declares():
    import re

    declared = re.search(r'^license = "(.*)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    text = (ROOT / "LICENSE").read_text()
    assert declared == "MIT" and text.startswith("MIT License\n") and "Copyright (c) the mmd authors" in text


class _Ended(Exception):
    def __init__(self, status: int) -> None:
        self.status = status


@pytest.mark.parametrize("exiting", [False, True])
def test_mmd_run_leaves_its_backends_to_the_process_end_only_when_the_process_ends(tmp_path, monkeypatch, exiting):
    # the program (mmd.cli.entry) ends the process after mmd run without closing what the job opened (its
    # CUDA context and page-locked buffers go with the process); a caller's own process gets them closed
    from mmd import cli
    from mmd.backends import BackendPool

    closed: list[bool] = []
    real_close = BackendPool.close
    monkeypatch.setattr(BackendPool, "close", lambda self: (closed.append(True), real_close(self))[1])
    monkeypatch.setattr(cli.os, "_exit", lambda status: (_ for _ in ()).throw(_Ended(status)))
    src = tmp_path / "m.txt"
    assert cli.main(["gen", "8", "--seed", "1", "-q", "-o", str(src)]) == 0
    if exiting:
        with pytest.raises(_Ended) as ended:
            cli.main(["run", str(src), "--backend", "cpu"], exiting=True)
        assert ended.value.status == 0 and closed == []
        with pytest.raises(_Ended) as ended:  # a refusal's status ends it the same way
            cli.main(["run", str(tmp_path / "missing.txt")], exiting=True)
        assert ended.value.status == 2
    else:
        assert cli.main(["run", str(src), "--backend", "cpu"]) == 0 and closed == [True]
    assert (tmp_path / "m.out").read_bytes().startswith(b"8\n")
    # any other command returns as before, whatever the caller
    assert cli.main(["gen", "4", "--seed", "1", "-q", "-o", str(tmp_path / "n.txt")], exiting=exiting) == 0


@pytest.mark.integration  # runs mmd as a real process
def test_run_dash_reads_the_input_from_stdin(tmp_path):
    """`mmd run -`: the input from a pipe, the product to stdout and no sidecar, or to -o FILE with its sidecar."""
    data = run_mmd("gen", "5", "--seed", "2", "-o", "-").stdout.encode()
    mats = textformat.parse(data)

    def run(*args: str, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
        env = mmd_env({"MMD_LOG_FORMAT": "json", "MMD_BACKEND": "cpu"})
        argv = [sys.executable, "-m", "mmd", "run", *args]
        return subprocess.run(argv, cwd=tmp_path, env=env, input=stdin, capture_output=True, timeout=120)

    r = run("-", stdin=data)
    assert r.returncode == 0 and r.stderr == b"", r.stderr
    assert r.stdout == textformat.format_reference(mats.a @ mats.b)
    assert list(tmp_path.iterdir()) == [], "nothing kept beside: the product went to stdout"
    r = run("-", "-o", "m.out", stdin=data)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "m.out").read_bytes() == textformat.format_reference(mats.a @ mats.b)
    assert yaml.safe_load((tmp_path / "m.timing.yaml").read_text())["status"] == "ok"
    r = run("-", "-o", "m.out", stdin=data)
    assert r.returncode == 2 and b"exists; give --force" in r.stderr, "refused before reading"
    r = run("-", stdin=b"2\n1 2 3\n")
    assert r.returncode == 1 and r.stdout == b"" and r.stderr.count(b"\n") == 1
    assert r.stderr.startswith(b"mmd run: stdin: line 2: "), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.out", "m.timing.yaml"]


@pytest.mark.integration  # runs mmd as a real process
@pytest.mark.parametrize("unbuffered", ["", "1"], ids=["buffered", "unbuffered"])  # PYTHONUNBUFFERED
@pytest.mark.parametrize(
    "argv",
    [
        ["gen", "300", "--seed", "1", "-o", "-"],  # stopped in its writing
        ["kernels"],  # buffered, a short output is written as the process ends
        ["run", "m.txt", "-o", "-"],
        ["--help"],
    ],
    ids=["gen", "kernels", "run", "help"],
)
def test_a_reader_that_stops_ends_the_command_quietly(tmp_path, argv, unbuffered):
    """`mmd gen 300 -o - | head -1`: the reader closed its end; mmd stops with 141, as a shell reports SIGPIPE."""
    (tmp_path / "m.txt").write_bytes(run_mmd("gen", "40", "--seed", "1", "-o", "-").stdout.encode())
    env = mmd_env({"MMD_LOG_FORMAT": "json", "MMD_BACKEND": "cpu", "PYTHONUNBUFFERED": unbuffered})
    argv = [sys.executable, "-m", "mmd", *argv]
    with subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        if argv[3] == "gen":
            assert proc.stdout.readline() == b"300\n"
        proc.stdout.close()  # `head -1` exits: the pipe's reading end closes
        err = proc.stderr.read()
        status = proc.wait(timeout=120)
    # argparse drops a failed write of its help itself (unbuffered, the write fails there): done, then
    assert status == (0 if argv[3] == "--help" and unbuffered else 141) and err == b"", err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.txt"]


def test_help_names_the_commands_or_shows_one(capsys):
    """`mmd help` is `mmd --help` on stdout, `mmd help run` is `mmd run --help`."""
    from mmd.cli import COMMANDS, main

    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    top = capsys.readouterr().out
    assert main(["help"]) == 0
    assert capsys.readouterr() == (top, "")
    assert all(f"\n    {name}" in top for name in (*COMMANDS, "help")), top
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    run_help = capsys.readouterr().out
    assert main(["help", "run"]) == 0
    assert capsys.readouterr() == (run_help, "")
    assert "usage: mmd run" in run_help


@pytest.mark.integration  # runs mmd as a real process
def test_serve_says_serving_before_any_job_and_its_fallback_once(tmp_path):
    """Three workers falling back from auto to the cpu: one "backend fallback" line, then "serving", then jobs."""
    (tmp_path / "in").mkdir()
    for i in range(6):
        (tmp_path / "in" / f"a{i}.txt").write_text("1\n2\n3\n")
    env = {"MMD_DEVICES": "0", "MMD_WORKERS_PER_DEVICE": "3"}
    r = run_mmd("serve", "--inbox", "in", "--outbox", "out", "--create", "--once", "--backend", "auto", cwd=tmp_path,
                env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    events = [json.loads(line)["event"] for line in r.stderr.splitlines()]
    if "backend fallback" not in events:
        pytest.skip("a GPU is usable here: no worker falls back")
    assert events.count("backend fallback") == 1, events
    assert events.index("serving") < events.index("job done") and events.count("job done") == 6, events
