import dataclasses
import json
import os
import re
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
    with pytest.warns(config.UnknownVariableWarning, match=r"MMD_TILES is not an mmd setting; ignored \(did you mean"):
        s = config.load(None, environ={"MMD_TILES": "3", "MMD_TILE": "8"})
    assert s.tile == 8


def test_an_unknown_name_is_answered_with_the_names_it_is_close_to():
    """An unknown key listed all the settings' names; the near ones are what the user was after."""
    with pytest.raises(ConfigError, match=r"^test: unknown setting 'tiel' \(did you mean tile\?\)$"):
        config.Settings().with_values({"tiel": 4}, "test")
    with pytest.raises(ConfigError, match=r"unknown setting 'worker_per_device' \(did you mean workers_per_device\b"):
        config.Settings().with_values({"worker_per_device": 4}, "test")
    with pytest.raises(ConfigError) as far:  # nothing close: every name, so the user finds theirs
        config.Settings().with_values({"zzz": 4}, "test")
    assert far.value.reason == f"test: unknown setting 'zzz' (known: {', '.join(config.NAMES)})"
    with pytest.warns(config.UnknownVariableWarning) as said:
        config.load(None, environ={"MMD_TILES": "3"})
    assert str(said[0].message) == "MMD_TILES is not an mmd setting; ignored (did you mean MMD_TILE?)"
    with pytest.raises(ConfigError, match=r"unknown setting 'timout' \(did you mean timeout\?\)"):
        config.name_rule(("timout",))


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


@pytest.mark.parametrize("value", ["nan", "NaN", "-nan"])
def test_not_a_number_is_no_limit(tmp_path, value):
    """``MMD_JOB_TIMEOUT_S=nan`` passed every check (no comparison with NaN is true) and became the limit."""
    with pytest.raises(ConfigError, match=f"environment: MMD_JOB_TIMEOUT_S must be float, got '{value}'"):
        config.load(None, environ={"MMD_JOB_TIMEOUT_S": value})
    with pytest.raises(ConfigError, match="max_output_ratio must be float or null, got nan"):
        config.load(write(tmp_path, "max_output_ratio: .nan\n"), environ={})


def test_each_setting_s_rules_are_on_its_field():
    """The checks sat in a function of their own (names listed by hand, types matched by annotation text)."""
    assert config.CHOICES == {
        "backend": ("auto", "cpu", "cuda"),
        "memory": ("device", "pitched", "managed"),
        "text_path": ("auto", "host", "gpu"),
        "observer": ("auto", "inotify", "polling"),
        "log_format": ("auto", "json", "console"),
        "log_level": ("debug", "info", "warning", "error"),
    }
    with pytest.raises(ConfigError, match=r"^test: warm_up_mib must not be negative, got -1$"):
        config.Settings().with_values({"warm_up_mib": -1}, "test")
    with pytest.raises(ConfigError, match=r"^test: workers_per_device must be 1 to 64, got 65$"):
        config.Settings().with_values({"workers_per_device": "65"}, "test")
    with pytest.raises(ConfigError, match=r"^test: devices must be device ordinals \(0, 1, \.\.\.\), got \[-1\]$"):
        config.Settings().with_values({"devices": [-1]}, "test")
    with pytest.raises(ConfigError, match=r"^test: rescan_seconds must be a positive number of seconds, got 0\.0$"):
        config.Settings().with_values({"rescan_seconds": "0"}, "test")
    with pytest.raises(ConfigError, match=r"^environment: MMD_METRICS_LISTEN must be HOST:PORT \(say 127"):
        config.load(None, environ={"MMD_METRICS_LISTEN": "9817"})
    with pytest.raises(ConfigError, match=r"^test: kernel_folders: /s/k is in the inbox \(/s\): a kernel folder is"):
        config.Settings().with_values({"inbox": "/s", "kernel_folders": ["/s/k"]}, "test")


def _home(tmp_path: Path, text: str | None) -> Path:
    folder = tmp_path / "xdg"
    if text is not None:
        (folder / "mmd").mkdir(parents=True)
        (folder / "mmd" / "mmd.yaml").write_text(text)
    return folder


def _layers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    """A working directory with config/mmd.yaml, a user's config home and a service's file, each setting
    tile (and one setting of its own): (project file, user file, service file)."""
    work = tmp_path / "work"
    (work / "config").mkdir(parents=True)
    monkeypatch.chdir(work)
    system = tmp_path / "etc-mmd.yaml"
    system.write_text(f"tile: 4\nclass_mode: true\nstate_dir: {tmp_path / 'state'}\ncontrol_socket: /run/x.sock\n")
    monkeypatch.setattr(config, "SYSTEM_CONFIG", system)
    user = _home(tmp_path, "tile: 8\nkernel: aplus\n") / "mmd" / "mmd.yaml"
    project = work / "config" / "mmd.yaml"
    project.write_text("tile: 16\nmemory: pitched\n")
    return project, user, system


def test_the_files_are_layers_each_setting_from_the_nearest(tmp_path, monkeypatch):
    """./config/mmd.yaml hid ~/.config/mmd/mmd.yaml whole: a project's tile took the user's kernel with it."""
    project, user, _ = _layers(tmp_path, monkeypatch)
    environ = {"XDG_CONFIG_HOME": str(user.parent.parent)}
    s = config.load(environ=environ)
    assert (s.tile, s.kernel, s.memory) == (16, "aplus", "pitched")
    assert (s.origin("tile"), s.origin("kernel"), s.origin("memory"), s.origin("backend")) == (
        "config/mmd.yaml",
        str(user),
        "config/mmd.yaml",
        "default",
    )
    assert s.sources == ("defaults", str(user), "config/mmd.yaml", "environment")
    s = config.load(None, {"memory": "managed"}, environ={**environ, "MMD_TILE": "2"})
    assert (s.tile, s.kernel, s.memory) == (2, "aplus", "managed")
    assert (s.origin("tile"), s.origin("memory")) == ("environment", "command line")
    project.unlink()
    s = config.load(environ={"HOME": str(tmp_path / "nobody")})  # XDG's default: ~/.config, none there
    assert s == config.Settings()
    home = tmp_path / "home"
    (home / ".config" / "mmd").mkdir(parents=True)
    (home / ".config" / "mmd" / "mmd.yaml").write_text("tile: 2\n")
    assert config.load(environ={"HOME": str(home)}).tile == 2


def test_the_service_s_file_is_read_by_the_commands_that_address_the_service_only(tmp_path, monkeypatch):
    """A TA's own daemon on a class box took the service's state_dir and class_mode from /etc/mmd/mmd.yaml."""
    project, user, system = _layers(tmp_path, monkeypatch)
    project.unlink()
    mine = config.load(environ={})
    assert (mine.class_mode, mine.state_dir, mine.control_socket, mine.tile) == (False, None, None, 32)
    assert str(system) not in mine.sources
    theirs = config.load(environ={}, service=True)
    assert (theirs.class_mode, theirs.control_socket, theirs.tile) == (True, Path("/run/x.sock"), 4)
    assert theirs.origin("class_mode") == str(system)
    # the user's and the project's files lie over the service's, as over the defaults
    environ = {"XDG_CONFIG_HOME": str(user.parent.parent)}
    assert config.load(environ=environ, service=True).tile == 8
    assert [*config.config_paths(environ, service=True)] == [system, user, Path("config/mmd.yaml")]
    assert [*config.config_paths(environ)] == [user, Path("config/mmd.yaml")]


def test_config_or_mmd_config_names_the_one_file_read(tmp_path, monkeypatch):
    _, user, system = _layers(tmp_path, monkeypatch)
    other = write(tmp_path, "kernel: fast\n")
    environ = {"XDG_CONFIG_HOME": str(user.parent.parent)}
    for s in (config.load(other, environ=environ), config.load(environ={**environ, "MMD_CONFIG": str(other)})):
        assert (s.kernel, s.tile, s.memory) == ("fast", 32, "device")  # nothing from the other files
        assert s.sources == ("defaults", str(other), "environment")
    assert config.load(other, environ={"MMD_CONFIG": str(system)}, service=True).kernel == "fast"  # --config first
    assert config.load(environ={"MMD_CONFIG": os.devnull}, service=True) == config.Settings()


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
    fields = set(config.NAMES)
    assert fields == {f.name for f in dataclasses.fields(config.Settings)} - {"sources", "origins"}
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
    assert config.load(environ={}, service=True).sources == ("defaults", "environment")


def test_a_users_own_commands_leave_the_service_s_settings_to_the_service_s_commands(tmp_path, monkeypatch, capfd):
    """On a class box every command took /etc/mmd/mmd.yaml: a TA's `mmd run` met the service's limits."""
    from mmd.cli import main
    from mmd.errors import ExitStatus

    _, _, system = _layers(tmp_path, monkeypatch)
    with system.open("a") as fh:
        fh.write("max_dim: 1\n")
    (tmp_path / "work" / "config" / "mmd.yaml").unlink()
    (tmp_path / "work" / "m.txt").write_text("2\n1 2\n3 4\n1 0\n0 1\n")
    monkeypatch.setenv("MMD_BACKEND", "cpu")
    assert main(["run", "m.txt"]) == ExitStatus.OK, capfd.readouterr().err
    assert (tmp_path / "work" / "m.out").read_text() == "2\n  1.00  2.00\n  3.00  4.00\n"
    for argv in (["cancel", "m.txt"], ["rm", "m.out"]):  # they ask the service where its file says
        assert main(argv) == ExitStatus.NOT_SERVING
        assert "no daemon answers on /run/x.sock" in capfd.readouterr().err


def _shown(capfd, *argv: str) -> str:
    from mmd.cli import main

    assert main(["config", *argv]) == 0
    out, err = capfd.readouterr()
    assert err == ""
    return out


def test_mmd_config_shows_every_setting_and_where_it_came_from(tmp_path, monkeypatch, capfd):
    import yaml

    monkeypatch.chdir(tmp_path)
    plain = _shown(capfd)  # no file anywhere: the defaults
    assert config.load(write(tmp_path, plain), environ={}) == config.Settings()
    values = {name: shown["value"] for name, shown in json.loads(_shown(capfd, "--json"))["settings"].items()}
    assert yaml.safe_load(plain) == values
    lines = [line for line in plain.splitlines() if not line.startswith("#")]
    assert [line.split(":")[0] for line in lines] == list(config.NAMES)
    assert all(line.endswith("  # default") for line in lines)
    assert f"#   {Path('config/mmd.yaml')}" in plain and "absent" in plain

    _, user, system = _layers(tmp_path, monkeypatch)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(user.parent.parent))
    monkeypatch.setenv("MMD_BACKEND", "cpu")
    shown = _shown(capfd, "--device", "3")
    assert re.search(r"^tile: 16 +# config/mmd.yaml$", shown, re.M)
    assert re.search(rf"^kernel: aplus +# {re.escape(str(user))}$", shown, re.M)
    assert re.search(r"^backend: cpu +# environment: MMD_BACKEND$", shown, re.M)
    assert re.search(r"^device: 3 +# command line$", shown, re.M)
    assert re.search(r"^class_mode: false +# default$", shown, re.M)
    assert re.search(rf"^#   {re.escape(str(system))} +not read: the service's", shown, re.M)
    # what it prints is a config file that gives the same settings, whatever their types
    again = write(tmp_path, shown)
    assert config.load(again, environ={}) == config.load(None, {"device": 3}, environ=dict(os.environ))

    service = _shown(capfd, "--service")
    assert re.search(rf"^class_mode: true +# {re.escape(str(system))}$", service, re.M)
    assert re.search(r"^tile: 16 +# config/mmd.yaml$", service, re.M)
    assert re.search(rf"^#   {re.escape(str(system))} +read$", service, re.M)

    data = json.loads(_shown(capfd, "--service", "--json"))
    assert data["settings"]["control_socket"] == {"value": "/run/x.sock", "from": str(system)}
    assert data["settings"]["name_settings"]["value"] == list(config.NAME_KEYS)
    assert [f["path"] for f in data["files"]] == [str(system), str(user), "config/mmd.yaml"]

    one = json.loads(_shown(capfd, "--json", "--config", str(again)))
    assert one["files"] == [{"path": str(again), "state": "read: --config, the one file"}]
    assert one["settings"]["tile"] == {"value": 16, "from": str(again)}
