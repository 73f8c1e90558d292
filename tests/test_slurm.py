"""mmd.slurm and `mmd submit`: the script's text, and the script run as Slurm would run it.

Slurm is not needed: each array task is run with bash and SLURM_ARRAY_TASK_ID set,
which is what slurmd does for a batch step. The one test against a real Slurm is
skipped unless sbatch is on PATH and a controller answers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from mmd import slurm, textformat, textoutput
from mmd.check import full
from mmd.errors import KernelFileError, OutputError, UnreadableError, UsageError
from mmd.generate import input_chunks, random_matrix

from .conftest import ROOT, run_mmd

#: Real processes and daemons: left out of `make quick`, run by `make test`.
# The real-Slurm tests share one cluster, whose MaxArraySize and throttle they count on: alone.
pytestmark = [pytest.mark.integration, pytest.mark.serial]

#: File names a user may well have: spaces, a leading dash, shell syntax, quotes, non-ASCII.
HOSTILE = ["-rf x.txt", "a b.txt", "$(touch PWNED).txt", "it's `x`.txt", "--help.txt", "tab\there.txt", "ünï.txt"]


def make_input(path: Path, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a, b = random_matrix(rng, n, n), random_matrix(rng, n, n)
    path.write_bytes(b"".join(input_chunks(a, b, square=True)))
    return a, b


def task_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MMD_", "SLURM_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["MMD_LOG_FORMAT"] = "json"
    env.update(extra)
    return env


def on_path(tmp_path: Path, name: str, script: str, path: str) -> str:
    """Write ``script`` as the command ``name`` in ``tmp_path/bin``; ``path`` with that folder first."""
    command = tmp_path / "bin" / name
    command.parent.mkdir(exist_ok=True)
    command.write_text(script)
    command.chmod(0o755)
    return f"{command.parent}{os.pathsep}{path}"


def cpu_options(**kw) -> slurm.ArrayOptions:
    return slurm.ArrayOptions(**{"settings": (("backend", "cpu"),), "mmd": (sys.executable, "-m", "mmd"), **kw})


# ---------------------------------------------------------------------------
# the folder


def test_list_jobs_follows_the_inbox_rules(tmp_path):
    for name in ("b.txt", "a.txt", ".hidden", "x.part", "y.tmp", "z~"):
        (tmp_path / name).write_text("1\n1\n1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "deep.txt").write_text("1\n1\n1\n")
    (tmp_path / "link.txt").symlink_to(tmp_path / "a.txt")
    (tmp_path / "sub" / "hard.src").write_text("1\n1\n1\n")
    os.link(tmp_path / "sub" / "hard.src", tmp_path / "hard.txt")
    listing = slurm.list_jobs(tmp_path)
    assert [p.name for p in listing.jobs] == ["a.txt", "b.txt"]
    assert all(p.is_absolute() for p in listing.jobs)
    assert set(listing.skipped) == {"link.txt", "hard.txt"}  # what the daemon refuses unread


def test_list_jobs_refuses_line_breaks_and_missing_folders(tmp_path):
    (tmp_path / "two\nlines.txt").write_text("1\n1\n1\n")
    with pytest.raises(slurm.SubmitError, match="line break"):
        slurm.list_jobs(tmp_path)
    with pytest.raises(UnreadableError, match="no such folder"):
        slurm.list_jobs(tmp_path / "nope")
    with pytest.raises(slurm.SubmitError, match="line break"):
        slurm.manifest_bytes([Path("/x/a\rb.txt")])


def test_outputs_are_versioned_like_the_daemons(tmp_path):
    outbox = tmp_path / "out"
    outbox.mkdir()
    (outbox / "m.out").write_text("old")
    (outbox / "q.error.yaml").write_text("old")
    jobs = [tmp_path / n for n in ("m.txt", "m.dat", "p.txt", "q.txt")]
    tasks = slurm.plan_tasks(jobs, outbox)
    assert [t.output.name for t in tasks] == ["m.1.out", "m.2.out", "p.out", "q.1.out"]
    assert len({t.output for t in tasks}) == len(tasks)


# ---------------------------------------------------------------------------
# the script's text


def plan_for(tmp_path: Path, names: list[str], options: slurm.ArrayOptions) -> slurm.ArrayPlan:
    jobs = tmp_path / "jobs"
    jobs.mkdir(exist_ok=True)
    for name in names:
        (jobs / name).write_text("1\n2\n3\n")
    plan, _ = slurm.make_plan(jobs, tmp_path / "outbox", options, tmp_path / "sub" / "job.sbatch")
    return plan


def sbatch_lines(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line[len("#SBATCH ") :].partition("=")
            out[key] = value
    return out


def test_script_header_carries_every_option(tmp_path):
    names = [f"j{i:03d}.txt" for i in range(300)]
    opts = slurm.ArrayOptions(
        job_name="mm-run",
        passed=(
            ("time", "01:30:00"),
            ("partition", "gpu"),
            ("account", "cs101"),
            ("qos", "high"),
            ("mem", "16G"),
            ("cpus-per-task", "4"),
            ("constraint", "[a100|h100]&ib"),
        ),
        max_parallel=8,
        settings=(("backend", "cuda"), ("kernel", "tiled"), ("tile", "16")),
        mmd=("mmd",),
    )
    plan = plan_for(tmp_path, names, opts)
    text = slurm.render_script(plan)
    assert text.startswith("#!/bin/bash\n")
    assert sbatch_lines(text) == {
        "--job-name": "mm-run",
        "--array": "0-299%8",
        "--output": f"{tmp_path}/sub/logs/%A_%a.log",
        "--export": ",".join(slurm.PASSED_ENV),
        "--gres": "gpu:1",
        "--time": "01:30:00",
        "--partition": "gpu",
        "--account": "cs101",
        "--qos": "high",
        "--mem": "16G",
        "--cpus-per-task": "4",
        "--constraint": "[a100|h100]&ib",
    }
    # every #SBATCH line comes before the first command (sbatch stops reading at it)
    first_command = next(i for i, ln in enumerate(text.splitlines()) if ln and not ln.startswith("#"))
    assert all(i < first_command for i, ln in enumerate(text.splitlines()) if ln.startswith("#SBATCH"))
    assert "export MMD_BACKEND=cuda\nexport MMD_KERNEL=tiled\nexport MMD_TILE=16\n" in text
    assert 'exec mmd run -o "$output" -- "$input"' in text
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_script_without_gres_throttle_or_limits(tmp_path):
    plan = plan_for(tmp_path, ["only.txt"], slurm.ArrayOptions(gres=None, mmd=("mmd",)))
    assert sbatch_lines(slurm.render_script(plan)) == {
        "--job-name": "mmd",
        "--array": "0",
        "--output": f"{tmp_path}/sub/logs/%A_%a.log",
        "--export": ",".join(slurm.PASSED_ENV),
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"passed": (("time", "1h"),)}, "--time"),
        ({"passed": (("partition", "gpu; rm"),)}, "--partition"),
        ({"passed": (("account", "a b"),)}, "--account"),
        ({"passed": (("qos", "x#y"),)}, "--qos"),
        ({"passed": (("mem", "4 GB"),)}, "--mem"),
        ({"passed": (("mem", "-1"),)}, "--mem"),
        ({"passed": (("cpus-per-task", "0"),)}, "--cpus-per-task"),
        ({"passed": (("cpus-per-task", "two"),)}, "--cpus-per-task"),
        ({"passed": (("constraint", "a100 --uid=0"),)}, "--constraint"),
        ({"passed": (("constraint", "a'b"),)}, "--constraint"),
        ({"passed": (("nodelist", "n1"),)}, "nodelist"),
        ({"job_name": "x\ny"}, "--job-name"),
        ({"gres": "gpu:1 --uid=0"}, "--gres"),
        ({"max_parallel": 0}, "--max-parallel"),
    ],
)
def test_bad_sbatch_values_are_refused(tmp_path, change, message):
    with pytest.raises(UsageError, match=message):
        plan_for(tmp_path, ["a.txt"], slurm.ArrayOptions(mmd=("mmd",), **change))


def test_log_folder_that_sbatch_cannot_read_is_refused(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "a.txt").write_text("1\n1\n1\n")
    for bad in ("with space", "pct%A"):
        with pytest.raises(UsageError, match="#SBATCH"):
            slurm.make_plan(tmp_path / "jobs", tmp_path / "o", cpu_options(), tmp_path / bad / "job.sbatch")


def test_hostile_names_reach_the_manifest_verbatim_and_the_script_quotes_everything(tmp_path):
    opts = slurm.ArrayOptions(mmd=("/opt/my python/bin/python3", "-m", "mmd"), config=Path("/etc/my mmd/it's.yaml"))
    plan = plan_for(tmp_path, HOSTILE, opts)
    plan = slurm.write(plan).plan
    lines = plan.manifest.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == len(HOSTILE) + 1
    assert sorted(os.fsdecode(ln) for ln in lines[:-1]) == sorted(str(tmp_path / "jobs" / n) for n in HOSTILE)
    outs = [os.fsdecode(ln) for ln in plan.outputs.read_bytes().split(b"\n")[:-1]]
    # the daemon's output names: controls (the tab) become "_"
    assert sorted(Path(o).name for o in outs) == sorted(n[: -len(".txt")].replace("\t", "_") + ".out" for n in HOSTILE)
    text = plan.script.read_text()
    assert 'exec \'/opt/my python/bin/python3\' -m mmd run -o "$output" -- "$input"' in text
    assert "export MMD_CONFIG='/etc/my mmd/it'\"'\"'s.yaml'" in text
    for name in HOSTILE:
        assert name not in text, "names live in the manifest, never in the script"
    assert os.access(plan.script, os.X_OK)


# ---------------------------------------------------------------------------
# the script, run as slurmd runs it: bash, once per task id


def run_task(script: Path, task: int | None, cwd: Path) -> subprocess.CompletedProcess:
    env = task_env() if task is None else task_env(SLURM_ARRAY_TASK_ID=str(task))
    return subprocess.run(["bash", str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_every_task_of_the_array_runs_its_file(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    inputs = {name: make_input(jobs / name, 6 + i, i) for i, name in enumerate(HOSTILE)}
    (jobs / ".ignored").write_text("not a job")
    outbox = tmp_path / "outbox"
    plan, _ = slurm.make_plan(jobs, outbox, cpu_options(max_parallel=2), tmp_path / "sub" / "job.sbatch")
    plan = slurm.write(plan).plan
    cwd = tmp_path / "elsewhere"  # tasks must not depend on the submit folder
    cwd.mkdir()
    for task in range(len(plan.tasks)):
        r = run_task(plan.script, task, cwd)
        assert r.returncode == 0, r.stderr
    for task in plan.tasks:
        a, b = inputs[task.input.name]
        report = full.against_inputs(textoutput.parse_output(task.output.read_bytes()), a, b)
        assert report.ok, f"{task.input.name}: {report.summary()}"
        rec = yaml.safe_load(task.output.with_name(task.output.stem + ".timing.yaml").read_text())
        assert rec["status"] == "ok" and rec["backend"] == "cpu"
    assert sorted(p.name for p in outbox.glob("*.out")) == sorted(t.output.name for t in plan.tasks)
    assert not list(tmp_path.rglob("PWNED")), "a file name was executed"

    past_end = run_task(plan.script, len(plan.tasks), cwd)
    assert past_end.returncode == 2 and "no line" in past_end.stderr
    no_slurm = run_task(plan.script, None, cwd)
    assert no_slurm.returncode != 0 and "SLURM_ARRAY_TASK_ID" in no_slurm.stderr


def test_a_task_runs_the_job_the_daemon_makes_of_the_same_file(tmp_path):
    """A file's name settings beat the batch's, in a task as in the daemon: the same job description."""
    from mmd import config, daemon

    jobs, inbox = tmp_path / "jobs", tmp_path / "inbox"
    jobs.mkdir()
    inbox.mkdir()
    name = "m@kernel=cpu,tile=8.txt"
    for folder in (jobs, inbox):
        make_input(folder / name, 5, 1)
    opts = cpu_options(settings=(("backend", "cpu"), ("kernel", "tiled"), ("tile", "16")))
    plan, _ = slurm.make_plan(jobs, tmp_path / "outbox", opts, tmp_path / "s" / "job.sbatch")
    plan = slurm.write(plan).plan
    assert run_task(plan.script, 0, tmp_path).returncode == 0
    served = config.Settings(
        inbox=inbox,
        outbox=tmp_path / "served",
        backend="cpu",
        kernel="tiled",
        tile=16,
        quiet_seconds=0.05,
        create_folders=True,
    )
    assert daemon.Daemon(served).serve(once=True) == 0
    task = yaml.safe_load((tmp_path / "outbox" / "m@kernel=cpu,tile=8.timing.yaml").read_text())
    dropped = yaml.safe_load((tmp_path / "served" / "m@kernel=cpu,tile=8.timing.yaml").read_text())
    for key in ("name_settings", "requested", "backend", "kernel", "tile", "shape"):
        assert task[key] == dropped[key], key
    assert task["name_settings"] == {"kernel": "cpu", "tile": 8}
    assert task["requested"] == {"kernel": "cpu", "tile": 8, "memory": "device"}


def test_a_refused_input_fails_its_task_with_an_error_sidecar(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "bad.txt").write_text("2\n1 2 3\n")
    plan, _ = slurm.make_plan(jobs, tmp_path / "outbox", cpu_options(), tmp_path / "s" / "job.sbatch")
    plan = slurm.write(plan).plan
    r = run_task(plan.script, 0, tmp_path)
    assert r.returncode == 1
    assert yaml.safe_load((tmp_path / "outbox" / "bad.error.yaml").read_text())["status"] == "error"


# ---------------------------------------------------------------------------
# a kernel file: copied beside the script, the copy run by every task

#: The course's square kernel, as the stand-in GPU runs it (tests/fakegpu: C += A·B by its entry's name).
SQUARE = """\
__global__ void square(float* M, float* N, float* P, int Width) {
    int Row = blockIdx.y * blockDim.y + threadIdx.y;
    int Col = blockIdx.x * blockDim.x + threadIdx.x;
    for (int k = 0; k < Width; ++k) P[Row * Width + Col] += M[Row * Width + k] * N[k * Width + Col];
}
"""
#: The stand-in GPU (tests/fakegpu) first on a task's path: the kernel file's launch process imports its pycuda.
FAKE_GPU_PATH = f"{ROOT / 'tests' / 'fakegpu'}{os.pathsep}{ROOT}"


def kernel_file(folder: Path, name: str = "p1.cu", declaration: str | None = "entry: square\n") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(SQUARE, encoding="utf-8")
    if declaration is not None:
        path.with_name(name[: -len(".cu")] + ".kernel.yaml").write_text(declaration, encoding="utf-8")
    return path


def integer_input(path: Path, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Whole numbers: every sum is exact in float32, so the kernel's bytes are numpy's."""
    rng = np.random.default_rng(seed)
    a, b = (rng.integers(-4, 5, (n, n)).astype(np.float32) for _ in range(2))
    path.write_bytes(b"".join(input_chunks(a, b, square=True)))
    return a, b


def test_a_kernel_file_travels_beside_the_script_and_every_task_runs_the_copy(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    inputs = {name: integer_input(jobs / name, 5 + i, i) for i, name in enumerate(["a.txt", "b c.txt"])}
    source = kernel_file(tmp_path / "hw", "$(touch PWNED) p1.cu")  # the file's name is the user's, as a job's is
    original = source.read_bytes()
    opts = slurm.ArrayOptions(mmd=(sys.executable, "-m", "mmd"), settings=(("tile", "4"),), kernel_file=source)
    plan, _ = slurm.make_plan(jobs, tmp_path / "outbox", opts, tmp_path / "sub" / "job.sbatch")
    plan = slurm.write(plan).plan
    copy = plan.script.parent / "job.sbatch.kernel" / source.name
    assert plan.kernel_copy == copy and copy.read_bytes() == original
    assert (copy.parent / "$(touch PWNED) p1.kernel.yaml").read_text() == "entry: square\n"
    text = plan.script.read_text()
    sha = hashlib.sha256(original).hexdigest()
    assert f"# Every task runs the kernel file '$(touch PWNED) p1.cu' (sha256 {sha})," in text
    assert f"kernel_file={shlex.quote(str(copy))}\n" in text
    assert f'exec {shlex.join([sys.executable, "-m", "mmd"])} run --kernel-file "$kernel_file" -o "$output"' in text
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    source.write_text("// changed after the submission\n" + SQUARE, encoding="utf-8")  # the copy is what runs
    for task in range(len(plan.tasks)):
        env = task_env(SLURM_ARRAY_TASK_ID=str(task), PYTHONPATH=FAKE_GPU_PATH)
        r = subprocess.run(["bash", str(plan.script)], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    for task in plan.tasks:
        a, b = inputs[task.input.name]
        assert task.output.read_bytes() == b"".join(textformat.emit_chunks(np.matmul(a, b)))
        rec = yaml.safe_load(task.output.with_name(task.output.stem + ".timing.yaml").read_text())
        assert (rec["kernel"], rec["tile"], rec["kernel_file"]["sha256"]) == (source.name, 4, sha)
    assert not list(tmp_path.rglob("PWNED")), "a file name was executed"


def test_a_kernel_file_is_refused_at_submission_not_in_every_task(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "m.txt").write_text("1\n1\n1\n")
    k = kernel_file(tmp_path / "hw", declaration=None)
    out = tmp_path / "out"
    with_kernel = slurm.ArrayOptions(settings=(("kernel", "tiled"),), kernel_file=k)
    with pytest.raises(UsageError, match=r"--kernel .* or --kernel-file, not both"):
        slurm.make_plan(jobs, out, with_kernel)
    with pytest.raises(UsageError, match="a kernel file runs on a GPU"):
        slurm.make_plan(jobs, out, slurm.ArrayOptions(settings=(("backend", "cpu"),), kernel_file=k))
    bad = tmp_path / "hw" / "bad.cu"
    bad.write_text('#include "/etc/shadow"\n' + SQUARE, encoding="utf-8")
    with pytest.raises(KernelFileError, match=r"bad\.cu:1:"):
        slurm.make_plan(jobs, out, slurm.ArrayOptions(kernel_file=bad))
    assert not out.exists()
    # --script-out beside another submission's kernel: theirs is never replaced, and nothing of this one stays
    taken = tmp_path / "s" / "job.sbatch.kernel"
    taken.mkdir(parents=True)
    (taken / "p1.cu").write_text("theirs")
    plan, _ = slurm.make_plan(jobs, out, slurm.ArrayOptions(kernel_file=k), tmp_path / "s" / "job.sbatch")
    with pytest.raises(OutputError, match="another submission's kernel file"):
        slurm.write(plan)
    assert (taken / "p1.cu").read_text() == "theirs" and sorted(p.name for p in (tmp_path / "s").iterdir()) == [
        "job.sbatch.kernel"
    ]
    r = run_mmd("submit", "--slurm", "jobs", "--kernel-file", "none.cu", cwd=tmp_path)
    assert r.returncode == 2 and "--kernel-file" in r.stderr and "no such file" in r.stderr
    r = run_mmd("submit", "--slurm", "jobs", "--kernel-file", str(k), "--backend", "cpu", cwd=tmp_path)
    assert r.returncode == 2 and "a kernel file runs on a GPU" in r.stderr


# ---------------------------------------------------------------------------
# the command


def test_submit_writes_the_script_and_says_how_to_submit(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    make_input(jobs / "m.txt", 4, 1)
    (jobs / "l.txt").symlink_to(jobs / "m.txt")
    r = run_mmd("submit", "--slurm", "jobs", "--outbox", "out", "--tile", "16", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    scripts = list((tmp_path / "out" / "slurm").glob("*/job.sbatch"))
    assert len(scripts) == 1
    assert f"submit with: sbatch {scripts[0]}" in r.stdout
    assert "skipped 'l.txt'" in r.stderr
    text = scripts[0].read_text()
    assert "#SBATCH --gres=gpu:1" in text and "export MMD_BACKEND=cuda\nexport MMD_TILE=16\n" in text


def test_every_submission_has_its_own_folder(tmp_path):
    """Two plans made in the same second (one default folder name) are written to two folders, each whole."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    make_input(jobs / "a.txt", 4, 1)
    plan, _ = slurm.make_plan(jobs, tmp_path / "out", cpu_options())
    first = slurm.write(plan).plan
    (jobs / "a.txt").rename(jobs / "b.txt")
    again, _ = slurm.make_plan(jobs, tmp_path / "out", cpu_options())
    second = slurm.write(dataclasses.replace(again, script=plan.script)).plan  # the same second's name
    assert first.script.parent != second.script.parent
    assert first.manifest.read_text() == f"{jobs / 'a.txt'}\n"
    assert second.manifest.read_text() == f"{jobs / 'b.txt'}\n"
    assert str(second.manifest) in second.script.read_text()
    folders = sorted(p.name for p in (tmp_path / "out" / "slurm").iterdir())
    assert folders == [first.script.parent.name, second.script.parent.name], "named in the order they were made"


def test_submissions_in_a_loop_make_one_folder_each(tmp_path, capsys):
    from mmd.cli import main

    for i in range(4):
        (tmp_path / f"jobs{i}").mkdir()
        make_input(tmp_path / f"jobs{i}" / f"m{i}.txt", 4, i)
        assert main(["submit", "--slurm", str(tmp_path / f"jobs{i}"), "--outbox", str(tmp_path / "out")]) == 0
    manifests = sorted((tmp_path / "out" / "slurm").glob("*/job.sbatch.manifest"))
    assert [Path(m.read_text().strip()).name for m in manifests] == ["m0.txt", "m1.txt", "m2.txt", "m3.txt"]


def test_submit_passes_site_options_onto_the_scripts_sbatch_lines(tmp_path):
    (tmp_path / "jobs").mkdir()
    make_input(tmp_path / "jobs" / "m.txt", 4, 1)
    site = ["--mem", "16G", "--cpus-per-task", "4", "--constraint", "a100|h100", "--qos", "short", "--account", "cs"]
    r = run_mmd("submit", "--slurm", "jobs", "--outbox", "out", "--script-out", "s/job.sbatch", *site, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = sbatch_lines((tmp_path / "s" / "job.sbatch").read_text())
    assert {k: lines[k] for k in ("--mem", "--cpus-per-task", "--constraint", "--qos", "--account")} == {
        "--mem": "16G",
        "--cpus-per-task": "4",
        "--constraint": "a100|h100",
        "--qos": "short",
        "--account": "cs",
    }
    for bad in (["--mem", "lots"], ["--cpus-per-task", "-2"], ["--constraint", "a b"], ["--qos", "a;b"]):
        r = run_mmd("submit", "--slurm", "jobs", "--outbox", "bad", *bad, cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and bad[0] in r.stderr, (bad, r.stderr)
        assert not (tmp_path / "bad").exists()


def test_resubmitting_names_the_file_that_shows_a_job_finished(tmp_path):
    """A refused job finished with its error sidecar: that is the file named, not the output it never wrote."""
    (tmp_path / "jobs").mkdir()
    make_input(tmp_path / "jobs" / "good.txt", 4, 1)
    (tmp_path / "jobs" / "bad.txt").write_text("2\n1 2 3\n")
    mmd = f"{shlex.quote(sys.executable)} -m mmd"
    r = run_mmd("submit", "--slurm", "jobs", "--outbox", "out", "--backend", "cpu", "--mmd", mmd, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (script,) = (tmp_path / "out" / "slurm").glob("*/job.sbatch")
    for task in (0, 1):  # as slurmd runs them
        run_task(script, task, tmp_path)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "bad.error.yaml", "good.out", "good.timing.yaml", "slurm"
    ]  # fmt: skip
    r = run_mmd("submit", "--slurm", "jobs", "--outbox", "out", "--backend", "cpu", cwd=tmp_path)
    assert r.returncode == 0 and "nothing to submit" in r.stdout, r.stderr
    out = tmp_path / "out"
    assert r.stderr.splitlines() == [
        f"mmd submit: skipped 'bad.txt': finished already by an earlier submission: {out / 'bad.error.yaml'} (--redo "
        "runs it again)",
        f"mmd submit: skipped 'good.txt': finished already by an earlier submission: {out / 'good.out'} (--redo "
        "runs it again)",
    ]


def test_submit_without_sbatch_is_one_line(tmp_path):
    (tmp_path / "jobs").mkdir()
    make_input(tmp_path / "jobs" / "m.txt", 4, 1)
    r = run_mmd("submit", "--slurm", "jobs", "--submit", cwd=tmp_path, env={"PATH": str(tmp_path / "nothing")})
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "sbatch not found on PATH" in r.stderr, r.stderr


def test_submit_runs_sbatch_and_prints_the_job_id(tmp_path):
    (tmp_path / "jobs").mkdir()
    make_input(tmp_path / "jobs" / "m.txt", 4, 1)
    args = shlex.quote(str(tmp_path / "args"))
    sbatch = f'#!/bin/sh\nprintf "%s\\n" "$@" > {args}\necho "4242;mmdtest"\n'
    r = run_mmd(
        "submit",
        "--slurm",
        "jobs",
        "--gres",
        "none",
        "--script-out",
        "s/job.sbatch",
        "--submit",
        cwd=tmp_path,
        env={"PATH": on_path(tmp_path, "sbatch", sbatch, os.environ["PATH"])},
    )
    assert r.returncode == 0, r.stderr
    assert "submitted job array 4242" in r.stdout
    assert (tmp_path / "args").read_text().splitlines() == ["--parsable", str(tmp_path / "s" / "job.sbatch")]
    assert "--gres" not in (tmp_path / "s" / "job.sbatch").read_text()


def test_submit_that_sbatch_refuses_leaves_nothing(tmp_path):
    """No controller: sbatch is there but fails. The submission never reached Slurm, so nothing of it stays."""
    (tmp_path / "jobs").mkdir()
    make_input(tmp_path / "jobs" / "m.txt", 4, 1)
    sbatch = (
        "#!/bin/sh\necho 'sbatch: error: Batch job submission failed: Unable to contact slurm controller "
        "(connect failure)' >&2\nexit 1\n"
    )
    env = {"PATH": on_path(tmp_path, "sbatch", sbatch, os.environ["PATH"])}
    r = run_mmd("submit", "--slurm", "jobs", "--outbox", "out", "--submit", cwd=tmp_path, env=env)
    assert r.returncode == 1
    assert "mmd submit: sbatch refused the script: " in r.stderr and "Unable to contact slurm controller" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == "", "no script is named: none is left"
    assert not (tmp_path / "out").exists(), sorted(str(p) for p in (tmp_path / "out").rglob("*"))
    (tmp_path / "out" / "slurm").mkdir(parents=True)  # an outbox that was there stays, and so do its folders
    r = run_mmd("submit", "--slurm", "jobs", "--outbox", "out", "--submit", cwd=tmp_path, env=env)
    assert r.returncode == 1 and list((tmp_path / "out").rglob("*")) == [tmp_path / "out" / "slurm"]


def test_submit_refuses_an_empty_folder(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "x.part").write_text("")
    r = run_mmd("submit", "--slurm", "jobs", cwd=tmp_path)
    assert r.returncode == 1 and "no job files in jobs" in r.stderr


# ---------------------------------------------------------------------------
# pure parts of submitting and of --status


def test_chunks_fit_max_array_size():
    assert slurm.chunks(3, 1001) == [(0, 3)]
    assert slurm.chunks(10, 8) == [(0, 8), (8, 2)]
    assert slurm.chunks(16, 8) == [(0, 8), (8, 8)]
    with pytest.raises(slurm.SubmitError):
        slurm.chunks(3, 0)


def test_sbatch_argv_gives_each_array_its_offset_and_chains_throttled_arrays(tmp_path):
    script = tmp_path / "job.sbatch"
    opts = slurm.ArrayOptions(max_parallel=2)
    assert slurm.sbatch_argv(script, 3, 0, 3, opts, None) == ["--parsable", str(script)]
    assert slurm.sbatch_argv(script, 10, 8, 2, opts, "41") == [
        "--parsable",
        "--array=0-1%2",
        "--dependency=afterany:41",
        str(script),
        "8",
    ]


def test_parse_squeue_expands_pending_ranges():
    text = "7|0|COMPLETED|None\n7|1|FAILED|NonZeroExitCode\n7|2-4%1|PENDING|JobArrayTaskLimit\n"
    states = slurm.parse_squeue(text)
    assert states[("7", 0)].state == "COMPLETED"
    assert states[("7", 1)] == slurm.TaskState("FAILED", "NonZeroExitCode", None)
    assert [states[("7", t)].reason for t in (2, 3, 4)] == ["JobArrayTaskLimit"] * 3


def test_script_asks_for_gpus_the_chosen_way_and_runs_mmd_from_path(tmp_path):
    text = slurm.render_script(plan_for(tmp_path, ["a.txt"], slurm.ArrayOptions(gres=None, gpus=1)))
    assert sbatch_lines(text)["--gpus"] == "1" and "--gres" not in sbatch_lines(text)
    assert 'exec mmd run -o "$output" -- "$input"' in text
    assert sys.executable not in text, "the submitting Python is no default for the nodes"
    assert sbatch_lines(text)["--export"] == ",".join(slurm.PASSED_ENV)
    with pytest.raises(UsageError, match="--gpus and --gres"):
        plan_for(tmp_path, ["a.txt"], slurm.ArrayOptions(gpus=1))


def test_submit_help_names_the_real_defaults(tmp_path):
    r = run_mmd("submit", "--help", cwd=tmp_path)
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "None" not in text
    assert "default: mmd, on the nodes' PATH" in text and "--gpus N" in text and "--status JOBID" in text
    for option in slurm.PASSED_OPTIONS:
        assert f"--{option.name} {option.metavar} {option.help}" in text


def test_a_missing_mmd_is_one_clear_line_in_the_tasks_log(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    make_input(jobs / "m.txt", 4, 1)
    plan, _ = slurm.make_plan(jobs, tmp_path / "out", slurm.ArrayOptions(mmd=("no-such-mmd",)), tmp_path / "s" / "j")
    plan = slurm.write(plan).plan
    r = run_task(plan.script, 0, tmp_path)
    assert r.returncode == 127, r.stderr
    assert r.stderr.startswith("mmd task 0: 'no-such-mmd' is not a command on "), r.stderr


# ---------------------------------------------------------------------------
# a real Slurm: scripts/slurm_up.sh's one-node cluster (SLURM_CONF), which .ci/run brings up


def _slurm_up() -> bool:
    if not (shutil.which("sbatch") and shutil.which("scontrol") and shutil.which("squeue")):
        return False
    try:
        r = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and " is UP" in r.stdout


real_slurm = pytest.mark.skipif(
    not _slurm_up(),
    reason="needs a Slurm controller that answers `scontrol ping`: "
    'eval "$(bash scripts/slurm_up.sh)" starts one here (.ci/run does)',
)


def cluster_env(**extra: str) -> dict[str, str]:
    """The submitting shell: this venv's `mmd` first on PATH (the node is this machine), no MMD_* of ours."""
    env = task_env(**extra)
    env.pop("PYTHONPATH", None)  # the tasks find mmd by PATH, as on a cluster
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return env


def squeue(*args: str) -> str:
    return subprocess.run(["squeue", "-h", "-r", *args], capture_output=True, text=True, timeout=30).stdout


def submit_real(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, list[str]]:
    r = run_mmd(
        "submit", "--slurm", "jobs", "--outbox", "out", "--backend", "cpu", "--time", "00:05:00", "--submit",
        *args, cwd=cwd, env=env or cluster_env(),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("submitted job array"))
    return r, line.split(":")[0].split(" ", 3)[3].split(", ")


def wait_done(jobs: list[str], within: float = 120, every=None) -> None:
    """Until Slurm lists no task of ``jobs`` as pending or running; ``every`` sees each poll's squeue lines."""
    end = time.monotonic() + within
    while lines := squeue("-j", ",".join(jobs), "-t", "PENDING,RUNNING,CONFIGURING,COMPLETING", "-o", "%i|%T|%r"):
        if every is not None:
            every(lines)
        if time.monotonic() > end:
            subprocess.run(["scancel", *jobs])
            pytest.fail(f"job arrays {jobs} did not finish within {within:g} s")
        time.sleep(0.05)


def status(cwd: Path, job: str) -> subprocess.CompletedProcess:
    return run_mmd("submit", "--status", job, "--outbox", "out", cwd=cwd, env=cluster_env())


def rectangular_input(path: Path, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a, b = rng.integers(-9, 9, (3, 5)).astype(np.float32), rng.integers(-9, 9, (5, 2)).astype(np.float32)
    path.write_bytes(b"".join(input_chunks(a, b, square=False)))
    return a, b


@pytest.mark.integration
@real_slurm
@pytest.mark.parametrize("request_gpu", [(), ("--gpus", "1")], ids=["gres", "gpus"])
def test_real_slurm_runs_good_refused_and_rectangular_inputs(tmp_path, request_gpu):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    inputs = {"a.txt": make_input(jobs / "a.txt", 8, 1), "b c.txt": make_input(jobs / "b c.txt", 5, 2)}
    inputs["r.txt"] = rectangular_input(jobs / "r.txt", 3)
    (jobs / "bad.txt").write_text("2\n1 2 3\n")
    _, [job] = submit_real(tmp_path, *request_gpu)
    script = next((tmp_path / "out" / "slurm").glob("*/job.sbatch")).read_text()
    assert ("#SBATCH --gpus=1" if request_gpu else "#SBATCH --gres=gpu:1") in script
    wait_done([job])

    for name, (a, b) in inputs.items():
        out = tmp_path / "out" / (name[: -len(".txt")] + ".out")
        assert out.exists(), f"{out} missing: {[p.read_text() for p in (tmp_path / 'out').rglob('*.log')]}"
        assert full.against_inputs(textoutput.parse_output(out.read_bytes()), a, b).ok
        rec = yaml.safe_load(out.with_name(out.stem + ".timing.yaml").read_text())
        assert rec["status"] == "ok" and rec["backend"] == "cpu"
    assert yaml.safe_load((tmp_path / "out" / "bad.error.yaml").read_text())["status"] == "error"
    for name in ("a.out", "b c.out", "r.out"):
        assert run_mmd("check", f"out/{name}", "--input", f"jobs/{name[:-4]}.txt", cwd=tmp_path).returncode == 0

    # Slurm's word on the refused task, and mmd's
    tasks = dict(ln.split("|", 1) for ln in squeue("-j", job, "-t", "all", "-o", "%K|%T|%r").splitlines())
    assert tasks == {"0": "COMPLETED|None", "1": "COMPLETED|None", "2": "FAILED|NonZeroExitCode", "3": "COMPLETED|None"}
    shown = status(tmp_path, job)
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert f"{job}_2\tFAILED exit 1 (NonZeroExitCode)\tmmd: refused\tbad.txt -> bad.out" in shown.stdout
    assert f"{job}_0\tCOMPLETED exit 0\tmmd: ok\ta.txt -> a.out" in shown.stdout
    assert "ok 3, refused 1, missing 0; failed 1" in shown.stdout


@pytest.mark.integration
@real_slurm
def test_real_slurm_task_without_mmd_is_failed_and_its_output_missing(tmp_path):
    (tmp_path / "jobs").mkdir()
    make_input(tmp_path / "jobs" / "m.txt", 4, 1)
    r, [job] = submit_real(tmp_path, "--mmd", "no-such-mmd")
    assert "'no-such-mmd' is not a command here" in r.stderr
    wait_done([job])
    shown = status(tmp_path, job)
    assert shown.returncode == 1
    assert f"{job}_0\tFAILED exit 127 (NonZeroExitCode)\tmmd: missing\tm.txt -> m.out" in shown.stdout
    assert f"missing output: {tmp_path / 'out' / 'm.out'}" in shown.stderr
    log = next((tmp_path / "out" / "slurm").rglob("*.log")).read_text()
    assert "is not a command on" in log and "mmd submit --mmd" in log


@pytest.mark.integration
@real_slurm
def test_real_slurm_resubmitting_does_not_redo_finished_jobs(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    make_input(jobs / "a.txt", 4, 1)
    (jobs / "bad.txt").write_text("2\n1 2 3\n")
    _, [job] = submit_real(tmp_path)
    wait_done([job])
    again = run_mmd("submit", "--slurm", "jobs", "--outbox", "out", "--backend", "cpu", "--submit", cwd=tmp_path,
                    env=cluster_env())  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "nothing to submit: every job file in jobs is finished (--redo runs them again)" in again.stdout
    assert "skipped 'a.txt': finished already by an earlier submission" in again.stderr
    os.utime(jobs / "a.txt", (time.time() + 5, time.time() + 5))  # changed since: runs again
    _, [job2] = submit_real(tmp_path)
    wait_done([job2])
    assert sorted(p.name for p in (tmp_path / "out").glob("*.out")) == ["a.1.out", "a.out"]
    _, [job3] = submit_real(tmp_path, "--redo")
    wait_done([job3])
    assert {p.name for p in (tmp_path / "out").glob("*.out")} == {"a.out", "a.1.out", "a.2.out"}
    assert (tmp_path / "out" / "bad.1.error.yaml").exists()


@pytest.mark.integration
@real_slurm
def test_real_slurm_scancel_leaves_no_half_written_output(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    make_input(jobs / "big.txt", 1200, 1)
    _, [job] = submit_real(tmp_path)
    out = tmp_path / "out"
    end = time.monotonic() + 60
    while not any(p.name.endswith(".tmp") for p in out.iterdir()):  # the output is being written
        assert time.monotonic() < end and not (out / "big.out").exists(), "never caught the task writing"
        time.sleep(0.005)
    subprocess.run(["scancel", job], check=True)
    wait_done([job])
    left = sorted(p.name for p in out.iterdir() if p.name != "slurm")
    assert left == [], f"scancel left {left}"
    assert squeue("-j", job, "-t", "all", "-o", "%T").split() == ["CANCELLED"]
    shown = status(tmp_path, job)
    assert shown.returncode == 1 and "CANCELLED" in shown.stdout and "mmd: missing" in shown.stdout


@pytest.mark.integration
@real_slurm
def test_real_slurm_splits_a_folder_larger_than_max_array_size(tmp_path):
    limit = slurm.max_array_size()
    assert limit < 20, "scripts/slurm_up.sh sets a small MaxArraySize so that this test stays small"
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    inputs = {f"m{i:02d}.txt": make_input(jobs / f"m{i:02d}.txt", 3, i) for i in range(limit + 2)}
    r, arrays = submit_real(tmp_path)
    assert len(arrays) == 2, r.stdout
    wait_done(arrays)
    for name, (a, b) in inputs.items():
        out = tmp_path / "out" / (name[:-4] + ".out")
        assert full.against_inputs(textoutput.parse_output(out.read_bytes()), a, b).ok, name
    shown = status(tmp_path, arrays[1])
    assert shown.returncode == 0 and f"ok {limit + 2}, refused 0, missing 0; failed 0" in shown.stdout
    assert f"{arrays[1]}_1\tCOMPLETED exit 0\tmmd: ok\tm{limit + 1:02d}.txt" in shown.stdout


@pytest.mark.integration
@real_slurm
def test_real_slurm_honours_the_throttle(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    for i in range(4):
        make_input(jobs / f"m{i}.txt", 3, i)
    _, [job] = submit_real(tmp_path, "--max-parallel", "1")
    running, reasons = [], set()

    def seen(lines: str) -> None:
        states = [ln.split("|") for ln in lines.splitlines()]
        running.append(sum(s[1] == "RUNNING" for s in states))
        reasons.update(s[2] for s in states if s[1] == "PENDING")

    wait_done([job], every=seen)
    assert max(running) == 1, running  # the node has room for two: the throttle held the others
    assert "JobArrayTaskLimit" in reasons, reasons
    assert len(list((tmp_path / "out").glob("*.out"))) == 4


@pytest.mark.integration
@real_slurm
def test_real_slurm_runs_the_kernel_files_copy_in_every_task(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    inputs = {name: integer_input(jobs / name, 6 + i, i) for i, name in enumerate(("a.txt", "b.txt"))}
    source = kernel_file(tmp_path / "hw")
    # the node's mmd over the stand-in GPU: slurm_up.sh's GPUs are device files, not GPUs
    wrapper = f'#!/bin/sh\nPYTHONPATH={shlex.quote(FAKE_GPU_PATH)} exec {shlex.quote(sys.executable)} -m mmd "$@"\n'
    env = cluster_env()
    env["PATH"] = on_path(tmp_path, "mmd-fakegpu", wrapper, env["PATH"])
    r = run_mmd(
        "submit", "--slurm", "jobs", "--outbox", "out", "--kernel-file", str(source), "--tile", "8", "--time",
        "00:05:00", "--mmd", "mmd-fakegpu", "--submit", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    job = next(ln for ln in r.stdout.splitlines() if ln.startswith("submitted job array")).split(":")[0].split()[3]
    wait_done([job])
    sha = hashlib.sha256(source.read_bytes()).hexdigest()
    for name, (a, b) in inputs.items():
        out = tmp_path / "out" / (name[: -len(".txt")] + ".out")
        assert out.exists(), [p.read_text() for p in (tmp_path / "out").rglob("*.log")]
        assert out.read_bytes() == b"".join(textformat.emit_chunks(np.matmul(a, b)))
        rec = yaml.safe_load(out.with_name(out.stem + ".timing.yaml").read_text())
        assert (rec["kernel"], rec["tile"], rec["kernel_file"]["sha256"]) == ("p1.cu", 8, sha)
    shown = status(tmp_path, job)
    assert shown.returncode == 0 and "ok 2, refused 0, missing 0; failed 0" in shown.stdout


@pytest.mark.integration
@real_slurm
def test_real_slurm_passes_only_what_mmd_needs(tmp_path):
    (tmp_path / "jobs").mkdir()
    make_input(tmp_path / "jobs" / "m.txt", 4, 1)
    # --mmd: a command of the user's choosing, which shows its environment
    wrapper = f'#!/bin/sh\nenv > {shlex.quote(str(tmp_path / "env.txt"))}\nexec mmd "$@"\n'
    env = cluster_env(CANARY_SECRET="s3cret", MMD_TILE="8", MMD_KERNEL="tiled")
    env["PATH"] = on_path(tmp_path, "mmd-env", wrapper, env["PATH"])
    _, [job] = submit_real(tmp_path, "--mmd", "mmd-env", env=env)
    wait_done([job])
    got = dict(ln.split("=", 1) for ln in (tmp_path / "env.txt").read_text().splitlines() if "=" in ln)
    assert "CANARY_SECRET" not in got
    assert {k: v for k, v in got.items() if k.startswith("MMD_")} == {"MMD_BACKEND": "cpu"}
    assert got["PATH"] == env["PATH"] and got["SLURM_ARRAY_TASK_ID"] == "0" and got.get("CUDA_VISIBLE_DEVICES")
    assert (tmp_path / "out" / "m.out").exists()


@pytest.mark.integration
@real_slurm
def test_real_slurm_takes_the_sites_options_and_a_refusal_leaves_nothing(tmp_path):
    (tmp_path / "jobs").mkdir()
    make_input(tmp_path / "jobs" / "m.txt", 4, 1)
    # The one-node cluster has every CPU (2 or more) and 1 MB of memory (no RealMemory), and no node features.
    _, [job] = submit_real(tmp_path, "--mem", "1M", "--cpus-per-task", "2")
    shown = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True, timeout=30).stdout
    fields = dict(f.split("=", 1) for f in shown.split() if "=" in f)
    assert fields["MinMemoryNode"] == "1M" and fields["CPUs/Task"] == "2", shown
    wait_done([job])
    assert (tmp_path / "out" / "m.out").exists()
    r = run_mmd("submit", "--slurm", "jobs", "--outbox", "out2", "--backend", "cpu", "--constraint", "nosuchfeature",
                "--submit", cwd=tmp_path, env=cluster_env())  # fmt: skip
    assert r.returncode == 1 and "sbatch refused the script: " in r.stderr and "feature" in r.stderr, r.stderr
    assert not (tmp_path / "out2").exists()
