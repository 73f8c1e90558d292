"""Per-job settings in file names: what is accepted, what is refused and why."""

from __future__ import annotations

from pathlib import PurePath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmd import jobname
from mmd.errors import JobNameError


def test_plain_name_has_no_settings():
    assert jobname.parse("m.txt") == jobname.JobName("m.txt", "m", {})
    assert jobname.parse("run.v2.txt").stem == "run.v2"
    assert jobname.parse("noext").stem == "noext"


def test_settings_are_parsed_and_stem_kept_whole():
    got = jobname.parse("m@kernel=aplus,tile=16.txt")
    assert got.stem == "m@kernel=aplus,tile=16"
    assert got.overrides == {"kernel": "aplus", "tile": 16}


def test_all_keys_in_canonical_order():
    got = jobname.parse("x@memory=managed,backend=cpu,tile=8,kernel=naive.txt")
    assert list(got.overrides) == ["kernel", "tile", "backend", "memory"]
    assert got.overrides == {"kernel": "naive", "tile": 8, "backend": "cpu", "memory": "managed"}


@pytest.mark.parametrize(
    "name, words",
    [
        ("m@foo=1.txt", "unknown setting 'foo'"),
        ("m@kernel=nope.txt", "unknown kernel 'nope'"),
        ("m@tile=0.txt", "from 1 to 1024"),
        ("m@tile=2048.txt", "from 1 to 1024"),
        ("m@tile=-4.txt", "from 1 to 1024"),
        ("m@tile=x.txt", "tile must be int, got 'x'"),
        ("m@tile=1.5.txt", "tile must be int, got '1.5'"),
        ("m@backend=tpu.txt", "backend must be one of auto, cpu, cuda, got 'tpu'"),
        ("m@memory=host.txt", "memory must be one of device, pitched, managed, got 'host'"),
        ("m@timeout=-1.txt", "timeout must be a positive number of seconds, got -1.0"),
        ("m@timeout=nan.txt", "timeout must be float, got 'nan'"),
        ("m@tile=8,tile=16.txt", "given twice"),
        ("m@tile=8,.txt", "not key=value"),
        ("m@lab.txt", "not key=value"),
        ("m@=3.txt", "not key=value"),
    ],
)
def test_refusals_name_the_problem(name, words):
    with pytest.raises(JobNameError) as info:
        jobname.parse(name)
    assert words in info.value.reason
    assert info.value.kind == "jobname"


def test_kernel_names_come_from_the_registry():
    from mmd import kernels

    for name in kernels.NAMES:
        assert jobname.parse(f"m@kernel={name}.txt").overrides == {"kernel": name}


def test_the_registry_words_a_bad_kernel_or_tile_for_a_name_as_for_a_config():
    from mmd import config

    with pytest.raises(JobNameError) as by_name:
        jobname.parse("m@kernel=bogus.txt")
    with pytest.raises(config.ConfigError) as by_config:
        config.load(None, environ={"MMD_KERNEL": "bogus"})
    registry_s = by_config.value.reason.removeprefix("environment: MMD_KERNEL: ")
    assert by_name.value.reason == "in the file name: " + registry_s
    assert by_name.value.details["choices"] == by_config.value.details["choices"]


@pytest.mark.parametrize(
    ("key", "text"),
    [("tile", "x"), ("tile", "16.0"), ("backend", "tpu"), ("memory", "host"), ("timeout", "-1"), ("timeout", "nan"),
     ("timeout", "soon")],
)  # fmt: skip
def test_a_name_s_value_is_read_as_the_same_setting_s_variable_is(key, text):
    """One reading of each setting: a name's ``key=value`` gets the words an ``MMD_*`` variable's value gets
    (the name had readers of its own: ``tile 'x' must be a whole number``, where MMD_TILE said ``must be int``;
    the registry's words for kernels and tiles: the test above)."""
    from mmd import config

    setting = config.NAME_KEYS[key]
    with pytest.raises(JobNameError) as by_name:
        jobname.parse(f"m@{key}={text}.txt")
    with pytest.raises(config.ConfigError) as by_variable:
        config.load(None, environ={f"MMD_{setting.upper()}": text})
    said = by_variable.value.reason.removeprefix("environment: ")
    assert by_name.value.reason.removeprefix("in the file name: ") == said.replace(f"MMD_{setting.upper()}", key)


def test_stem_of_never_raises():
    assert jobname.stem_of("m@foo=1.txt") == "m@foo=1"
    assert jobname.stem_of(".hidden") == ".hidden"


@given(st.text(alphabet=st.sampled_from("ab./ \x00é"), max_size=12))
def test_stem_of_is_the_path_s_stem(name):
    """Without making a path for a plain name: the same stem as PurePath's (or the name, where that is empty)."""
    assert jobname.stem_of(name) == (PurePath(name).stem or name)


# A name can only pick from the allowed sets: no paths, no code, whatever the bytes.

from mmd import config  # noqa: E402
from mmd.config import MEMORY_MODES  # noqa: E402


@settings(max_examples=400, derandomize=True)
@given(st.text(max_size=80), st.text(alphabet="@=,.kerneltilbackdmory/\\;$ 0123456789", max_size=60))
def test_any_name_parses_to_allowed_values_or_is_refused(prefix, spec):
    try:
        got = jobname.parse(f"{prefix}@{spec}.txt")
    except JobNameError as exc:
        assert exc.reason
        return
    from mmd import kernels

    for key, value in got.overrides.items():
        if key == "kernel":
            assert value in kernels.NAMES
            assert "/" not in value and "." not in value
        elif key == "tile":
            assert isinstance(value, int) and 1 <= value <= kernels.MAX_TILE
        elif key == "backend":
            assert value in config.CHOICES["backend"]
        else:
            assert key == "memory" and value in MEMORY_MODES
