#!/usr/bin/env bash
# The v2 layer: crishim on a real node's host — cgroup v2 unified, systemd as PID 1,
# AppArmor enforced — in the Debian 12 guest that ../shared/v2vm builds and boots under
# QEMU. Builds the image or reuses it (rebuilt when pyproject.toml's dependencies change:
# its wheelhouse comes from them), boots a throw-away copy of it (every run starts from the
# image as built: nothing one run installs or leaves behind reaches the next), copies this
# checkout in, runs hack/v2-guest.sh there (hack/setup.sh --run, then the cgroup/stats/
# logs/AppArmor e2e tests, crun and kill -9 recovery, and the kubelet layer with kubelets
# 1.36 and 1.32 on the systemd driver), stops the guest and deletes its copy of the image.
#
#   hack/v2.sh [-- PYTEST_ARGS...]       (as root; hack/test.sh v2 runs it)
#
# QEMU runs under `nice` (these hosts are shared). Environment: V2VM_DIR (default
# ~/.cache/crishim-v2vm), CRISHIM_V2VM (the scripts, default ../shared/v2vm),
# CRISHIM_V2_TIMEOUT (seconds for the guest's part, default 3000).
set -uo pipefail
cd "$(dirname "$0")/.."
V2VM=${CRISHIM_V2VM:-$(cd .. && pwd)/shared/v2vm}
export V2VM_DIR=${V2VM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/crishim-v2vm}
t0=$(date +%s)
say() { printf '==> v2: %s\n' "$*"; }

[ -x "$V2VM/build.sh" ] || { echo "v2.sh: no $V2VM/build.sh (the guest's scripts)" >&2; exit 1; }
need=()
for t in mmdebstrap qemu-system-x86_64 mkfs.ext4 ssh-keygen ssh; do
    command -v "$t" >/dev/null || need+=("$t")
done
if [ ${#need[@]} -gt 0 ]; then
    say "installing the guest's tools (missing: ${need[*]})"
    DEBIAN_FRONTEND=noninteractive apt-get install -y mmdebstrap qemu-system-x86 \
        qemu-utils e2fsprogs openssh-client >/dev/null || exit 1
fi

# The image holds a wheelhouse of pyproject.toml's dependencies (the guest's pip installs
# only from it): a different dependency list needs a new image.
deps=$(python3 -c 'import json, tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print(json.dumps([p["dependencies"], p["optional-dependencies"]["dev"]]))' | sha256sum | cut -c1-64)
if "$V2VM/run.sh" status >/dev/null 2>&1; then
    echo "v2.sh: a guest already runs in $V2VM_DIR; stop it first ($V2VM/run.sh stop)" >&2
    exit 1
fi
# The image as build.sh made it is never booted: its stamp (base.sha256) is written only
# after a build, so an image from before (booted read-write by earlier runs) is rebuilt.
BASE=$V2VM_DIR
BOOT=$BASE/boot
if [ ! -f "$BASE/rootfs.img" ] || [ "$(cat "$BASE/base.sha256" 2>/dev/null)" != "$deps" ]; then
    say "building the guest image (dependencies changed or no pristine image)"
    rm -rf "$BASE/wheels" "$BASE/deps.sha256"  # build.sh keeps a wheelhouse that is not empty
    nice -n 10 "$V2VM/build.sh" || { echo "v2.sh: build.sh failed" >&2; exit 1; }
    echo "$deps" >"$BASE/base.sha256"
else
    say "reusing $BASE/rootfs.img"
fi

# Boot a copy: run.sh boots $V2VM_DIR/rootfs.img read-write, so $V2VM_DIR becomes a
# scratch directory beside the image with the kernel, initrd and key of the build.
export V2VM_DIR=$BOOT
if "$V2VM/run.sh" status >/dev/null 2>&1; then
    echo "v2.sh: a guest already runs in $BOOT; stop it first (V2VM_DIR=$BOOT $V2VM/run.sh stop)" >&2
    exit 1
fi
rm -rf "$BOOT" && mkdir -p "$BOOT" || exit 1
for f in vmlinuz initrd.img id_ed25519; do ln -s "../$f" "$BOOT/$f"; done
cp --reflink=auto --sparse=always "$BASE/rootfs.img" "$BOOT/rootfs.img" || exit 1
say "copied the image in $(( $(date +%s) - t0 ))s"

# The guest is stopped and its copy deleted however this ends (a stray QEMU would eat the
# shared CPUs).
trap '"$V2VM/run.sh" stop >/dev/null 2>&1 || true; rm -f "$BOOT/rootfs.img"' EXIT
say "booting the guest"
nice -n 10 "$V2VM/run.sh" start || exit 1
CRISHIM_SRC=. "$V2VM/sync.sh" || exit 1
say "running hack/v2-guest.sh in the guest"
out=$(mktemp)
timeout --kill-after=60 "${CRISHIM_V2_TIMEOUT:-3000}" "$V2VM/ssh.sh" \
    "cd /srv/crishim && hack/v2-guest.sh $( [ $# -gt 0 ] && printf '%q ' "$@")" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 124 ] && echo "--- v2: the guest's part stopped after ${CRISHIM_V2_TIMEOUT:-3000}s"
"$V2VM/run.sh" stop >/dev/null 2>&1 || true
rm -f "$BOOT/rootfs.img"
trap - EXIT
say "counts (in the guest: cgroup v2, systemd, AppArmor):"
grep '^v2 ' "$out" | sed 's/^/    /'
rm -f "$out"
say "finished in $(( $(date +%s) - t0 ))s (exit $rc)"
exit "$rc"
