#!/usr/bin/env bash
# Builds the spate broker image and the spate-operator image from this repository, offline (no
# image registry is needed or reachable), with podman:
#   scripts/image.sh        # -> localhost/spate:<version> and localhost/spate-operator:<version>
# It proves the Dockerfile builds: it installs what it needs (podman, runc, debootstrap, via
# scripts/image/podman-setup.sh), makes the Debian base image once with debootstrap (minbase,
# security updates applied) and caches it as a tarball under $SPATE_IMAGE_CACHE/<suite>
# (default ~/.cache/spate-image; imported again when podman no longer has it), builds both
# binaries on the host with cargo (release), and builds both images from the repository's
# Dockerfile: FROM scratch, uid 10001, labels org.opencontainers.image.version (Cargo.toml)
# and .revision (git commit, "-dirty" when the crates differ from it). Prints the sizes.
# Needs root (podman runs as root here). Settings:
#   SPATE_IMAGE_TAG    image tag (default: the version in Cargo.toml)
#   SPATE_IMAGE_SUITE  Debian suite of the base (default: this machine's, bookworm here; the
#                      binaries link this machine's glibc, so the base must not be older)
#   SPATE_IMAGE_MIRROR Debian mirror for debootstrap (default http://deb.debian.org/debian)
#   SPATE_IMAGE_CACHE  where the base's tarball is kept (default ~/.cache/spate-image)
#   SPATE_IMAGE_PROFILE release (default) or debug: which cargo profile's binaries go in
#   SPATE_IMAGE_NO_CARGO=1 takes the binaries already in $CARGO_TARGET_DIR/<profile> (CI,
#                      whose test.sh has just built the debug ones) instead of running cargo
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
start=$SECONDS
[[ $(id -u) -eq 0 ]] || { echo "image.sh: needs root (podman runs as root here)" >&2; exit 1; }
scripts/image/podman-setup.sh --debootstrap
command -v strip >/dev/null 2>&1 || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq binutils >/dev/null; }
pm() { podman --runtime runc "$@"; }
tmp=""; CTX=""
# Unmounted and removed on any exit, also when debootstrap, apt-get or a build fails.
cleanup() {
  if [[ -n "$tmp" ]]; then umount "$tmp/root/proc" 2>/dev/null || true; rm -rf "$tmp"; fi
  [[ -z "$CTX" ]] || rm -rf "$CTX"
}
trap cleanup EXIT

# shellcheck disable=SC1091 # the machine's own file
SUITE="${SPATE_IMAGE_SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")}"
MIRROR="${SPATE_IMAGE_MIRROR:-http://deb.debian.org/debian}"
CACHE="${SPATE_IMAGE_CACHE:-$HOME/.cache/spate-image}/$SUITE"
BASE="localhost/spate-base:$SUITE"

# The base: Debian minbase, only a build stage (the images take its glibc, dash and CA bundle).
if pm image exists "$BASE"; then
  echo "image.sh: base $BASE present"
else
  if [[ ! -s "$CACHE/rootfs.tar" ]]; then
    echo "image.sh: making the base with debootstrap ($SUITE from $MIRROR; once, cached in $CACHE)"
    mkdir -p "$CACHE"
    tmp="$(mktemp -d)"
    debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$tmp/root" "$MIRROR" >"$tmp/debootstrap.log" 2>&1 \
      || { tail -n 30 "$tmp/debootstrap.log" >&2; exit 1; }
    # debootstrap takes the suite only: security fixes (glibc's among them) come from
    # <suite>-security and <suite>-updates.
    {
      echo "deb $MIRROR $SUITE main"
      echo "deb $MIRROR $SUITE-updates main"
      echo "deb ${SPATE_IMAGE_SECURITY_MIRROR:-http://deb.debian.org/debian-security} $SUITE-security main"
    } >"$tmp/root/etc/apt/sources.list"
    cp /etc/resolv.conf "$tmp/root/etc/resolv.conf"
    mount -t proc proc "$tmp/root/proc"
    chroot "$tmp/root" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive chroot "$tmp/root" apt-get upgrade -y -qq >/dev/null
    chroot "$tmp/root" apt-get clean
    umount "$tmp/root/proc"
    rm -rf "$tmp/root/var/lib/apt/lists/"* "$tmp/root/etc/resolv.conf"
    tar -C "$tmp/root" -cf "$CACHE/rootfs.tar.part" .
    mv "$CACHE/rootfs.tar.part" "$CACHE/rootfs.tar"
  fi
  echo "image.sh: importing $CACHE/rootfs.tar as $BASE"
  pm import -q "$CACHE/rootfs.tar" "$BASE" >/dev/null
fi

# The binaries, on the host: no Rust toolchain image is reachable.
PROFILE="${SPATE_IMAGE_PROFILE:-release}"
[[ "$PROFILE" == release || "$PROFILE" == debug ]] || { echo "image.sh: SPATE_IMAGE_PROFILE is release or debug" >&2; exit 2; }
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
if [[ -z "${SPATE_IMAGE_NO_CARGO:-}" ]]; then
  flags=(--locked); [[ "$PROFILE" == release ]] && flags+=(--release)
  cargo build "${flags[@]}" -p spate-server --bin spate -p spate-operator --bin spate-operator
fi
CTX="$(mktemp -d)"
# Debug info off (the binaries shrink several times); symbols stay, so a panic's backtrace
# still names its functions.
for bin in spate spate-operator; do
  [[ -x "$TARGET/$PROFILE/$bin" ]] || { echo "image.sh: no $TARGET/$PROFILE/$bin" >&2; exit 1; }
  strip --strip-debug -o "$CTX/$bin" "$TARGET/$PROFILE/$bin"
done
cp scripts/image/rootfs.sh "$CTX/"

VERSION="$(cargo metadata --no-deps --format-version 1 --offline \
  | python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "spate-server"))')"
REVISION="unknown"
if REVISION="$(git rev-parse HEAD 2>/dev/null)"; then
  [[ -z "$(git status --porcelain --untracked-files=no -- crates Cargo.toml Cargo.lock)" ]] || REVISION="$REVISION-dirty"
fi
# Debug binaries get their own tag: such an image is for tests, never to be mistaken for one.
suffix=""; if [[ "$PROFILE" == debug ]]; then suffix="-debug"; fi
TAG="${SPATE_IMAGE_TAG:-$VERSION$suffix}"
for target in spate operator; do
  name="spate"; [[ "$target" == operator ]] && name="spate-operator"
  echo "image.sh: building localhost/$name:$TAG (version $VERSION, revision $REVISION, $PROFILE binaries)"
  pm build -q --pull=never --network=none --target "$target" \
    --build-arg "BASE=$BASE" --build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION" \
    -t "localhost/$name:$TAG" -f "$ROOT/Dockerfile" "$CTX" >/dev/null
done
for name in spate spate-operator; do
  bytes="$(pm image inspect --format '{{.Size}}' "localhost/$name:$TAG")"
  echo "image.sh: localhost/$name:$TAG $(( bytes / 1000000 )) MB ($bytes bytes)"
done
echo "image.sh: done in $(( SECONDS - start )) s"
