#!/bin/sh
# Set up a class box in one command (as root; `make install-service`):
#
#   systemd/install.sh [--dry-run] [--graders GROUP] [--no-cuda] [--spool-image SIZE] [--source DIR]
#                      [--root DIR] [--user NAME] [--group NAME]
#
#   --dry-run        print every action, one shell line each, exactly as it would run; change nothing
#   --graders GROUP  the group that reads every student's outputs: made when missing, and
#                    graders_group in a new config
#   --no-cuda        install without pycuda (the cpu backend); the default adds it where nvcc is found
#   --spool-image SIZE  give the spool a filesystem of its own (students then cannot move a classmate's
#                    file into the inbox): an ext4 image of SIZE (20G, say), /var/lib/mmd-spool.img, mounted
#                    on /srv/mmd and in /etc/fstab; nothing where /srv/mmd is a mount already; refused
#                    where /srv/mmd holds files, which the mount would hide
#   --source DIR     the clone to install (default: this script's repository)
#   --root DIR       install under DIR instead of / (like DESTDIR: the config and the unit still name
#                    /srv/mmd and /opt/mmd; users and groups are still made on this host). For tests and images.
#   --user NAME      the service user (default mmd)
#   --group NAME     the group of the people who may drop files (default mmd-spool)
#
#   PYTHON (environment): the interpreter the venv is made from (default python3). The service user
#   must be able to run it: every user may read it, and it lives outside /home and /root, which the
#   unit hides; one that is not is refused before anything changes (a pyenv in /root, ProtectHome=yes).
#
# What it makes (docs/operations.md, "Checklist"): the user and groups; /opt/mmd/releases/STAMP with
# the files the service needs (src) and a venv with mmd installed from them (not editable), each
# package at the version of the lock (constraints.txt);
# /opt/mmd/current -> that release, /opt/mmd/venv and /opt/mmd/src through it; the spool's filesystem
# (--spool-image) and folders, then the check that no student may move another's file into the inbox
# (mmd.inboxfs: it prints what it found); /etc/mmd/mmd.yaml for a class box (only when there is none); the unit;
# with CUDA, the configured kernel and the text kernels built into /var/cache/mmd (`mmd kernels --build
# --configured`, as the service user). The release is built first,
# and only when it is whole is anything else touched: a failed build (pycuda, say) leaves the host
# as it was, the previous release serving. Run it again to upgrade, then `systemctl restart mmd`.
# POSIX ACLs are not set here: the daemon sets the ones it needs at every start (mmd/acl.py).
set -eu
# What it makes is read by the service user, whatever the admin's own umask.
umask 022

usage() {
    sed -n '3,/ProtectHome/s/^# \{0,1\}//p' "$0" >&2
    exit 2
}
die() {
    echo "install.sh: $*" >&2
    exit 1
}

# q WORD: WORD as the shell reads it back (quoted only where it needs to be).
q() {
    case $1 in
        '' | *[!A-Za-z0-9_./:=+@%,-]*) printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")" ;;
        *) printf '%s' "$1" ;;
    esac
}

# This run's options, as the shell reads them back: a message that says to run it again repeats them.
options=""
for word in "$@"; do options="$options $(q "$word")"; done
dry=false cuda=auto graders="" root="" user=mmd group=mmd-spool image=""
src=$(dirname "$0")/..
while [ $# -gt 0 ]; do
    case $1 in
        --dry-run) dry=true ;;
        --no-cuda) cuda=no ;;
        --graders) [ $# -ge 2 ] || usage; graders=$2; shift ;;
        --spool-image) [ $# -ge 2 ] || usage; image=$2; shift ;;
        --source) [ $# -ge 2 ] || usage; src=$2; shift ;;
        --root) [ $# -ge 2 ] || usage; root=$2; shift ;;
        --user) [ $# -ge 2 ] || usage; user=$2; shift ;;
        --group) [ $# -ge 2 ] || usage; group=$2; shift ;;
        *) usage ;;
    esac
    shift
done
src=$(cd "$src" && pwd) || die "no source folder $src"
[ -f "$src/pyproject.toml" ] || die "$src is not a clone of mmd (no pyproject.toml)"
# "/" and "" are the same root; every path below is "$root/..." so that a test can use a folder.
[ "$root" != / ] || root=""
[ -z "$root" ] || root=$(cd "$root" 2>/dev/null && pwd) || die "no root folder $root"
$dry || [ "$(id -u)" = 0 ] || die "run as root (--dry-run shows what it would do)"
# The spool's own filesystem (docs/operations.md, "The inbox's own filesystem"): a rename keeps a file's
# owner and never crosses a mount, so on a filesystem of its own a file enters the inbox only as its copier's.
spool=/srv/mmd
spool_image=/var/lib/mmd-spool.img
spool_options=loop,nodev,nosuid,noexec
mount_image=false
if [ -n "$image" ]; then
    expr "$image" : '[1-9][0-9]*[KMGT]\{0,1\}$' >/dev/null || die "--spool-image SIZE: a size such as 20G (K, M, G or T), not $image"
    if ! mountpoint -q "$root$spool" 2>/dev/null; then
        [ -z "$(ls -A "$root$spool" 2>/dev/null)" ] || die "$root$spool is no mount and holds files, which the image \
mounted over it would hide. Nothing was changed. Stop mmd, move $spool aside, run this again, \
then move the inbox's, outbox's and state's contents onto the image (docs/operations.md, \"The inbox's own filesystem\")"
        mount_image=true
    fi
fi

# act LINE: every change is one shell line, printed by --dry-run and otherwise run as printed,
# so the dry run is the script of what would happen.
act() {
    if $dry; then printf '%s\n' "$1"; else eval "$1"; fi
}
# note TEXT: a message for the admin; a comment in the dry run, so its output stays a script.
note() {
    printf '# %s\n' "$*"
}

opt=$root/opt/mmd
python=${PYTHON:-python3}

# why_not PY: nothing when the service user can run a venv made from PY, else why not (one line). The unit
# hides /home, /root and /run/user (ProtectHome=yes), and the service user owns none of the interpreter's
# files nor is in their group: each folder on the way to them must let others through (o+x), and the
# interpreter, its standard library and its shared library must be others' to read (and run). PY itself
# answers, from its own paths (a pyenv shim or a venv's link names the interpreter behind it).
why_not() {
    "$1" - 2>/dev/null <<'PY' || echo "$1 does not run here"
import os, stat, sys, sysconfig
RX = stat.S_IROTH | stat.S_IXOTH
needed = [(sys.executable, RX), (sysconfig.get_path("stdlib"), RX)]
if sysconfig.get_config_var("Py_ENABLE_SHARED"):
    lib = os.path.join(sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDLIBRARY"))
    needed.append((lib, stat.S_IROTH))
def why(path, mode):
    real = os.path.realpath(path)
    for hidden in ("/home", "/root", "/run/user"):
        if real == hidden or real.startswith(hidden + "/"):
            return f"{real} is under {hidden}, which the unit hides (ProtectHome=yes)"
    folder = "/"
    for part in real.split("/")[1:-1]:
        folder = os.path.join(folder, part)
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            return f"{folder} lets no other user through (o+x), and the service user is another"
    if os.stat(real).st_mode & mode != mode:
        return f"{real} is not {'readable and runnable' if mode == RX else 'readable'} by other users"
    return None
print(next((reason for reason in map(why, *zip(*needed)) if reason), ""), end="")
PY
}
problem=$(why_not "$python")
if [ -n "$problem" ]; then
    how="install one (Debian: apt install python3-venv), then PYTHON=/path/to/python3 sh $0$options"
    for candidate in /usr/bin/python3 /usr/local/bin/python3; do
        if [ -x "$candidate" ] && [ -z "$(why_not "$candidate")" ]; then how="PYTHON=$candidate sh $0$options"; break; fi
    done
    die "$python: $problem; the service could not run a venv made from it, nor the users its mmd. \
Nothing was changed. Run it with an interpreter that every user can read, outside /home and /root: $how"
fi
# What the service needs from the clone (the package, the kernels and config the wheel carries,
# the unit, the docs the unit names); not .git, a venv, inbox/outbox data, tests or build outputs.
needed="pyproject.toml setup.py constraints.txt README.md LICENSE mmd kernels config systemd docs"
if [ "$cuda" = auto ]; then
    if command -v nvcc >/dev/null 2>&1; then cuda=yes; else cuda=no; fi # pycuda builds against the CUDA toolkit
fi
if [ "$cuda" = yes ]; then
    # The cuda extra's requirement, from its one home, installed in a step of its own so that
    # its failure is told apart from mmd's.
    pycuda=$(sed -n 's/^cuda = \["\([^"]*\)"\]$/\1/p' "$src/pyproject.toml")
    [ -n "$pycuda" ] || die "no 'cuda = [...]' extra in $src/pyproject.toml"
fi

# --- 1. the release: built whole before anything else changes ---
stamp=$(date +%Y%m%d-%H%M%S)
[ ! -e "$opt/releases/$stamp" ] || stamp=$stamp-$$
rel=$opt/releases/$stamp
built=false
# A release that did not finish is removed, whatever stopped it.
cleanup() {
    if ! $dry && ! $built && [ -d "$rel" ]; then rm -rf "$rel"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

act "install -d -m 0755 $(q "$opt") $(q "$opt/releases") $(q "$rel/src")"
if [ -e "$src/.git" ] && command -v git >/dev/null 2>&1; then
    # safe.directory: root may install from a clone that someone else owns.
    act "git -c safe.directory=$(q "$src") -C $(q "$src") ls-files -z -- $needed > $(q "$rel/files")"
else
    act "(cd $(q "$src") && find $needed \\( -name .git -o -name '.*cache' -o -name __pycache__ -o -name build -o -name '*.egg-info' -o -name '*.so' \\) -prune -o ! -type d -print0) > $(q "$rel/files")"
fi
act "(cd $(q "$src") && xargs -0 cp -P --preserve=timestamps --parents -t $(q "$rel/src")) < $(q "$rel/files")"
# A clone made under umask 077 has files only its owner reads; the service user reads these.
act "chmod -R a+rX,go-w $(q "$rel/src")"
act "$(q "$python") -m venv $(q "$rel/venv")"
# The versions are the lock's (constraints.txt, `make lock`): two boxes installed a month apart run the same.
lock=$rel/src/constraints.txt
act "$(q "$rel/venv/bin/pip") install -q -c $(q "$lock") $(q "$rel/src")" ||
    die "pip could not install mmd from $rel/src (its messages are above); nothing else was changed"
if [ "$cuda" = yes ]; then
    act "$(q "$rel/venv/bin/pip") install -q -c $(q "$lock") $(q "$pycuda")" || die "pycuda ($pycuda, mmd's cuda extra) failed to \
install: it builds against the CUDA toolkit that nvcc belongs to, see pip's messages above. Nothing was changed; \
the previous install, if any, still serves. Fix the toolkit, or install without CUDA (cpu backend only): $0 --no-cuda"
fi
# pip builds in the tree it installs from; the release keeps the source only.
act "rm -rf $(q "$rel/src/build") $(q "$rel/src/mmd_lab.egg-info")"

# --- 2. the users and groups ---
getent group "$group" >/dev/null || act "groupadd --system $(q "$group")"
id -u "$user" >/dev/null 2>&1 || act "useradd --system --gid $(q "$group") --home-dir /var/lib/mmd --shell /usr/sbin/nologin $(q "$user")"
# Where /dev/nvidia* belong to the group video.
if getent group video >/dev/null && ! id -nG "$user" 2>/dev/null | tr ' ' '\n' | grep -qx video; then
    act "usermod -aG video $(q "$user")"
fi
[ -z "$graders" ] || getent group "$graders" >/dev/null || act "groupadd $(q "$graders")"

# --- 3. the spool's filesystem, and the folders: owner, group and mode of each, here and nowhere else ---
if $mount_image; then
    [ -e "$root$spool_image" ] || act "mkdir -p $(q "$root${spool_image%/*}") && (umask 077 && truncate -s $(q "$image") $(q "$root$spool_image")) && mkfs.ext4 -q $(q "$root$spool_image")"
    act "install -d -m 0755 $(q "$root$spool") && mount -t ext4 -o $spool_options $(q "$root$spool_image") $(q "$root$spool")"
elif [ -n "$image" ]; then
    note "$root$spool is a mount of its own already: kept as it is"
fi
folder() { # OWNER GROUP MODE PATH (install -d also mends the owner and mode of one that exists)
    act "install -d -o $(q "$1") -g $(q "$2") -m $3 $(q "$root$4")"
}
folder root root 0755 /srv/mmd
folder "$user" "$group" 3730 /srv/mmd/inbox # setgid + sticky, no read: students drop, never list; only mmd moves
folder "$user" "$group" 2750 /srv/mmd/outbox # each student's folder in it is theirs and the graders' (ACLs, by mmd)
folder "$user" "$group" 0700 /srv/mmd/state  # the lock, the state, claimed and archived jobs: mmd's alone
folder root "$group" 0750 /etc/mmd           # students read the config (mmd status), no one else
if $mount_image && ! grep -qs "^$spool_image $spool " "$root/etc/fstab"; then
    act "printf '%s\\n' $(q "$spool_image $spool ext4 $spool_options 0 0") >> $(q "$root/etc/fstab")"
fi
# Whether one student may move another's file into the inbox, a job in its owner's name (a warning and
# the fix, or that none may): what the daemon checks at each start, here as root, which sees all.
act "$(q "$rel/venv/bin/python") -m mmd.inboxfs $(q "$root$spool/inbox")"

# --- 4. the config: a class box's, never over the admin's own ---
config=$root/etc/mmd/mmd.yaml
if [ -e "$config" ] || [ -L "$config" ]; then
    note "$config exists: kept as it is (a class box needs state_dir: /srv/mmd/state, class_mode: true and control_socket: /run/mmd/mmd.sock in it${graders:+, and graders_group: $graders})"
else
    lines="'# mmd on a class box (written by systemd/install.sh; every key: /opt/mmd/src/config/mmd.yaml)' \
'inbox: /srv/mmd/inbox' 'outbox: /srv/mmd/outbox' 'state_dir: /srv/mmd/state' 'class_mode: true'"
    [ -z "$graders" ] || lines="$lines $(q "graders_group: $graders")"
    act "printf '%s\\n' $lines 'control_socket: /run/mmd/mmd.sock' 'retention_days: 120' 'min_free_bytes: 1073741824' 'backend: auto' | install -o root -g $(q "$group") -m 0640 /dev/stdin $(q "$config")"
fi

# --- 5. the unit, and the switch to the new release ---
unit=$root/etc/systemd/system/mmd.service
act "install -d -m 0755 $(q "$root/etc/systemd/system")"
if [ "$user" = mmd ] && [ "$group" = mmd-spool ]; then
    act "install -m 0644 $(q "$rel/src/systemd/mmd.service") $(q "$unit")"
else
    act "sed -e $(q "s/^User=mmd\$/User=$user/") -e $(q "s/^Group=mmd-spool\$/Group=$group/") $(q "$rel/src/systemd/mmd.service") | install -m 0644 /dev/stdin $(q "$unit")"
fi
previous=$(readlink "$opt/current" 2>/dev/null || true)
# A rename over the link: a restart at any moment finds either release whole.
act "ln -sfn $(q "releases/$stamp") $(q "$opt/current.new") && mv -T $(q "$opt/current.new") $(q "$opt/current")"
built=true
for link in venv src; do
    [ "$(readlink "$opt/$link" 2>/dev/null || true)" != "current/$link" ] || continue
    if [ -e "$opt/$link" ] && [ ! -L "$opt/$link" ]; then
        # The layout before releases (a plain folder): it goes with the next upgrade, like a previous release.
        act "install -d -m 0755 $(q "$opt/releases/before") && mv -T $(q "$opt/$link") $(q "$opt/releases/before/$link")"
        previous=releases/before
    fi
    act "ln -sfn $(q "current/$link") $(q "$opt/$link.new") && mv -T $(q "$opt/$link.new") $(q "$opt/$link")"
done
# The previous release stays until the next upgrade: a daemon still running from it imports
# sub-commands and starts workers from its files until it is restarted.
for old in "$opt"/releases/*; do
    [ -e "$old" ] || continue
    case releases/${old##*/} in "releases/$stamp" | "$previous") continue ;; esac
    act "rm -rf $(q "$old")"
done

# --- 6. the kernels the service runs, built into its cache: a fresh service then compiles nothing ---
if [ "$cuda" = yes ]; then
    # CacheDirectory=mmd's folder, the service user's as systemd makes it; the build runs as that user, with the
    # service's config (its kernel and tile), the nvcc the service finds (systemd's PATH; the cache's key names
    # it) and this GPU's architecture. No GPU here: the service builds them.
    act "install -d -o $(q "$user") -g $(q "$group") -m 0755 $(q "$root/var/cache/mmd")"
    act "runuser -u $(q "$user") -- env -u CUDA_HOME -u CUDA_PATH PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin CACHE_DIRECTORY=$(q "$root/var/cache/mmd") MMD_CONFIG=$(q "$config") $(q "$rel/venv/bin/mmd") kernels --build --configured" ||
        note "the service's kernels were not built here (no GPU?): the service compiles them at its first jobs, once each"
fi

# --- 7. systemd, where it runs ---
if [ -d "$root/run/systemd/system" ]; then
    act "systemctl daemon-reload"
    note "start it with: systemctl enable --now mmd (or systemctl restart mmd to upgrade)"
else
    note "systemd does not run here ($root/run/systemd/system is missing): where it runs, run: systemctl daemon-reload && systemctl enable --now mmd"
fi
$dry || echo "installed $("$opt/venv/bin/mmd" --version) in $rel"
