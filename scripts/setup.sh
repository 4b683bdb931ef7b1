# The set-up shared by scripts/demo and scripts/test, which source this file (it does nothing
# when run on its own). On a fresh Debian/Ubuntu machine, as root or with sudo, it installs what
# is missing: apt packages, a virtualenv at REPO/.venv with tfrfs installed editable, and the
# fuse kernel module. After sourcing, a script calls, in this order:
#
#   install_system_packages [COMMAND:PACKAGE ...]   fuse3 and python3, plus a package per missing command
#   install_build_tools                             gcc and the Python headers (for the compiled part)
#   install_tfrfs [EXTRAS [MODULE ...]]             (uv) pip install -e REPO[EXTRAS], unless it is done already
#   check_dev_fuse                                  /dev/fuse is there and usable
#
# It sets REPO, VENV and PY. Set TFRFS_REINSTALL=1 to install again even when nothing changed.

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
VENV="$REPO/.venv"
PY="$VENV/bin/python"
PROG="scripts/${0##*/}"   # the sourcing script, for messages
export PIP_DISABLE_PIP_VERSION_CHECK=1

# Import names of the base package's dependencies in pyproject.toml.
BASE_MODULES=(google.protobuf PIL crc32c)

say() { printf '==> %s\n' "$*"; }
die() { printf '%s: %s\n' "$PROG" "$*" >&2; exit 1; }

can_be_root() { [ "$(id -u)" -eq 0 ] || command -v sudo >/dev/null 2>&1; }
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        # Under CI there is nobody to type a password: fail at once instead of hanging.
        if [ -n "${CI:-}" ]; then sudo -n "$@"; else sudo "$@"; fi
    else
        die "need root for: $* (run as root, or install sudo)"
    fi
}

has_libfuse3() {
    [ -x /sbin/ldconfig ] && /sbin/ldconfig -p 2>/dev/null | grep -q 'libfuse3\.so\.3'
}

APT_UPDATED=0
apt_install() {
    command -v apt-get >/dev/null 2>&1 ||
        die "missing: $* -- install them with your system's package manager (this script knows apt only)"
    can_be_root || die "missing: $* -- run as root or with sudo to install them"
    if [ "$APT_UPDATED" = 0 ]; then
        say "apt-get update"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        APT_UPDATED=1
    fi
    say "installing $*"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

# install_system_packages [COMMAND:PACKAGE ...]: fuse3 (libfuse3, what the mount runs on, and
# fusermount3) and python3, and PACKAGE wherever COMMAND is missing.
install_system_packages() {
    local wanted=(fuse3) missing=() pair
    { has_libfuse3 && command -v fusermount3 >/dev/null 2>&1; } || missing+=(fuse3)
    for pair in "$@"; do
        wanted+=("${pair#*:}")
        command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
    done
    wanted+=(python3)
    command -v python3 >/dev/null 2>&1 || missing+=(python3)
    if [ "${#missing[@]}" -gt 0 ]; then
        apt_install "${missing[@]}"
    else
        say "installed: ${wanted[*]}"
    fi
}

# install_build_tools: a C compiler and the Python headers, so that `pip install -e` builds the
# compiled part (tfrfs/fuse/_answer.c; without them tfrfs installs and runs in pure Python).
install_build_tools() {
    local missing=()
    command -v gcc >/dev/null 2>&1 || missing+=(gcc)
    local include
    include="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null || true)"
    [ -n "$include" ] && [ -f "$include/Python.h" ] || missing+=(python3-dev)
    if [ "${#missing[@]}" -gt 0 ]; then
        apt_install "${missing[@]}"
    fi
}

ensure_venv() {
    if ! { [ -x "$PY" ] && "$PY" -c 'import sys' 2>/dev/null; }; then
        python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
            die "tfrfs needs Python 3.10 or newer; python3 is $(python3 -V 2>&1)"
        # Debian and Ubuntu ship venv's ensurepip in a separate package.
        python3 -c 'import ensurepip, venv' 2>/dev/null || apt_install python3-venv
        say "creating a virtualenv at $VENV"
        python3 -m venv --clear "$VENV"
    fi
}

# Exits 0 when tfrfs imports from this checkout and every module named imports too.
modules_ok() {
    "$PY" - "$REPO" "$@" <<'PY'
import importlib.util, os, sys
repo = os.path.realpath(sys.argv[1])
spec = importlib.util.find_spec("tfrfs")
if spec is None or spec.origin is None or not os.path.realpath(spec.origin).startswith(repo + os.sep):
    sys.exit(1)
for name in sys.argv[2:]:
    if importlib.util.find_spec(name) is None:
        sys.exit(1)
PY
}

# install_tfrfs [EXTRAS [MODULE ...]]: the virtualenv, and tfrfs[EXTRAS] installed editable in
# it. pip is skipped when pyproject.toml is unchanged since the last install of these extras, the
# tfrfs command is there, and tfrfs (from this checkout), its dependencies and MODULE... import:
# `pip install -e` rebuilds the editable wheel each time, which needs the package index.
install_tfrfs() {
    local extras="${1:-}"
    shift || true
    ensure_venv
    local spec="$REPO" name="tfrfs"
    if [ -n "$extras" ]; then spec="$REPO[$extras]" name="tfrfs[$extras]"; fi
    local stamp want
    stamp="$VENV/.tfrfs-installed-$(printf '%s' "${extras:-base}" | tr , -)"
    # (setup.py and the C source too: a change to them is built again)
    want="$(cat "$REPO/pyproject.toml" "$REPO/setup.py" "$REPO"/tfrfs/*/*.[ch] | sha256sum | cut -d' ' -f1)"
    if [ -n "${TFRFS_REINSTALL:-}" ] || [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ] ||
        [ ! -x "$VENV/bin/tfrfs" ] || ! modules_ok "${BASE_MODULES[@]}" "$@"; then
        # Through uv where it can be had (one small wheel, installed by pip into the
        # virtualenv): it resolves, installs and byte-compiles the test extras' 150 packages
        # in under a minute, where pip took 8.5 minutes on this 2-core machine (resolving and
        # unpacking, not downloading) without compiling. Compiled at install, no process pays
        # for it later: left to the first import, each test process that imported TensorFlow
        # or Ray before another had kept the result compiled them again (tens of seconds
        # each), and the ordinary user the mount suite's second pass runs as cannot keep them
        # at all. Without uv (no wheel for this machine), pip does the same, uncompiled.
        if "$PY" -m uv --version >/dev/null 2>&1 || "$PY" -m pip install -q uv >/dev/null 2>&1; then
            say "installing $name into $VENV (uv pip install -e)"
            local index
            index="$("$PY" -m pip config get global.index-url 2>/dev/null || true)"
            UV_LINK_MODE=copy "$PY" -m uv pip install -q --compile-bytecode --python "$PY" ${index:+--index-url "$index"} \
                -e "$spec" || {
                say "uv could not install $name; pip instead"
                "$PY" -m pip install -q --no-compile -e "$spec"
            }
        else
            say "installing $name into $VENV (pip install -e)"
            "$PY" -m pip install -q --no-compile -e "$spec"
        fi
        printf '%s\n' "$want" >"$stamp"
    else
        say "$name is installed in $VENV"
    fi
}

check_dev_fuse() {
    if [ ! -c /dev/fuse ] && command -v modprobe >/dev/null 2>&1 && can_be_root; then
        say "loading the fuse kernel module"
        as_root modprobe fuse || true
    fi
    [ -c /dev/fuse ] ||
        die "/dev/fuse is missing: load the fuse kernel module (modprobe fuse); in a container, start it with --device /dev/fuse --cap-add SYS_ADMIN"
    { [ -r /dev/fuse ] && [ -w /dev/fuse ]; } ||
        die "no read/write access to /dev/fuse for $(id -un): run as root or fix its permissions"
}
