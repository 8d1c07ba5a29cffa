#!/usr/bin/env bash
# Prints the path of a Go binary new enough for the project's Go test programs (franz-go needs
# Go 1.26): `go` on PATH when it is, else Go 1.26.8 fetched once from the Go module proxy
# (module golang.org/toolchain, the same zip `GOTOOLCHAIN=auto` would fetch) into
# ~/.cache/spate-go.
set -euo pipefail
WANT_MINOR=26
VERSION=1.26.8
if command -v go >/dev/null 2>&1; then
  minor="$(go env GOVERSION 2>/dev/null | sed -n 's/^go1\.\([0-9]*\).*/\1/p')"
  if [[ -n "$minor" ]] && (( minor >= WANT_MINOR )); then
    command -v go
    exit 0
  fi
fi
case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) echo "go-toolchain: no Go toolchain for $(uname -m)" >&2; exit 1 ;;
esac
DIR="$HOME/.cache/spate-go/go$VERSION"
if [[ ! -x "$DIR/bin/go" ]]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  echo "go-toolchain: fetching Go $VERSION from the Go module proxy" >&2
  curl -fsSL --retry 3 -o "$tmp/go.zip" \
    "${GOPROXY_URL:-https://proxy.golang.org}/golang.org/toolchain/@v/v0.0.1-go$VERSION.linux-$arch.zip"
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$tmp/go.zip" "$tmp/x"
  # The zip holds golang.org/toolchain@v0.0.1-go<version>.linux-<arch>/ (a GOROOT).
  mkdir -p "$(dirname "$DIR")"
  rm -rf "$DIR"
  mv "$tmp"/x/golang.org/toolchain@* "$DIR"
  chmod +x "$DIR"/bin/* "$DIR"/pkg/tool/*/*
fi
echo "$DIR/bin/go"
