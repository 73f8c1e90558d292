"""The daemon's metrics (mmd.metrics): counts from sidecar records, the text format, throttled atomic writes."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from mmd import record
from mmd.metrics import Metrics

from .test_record import refusal, timing


def samples(text: bytes) -> dict:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def test_jobs_are_counted_by_status_kernel_and_kind():
    m = Metrics(None, 5.0)
    for _ in range(2):
        m.job_ended(record.tally(timing()))
    m.job_ended(record.tally(refusal()))
    got = samples(m.text())
    assert got[("mmd_jobs_total", (("kernel", "tiled"), ("status", "ok")))] == 2
    assert got[("mmd_jobs_total", (("kernel", ""), ("status", "error")))] == 1
    assert got[("mmd_job_errors_total", (("kind", "input"),))] == 1
    assert got[("mmd_input_bytes_total", ())] == 3 * 12 and got[("mmd_output_bytes_total", ())] == 2 * 20
    assert got[("mmd_job_duration_seconds_count", ())] == 3
    assert got[("mmd_job_phase_seconds_count", (("phase", "kernel"),))] == 2
    assert ("mmd_job_phase_seconds_count", (("phase", "cuda"),)) not in got  # a sum of phases, not one


def test_a_refused_job_counts_with_no_kernel_even_when_it_asked_for_one():
    import dataclasses

    m = Metrics(None, 5.0)
    asked = dataclasses.replace(refusal(), requested=record.Requested("tiled", 16, "device"))
    m.job_ended(record.tally(asked))
    got = samples(m.text())
    assert got[("mmd_jobs_total", (("kernel", ""), ("status", "error")))] == 1
    assert [k for k in got if k[0] == "mmd_jobs_total"] == [("mmd_jobs_total", (("kernel", ""), ("status", "error")))]


def test_no_counter_has_a_created_twin():
    m = Metrics(None, 5.0)
    m.job_ended(record.tally(timing()))
    m.job_ended(record.tally(refusal()))
    assert b"_created" not in m.text()


def test_the_file_is_rewritten_atomically_at_most_every_period(tmp_path):
    now = [100.0]
    path = tmp_path / "mmd.prom"
    m = Metrics(path, 5.0, clock=lambda: now[0])
    m.write()
    first = path.read_bytes()
    m.job_ended(record.tally(timing()))
    now[0] += 1
    m.write()
    assert path.read_bytes() == first, "throttled"
    assert m.due_in() == 4.0
    now[0] += 4
    m.write()
    assert path.read_bytes() != first and not [p for p in tmp_path.iterdir() if p != path], "no temporary left"
    m.write(force=True)
    assert Metrics(None, 5.0).due_in() is None


def test_an_error_record_without_settings_counts_with_no_kernel():
    rec = record.ErrorRecord(
        job="x" * 12,
        input=record.FileFacts("a.txt"),
        output=record.FileFacts("a.out", written=False),
        error=record.ErrorFacts("spool", "is a link"),
    )
    m = Metrics(Path("/nonexistent/never-written"), 5.0)
    m.job_ended(record.tally(rec))
    assert samples(m.text())[("mmd_job_errors_total", (("kind", "spool"),))] == 1


def test_a_class_jobs_and_time_are_counted_by_submitter():
    import dataclasses

    m = Metrics(None, 5.0)
    alice = record.Context(submitter="alice")
    m.job_ended(record.tally(dataclasses.replace(timing(), context=alice)))
    m.job_ended(record.tally(dataclasses.replace(refusal(), context=alice)))
    m.job_ended(record.tally(timing()))  # no submitter (mmd run, Slurm): not counted by one
    got = samples(m.text())
    assert got[("mmd_submitter_jobs_total", (("status", "ok"), ("submitter", "alice")))] == 1
    assert got[("mmd_submitter_jobs_total", (("status", "error"), ("submitter", "alice")))] == 1
    assert got[("mmd_submitter_seconds_total", (("submitter", "alice"),))] > 0
    assert len([k for k in got if k[0] == "mmd_submitter_jobs_total"]) == 2
