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
