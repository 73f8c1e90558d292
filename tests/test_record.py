"""The sidecar's one definition (mmd.record): written (writer), read back (reader), its schema and table current
(published)."""

from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from mmd import record
from mmd.record import ErrorRecord, FileFacts, TimingRecord, published, reader, writer

DOCS = Path(__file__).resolve().parent.parent / "docs"


def timing() -> TimingRecord:
    return TimingRecord(
        job="0123456789ab",
        input=FileFacts("m.txt", 12, "a" * 64),
        output=FileFacts("m.out", 20, "b" * 64),
        shape=record.Shape(2, 3, 4),
        backend="cuda",
        kernel="tiled",
        tile=16,
        memory="device",
        device="NVIDIA H100 80GB HBM3 (sm_90)",
        requested=record.Requested("tiled", 16, "device"),
        timings_ms=record.timings({"read": 0.1, "kernel": 0.5, "overall": 3.0}),
        text=record.TextFacts("gpu", parse_gpu=0.2, emit_gpu=0.1, host_parse=False, exotic_runs=0),
        gflops=1.5,
        context=record.Context(name_settings={"tile": 16}, device_index=1),
        finished_at=record.now_iso(),
    )


def refusal() -> ErrorRecord:
    return ErrorRecord(
        job="0123456789ab",
        input=FileFacts("m.txt", 12),
        output=FileFacts("m.out", written=False),
        error=record.ErrorFacts("input", "line 3: 'x' is not a number", {"line": 3, "value": "x"}),
        timings_ms=record.timings({"read": 0.1, "overall": 0.4}),
        finished_at=record.now_iso(),
    )


def test_the_published_schema_and_table_are_current():
    assert json.loads((DOCS / "sidecar.schema.json").read_text()) == published.json_schema(), (
        "docs/sidecar.schema.json is stale: run python -m mmd.record.published docs"
    )
    assert (DOCS / "sidecar.md").read_text() == published.markdown(), (
        "docs/sidecar.md is stale: run python -m mmd.record.published docs"
    )


@pytest.mark.parametrize("rec", [timing(), refusal()], ids=["timing", "error"])
def test_written_records_read_back_equal_and_follow_the_schema(tmp_path, rec):
    path = tmp_path / "m.yaml"
    path.write_bytes(writer.dumps(rec))
    data = yaml.safe_load(path.read_text())
    jsonschema.validate(data, published.json_schema())
    assert reader.read(path) == rec
    assert next(iter(data)) == "status"


def test_context_and_error_details_sit_beside_the_records_own_keys():
    data = record.as_dict(timing())
    assert data["name_settings"] == {"tile": 16} and data["device_index"] == 1
    assert "context" not in data and "resumed" not in data  # unset facts are left out
    err = record.as_dict(refusal())["error"]
    assert err == {"kind": "input", "reason": "line 3: 'x' is not a number", "line": 3, "value": "x"}
    assert record.as_dict(refusal())["output"] == {"name": "m.out", "written": False}


@pytest.mark.parametrize(
    "change",
    [
        {"status": "maybe"},
        {"shape": {"m": 2, "k": 3}},
        {"timings_ms": {"kernel": "fast"}},
        {"gflops": "many"},
        {"unknown_key": 1},
    ],
)
def test_the_schema_refuses_what_mmd_never_writes(change):
    data = {**record.as_dict(timing()), **change}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, published.json_schema())


def test_read_refuses_a_file_that_is_not_a_sidecar(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("status: pending\n")
    with pytest.raises(ValueError, match="status must be ok or error"):
        reader.read(path)
    path.write_text("- 1\n")
    with pytest.raises(ValueError, match="not a sidecar mapping"):
        reader.read(path)


def test_timing_keys_are_the_timings_fields_in_order():
    assert record.TIMING_KEYS == ("read", "parse", "compile", "malloc", "h2d", "kernel", "d2h", "free", "cuda",
                                  "emit", "write", "overall")  # fmt: skip
    assert record.timings({"kernel": 1.23456, "bogus": 1.0}) == record.Timings(kernel=1.235)


def test_finished_at_is_written_as_datetime_writes_it():
    """``now_iso`` is UTC to the millisecond in ``datetime.isoformat``'s words, and it is now."""
    before = datetime.datetime.now(datetime.timezone.utc)
    text = record.now_iso()
    after = datetime.datetime.now(datetime.timezone.utc)
    when = datetime.datetime.fromisoformat(text)
    assert when.isoformat(timespec="milliseconds") == text
    assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= when <= after


@given(st.floats(min_value=0, max_value=4e9, allow_nan=False) | st.integers(0, 4 * 10**9).map(lambda s: s + 0.0009995))
def test_a_given_moment_is_written_as_datetime_writes_it(at):
    """``now_iso(at)`` (the daemon's state and held jobs) is ``datetime.isoformat`` of that moment, to the ms."""
    expected = datetime.datetime.fromtimestamp(at, datetime.timezone.utc).isoformat(timespec="milliseconds")
    assert record.now_iso(at) == expected


def test_paths_beside_the_output():
    assert record.timing_path(Path("o/m.out")) == Path("o/m.timing.yaml")
    assert record.error_path(Path("o/m.1.out")) == Path("o/m.1.error.yaml")


# -- mmd's own writer of plain sidecars, against PyYAML's ---------------------------------

_TEXT = st.text(alphabet=st.sampled_from("aZ09_.()/+=,;: -'#\"\\\té"), max_size=90)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    _TEXT,
    st.sampled_from(
        ["yes", "null", "1.5", "0x1f", "2026-11-27T04:23:16.376+00:00", "12e3", "~", "a: b", "a #b", "...", "---"]
    ),
)
_KEYS = st.one_of(st.from_regex(r"[a-z_]{1,12}", fullmatch=True), _TEXT)
_TREES = st.recursive(
    st.dictionaries(_KEYS, _SCALARS, max_size=4),
    lambda inner: st.dictionaries(_KEYS, st.one_of(_SCALARS, inner, st.lists(_SCALARS, max_size=3)), max_size=4),
    max_leaves=12,
)


@given(_TREES)
def test_plain_sidecars_are_written_as_pyyaml_writes_them(data):
    """Where mmd writes a sidecar's YAML itself, the bytes are PyYAML's (else it leaves them to PyYAML)."""
    ours = writer._plain_yaml(data)
    if ours is not None:
        assert ours == yaml.dump(data, Dumper=yaml.SafeDumper, sort_keys=False, default_flow_style=False,
                                 allow_unicode=True)  # fmt: skip


def _pyyaml(rec) -> bytes:
    return yaml.dump(record.as_dict(rec), Dumper=yaml.SafeDumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True).encode()  # fmt: skip


_CONTEXTS = [
    record.Context(),
    record.Context(name_settings={"tile": 16, "kernel": "aplus"}, device_index=1, submitter="ann"),
    record.Context(
        original_name="we\u202eird.txt",
        collision=record.Collision("m.out", ["m.out"], "m.1.out"),
        resumed=True,
        host="node0",
    ),
    record.Context(name_settings={}, collision=record.Collision("m.out", [], "m.1.out")),  # empty: PyYAML's
]
_DETAILS = [{}, {"line": 3, "value": "x"}, {"limits": {"max_dim": 4096}, "paths": ["a", "b"]}, {"note": "a: b #c"}]


@given(st.sampled_from(_CONTEXTS), st.sampled_from(_DETAILS), st.sampled_from([None, ["one note"], ["a: b", "c"]]),
       st.floats(allow_nan=True, allow_infinity=True) | st.none(), st.booleans())  # fmt: skip
def test_a_record_is_written_as_pyyaml_writes_its_plain_data(context, details, notes, value, error):
    """dumps writes a record's parts straight from the record: the bytes are PyYAML's of as_dict's data."""
    if error:
        rec: record.Record = ErrorRecord(job="0123456789ab", input=FileFacts("m.txt", 12),
                                         output=FileFacts("m.out", written=False),
                                         error=record.ErrorFacts("input", "line 3: bad", details),
                                         timings_ms=record.timings({"read": value}), context=context)  # fmt: skip
    else:
        rec = dataclasses.replace(timing(), notes=notes, gflops=value, context=context)
    assert writer.dumps(rec) == _pyyaml(rec)


def test_every_usual_sidecar_is_written_by_mmd_itself(tmp_path):
    """A timing record as the pipeline makes it takes the fast path (the test above holds its bytes)."""
    rec = timing()
    assert writer._plain_yaml(record.as_dict(rec)) is not None
    assert writer.dumps(rec) == yaml.dump(record.as_dict(rec), Dumper=yaml.SafeDumper, sort_keys=False,
                                          default_flow_style=False, allow_unicode=True).encode()  # fmt: skip
