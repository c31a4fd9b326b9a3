#!/usr/bin/env bash
# tools/arm64/setup.sh -- what building and testing the AArch64 library on x86-64 Linux needs:
#
#   toolchain  Debian's clang-19, lld-19 (ld.lld, ld64.lld) and llvm-19 (llvm-nm), installed with apt-get
#              (root; the only part that touches the system): assembles SME2, links ELF and Mach-O.
#   qemu       qemu-aarch64 11.x, static, from the qemu-user package of Debian trixie-backports
#              (bookworm's 7.2 has no SME2), unpacked into the cache with dpkg-deb.
#   sysroot    an arm64 Python 3.11: Debian bookworm arm64 .debs unpacked with dpkg-deb -x, plus the aarch64
#              PyPI wheels of tools/arm64/requirements.txt in its /usr/lib/python3/dist-packages.
#   smoke      under qemu, the arm64 Python imports numpy and ctypes, reads HWCAP2 (SME2 at SVL 512) and
#              calls gpt2asm_rdsvl of the cross-built library at SVL 512, 256 and 128 (64, 32, 16 bytes).
#
# Usage: tools/arm64/setup.sh [toolchain] [qemu] [sysroot] [smoke]     (no argument: all four)
#
# The .debs come through apt-get download under a separate APT state and sources list (in the cache,
# never the system's), whose mirror is the one the machine's own Debian sources name
# (/etc/apt/sources.list, /etc/apt/sources.list.d/*; override: ARM64_DEBIAN_MIRROR=URI); apt checks them
# against the archive's signed indexes.  No root install of arm64 parts, no binfmt registration.
#
# Cache: $ARM64_CACHE (default .cache/arm64 in the checkout).  A component whose stamp matches its recipe
# and whose files check out is skipped; anything else is fetched again, built beside the old one and
# swapped in only once verified, so an interrupted run leaves nothing half made.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CACHE=${ARM64_CACHE:-$ROOT/.cache/arm64}
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
APT_DIR=$CACHE/apt
QEMU_DIR=$CACHE/qemu
QEMU=$QEMU_DIR/usr/bin/qemu-aarch64
SYSROOT=$CACHE/sysroot
PY=/usr/bin/python3.11                           # inside the sysroot
HOST_PY=${PYTHON:-python3}

QEMU_PKG="qemu-user/trixie-backports"
QEMU_MIN_MAJOR=10
TOOLCHAIN_PKGS=(clang-19 lld-19 llvm-19)
TOOLCHAIN_BINS=(clang-19 ld.lld-19 ld64.lld-19 llvm-nm-19)
ARM64_PKGS=(python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libc6 libffi8 zlib1g libexpat1
            libssl3 libbz2-1.0 liblzma5 libgcc-s1 libstdc++6 libcrypt1 libuuid1 libtinfo6 libncursesw6
            libreadline8 libsqlite3-0)
WHEEL_PLATFORMS=(--platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 --python-version 3.11
                 --implementation cp --abi cp311 --abi abi3 --abi none)
SVL_CPUS=("sme512:max,sme512=on,sme_fa64=off:64" "sme256:max,sme256=on,sme_fa64=off:32"
          "sme128:max,sme128=on,sme_fa64=off:16")
SETUP_VERSION=1                                  # bump to rebuild every cached component

say() { printf '[arm64-setup] %s\n' "$*"; }
die() { printf '[arm64-setup] error: %s\n' "$*" >&2; exit 1; }
t_start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t_start ))s"; }

# ---------------------------------------------------------------------------------------------------
# the separate APT state

debian_mirror() {
    if [ -n "${ARM64_DEBIAN_MIRROR:-}" ]; then echo "$ARM64_DEBIAN_MIRROR"; return; fi
    "$HOST_PY" - <<'EOF'
import glob, re, sys
codename = ""
try:
    for line in open("/etc/os-release"):
        if line.startswith("VERSION_CODENAME="):
            codename = line.split("=", 1)[1].strip().strip('"')
except OSError:
    pass
entries = []            # (uri, suites, components) of every enabled `deb` source
for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    for line in lines:
        line = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()
        if len(line) >= 3 and line[0] == "deb":
            entries.append((line[1], [line[2]], line[3:]))
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    try:
        text = open(path).read()
    except OSError:
        continue
    for stanza in re.split(r"\n\s*\n", text):
        fields = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            k, v = line.split(":", 1)
            fields[k.strip().lower()] = v.split()
        if "deb" not in fields.get("types", []) or fields.get("enabled", ["yes"])[0].lower() == "no":
            continue
        for uri in fields.get("uris", []):
            entries.append((uri, fields.get("suites", []), fields.get("components", [])))
# the main archive: a source carrying the release's own suite (not -security, -updates, ...) with main
for want in (lambda s: s == codename, lambda s: "-" not in s and "security" not in s):
    for uri, suites, comps in entries:
        if "main" in comps and any(want(s) for s in suites) and "security" not in uri:
            print(uri.rstrip("/"))
            sys.exit(0)
sys.exit("no Debian archive found in /etc/apt/sources.list{,.d}; set ARM64_DEBIAN_MIRROR=URI")
EOF
}

APT_OPTS=()
apt_state() {
    # a private APT configuration: its own sources.list, lists, archives and (empty) dpkg status
    [ ${#APT_OPTS[@]} -gt 0 ] && return
    local uri keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    uri=$(debian_mirror) || die "cannot find the Debian mirror"
    [ -r "$keyring" ] || die "$keyring missing (Debian package debian-archive-keyring)"
    mkdir -p "$APT_DIR"/{lists/partial,archives/partial,cache,state,sources.list.d,preferences.d}
    : > "$APT_DIR/status"
    cat > "$APT_DIR/sources.list" <<EOF
deb [arch=amd64 signed-by=$keyring] $uri trixie-backports main
deb [arch=arm64 signed-by=$keyring] $uri bookworm main
EOF
    APT_OPTS=(-o "Dir::Etc::SourceList=$APT_DIR/sources.list" -o "Dir::Etc::SourceParts=$APT_DIR/sources.list.d"
              -o "Dir::Etc::Preferences=$APT_DIR/preferences" -o "Dir::Etc::PreferencesParts=$APT_DIR/preferences.d"
              -o "Dir::State=$APT_DIR/state" -o "Dir::State::Lists=$APT_DIR/lists"
              -o "Dir::State::status=$APT_DIR/status" -o "Dir::Cache=$APT_DIR/cache"
              -o "Dir::Cache::Archives=$APT_DIR/archives" -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
              -o "APT::Architecture=amd64" -o "APT::Architectures::=amd64" -o "APT::Architectures::=arm64"
              -o "Debug::NoLocking=1" -o "Acquire::Languages=none" -o "APT::Get::List-Cleanup=0")
    [ "$(id -u)" = 0 ] && APT_OPTS+=(-o "APT::Sandbox::User=root")
    say "APT state $APT_DIR (mirror from the machine's Debian sources: trixie-backports amd64, bookworm arm64)"
    apt-get "${APT_OPTS[@]}" -qq update || die "apt-get update (separate state) failed"
}

# ---------------------------------------------------------------------------------------------------
# toolchain

have_toolchain() { local b; for b in "${TOOLCHAIN_BINS[@]}"; do command -v "$b" >/dev/null || return 1; done; }

setup_toolchain() {
    # (no `cmd | grep -q` under pipefail: grep's early exit would fail the pipeline with SIGPIPE)
    if have_toolchain && grep -q 'version 19' <<<"$(clang-19 --version 2>/dev/null)"; then
        say "toolchain: present ($(clang-19 --version | head -1 | sed 's/ (.*//'), ld64.lld-19, llvm-nm-19)"
        return
    fi
    if [ "$(id -u)" != 0 ]; then
        die "clang-19/lld-19/llvm-19 missing: run as root or: sudo apt-get install ${TOOLCHAIN_PKGS[*]}"
    fi
    say "toolchain: apt-get install ${TOOLCHAIN_PKGS[*]}"
    apt-get update -qq
    if ! grep -q 'Candidate: [0-9]' <<<"$(apt-cache policy clang-19 2>/dev/null)"; then
        die "clang-19 is not in this machine's APT sources (Debian 12.10+ has it in bookworm main)"
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${TOOLCHAIN_PKGS[@]}" \
        >/dev/null || die "apt-get install ${TOOLCHAIN_PKGS[*]} failed"
    have_toolchain || die "installed ${TOOLCHAIN_PKGS[*]} but ${TOOLCHAIN_BINS[*]} are not all on PATH"
    say "toolchain: installed ($(clang-19 --version | head -1 | sed 's/ (.*//')) [$(elapsed)]"
}

# ---------------------------------------------------------------------------------------------------
# qemu

qemu_ok() {
    [ -x "$QEMU" ] && [ "$(cat "$QEMU_DIR/.stamp" 2>/dev/null)" = "$SETUP_VERSION $QEMU_PKG" ] || return 1
    local major
    major=$("$QEMU" --version 2>/dev/null | sed -n 's/.*version \([0-9]*\)\..*/\1/p' | head -1)
    [ -n "$major" ] && [ "$major" -ge "$QEMU_MIN_MAJOR" ]
}

setup_qemu() {
    if qemu_ok; then
        say "qemu: present ($("$QEMU" --version | head -1))"
        return
    fi
    apt_state
    local debs=$CACHE/debs/qemu tmp=$CACHE/qemu.tmp
    rm -rf "$debs" "$tmp" && mkdir -p "$debs" "$tmp"
    say "qemu: apt-get download $QEMU_PKG"
    (cd "$debs" && apt-get "${APT_OPTS[@]}" -qq download "$QEMU_PKG") || die "apt-get download $QEMU_PKG failed"
    dpkg-deb --fsys-tarfile "$debs"/qemu-user_*.deb | tar -x -C "$tmp" ./usr/bin/qemu-aarch64 \
        || die "cannot unpack qemu-aarch64 from $(ls "$debs")"
    echo "$SETUP_VERSION $QEMU_PKG" > "$tmp/.stamp"
    rm -rf "$QEMU_DIR" && mv "$tmp" "$QEMU_DIR"
    rm -rf "$debs"                                   # 70 MB of other emulators: keep only qemu-aarch64
    qemu_ok || die "$QEMU does not run or is older than $QEMU_MIN_MAJOR.x"
    say "qemu: unpacked $("$QEMU" --version | head -1) [$(elapsed)]"
}

# ---------------------------------------------------------------------------------------------------
# sysroot: arm64 Python + wheels

sysroot_recipe() {
    { echo "setup $SETUP_VERSION"; echo "debs ${ARM64_PKGS[*]}"; echo "wheel flags ${WHEEL_PLATFORMS[*]}";
      grep -v '^#' "$HERE/requirements.txt"; } | sha256sum | cut -c1-16
}

# run the sysroot's Python under qemu (CPU: $1), arguments after
guest_python() {
    local cpu=$1; shift
    env -u PYTHONPATH -u PYTHONHOME -u PYTHONDONTWRITEBYTECODE QEMU_LD_PREFIX="$SYSROOT" QEMU_CPU="$cpu" \
        "$QEMU" "$SYSROOT$PY" -s "$@"
}

sysroot_ok() {
    [ -x "$SYSROOT$PY" ] && [ "$(cat "$SYSROOT/.stamp" 2>/dev/null)" = "$(sysroot_recipe)" ]
}

setup_sysroot() {
    local recipe
    recipe=$(sysroot_recipe)
    if sysroot_ok; then
        say "sysroot: present ($SYSROOT, recipe $recipe)"
        return
    fi
    command -v "$HOST_PY" >/dev/null && "$HOST_PY" -m pip --version >/dev/null 2>&1 \
        || die "$HOST_PY with pip is needed to fetch the aarch64 wheels"
    apt_state
    local debs=$CACHE/debs/arm64 tmp=$CACHE/sysroot.tmp wheels=$CACHE/wheels p
    rm -rf "$debs" "$tmp" && mkdir -p "$debs" "$tmp"
    say "sysroot: apt-get download (bookworm arm64) ${ARM64_PKGS[*]}"
    (cd "$debs" && apt-get "${APT_OPTS[@]}" -qq download "${ARM64_PKGS[@]/%/:arm64}") \
        || die "apt-get download of the arm64 packages failed"
    for p in "$debs"/*.deb; do dpkg-deb -x "$p" "$tmp"; done
    # empty dirs shadow the host's: qemu -L falls back to host paths for what the sysroot lacks
    mkdir -p "$tmp/usr/local/lib/python3.11/dist-packages" "$tmp/usr/lib/python3/dist-packages" "$tmp/etc"
    : > "$tmp/etc/ld.so.cache"
    [ -x "$tmp$PY" ] || die "no $PY in the unpacked packages"
    say "sysroot: pip download + install (aarch64 wheels of tools/arm64/requirements.txt)"
    mkdir -p "$wheels"
    "$HOST_PY" -m pip download -q --disable-pip-version-check --only-binary=:all: "${WHEEL_PLATFORMS[@]}" \
        -d "$wheels" -r "$HERE/requirements.txt" 2> >(grep -v "is ignored: it is neither" >&2) \
        || die "pip download of the aarch64 wheels failed"
    PIP_ROOT_USER_ACTION=ignore "$HOST_PY" -m pip install -q --isolated --disable-pip-version-check --no-index --find-links "$wheels" \
        --only-binary=:all: "${WHEEL_PLATFORMS[@]}" --target "$tmp/usr/lib/python3/dist-packages" \
        --no-compile -r "$HERE/requirements.txt" || die "pip install --target (aarch64 wheels) failed"
    # byte-compile once (an interpreted import of pytest and numpy is 4x slower without .pyc files):
    # with the host's Python when it is 3.11 too (same bytecode), else with the emulated one
    say "sysroot: byte-compiling the standard library and the wheels"
    if "$HOST_PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
        "$HOST_PY" -m compileall -q -j 0 -s "$tmp" -p / "$tmp/usr/lib/python3.11" \
            "$tmp/usr/lib/python3/dist-packages" >/dev/null 2>&1 || true
    else
        env -u PYTHONPATH -u PYTHONHOME -u PYTHONDONTWRITEBYTECODE QEMU_LD_PREFIX="$tmp" "$QEMU" "$tmp$PY" -s \
            -m compileall -q /usr/lib/python3.11 /usr/lib/python3/dist-packages >/dev/null 2>&1 || true
    fi
    echo "$recipe" > "$tmp/.stamp"
    rm -rf "$SYSROOT" && mv "$tmp" "$SYSROOT"
    rm -rf "$debs"
    say "sysroot: $(du -sh "$SYSROOT" | cut -f1) in $SYSROOT [$(elapsed)]"
}

# ---------------------------------------------------------------------------------------------------
# smoke: the arm64 Python, numpy, ctypes, HWCAP2 and gpt2asm_rdsvl of the cross-built library

setup_smoke() {
    [ -x "$QEMU" ] && [ -x "$SYSROOT$PY" ] || die "smoke: run tools/arm64/setup.sh qemu sysroot first"
    local lib=$ROOT/build/aarch64-linux-gnu/libgpt2asm.so
    "$HOST_PY" "$ROOT/build.py" --target aarch64-linux-gnu -q >/dev/null 2>"$CACHE/build.log" \
        || { cat "$CACHE/build.log" >&2; die "cross build failed"; }
    local entry name cpu want out
    for entry in "${SVL_CPUS[@]}" "nosme:max,sme=off:0"; do
        IFS=: read -r name cpu want <<<"$entry"
        out=$(guest_python "$cpu" "$HERE/smoke.py" "$lib" 2>&1) \
            || { echo "$out" >&2; die "smoke run under -cpu $cpu failed"; }
        say "smoke $name (-cpu $cpu): $(echo "$out" | tr '\n' ' ')"
        grep -q "^svl_bytes=$want\$" <<<"$out" || die "smoke $name: expected svl_bytes=$want"
        if [ "$want" != 0 ]; then
            grep -q "^sme2=True" <<<"$out" || die "smoke $name: SME2 not reported in HWCAP2"
        fi
    done
    say "smoke: ok [$(elapsed)]"
}

# ---------------------------------------------------------------------------------------------------

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(toolchain qemu sysroot smoke)
for step in "${steps[@]}"; do
    case $step in
        toolchain|qemu|sysroot|smoke) "setup_$step" ;;
        *) die "unknown step '$step' (toolchain, qemu, sysroot, smoke)" ;;
    esac
done
say "done (${steps[*]}) in $(elapsed); cache $CACHE"
