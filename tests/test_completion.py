"""`mmd completion bash|zsh`: a shell's completion script, made from the command's own parser."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import run_mmd

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    made = run_mmd("completion", "bash")
    assert made.returncode == 0, made.stderr
    script = tmp_path_factory.mktemp("completion") / "mmd.bash"
    script.write_text(made.stdout)
    return script


def complete(script: Path, line: str, cwd: Path | None = None) -> list[str]:
    """What bash offers for ``line`` (its last word being typed), through the script's completion function."""
    words = line.split(" ")
    probe = (
        f"source {script}\n"
        f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
        f"COMP_LINE={line!r}; COMP_POINT={len(line)}\n"
        '"$(complete -p mmd | sed -n "s/.*-F \\([^ ]*\\) .*/\\1/p")" mmd "${COMP_WORDS[-1]}" "${COMP_WORDS[-2]}"\n'
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(["bash", "-c", probe], cwd=cwd, capture_output=True, text=True, check=True)
    return sorted(set(done.stdout.split()))


def test_bash_completes_the_commands_and_each_commands_options(bash_script: Path) -> None:
    assert complete(bash_script, "mmd se") == ["serve"]
    assert "completion" in complete(bash_script, "mmd ")
    # serve's options come from the config's choices: the parser adds them only when it is used
    assert complete(bash_script, "mmd serve --in") == ["--inbox"]
    assert complete(bash_script, "mmd serve --observer ") == ["auto", "inotify", "polling"]


def test_bash_completes_file_names_where_a_command_takes_a_path(bash_script: Path, tmp_path: Path) -> None:
    for name in ("hw1.txt", "hw2.txt", "notes.md"):
        (tmp_path / name).write_text("")
    assert complete(bash_script, "mmd run hw", cwd=tmp_path) == ["hw1.txt", "hw2.txt"]
    assert complete(bash_script, "mmd check --input no", cwd=tmp_path) == ["notes.md"]


def test_zsh_gets_a_compdef_function() -> None:
    made = run_mmd("completion", "zsh")
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("#compdef mmd\n")
    if shutil.which("zsh"):
        parsed = subprocess.run(["zsh", "-n"], input=made.stdout, capture_output=True, text=True)
        assert parsed.returncode == 0, parsed.stderr


def test_an_unknown_shell_is_bad_usage() -> None:
    done = run_mmd("completion", "fish")
    assert done.returncode == 2 and done.stdout == ""
