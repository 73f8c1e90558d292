"""The package installs as a plain wheel and works from anywhere: kernels, config and the C accelerator ship in it."""

from __future__ import annotations

import email
import grp
import os
import pwd
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

import mmd
from mmd import accel, resources

ROOT = Path(__file__).resolve().parent.parent

# The installer makes the service's system user and groups (fixed names) and a venv: alone on the machine.
pytestmark = [pytest.mark.integration, pytest.mark.serial]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tree, without build outputs: what a clone holds."""
    src = tmp_path_factory.mktemp("source") / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", "*.so", ".*cache"),
        symlinks=True,
    )
    return src


@pytest.fixture(scope="module")
def wheel(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mmd built as a wheel from a copy of the tree."""
    wheels = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(source)],
        check=True,
        capture_output=True,
    )
    (built,) = wheels.glob(f"{resources.DISTRIBUTION.replace('-', '_')}-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel installed (not editable) into a folder of its own."""
    tmp = tmp_path_factory.mktemp("install")
    site = tmp / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    return site


def test_the_wheel_carries_no_c_sources_and_stripped_libraries(wheel: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(tmp_path)
    assert not [n for n in names if n.endswith(".c")], "the C sources are the sdist's"
    assert "mmd/_fasttext.pyi" in names and "mmd/py.typed" in names
    libraries = [n for n in names if n.endswith(".so")]
    assert len(libraries) == (0 if accel.fasttext is None else 2), libraries  # no compiler here: none built
    for library in libraries:
        described = subprocess.run(["file", "-b", str(tmp_path / library)], capture_output=True, text=True, check=True)
        assert "ELF" in described.stdout and ", stripped" in described.stdout, (library, described.stdout)
        assert "debug_info" not in described.stdout


def test_the_wheel_says_what_mmd_is_for_and_where_its_docs_are(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (meta,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        fields = email.message_from_bytes(archive.read(meta))
    assert fields["Name"] == resources.DISTRIBUTION
    classifiers = fields.get_all("Classifier") or []
    for needed in ("Environment :: GPU :: NVIDIA CUDA", "Operating System :: POSIX :: Linux", "Typing :: Typed"):
        assert needed in classifiers
    assert {url.split(",")[0] for url in fields.get_all("Project-URL") or []} >= {"Documentation", "Source"}


def test_the_sdist_carries_the_c_sources(source: Path, tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--outdir", str(tmp_path), str(source)],
        check=True,
        capture_output=True,
    )
    (sdist,) = tmp_path.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"mmd/_fasttext.c", "mmd/_fastcheck.c", "setup.py"} <= names


def run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMD_")}
    env["PYTHONPATH"] = str(site)  # ahead of the editable install of the tree under test
    env["XDG_CACHE_HOME"] = str(cwd / "cache")
    return subprocess.run(
        [sys.executable, "-m", "mmd", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_wheel_carries_kernels_config_and_runs_a_job_from_elsewhere(installed: Path, tmp_path: Path) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", "import mmd, mmd.resources as r; print(mmd.__file__); print(r.kernels_dir())"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(installed)},
        capture_output=True,
        text=True,
        check=True,
    )
    module, kernels = probe.stdout.split()
    assert Path(module).is_relative_to(installed), "the installed package answers, not the tree"
    assert Path(kernels).is_relative_to(installed) and (Path(kernels) / "tiled.cu").is_file()
    listing = run(installed, tmp_path, "kernels")
    assert listing.returncode == 0, listing.stderr
    assert "tiled" in listing.stdout and "fast" in listing.stdout
    (tmp_path / "inbox").mkdir()
    made = run(installed, tmp_path, "gen", "24", "--seed", "1", "-o", "m.txt")
    assert made.returncode == 0, made.stderr
    done = run(installed, tmp_path, "run", "m.txt", "--backend", "cpu")
    assert done.returncode == 0, done.stderr
    checked = run(installed, tmp_path, "check", "m.out", "--input", "m.txt")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_an_installed_wheels_hint_installs_the_extras_requirements(installed: Path, tmp_path: Path) -> None:
    """No clone to reinstall from: the extra's own requirements, into the environment mmd runs in."""
    probe = subprocess.run(
        [sys.executable, "-c", "import mmd.resources as r; print(r.install_hint('report'))"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(installed), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "pip install 'matplotlib>=3.7'"  # pyproject.toml's report extra


def test_the_wheel_carries_the_c_accelerators_and_their_stubs(installed: Path, tmp_path: Path) -> None:

    for name, built in (("_fasttext", accel.fasttext), ("_fastcheck", accel.fastcheck)):
        assert (installed / "mmd" / f"{name}.pyi").is_file()
        if built is None:  # no compiler here: the wheel has none either
            continue
        probe = subprocess.run(
            [sys.executable, "-c", f"import mmd.{name} as m; print(m.__file__)"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(installed)},
            capture_output=True,
            text=True,
            check=True,
        )
        assert Path(probe.stdout.strip()).is_relative_to(installed)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_installed_kernels_compile(installed: Path, tmp_path: Path) -> None:
    built = run(installed, tmp_path, "kernels", "--build", "--arch", "sm_90", "--cache", str(tmp_path / "k"))
    assert built.returncode == 0, built.stdout + built.stderr
    assert " 0 failed" in built.stdout


# --- systemd/install.sh: a class box in one command ---

INSTALL_SH = ROOT / "systemd" / "install.sh"
OPERATIONS = ROOT / "docs" / "operations.md"


@dataclass(frozen=True)
class Names:
    """The service user and groups the installer makes: unique to this run, removed after."""

    user: str
    group: str
    graders: str

    @property
    def args(self) -> tuple[str, ...]:
        return ("--user", self.user, "--group", self.group, "--graders", self.graders)


@pytest.fixture(scope="module")
def names() -> Iterator[Names]:
    tag = os.getpid() % 100000
    made = Names(user=f"mmdi{tag}u", group=f"mmdi{tag}g", graders=f"mmdi{tag}r")
    for group in (made.group, made.graders):
        with pytest.raises(KeyError):
            grp.getgrnam(group)
    yield made
    if os.geteuid() == 0:
        subprocess.run(["userdel", made.user], capture_output=True)
        for group in (made.group, made.graders):
            subprocess.run(["groupdel", group], capture_output=True)


#: An interpreter the service user can run (the distribution's: outside /home and /root, readable by every
#: user): the installer's venvs in these tests are made from it, as the installer tells an admin to.
SERVICE_PYTHON = Path("/usr/bin/python3")


def install_sh(*args: str, path_front: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """systemd/install.sh ARGS, its venv made from :data:`SERVICE_PYTHON` unless ``env`` says ``PYTHON``."""
    if not SERVICE_PYTHON.is_file():
        pytest.skip(f"the installer's tests make the service's venv from {SERVICE_PYTHON} (Debian's python3)")
    full = {k: v for k, v in os.environ.items() if not k.startswith("MMD_")} | {"PYTHON": str(SERVICE_PYTHON)} | env
    if path_front is not None:
        full["PATH"] = f"{path_front}:{full['PATH']}"
    return subprocess.run(["sh", str(INSTALL_SH), *args], env=full, capture_output=True, text=True, timeout=300)


def fake_nvcc(folder: Path) -> Path:
    """A folder whose ``nvcc`` makes the installer pick the cuda extra (it only looks for one)."""
    folder.mkdir()
    nvcc = folder / "nvcc"
    nvcc.write_text("#!/bin/sh\nexit 1\n")
    nvcc.chmod(0o755)
    return folder


@pytest.fixture
def hidden_python() -> Iterator[Path]:
    """A venv's interpreter under /home, which the unit hides (ProtectHome=yes): an admin's own Python there."""
    if not os.access("/home", os.W_OK):
        pytest.skip("makes a venv under /home: needs root (CI runs as root)")
    home = Path(tempfile.mkdtemp(prefix="mmd-admin-", dir="/home"))
    try:
        home.chmod(0o755)  # readable by everyone: only its place hides it from the service
        subprocess.run(
            [str(SERVICE_PYTHON), "-m", "venv", "--copies", "--without-pip", str(home / "venv")],
            check=True, capture_output=True,
        )  # fmt: skip
        yield home / "venv" / "bin" / "python3"
    finally:
        shutil.rmtree(home)


def assert_refused_before_anything(done: subprocess.CompletedProcess[str], why: str) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == "", "not one action, in a dry run or a real one"
    (line,) = done.stderr.splitlines()
    assert why in line, line
    assert "Nothing was changed" in line
    again = shlex.join(["sh", str(INSTALL_SH), *done.args[2:]])
    assert line.endswith(f": PYTHON={SERVICE_PYTHON} {again}"), "how to fix it: the same command, as a command"


def test_python3_under_home_is_refused_before_anything_with_the_interpreter_that_works(
    tmp_path: Path, hidden_python: Path
) -> None:
    """The admin's python3 (PATH, no PYTHON) lives where the unit cannot see it: a venv made from it would be
    a service that cannot start its workers and an mmd that students cannot run."""
    front = tmp_path / "bin"
    front.mkdir()
    (front / "python3").symlink_to(hidden_python)
    root = tmp_path / "root"
    root.mkdir()
    runs = [("--dry-run",)] + ([()] if os.geteuid() == 0 else [])  # as root, the real install too
    for dry in runs:
        done = install_sh(*dry, "--root", str(root), "--no-cuda", path_front=front, PYTHON="")
        assert_refused_before_anything(done, f"install.sh: python3: {hidden_python} is under /home, which the unit")
        assert list(root.iterdir()) == [], "nothing made"


def test_an_interpreter_in_a_folder_others_cannot_enter_is_refused(tmp_path: Path) -> None:
    private = Path(tempfile.mkdtemp(prefix="mmd-private-", dir="/tmp"))  # 0700, its parent open to all
    try:
        subprocess.run(
            [str(SERVICE_PYTHON), "-m", "venv", "--copies", "--without-pip", str(private / "venv")],
            check=True, capture_output=True,
        )  # fmt: skip
        python = private / "venv" / "bin" / "python3"
        done = install_sh("--dry-run", "--root", str(tmp_path), "--no-cuda", PYTHON=str(python))
        assert_refused_before_anything(done, f"{python}: {private} lets no other user through")
    finally:
        shutil.rmtree(private)


def test_an_interpreter_that_does_not_run_is_refused(tmp_path: Path) -> None:
    done = install_sh("--dry-run", "--root", str(tmp_path), "--no-cuda", PYTHON=str(tmp_path / "python3"))
    assert_refused_before_anything(done, f"{tmp_path / 'python3'} does not run")


def test_the_dry_run_prints_each_action_as_a_shell_line_and_changes_nothing(tmp_path: Path, names: Names) -> None:
    root = tmp_path / "root"
    root.mkdir()
    done = install_sh("--dry-run", "--root", str(root), *names.args, "--no-cuda")
    assert done.returncode == 0, done.stderr
    assert list(root.iterdir()) == [], "a dry run makes nothing"
    with pytest.raises(KeyError):
        pwd.getpwnam(names.user)
    lines = done.stdout.splitlines()
    u, g = names.user, names.group
    for line in (
        f"groupadd --system {g}",
        f"useradd --system --gid {g} --home-dir /var/lib/mmd --shell /usr/sbin/nologin {u}",
        f"groupadd {names.graders}",
        f"install -d -o {u} -g {g} -m 3730 {root}/srv/mmd/inbox",
        f"install -d -o {u} -g {g} -m 2750 {root}/srv/mmd/outbox",
        f"install -d -o {u} -g {g} -m 0700 {root}/srv/mmd/state",
        f"install -d -o root -g {g} -m 0750 {root}/etc/mmd",
    ):
        assert lines.count(line) == 1, line
    (config,) = (line for line in lines if line.endswith(f"-m 0640 /dev/stdin {root}/etc/mmd/mmd.yaml"))
    for setting in ("state_dir: /srv/mmd/state", "class_mode: true", f"graders_group: {names.graders}"):
        assert f"'{setting}'" in config
    assert not any("pycuda" in line for line in lines), "--no-cuda"
    (release,) = {m[1] for line in lines if (m := re.search(r"(/opt/mmd/releases/[^/ ]+)/", line))}
    (install,) = (line for line in lines if "/pip install" in line)
    assert (
        install == f"{root}{release}/venv/bin/pip install -q -c {root}{release}/src/constraints.txt {root}{release}/src"
    )
    check = f"{root}{release}/venv/bin/python -m mmd.inboxfs {root}/srv/mmd/inbox"
    assert lines.index(check) > lines.index(f"install -d -o {u} -g {g} -m 3730 {root}/srv/mmd/inbox"), "the check"
    assert not [line for line in lines if "mount" in line or "fstab" in line], "no --spool-image: no filesystem"
    assert len(lines) == len(set(lines)), "each action once"
    parsed = subprocess.run(["sh", "-n"], input=done.stdout, capture_output=True, text=True)
    assert parsed.returncode == 0, "the dry run is a script: " + parsed.stderr


def test_systemctl_runs_only_where_systemd_runs(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    without = install_sh("--dry-run", "--root", str(root), "--no-cuda")
    assert without.returncode == 0, without.stderr
    assert not [line for line in without.stdout.splitlines() if line.startswith("systemctl")]
    assert "systemd does not run here" in without.stdout
    assert "run: systemctl daemon-reload && systemctl enable --now mmd" in without.stdout
    (root / "run" / "systemd" / "system").mkdir(parents=True)
    running = install_sh("--dry-run", "--root", str(root), "--no-cuda")
    assert running.returncode == 0, running.stderr
    assert "systemctl daemon-reload" in running.stdout.splitlines()


#: The docs' dry run: a fresh box with systemd and nvcc, a clone in /home/admin/mmd.
DOCS_SOURCE = "/home/admin/mmd"
DOCS_BLOCK = re.compile(r"<!-- install-dry-run[^\n]*-->\n```sh\n(.*?)```\n", re.S)


def docs_dry_run(tmp_path: Path, names: Names) -> str:
    """``install.sh --dry-run --graders graders`` as the docs show it, made here with this run's names."""
    root = tmp_path / "root"
    (root / "run" / "systemd" / "system").mkdir(parents=True)
    front = fake_nvcc(tmp_path / "bin")
    (front / "python3").symlink_to(SERVICE_PYTHON)  # the admin's python3, one the service can run
    done = install_sh("--dry-run", "--root", str(root), *names.args, path_front=front, PYTHON="")
    assert done.returncode == 0, done.stderr
    text = done.stdout.replace(str(root), "").replace(str(ROOT), DOCS_SOURCE)
    # The test's own names need the unit rewritten; the docs show the default names, which need not.
    text = re.sub(r"sed -e \S+ -e \S+ (\S+) \| install -m 0644 /dev/stdin", r"install -m 0644 \1", text)
    for mine, theirs in ((names.user, "mmd"), (names.group, "mmd-spool"), (names.graders, "graders")):
        text = text.replace(mine, theirs)
    return re.sub(r"releases/\d{8}-\d{6}(-\d+)?", "releases/20250901-120000", text)


def test_the_docs_show_the_dry_runs_real_output(tmp_path: Path, names: Names) -> None:
    if not (ROOT / ".git").exists():  # a copy, not a clone: the installer's own list of what to copy
        pytest.skip("the docs show the install from a git clone")
    (shown,) = DOCS_BLOCK.findall(OPERATIONS.read_text())
    if subprocess.run(["getent", "group", "video"], capture_output=True).returncode != 0:
        shown = shown.replace("usermod -aG video mmd\n", "")  # a host without the group video
    made = docs_dry_run(tmp_path, names)
    assert "/src/constraints.txt 'pycuda>=2024.1'\n" in made, "nvcc found: the cuda extra, at the lock's version"
    assert shown == made


@pytest.fixture(scope="module")
def installed_box(
    tmp_path_factory: pytest.TempPathFactory, names: Names
) -> Iterator[tuple[Path, subprocess.CompletedProcess[str]]]:
    """The whole set-up, for real, into a fresh root: users and groups made on this host (this run's names),
    the spool on an image of its own (unmounted after); with what the installer printed."""
    if os.geteuid() != 0:
        pytest.skip("the whole set-up makes users and groups and chowns folders: needs root (CI runs as root)")
    root = tmp_path_factory.mktemp("box")
    # mmd's dependencies are left out (PIP_NO_DEPS): `mmd --version` needs none, and it keeps this fast.
    done = install_sh("--root", str(root), *names.args, "--no-cuda", "--spool-image", "64M", PIP_NO_DEPS="1")
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        yield root, done
    finally:
        if os.path.ismount(root / "srv/mmd"):
            subprocess.run(["umount", str(root / "srv/mmd")], check=True, capture_output=True)


@pytest.fixture(scope="module")
def box(installed_box: tuple[Path, subprocess.CompletedProcess[str]]) -> Path:
    return installed_box[0]


def test_the_whole_set_up_makes_users_folders_config_and_a_working_mmd(box: Path, names: Names) -> None:
    service = pwd.getpwnam(names.user)
    spool = grp.getgrnam(names.group).gr_gid
    assert service.pw_gid == spool
    grp.getgrnam(names.graders)
    for path, uid, gid, mode in (
        (box / "srv/mmd/inbox", service.pw_uid, spool, 0o3730),
        (box / "srv/mmd/outbox", service.pw_uid, spool, 0o2750),
        (box / "srv/mmd/state", service.pw_uid, spool, 0o700),
        (box / "etc/mmd", 0, spool, 0o750),
        (box / "etc/mmd/mmd.yaml", 0, spool, 0o640),
    ):
        st = path.lstat()
        assert (st.st_uid, st.st_gid, oct(stat.S_IMODE(st.st_mode))) == (uid, gid, oct(mode)), path
    config = yaml.safe_load((box / "etc/mmd/mmd.yaml").read_text())
    assert config["state_dir"] == "/srv/mmd/state" and config["class_mode"] is True
    assert config["graders_group"] == names.graders
    assert (config["inbox"], config["outbox"]) == ("/srv/mmd/inbox", "/srv/mmd/outbox")
    unit = (box / "etc/systemd/system/mmd.service").read_text()
    assert f"\nUser={names.user}\n" in unit and f"\nGroup={names.group}\n" in unit
    version = subprocess.run([str(box / "opt/mmd/venv/bin/mmd"), "--version"], capture_output=True, text=True)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"mmd {mmd.__version__}"


def test_only_what_the_service_needs_is_copied(box: Path) -> None:
    src = box / "opt/mmd/src"
    wanted = ("pyproject.toml", "mmd/__init__.py", "kernels/tiled.cu", "docs/operations.md", "systemd/mmd.service")
    for needed in wanted:
        assert (src / needed).is_file(), needed
    assert (src / "mmd/data/kernels").is_symlink(), "the package's links to the kernels stay links"
    for left_out in (".git", ".venv", "inbox", "outbox", "tests", "build", "mmd_lab.egg-info"):
        assert not (src / left_out).exists(), left_out
    assert not [p for p in src.rglob("*") if p.name == "__pycache__" or p.suffix == ".so"]
    if (ROOT / ".git").exists():
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True)
        tracked = set(listed.stdout.split())
        copied = {str(p.relative_to(src)) for p in src.rglob("*") if p.is_symlink() or p.is_file()}
        assert copied <= tracked, copied - tracked
    owner = src.stat()
    assert stat.S_IMODE(owner.st_mode) & 0o005 == 0o005, "the service user reads it"


def test_a_failed_pycuda_build_says_how_to_do_without_and_keeps_the_install(
    box: Path, names: Names, tmp_path: Path
) -> None:
    current = os.readlink(box / "opt/mmd/current")
    releases = sorted(os.listdir(box / "opt/mmd/releases"))
    config = (box / "etc/mmd/mmd.yaml").read_text()
    impossible = tmp_path / "constraints.txt"
    impossible.write_text("pycuda<0\n")  # pip fails on pycuda as a failed build would, offline or not
    done = install_sh(
        "--root", str(box), *names.args,
        path_front=fake_nvcc(tmp_path / "bin"), PIP_NO_DEPS="1", PIP_CONSTRAINT=str(impossible),
    )  # fmt: skip
    assert done.returncode != 0
    assert "pycuda" in done.stderr and "--no-cuda" in done.stderr and "Nothing was changed" in done.stderr
    assert os.readlink(box / "opt/mmd/current") == current
    assert sorted(os.listdir(box / "opt/mmd/releases")) == releases, "the failed release is gone"
    assert (box / "etc/mmd/mmd.yaml").read_text() == config
    version = subprocess.run([str(box / "opt/mmd/venv/bin/mmd"), "--version"], capture_output=True, text=True)
    assert version.returncode == 0, version.stderr


def test_a_second_run_keeps_the_admins_config_and_says_so(box: Path, names: Names) -> None:
    again = install_sh("--dry-run", "--root", str(box), *names.args, "--no-cuda")
    assert again.returncode == 0, again.stderr
    lines = again.stdout.splitlines()
    assert not [line for line in lines if "/dev/stdin" in line and "mmd.yaml" in line], "never over the admin's"
    assert f"# {box}/etc/mmd/mmd.yaml exists: kept as it is" in again.stdout
    assert not [line for line in lines if line.startswith(("useradd", "groupadd"))], "they exist now"
    assert f"install -d -o {names.user} -g {names.group} -m 3730 {box}/srv/mmd/inbox" in lines, "modes mended"


def test_the_spool_gets_a_filesystem_of_its_own_and_the_check_finds_nothing_to_move_in(
    installed_box: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """--spool-image: /srv/mmd is an ext4 image's mount (in fstab for the next boot), so no folder beside the
    inbox lets one student move another's file into it; the installer's check, the daemon's, says so."""
    box, done = installed_box
    spool, image = box / "srv/mmd", box / "var/lib/mmd-spool.img"
    assert os.path.ismount(spool) and os.stat(spool).st_dev != os.stat(box).st_dev
    assert os.stat(spool / "inbox").st_dev == os.stat(spool / "state").st_dev == os.stat(spool).st_dev
    st = image.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode), st.st_size) == (0, 0o600, 64 << 20)
    fstab = (box / "etc/fstab").read_text().splitlines()
    assert fstab == ["/var/lib/mmd-spool.img /srv/mmd ext4 loop,nodev,nosuid,noexec 0 0"]
    assert (
        f"ok: {spool}/inbox: the inbox's filesystem (from {spool}) holds no folder where one user may move "
        "another's file into the inbox" in done.stdout
    ), done.stdout


def test_a_second_run_keeps_the_spools_filesystem(box: Path, names: Names) -> None:
    again = install_sh("--dry-run", "--root", str(box), *names.args, "--no-cuda", "--spool-image", "64M")
    assert again.returncode == 0, again.stderr
    assert f"# {box}/srv/mmd is a mount of its own already: kept as it is" in again.stdout
    actions = [line for line in again.stdout.splitlines() if not line.startswith("#")]
    assert not [line for line in actions if "mount " in line or "mkfs" in line or "fstab" in line]


def test_a_spool_image_is_refused_over_a_spool_it_would_hide(tmp_path: Path) -> None:
    (tmp_path / "srv/mmd/inbox").mkdir(parents=True)
    (tmp_path / "srv/mmd/inbox/hw1.txt").write_text("1 1 1\n2\n3\n")
    done = install_sh("--dry-run", "--root", str(tmp_path), "--no-cuda", "--spool-image", "20G")
    assert (done.returncode, done.stdout) == (1, "")
    assert f"{tmp_path}/srv/mmd is no mount and holds files, which the image mounted over it would hide" in done.stderr
    assert "Nothing was changed" in done.stderr
    bad = install_sh("--dry-run", "--root", str(tmp_path), "--no-cuda", "--spool-image", "lots")
    assert bad.returncode == 1 and "--spool-image SIZE: a size such as 20G" in bad.stderr


def test_the_dry_run_of_a_spool_image_makes_mounts_and_records_it_before_the_folders(tmp_path: Path) -> None:
    done = install_sh("--dry-run", "--root", str(tmp_path), "--no-cuda", "--spool-image", "20G")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    image, spool = f"{tmp_path}/var/lib/mmd-spool.img", f"{tmp_path}/srv/mmd"
    made = lines.index(f"mkdir -p {tmp_path}/var/lib && (umask 077 && truncate -s 20G {image}) && mkfs.ext4 -q {image}")
    mounted = lines.index(f"install -d -m 0755 {spool} && mount -t ext4 -o loop,nodev,nosuid,noexec {image} {spool}")
    inbox = lines.index(f"install -d -o mmd -g mmd-spool -m 3730 {spool}/inbox")
    recorded = lines.index(
        f"printf '%s\\n' '/var/lib/mmd-spool.img /srv/mmd ext4 loop,nodev,nosuid,noexec 0 0' >> {tmp_path}/etc/fstab"
    )
    assert made < mounted < inbox < recorded


def test_from_a_copy_that_is_no_clone_the_same_files_are_copied(tmp_path: Path) -> None:
    source = tmp_path / "copy"
    ignore = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", "*.so", ".*cache")
    shutil.copytree(ROOT, source, ignore=ignore, symlinks=True)
    for junk in (".venv/bin/python", "mmd/__pycache__/x.pyc", "mmd/_x.so", "build/lib/x", "inbox/hw1.txt"):
        (source / junk).parent.mkdir(parents=True, exist_ok=True)
        (source / junk).write_text("junk\n")
    root = tmp_path / "root"
    root.mkdir()
    planned = install_sh("--dry-run", "--source", str(source), "--root", str(root), "--no-cuda")
    assert planned.returncode == 0, planned.stderr
    lines = planned.stdout.splitlines()
    assert lines[1].startswith(f"(cd {source} && find "), "no git: the script's own list"
    for line in lines[:4]:  # make the release folder, list, copy, chmod: the dry run's lines, run as printed
        subprocess.run(["sh", "-ec", line], check=True)
    (src,) = (root / "opt/mmd/releases").glob("*/src")
    assert (src / "pyproject.toml").is_file() and (src / "kernels/tiled.cu").is_file()
    assert (src / "mmd/data/kernels").is_symlink()
    for left_out in (".venv", "build", "inbox", "tests", "mmd/__pycache__", "mmd/_x.so"):
        assert not (src / left_out).exists(), left_out
