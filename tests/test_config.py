import dataclasses
from pathlib import Path

import pytest

from mmd import config
from mmd.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mmd.yaml"
    path.write_text(text)
    return path


def test_defaults_without_any_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = config.load(environ={})
    assert (s.backend, s.kernel, s.tile, s.memory) == ("auto", "tiled", 32, "device")
    assert s.inbox == Path("inbox") and s.outbox == Path("outbox")


def test_precedence_defaults_file_env_flags(tmp_path):
    path = write(tmp_path, "tile: 8\nkernel: aplus\nbackend: cpu\n")
    s = config.load(path, environ={})
    assert (s.tile, s.kernel, s.backend) == (8, "aplus", "cpu")
    s = config.load(path, environ={"MMD_TILE": "16"})
    assert (s.tile, s.kernel) == (16, "aplus")
    s = config.load(path, {"tile": 4, "kernel": None}, environ={"MMD_TILE": "16"})
    assert (s.tile, s.kernel) == (4, "aplus")


def test_mmd_config_variable_names_the_file(tmp_path):
    path = write(tmp_path, "tile: 4\n")
    assert config.load(environ={"MMD_CONFIG": str(path)}).tile == 4


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("tiel: 4\n", "unknown setting 'tiel'"),
        ("tile: four\n", "tile must be int"),
        ("tile: 4.5\n", "tile must be int"),
        ("tile: true\n", "tile must be int"),
        ("backend: gpu\n", "backend must be one of auto, cpu, cuda"),
        ("memory: shared\n", "memory must be one of"),
        ("- a\n- b\n", "must be a mapping"),
        ("tile: [\n", "not valid YAML"),
        ("max_file_bytes: -3\n", "max_file_bytes must be positive"),
        ("inbox: 3\n", "inbox must be Path"),
    ],
)
def test_bad_files_name_the_key(tmp_path, text, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace("[", r"\[")):
        config.load(write(tmp_path, text), environ={})


def test_bad_environment_names_the_variable():
    with pytest.raises(ConfigError, match="environment: MMD_TILE must be int, got 'abc'"):
        config.load(None, environ={"MMD_TILE": "abc"})
    with pytest.raises(ConfigError, match="environment: MMD_KERNEL: unknown kernel"):
        config.load(None, environ={"MMD_KERNEL": "nope"})
    with pytest.raises(ConfigError, match="environment: MMD_MAX_ATTEMPTS must be at least 1"):
        config.load(None, environ={"MMD_MAX_ATTEMPTS": "0"})


def test_a_stray_mmd_variable_is_ignored_with_a_warning():
    """Any unknown MMD_* variable failed every command with 78; it is now ignored, once said."""
    with pytest.warns(config.UnknownVariableWarning, match="MMD_TILES is not an mmd setting; ignored"):
        s = config.load(None, environ={"MMD_TILES": "3", "MMD_TILE": "8"})
    assert s.tile == 8


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('tile: "16"\n', "tile must be int, got '16'"),
        ('job_timeout_s: "60"\n', "job_timeout_s must be float, got '60'"),
        ('durable: "no"\n', "durable must be bool, got 'no'"),
        ("kernel: 3\n", "kernel must be str, got 3"),
        ("tile: 16.0\n", "tile must be int, got 16.0"),
    ],
)
def test_a_config_file_s_values_have_their_yaml_types(tmp_path, text, needle):
    """The README says wrong types are errors: a file is typed YAML, so a quoted number is not a number."""
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        config.load(write(tmp_path, text), environ={})


def test_text_sources_are_still_parsed():
    """The environment, a file name and flags are text: ``MMD_TILE=16`` and ``NAME@tile=16`` are numbers."""
    assert config.load(None, environ={"MMD_TILE": "16", "MMD_DURABLE": "no"}).tile == 16
    assert config.Settings().with_values({"tile": "8"}, "file name").tile == 8
    assert config.load(None, environ={"MMD_JOB_TIMEOUT_S": "60"}).job_timeout_s == 60.0


def _home(tmp_path: Path, text: str | None) -> Path:
    folder = tmp_path / "xdg"
    if text is not None:
        (folder / "mmd").mkdir(parents=True)
        (folder / "mmd" / "mmd.yaml").write_text(text)
    return folder


def test_config_is_looked_up_here_then_in_xdg_config_home_then_in_etc(tmp_path, monkeypatch):
    work = tmp_path / "work"
    (work / "config").mkdir(parents=True)
    monkeypatch.chdir(work)
    system = tmp_path / "etc-mmd.yaml"
    system.write_text("tile: 4\n")
    monkeypatch.setattr(config, "SYSTEM_CONFIG", system)
    assert config.load(environ={}).tile == 4 and str(system) in config.load(environ={}).sources
    xdg = _home(tmp_path, "tile: 8\n")
    assert config.load(environ={"XDG_CONFIG_HOME": str(xdg)}).tile == 8
    home = tmp_path / "home"
    (home / ".config" / "mmd").mkdir(parents=True)
    (home / ".config" / "mmd" / "mmd.yaml").write_text("tile: 16\n")
    assert config.load(environ={"HOME": str(home)}).tile == 16  # XDG's default: ~/.config
    (work / "config" / "mmd.yaml").write_text("tile: 2\n")
    assert config.load(environ={"XDG_CONFIG_HOME": str(xdg)}).tile == 2
    assert config.load(environ={"MMD_CONFIG": str(system), "XDG_CONFIG_HOME": str(xdg)}).tile == 4
    assert config.load(xdg / "mmd" / "mmd.yaml", environ={"MMD_CONFIG": str(system)}).tile == 8
    # the first found is the one file read: no merging, so a setting has one source
    assert [p for p in config.config_paths({"XDG_CONFIG_HOME": str(xdg)})] == [
        Path("config/mmd.yaml"),
        xdg / "mmd" / "mmd.yaml",
        system,
    ]


def test_missing_explicit_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        config.load(tmp_path / "nope.yaml", environ={})


def test_null_memory_limit_and_env_null(tmp_path):
    s = config.load(write(tmp_path, "max_memory_bytes: 1_000\n"), environ={})
    assert s.max_memory_bytes == 1000
    s = config.load(write(tmp_path, "max_memory_bytes: 1000\n"), environ={"MMD_MAX_MEMORY_BYTES": "null"})
    assert s.max_memory_bytes is None


def test_shipped_config_is_valid_and_equals_defaults():
    shipped = Path(__file__).resolve().parent.parent / "config" / "mmd.yaml"
    s = config.load(shipped, environ={})
    assert s == config.Settings()


def test_replace_validates():
    with pytest.raises(ConfigError):
        config.Settings().replace(backend="tpu")
    assert config.Settings().replace(tile=8, kernel=None).tile == 8


def test_text_path_setting():
    assert config.Settings().text_path == "auto"
    assert config.load(None, environ={"MMD_TEXT_PATH": "host"}).text_path == "host"
    assert config.Settings().replace(text_path="gpu").text_path == "gpu"
    with pytest.raises(ConfigError, match="environment: MMD_TEXT_PATH must be one of auto, host, gpu"):
        config.load(None, environ={"MMD_TEXT_PATH": "cuda"})


def test_the_shipped_config_documents_every_setting_and_ships_in_the_package():
    import yaml

    from mmd import resources

    text = resources.default_config_text()
    assert text == (Path(__file__).resolve().parent.parent / "config" / "mmd.yaml").read_text()
    keys = set(yaml.safe_load(text))
    fields = {f.name for f in dataclasses.fields(config.Settings)} - {"sources"}
    assert keys == fields, f"undocumented: {sorted(fields - keys)}; unknown: {sorted(keys - fields)}"


def test_commands_are_argv_lists_never_shell_strings():
    s = config.load(None, environ={"MMD_ON_DONE": "notify-send 'mmd: done'"})
    assert s.on_done == ("notify-send", "mmd: done")
    with pytest.raises(ConfigError, match="on_error must be a command"):
        config.Settings().with_values({"on_error": [1, 2]}, "test")
    with pytest.raises(ConfigError, match="No closing quotation"):
        config.load(None, environ={"MMD_ON_DONE": "say 'unclosed"})


def test_hook_variables_are_not_settings():
    s = config.load(None, environ={"MMD_JOB_STATUS": "ok", "MMD_JOB_TIMEOUT_S": "7"})
    assert s.job_timeout_s == 7.0


def test_the_shipped_config_names_each_setting_once():
    from mmd import resources

    keys = [line.split(":")[0] for line in resources.default_config_text().splitlines() if line[:1].isalpha()]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)


def test_a_config_folder_this_user_may_not_enter_is_passed_over(tmp_path, monkeypatch):
    """/etc/mmd is the spool group's alone (0750): for anyone else, stat() of /etc/mmd/mmd.yaml is EACCES, which
    ended every command in a traceback (tests/test_reliability.py meets it as another user)."""
    import os

    system = tmp_path / "etc" / "mmd.yaml"
    monkeypatch.setattr(config, "SYSTEM_CONFIG", system)
    real_stat = os.stat

    def stat(path, *args, **kwargs):
        if Path(path) == system:
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.chdir(tmp_path)
    assert config.load(environ={}).sources == ("defaults", "environment")
