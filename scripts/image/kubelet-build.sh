#!/usr/bin/env bash
# Builds (once) the kubelet at the Kubernetes version of scripts/k8s/build.sh, from the Go
# module proxy through a wrapper module pinning kubernetes' staging modules (as build.sh does
# for the control plane), into $SPATE_K8S_CACHE/bin/kubelet (~/.cache/spate-k8s; ~6 min on
# 2 cores). Used by scripts/image/kubelet-smoke.sh and kubelet-operator-e2e.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck disable=SC2016 # the pattern matches build.sh's text
K8S_VERSION="${K8S_VERSION:-$(sed -n 's/^K8S_VERSION="\${K8S_VERSION:-\(v[0-9.]*\)}"$/\1/p' "$ROOT/scripts/k8s/build.sh")}"
CACHE="${SPATE_K8S_CACHE:-$HOME/.cache/spate-k8s}"
KUBELET="$CACHE/bin/kubelet"
export PATH="$PATH:/usr/local/go/bin"
if [[ ! -x "$KUBELET" ]]; then
  echo "kubelet-build: building kubelet $K8S_VERSION (minutes)"
  mod="$CACHE/src/kubelet"; mkdir -p "$mod" "$CACHE/bin"
  cd "$mod"
  export GOFLAGS="${GOFLAGS:--buildvcs=false}"
  go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >dl.json
  gomod="$(sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' dl.json)"
  {
    printf 'module example.com/kubelet\n\ngo 1.25\n\nrequire k8s.io/kubernetes %s\n\n' "$K8S_VERSION"
    grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" |
      awk -v v="v0.${K8S_VERSION#v1.}" '{print "replace " $1 " => " $1 " " v}'
  } >go.mod
  printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kubelet"\n' >tools.go
  go mod tidy -e >/dev/null 2>&1 || true
  go get "k8s.io/kubernetes@$K8S_VERSION" >/dev/null
  go mod tidy
  minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  go build -p 2 -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
    -o "$KUBELET.tmp" k8s.io/kubernetes/cmd/kubelet
  mv "$KUBELET.tmp" "$KUBELET"
fi
"$KUBELET" --version
