"""The job description (mmd.job): layered settings, the name's settings, flags, and refusals kept not raised."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmd import config
from mmd.job import describe
from mmd.record import Context

IN, OUT = Path("in/m.txt"), Path("out/m.out")


def test_precedence_defaults_config_env_name_flags(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("kernel: naive\ntile: 8\nmemory: pitched\n")
    base = config.load(cfg, environ={"MMD_TILE": "16"})
    assert (base.kernel, base.tile, base.memory) == ("naive", 16, "pitched")
    job = describe(Path("m@kernel=aplus,tile=4.txt"), OUT, base)
    assert (job.settings.kernel, job.settings.tile, job.settings.memory) == ("aplus", 4, "pitched")
    assert job.name_settings == {"kernel": "aplus", "tile": 4} and job.refusal is None
    job = describe(Path("m@kernel=aplus.txt"), OUT, base, flags={"tile": 32, "memory": "device", "kernel": None})
    assert (job.settings.kernel, job.settings.tile, job.settings.memory) == ("aplus", 32, "device")
    assert job.settings.sources[-2:] == ("file name", "command line")


def test_a_flag_that_contradicts_the_name_is_a_refusal_naming_both():
    job = describe(Path("m@kernel=aplus.txt"), OUT, config.Settings(), flags={"kernel": "tiled"})
    assert job.refusal is not None and job.refusal.kind == "jobname"
    assert job.refusal.reason == ("the file name sets kernel=aplus but the command line gives --kernel tiled; drop one")
    assert describe(Path("m@kernel=aplus.txt"), OUT, config.Settings(), flags={"kernel": "aplus"}).refusal is None


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("m@kernel=bogus.txt", "unknown kernel 'bogus'"),
        ("m@tile=0.txt", "from 1 to 1024"),
        ("m@timeout=-1.txt", "positive number of seconds"),
        ("m@color=red.txt", "unknown setting 'color'"),
    ],
)
def test_what_the_name_gets_wrong_is_the_jobs_refusal_not_an_exception(name, words):
    job = describe(Path(name), OUT, config.Settings())
    assert job.refusal is not None and words in job.refusal.reason
    assert job.settings == config.Settings(), "the base settings stay, for the record"


def test_the_name_may_set_the_time_limit_and_the_request_follows_the_settings():
    job = describe(Path("m@timeout=90,tile=8.txt"), OUT, config.Settings(text_path="host"))
    assert job.settings.job_timeout_s == 90.0 and job.name_settings == {"tile": 8, "timeout": 90.0}
    assert (job.request.kernel, job.request.tile, job.request.text_path) == ("tiled", 8, "host")


def test_the_daemon_reads_the_dropped_name_and_keeps_its_facts():
    context = Context(original_name="odd\x07name@tile=8.txt", device_index=1)
    job = describe(Path("in/odd_name@tile=8.txt"), OUT, config.Settings(), name="odd\x07name@tile=8.txt",
                   job_id="0123456789ab", started=5.0, context=context)  # fmt: skip
    assert (job.id, job.started, job.settings.tile) == ("0123456789ab", 5.0, 8)
    assert job.context.device_index == 1 and job.context.name_settings == {"tile": 8}
    fresh = describe(IN, OUT, config.Settings())
    assert len(fresh.id) == 12 and fresh.id != describe(IN, OUT, config.Settings()).id


def test_a_name_may_lower_the_time_limit_never_raise_it():
    """``@timeout=`` is a request to stop sooner: above the admin's job_timeout_s it is refused, naming the limit."""
    admin = config.Settings(job_timeout_s=2.0)
    job = describe(Path("m@timeout=99999999.txt"), OUT, admin)
    assert job.refusal is not None and job.refusal.kind == "jobname"
    assert job.refusal.reason == (
        "in the file name: timeout 99999999 s is above this service's limit, 2 s (job_timeout_s); "
        "a name may only lower it"
    )
    assert job.settings.job_timeout_s == 2.0
    assert describe(Path("m@timeout=2.txt"), OUT, admin).settings.job_timeout_s == 2.0
    assert describe(Path("m@timeout=1.5.txt"), OUT, admin).settings.job_timeout_s == 1.5


def test_a_tiny_time_limit_is_refused_as_a_worker_restart_it_would_cost():
    job = describe(Path("m@timeout=0.0001.txt"), OUT, config.Settings())
    assert job.refusal is not None and job.refusal.kind == "jobname"
    assert job.refusal.reason == (
        "in the file name: timeout 0.0001 s is below the least a name may set, 1 s (min_name_timeout_s)"
    )
    assert describe(Path("m@timeout=0.05.txt"), OUT, config.Settings(min_name_timeout_s=0.01)).refusal is None


def test_the_admin_restricts_what_names_may_pick_and_the_refusal_says_what_is_allowed(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name_settings: [kernel=tiled, kernel=fast, tile=16, tile=32, timeout]\n")
    admin = config.load(cfg, environ={})
    assert admin.name_settings == ("kernel=tiled", "kernel=fast", "tile=16", "tile=32", "timeout")
    assert describe(Path("m@kernel=fast,tile=16,timeout=60.txt"), OUT, admin).refusal is None
    cases = {
        "m@kernel=naive.txt": "in the file name: kernel naive is not allowed here; a name may pick kernel fast or "
        "tiled (setting name_settings)",
        "m@tile=8.txt": "in the file name: tile 8 is not allowed here; a name may pick tile 16 or 32 "
        "(setting name_settings)",
        "m@backend=cpu.txt": "in the file name: backend is not allowed here; a name may set kernel, tile or timeout "
        "(setting name_settings)",
    }
    for name, reason in cases.items():
        job = describe(Path(name), OUT, admin)
        assert job.refusal is not None and job.refusal.kind == "jobname", name
        assert job.refusal.reason == reason
        assert job.refusal.details["allowed"] == list(admin.name_settings)
    nothing = config.Settings(name_settings=None)
    job = describe(Path("m@tile=16.txt"), OUT, nothing)
    assert job.refusal is not None
    assert job.refusal.reason == (
        "in the file name: tile is not allowed here; names may set nothing (setting name_settings)"
    )
    assert describe(IN, OUT, nothing).refusal is None


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("[colour]", "name_settings: unknown setting 'colour'"),
        ("[kernel=bogus]", "name_settings: unknown kernel 'bogus'"),
        ("[tile=0]", "name_settings: tile 0 must be a whole number from 1 to 1024"),
        ("[backend=tpu]", "name_settings: backend must be one of auto, cpu, cuda, got 'tpu'"),
    ],
)
def test_a_bad_name_rule_is_a_config_error_naming_it(tmp_path, value, words):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"name_settings: {value}\n")
    with pytest.raises(config.ConfigError) as info:
        config.load(cfg, environ={})
    assert words in info.value.reason
