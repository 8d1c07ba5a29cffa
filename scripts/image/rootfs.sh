#!/bin/sh
# Assembles the root file system of a FROM-scratch image: one binary, the shared libraries it
# links (resolved with ldd in the Debian base the image is built on, so they are that base's
# glibc), /etc/passwd and /etc/group naming uid/gid 10001 "spate", and nothing else unless
# asked: no package manager, no coreutils, no setuid programs. Runs inside the Dockerfile's
# `rootfs` stage (Debian minbase, dash); see scripts/image.sh.
#   rootfs.sh OUT BINARY [--shell] [--ca-certificates] [--data-dir DIR]
# --shell adds /bin/sh (Debian's dash), --ca-certificates the system CA bundle, --data-dir an
# empty directory owned by 10001:10001 (a fresh volume mounted there takes its ownership).
set -eu
out="$1"; bin="$2"; shift 2
shell=""; ca=""; data=""
while [ $# -gt 0 ]; do
  case "$1" in
    --shell) shell=1 ;;
    --ca-certificates) ca=1 ;;
    --data-dir) data="$2"; shift ;;
    *) echo "rootfs.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

# Copies each library `ldd` names for the given programs to the same path under $out, links
# followed (/lib64/ld-linux-x86-64.so.2 stays where the binaries' interpreter field says).
copy_libs() {
  for prog in "$@"; do
    if ldd "$prog" | grep -q 'not found'; then
      echo "rootfs.sh: $prog needs a library this base lacks:" >&2; ldd "$prog" >&2; exit 1
    fi
    ldd "$prog" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'
  done | sort -u | while read -r lib; do
    cp -L --parents "$lib" "$out"
  done
}

mkdir -p "$out/usr/local/bin" "$out/etc" "$out/tmp"
chmod 1777 "$out/tmp"
install -m 0755 "$bin" "$out/usr/local/bin/"
progs="$bin"
if [ -n "$shell" ]; then
  mkdir -p "$out/bin"
  install -m 0755 "$(readlink -f /bin/sh)" "$out/bin/sh"
  progs="$progs /bin/sh"
fi
# shellcheck disable=SC2086 # two paths without spaces
copy_libs $progs
printf 'root:x:0:0:root:/root:/sbin/nologin\nspate:x:10001:10001:spate:/var/lib/spate:/sbin/nologin\n' \
  >"$out/etc/passwd"
printf 'root:x:0:\nspate:x:10001:\n' >"$out/etc/group"
# glibc's resolver reads this; without it a name is tried in DNS before /etc/hosts.
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$out/etc/nsswitch.conf"
if [ -n "$ca" ]; then
  mkdir -p "$out/etc/ssl/certs"
  cp -L /etc/ssl/certs/ca-certificates.crt "$out/etc/ssl/certs/"
fi
if [ -n "$data" ]; then
  mkdir -p "$out$data"
  chown 10001:10001 "$out$data"
  chmod 0750 "$out$data"
fi
# The assembled tree must run on its own: the binary, and the shell when there is one.
chroot "$out" "/usr/local/bin/$(basename "$bin")" --version
if [ -n "$shell" ]; then
  chroot "$out" /bin/sh -c 'echo "rootfs.sh: /bin/sh runs"'
fi
find "$out" -perm /6000 -type f | grep . && { echo "rootfs.sh: setuid/setgid files" >&2; exit 1; }
echo "rootfs.sh: $out: $(du -sh "$out" | cut -f1)"
