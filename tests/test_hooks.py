"""Job-end hooks (mmd.hooks): an argv run without a shell, told the job's facts, never the job's problem."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mmd.hooks import HOOK_VARIABLES, Hooks, JobEnd, run_hook

END = JobEnd("0123456789ab", "ok", "m.txt", Path("/o/m.out"), Path("/o/m.timing.yaml"), "", "tiled")


def test_the_hook_is_told_the_jobs_facts(tmp_path):
    out = tmp_path / "env.json"
    script = f"import json, os; json.dump(dict(os.environ), open({str(out)!r}, 'w'))"
    result = run_hook([sys.executable, "-c", script], END, timeout=30, environ={"PATH": "/usr/bin"})
    assert result.returncode == 0 and result.problem is None
    env = json.loads(out.read_text())
    assert {k: env[k] for k in HOOK_VARIABLES} == END.environ()
    assert env["MMD_JOB_OUTPUT"] == "/o/m.out" and env["MMD_JOB_KERNEL"] == "tiled" and env["PATH"] == "/usr/bin"


def test_a_slow_hook_is_killed_at_its_limit_and_a_missing_one_is_said():
    slow = run_hook([sys.executable, "-c", "import time; time.sleep(30)"], END, timeout=0.5)
    assert slow.returncode is None and slow.problem == "killed after 0.5 s"
    missing = run_hook(["/nonexistent/hook"], END, timeout=5)
    assert missing.returncode is None and "No such file" in (missing.problem or "")
    failing = run_hook([sys.executable, "-c", "raise SystemExit(3)"], END, timeout=5)
    assert failing.returncode == 3


def test_the_runner_picks_the_hook_by_status_and_none_is_fine():
    hooks = Hooks([sys.executable, "-c", "pass"], None, timeout=5)
    done = hooks.ended(END)
    assert done is not None and done.result().returncode == 0
    assert hooks.ended(JobEnd("x" * 12, "error", "b.txt", None, None, "why")) is None
    hooks.close()
