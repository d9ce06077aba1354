#!/usr/bin/env bash
# Build the gpufleet Debian package: a self-contained virtual environment under
# /opt/gpufleet/venv (the dh-virtualenv layout, without dh-virtualenv), the systemd units,
# the sysusers file, the example configs as conffiles and maintainer scripts that create the
# service users and enable nothing.
#
#   packaging/build-deb.sh [--extras agent|all|agent,otlp] [--out DIR] [--python PYTHON]
#                          [--compress xz|gzip|zstd|none] [--revision N] [--wheels DIR]
#
# Prints the path of the .deb on the last line of stdout. Runs as any user (fakeroot is used
# when not root); needs python3-venv and dpkg-deb.
#
# The third-party packages come from the hashed lock file of the extras
# (packaging/locks/<extras, sorted, joined by +>.txt, refreshed by packaging/lock.sh): downloaded
# with pip --require-hashes, then installed from that directory alone, so two builds of one
# commit ship the same files. --wheels DIR only downloads the locked set into DIR and prints
# "sha256  file" for each (what a build would install); the package lists the same in
# /usr/share/doc/gpufleet/wheels.sha256.
set -euo pipefail

SRC=$(cd "$(dirname "$0")/.." && pwd)
EXTRAS=all
OUT="$SRC/dist"
PYTHON=/usr/bin/python3
COMPRESS=xz
REVISION=1
WHEELS_ONLY=""
PREFIX=/opt/gpufleet
UNITDIR=/lib/systemd/system   # Debian 12 ships units below /lib (usrmerge moratorium)

die() { echo "build-deb: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --extras) EXTRAS=${2:?}; shift 2 ;;
        --out) OUT=${2:?}; shift 2 ;;
        --python) PYTHON=${2:?}; shift 2 ;;
        --compress) COMPRESS=${2:?}; shift 2 ;;
        --revision) REVISION=${2:?}; shift 2 ;;
        --wheels) WHEELS_ONLY=${2:?}; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) die "unknown argument: $1" ;;
    esac
done

case "$EXTRAS" in *[!a-z,-]*|"") die "--extras must be a comma-separated list such as agent or all" ;; esac
case "$COMPRESS" in xz|gzip|zstd|none) ;; *) die "--compress must be xz, gzip, zstd or none" ;; esac
command -v dpkg-deb >/dev/null || die "dpkg-deb not found (apt-get install dpkg)"
[ -x "$PYTHON" ] || die "python not found: $PYTHON"
"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null || die "$PYTHON is older than 3.11"
"$PYTHON" -c 'import ensurepip, venv' 2>/dev/null || die "$PYTHON has no venv/ensurepip (apt-get install python3-venv)"

PYVER=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
LOCK="$SRC/packaging/locks/$(printf '%s\n' ${EXTRAS//,/ } | sort -u | paste -sd+ -).txt"
[ -f "$LOCK" ] || die "no lock file for extras $EXTRAS ($LOCK); locked: $(cd "$SRC/packaging/locks" && ls -- *.txt | sed 's/\.txt$//; s/+/,/g' | paste -sd' ' -)"
LOCKPY=$(sed -n 's/^#.*(python \([0-9][0-9.]*\),.*/\1/p' "$LOCK" | head -n 1)
[ "$LOCKPY" = "$PYVER" ] || die "$LOCK is resolved for python ${LOCKPY:-?}, $PYTHON is $PYVER (PYVER=$PYVER packaging/lock.sh)"
VERSION=$("$PYTHON" -c "import re,sys; print(re.search(r'__version__ = \"([^\"]+)\"', open(sys.argv[1]).read())[1])" \
    "$SRC/gpufleet/__init__.py")
ARCH=$(dpkg --print-architecture)
DEBVERSION="$VERSION-$REVISION"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpufleet-deb.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
STAGE="$WORK/root"
VENV="$STAGE$PREFIX/venv"

# 1. the virtual environment, built in the staging tree and moved into place by path rewriting.
# pip builds from a copy of the tree so that nothing is written into the checkout.
mkdir -p "$WORK/src"
if git -C "$SRC" rev-parse --git-dir >/dev/null 2>&1; then
    git -C "$SRC" ls-files -z --cached --others --exclude-standard \
        | (cd "$SRC" && xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh) \
        | tar -C "$SRC" --null -T - -cf - | tar -C "$WORK/src" -xf -
else
    tar -C "$SRC" --exclude=./.venv --exclude=./dist --exclude=./build -cf - . | tar -C "$WORK/src" -xf -
fi
# The locked third-party set: downloaded with every file's hash checked, then installed from that
# directory alone (no index), then gpufleet itself without dependencies.
WHEELS="$WORK/wheels"
download_locked() {  # $1: a python with pip, $2: directory
    "$1" -m pip download --quiet --require-hashes --no-deps --dest "$2" -r "$LOCK" >&2 \
        || die "downloading the locked packages failed ($LOCK)"
}
if [ -n "$WHEELS_ONLY" ]; then
    "$(readlink -f "$PYTHON")" -m venv "$WORK/dl"
    mkdir -p "$WHEELS_ONLY"
    download_locked "$WORK/dl/bin/python" "$WHEELS_ONLY"
    (cd "$WHEELS_ONLY" && sha256sum -- * | sort -k 2)
    exit 0
fi
# The venv links to the versioned interpreter (python3.11), which is what the package depends on.
"$(readlink -f "$PYTHON")" -m venv "$VENV"
download_locked "$VENV/bin/python" "$WHEELS"
"$VENV/bin/python" -m pip install --quiet --no-compile --no-warn-script-location --no-index \
    --find-links "$WHEELS" --require-hashes --no-deps -r "$LOCK" >&2
"$VENV/bin/python" -m pip install --quiet --no-compile --no-warn-script-location --no-deps "$WORK/src" >&2
"$VENV/bin/python" -m pip check >&2 || die "the locked set does not satisfy gpufleet[$EXTRAS] (packaging/lock.sh)"
"$VENV/bin/python" -m pip uninstall --quiet --yes pip setuptools >&2 2>/dev/null || true
rm -f "$VENV"/bin/pip "$VENV"/bin/pip3* "$VENV"/bin/Activate.ps1
# Scripts carry the staging path in their shebang, the activate scripts in VIRTUAL_ENV.
grep -rlI --null -F "$VENV" "$VENV/bin" "$VENV/pyvenv.cfg" | xargs -0 -r sed -i "s#$VENV#$PREFIX/venv#g"
if grep -rqI -F "$STAGE" "$VENV/bin" "$VENV/pyvenv.cfg"; then die "staging path left in the venv"; fi
# Byte-code with the installed path and hash-based invalidation: nothing is ever written below
# /opt at run time (the units mount /opt read-only anyway) and dpkg owns every file.
"$VENV/bin/python" -m compileall -q -j 0 --invalidation-mode checked-hash \
    -s "$STAGE" -p / "$VENV/lib/python$PYVER/site-packages" >/dev/null
find "$VENV" -name '*.pyc' -print -quit | grep -q . || die "byte-compilation produced nothing"

# 2. units, sysusers, configs, docs
install -D -m 0644 "$SRC/packaging/systemd/gpufleet-agent.service" "$STAGE$UNITDIR/gpufleet-agent.service"
install -D -m 0644 "$SRC/packaging/systemd/gpufleet-analyzer.service" "$STAGE$UNITDIR/gpufleet-analyzer.service"
install -D -m 0644 "$SRC/packaging/systemd/gpufleet-analyzer@.service" "$STAGE$UNITDIR/gpufleet-analyzer@.service"
install -D -m 0644 "$SRC/packaging/sysusers.d/gpufleet.conf" "$STAGE/usr/lib/sysusers.d/gpufleet.conf"
mkdir -p "$STAGE/etc/gpufleet"
CONFFILES=""
for conf in "$SRC"/packaging/config/*.toml; do
    [ -e "$conf" ] || continue
    install -m 0644 "$conf" "$STAGE/etc/gpufleet/$(basename "$conf")"
    # Under the unit only its StateDirectory (/var/lib/gpufleet-agent) is writable for the agent:
    # the packaged config keeps the spool and the file exporter's output there.
    if [ "$(basename "$conf")" = agent.toml ]; then
        sed -i 's#"/var/lib/gpufleet/#"/var/lib/gpufleet-agent/#g' "$STAGE/etc/gpufleet/agent.toml"
    fi
    CONFFILES="$CONFFILES/etc/gpufleet/$(basename "$conf")"$'\n'
done
mkdir -p "$STAGE/usr/bin"
ln -s "$PREFIX/venv/bin/gpufleet" "$STAGE/usr/bin/gpufleet"
DOC="$STAGE/usr/share/doc/gpufleet"
install -D -m 0644 "$SRC/README.md" "$DOC/README.md"
for d in operations.md scale.md schema.md architecture.md; do
    [ -e "$SRC/docs/$d" ] && install -m 0644 "$SRC/docs/$d" "$DOC/$d"
done
install -D -m 0644 "$SRC/packaging/deb/60-gpufleet-ipmi.rules" "$DOC/examples/60-gpufleet-ipmi.rules"
# action-sink examples (Slurm drain, Kubernetes cordon) and the runbooks alerts link by default
for ex in "$SRC"/packaging/examples/*.toml; do
    [ -e "$ex" ] && install -m 0644 "$ex" "$DOC/examples/$(basename "$ex")"
done
for rb in "$SRC"/docs/runbooks/*.md; do
    [ -e "$rb" ] && install -D -m 0644 "$rb" "$DOC/runbooks/$(basename "$rb")"
done
(cd "$WHEELS" && sha256sum -- * | sort -k 2) > "$DOC/wheels.sha256"  # what the venv was built from
# the canary's job-boundary hooks (slurm.conf Epilog= / Prolog=; docs/sources.md)
for hook in epilog.sh prolog.sh; do
    install -D -m 0755 "$SRC/packaging/slurm/$hook" "$STAGE/usr/share/gpufleet/slurm/$hook"
done
cat > "$DOC/copyright" <<COPY
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: gpufleet

Files: *
License: Apache-2.0
 On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.
 The virtual environment in $PREFIX/venv bundles third-party Python packages under their
 own licenses; each one's license is in its *.dist-info directory.
COPY

# 3. control data
DEBIAN="$STAGE/DEBIAN"
mkdir -p "$DEBIAN"
for script in postinst prerm postrm; do
    install -m 0755 "$SRC/packaging/deb/$script" "$DEBIAN/$script"
done
[ -n "$CONFFILES" ] && printf '%s' "$CONFFILES" > "$DEBIAN/conffiles"
INSTALLED_SIZE=$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
PYPKG="python$PYVER"
cat > "$DEBIAN/control" <<CONTROL
Package: gpufleet
Version: $DEBVERSION
Architecture: $ARCH
Maintainer: gpufleet maintainers <gpufleet@localhost>
Installed-Size: $INSTALLED_SIZE
Depends: $PYPKG, systemd
Recommends: freeipmi-tools | ipmitool
Section: admin
Priority: optional
Homepage: https://github.com/gpufleet/gpufleet
Description: observability for GPU fleets: node agent and fault analyzer
 A node agent that polls NVML, BMC sensors, XID events and host metrics
 through OpenTelemetry into InfluxDB (with a disk spool while InfluxDB is
 away), and an analyzer that finds silent data corruption, link degradation
 and thermal throttling and pages the on-call.
 .
 Self-contained: Python packages (extras: $EXTRAS) live in $PREFIX/venv.
 Installing enables no service: see /usr/share/doc/gpufleet/operations.md.
CONTROL

# 4. pack (fakeroot gives root:root ownership when not building as root)
mkdir -p "$OUT"
DEB="$OUT/gpufleet_${DEBVERSION}_${ARCH}.deb"
FAKEROOT=""
[ "$(id -u)" -eq 0 ] || FAKEROOT=fakeroot
$FAKEROOT dpkg-deb --root-owner-group -Z"$COMPRESS" --build "$STAGE" "$DEB" >&2
echo "$DEB"
