"""mmd.slurm and `mmd submit`: the script's text, and the script run as Slurm would run it.

Slurm is not needed: each array task is run with bash and SLURM_ARRAY_TASK_ID set,
which is what slurmd does for a batch step. The one test against a real Slurm is
skipped unless sbatch is on PATH and a controller answers.
"""

from __future__ import annotations

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

from mmd import slurm, textformat, verify
from mmd.errors import UnreadableError, UsageError
from mmd.generate import input_chunks, random_matrix

from .conftest import ROOT, run_mmd

#: Real processes and daemons: left out of `make quick`, run by `make test`.
pytestmark = pytest.mark.process

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


def plan_for(tmp_path: Path, names: list[str], options: slurm.ArrayOptions) -> slurm.Plan:
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
        time="01:30:00",
        partition="gpu",
        account="cs101",
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
        "--gres": "gpu:1",
        "--time": "01:30:00",
        "--partition": "gpu",
        "--account": "cs101",
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
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"time": "1h"}, "--time"),
        ({"partition": "gpu; rm"}, "--partition"),
        ({"account": "a b"}, "--account"),
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
    slurm.write(plan)
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
    slurm.write(plan)
    cwd = tmp_path / "elsewhere"  # tasks must not depend on the submit folder
    cwd.mkdir()
    for task in range(len(plan.tasks)):
        r = run_task(plan.script, task, cwd)
        assert r.returncode == 0, r.stderr
    for task in plan.tasks:
        a, b = inputs[task.input.name]
        report = verify.against_inputs(textformat.parse_output(task.output.read_bytes()), a, b)
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
    slurm.write(plan)
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
    slurm.write(plan)
    r = run_task(plan.script, 0, tmp_path)
    assert r.returncode == 1
    assert yaml.safe_load((tmp_path / "outbox" / "bad.error.yaml").read_text())["status"] == "error"


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


def test_submit_without_sbatch_is_one_line(tmp_path):
    (tmp_path / "jobs").mkdir()
    make_input(tmp_path / "jobs" / "m.txt", 4, 1)
    r = run_mmd("submit", "--slurm", "jobs", "--submit", cwd=tmp_path, env={"PATH": str(tmp_path / "nothing")})
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "sbatch not found on PATH" in r.stderr, r.stderr


def test_submit_runs_sbatch_and_prints_the_job_id(tmp_path):
    (tmp_path / "jobs").mkdir()
    make_input(tmp_path / "jobs" / "m.txt", 4, 1)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sbatch"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {shlex.quote(str(tmp_path / "args"))}\necho "4242;mmdtest"\n')
    fake.chmod(0o755)
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
        env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
    )
    assert r.returncode == 0, r.stderr
    assert "submitted job array 4242" in r.stdout
    assert (tmp_path / "args").read_text().splitlines() == ["--parsable", str(tmp_path / "s" / "job.sbatch")]
    assert "--gres" not in (tmp_path / "s" / "job.sbatch").read_text()


def test_submit_refuses_an_empty_folder(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "x.part").write_text("")
    r = run_mmd("submit", "--slurm", "jobs", cwd=tmp_path)
    assert r.returncode == 1 and "no job files in jobs" in r.stderr


# ---------------------------------------------------------------------------
# a real Slurm, where one runs here


def _slurm_up() -> bool:
    if not (shutil.which("sbatch") and shutil.which("scontrol") and shutil.which("squeue")):
        return False
    try:
        r = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and " is UP" in r.stdout


@pytest.mark.slow
@pytest.mark.skipif(not _slurm_up(), reason="needs sbatch and a Slurm controller that answers `scontrol ping`")
def test_real_slurm_runs_the_array(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    inputs = {name: make_input(jobs / name, 8, i) for i, name in enumerate(["a.txt", "b c.txt", "-d.txt"])}
    # No GPU is assumed here: no gres, the cpu backend. docs/cluster.md runs the default gres=gpu:1.
    r = run_mmd(
        "submit",
        "--slurm",
        "jobs",
        "--outbox",
        "out",
        "--backend",
        "cpu",
        "--gres",
        "none",
        "--time",
        "00:05:00",
        "--submit",
        cwd=tmp_path,
        env=task_env(),
    )
    assert r.returncode == 0, r.stderr
    job = r.stdout.split("submitted job array ")[1].split(":")[0]
    end = time.monotonic() + 180
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
        if time.monotonic() > end:
            subprocess.run(["scancel", job])
            pytest.fail(f"job array {job} did not finish within 180 s")
        time.sleep(0.5)
    for name, (a, b) in inputs.items():
        out = tmp_path / "out" / (name[: -len(".txt")] + ".out")
        assert out.exists(), f"{out} missing; logs: {list((tmp_path / 'out' / 'slurm').rglob('*.log'))}"
        assert verify.against_inputs(textformat.parse_output(out.read_bytes()), a, b).ok
