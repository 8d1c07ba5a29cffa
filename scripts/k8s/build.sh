#!/usr/bin/env bash
# Builds (once) the Kubernetes control plane the operator e2e runs against:
# kube-apiserver, kube-controller-manager, kube-scheduler, etcd, kwok and helm,
# all from the Go module proxy (no Docker engine here, so no kind/k3s).
# Binaries are cached under $SPATE_K8S_CACHE (default ~/.cache/spate-k8s/bin);
# a second run only checks they exist. Needs Go >= 1.25 on PATH.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.8}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
CACHE="${SPATE_K8S_CACHE:-$HOME/.cache/spate-k8s}"
BIN="$CACHE/bin"
mkdir -p "$BIN"

export PATH="$PATH:/usr/local/go/bin:$CACHE/go/bin"
if ! command -v go >/dev/null; then
  # A fresh machine: Go from go.dev into the cache (Kubernetes 1.36 needs Go >= 1.25).
  GO_VERSION="${GO_VERSION:-1.26.8}"
  echo "build.sh: fetching Go $GO_VERSION" >&2
  curl -fsSL "https://go.dev/dl/go$GO_VERSION.linux-amd64.tar.gz" | tar -C "$CACHE" -xz
fi
# Two cores shared with other builds: one package at a time keeps RSS bounded.
export GOFLAGS="${GOFLAGS:--buildvcs=false}"

have() { [ -x "$BIN/$1" ]; }

build_control_plane() {
  local mod="$CACHE/src/kapi"
  mkdir -p "$mod"
  cd "$mod"
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local staging="v0.${K8S_VERSION#v1.}"
  # kubernetes' go.mod requires its staging modules at v0.0.0 and replaces them with
  # ./staging paths; a wrapper module must replace each with the published tag.
  go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >dl.json
  local gomod
  gomod="$(sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' dl.json)"
  {
    echo "module example.com/kapi"
    echo
    echo "go 1.25"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" |
      awk -v v="$staging" '{print "replace " $1 " => " $1 " " v}'
  } >go.mod
  cat >tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
  go mod tidy -e >/dev/null 2>&1 || true
  # tidy drops requirements only reachable through a build tag; get them back explicitly.
  go get "k8s.io/kubernetes@$K8S_VERSION" >/dev/null
  go mod tidy
  local ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  for cmd in kube-apiserver kube-controller-manager kube-scheduler; do
    have "$cmd" && continue
    echo "build.sh: building $cmd $K8S_VERSION (minutes, ~2 GB RAM)" >&2
    go build -p 1 -ldflags "$ld" -o "$BIN/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
    mv "$BIN/$cmd.tmp" "$BIN/$cmd"
  done
}

build_etcd() {
  local mod="$CACHE/src/etcd"
  mkdir -p "$mod"
  cd "$mod"
  printf 'module example.com/etcdw\n\ngo 1.25\n' >go.mod
  cat >tools.go <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null
  go mod tidy
  go build -ldflags "-s -w" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$BIN/etcd.tmp" "$BIN/etcd"
}

have kube-apiserver && have kube-controller-manager && have kube-scheduler || build_control_plane
have etcd || build_etcd
have kwok || GOBIN="$BIN" go install -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
have helm || GOBIN="$BIN" go install -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
have kubectl || {
  if command -v kubectl >/dev/null; then ln -sf "$(command -v kubectl)" "$BIN/kubectl"
  else GOBIN="$BIN" go install "k8s.io/kubernetes/cmd/kubectl@$K8S_VERSION" 2>/dev/null ||
    (cd "$CACHE/src/kapi" && go build -o "$BIN/kubectl" k8s.io/kubernetes/cmd/kubectl); fi
}

# kwok's stage configs (pod/node lifecycle) ship in its module's kustomize dir.
if [ ! -f "$CACHE/kwok-stages.yaml" ]; then
  dir="$(cd "$CACHE/src/etcd" 2>/dev/null || cd "$CACHE"; GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  : >"$CACHE/kwok-stages.yaml"
  for f in "$dir"/kustomize/stage/node/fast/*.yaml "$dir"/kustomize/stage/pod/fast/*.yaml; do
    [ -f "$f" ] || continue
    cat "$f" >>"$CACHE/kwok-stages.yaml"
    echo "---" >>"$CACHE/kwok-stages.yaml"
  done
fi

