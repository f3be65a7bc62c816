#!/usr/bin/env bash
# Usage: localcluster/go/new-kube-module.sh vX.Y.Z
# Writes the wrapper module localcluster/go/kube/X.Y/ that builds kube-apiserver, kube-controller-manager,
# kube-scheduler and kubelet of k8s.io/kubernetes vX.Y.Z from the Go module proxy (see localcluster/BUILD.md):
# the same go and godebug lines as upstream's go.mod, and every staging module it requires at v0.0.0
# replaced by the published v0.Y.Z (a dependency's replaces are ignored, so the wrapper must repeat them).
set -euo pipefail
version=${1:?usage: $0 vX.Y.Z}
[[ $version =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || { echo "$0: expected vX.Y.Z, got $version" >&2; exit 2; }
minor=${BASH_REMATCH[1]}; patch=${BASH_REMATCH[2]}
dir="$(cd "$(dirname "$0")" && pwd)/kube/1.$minor"
export GOPROXY=${GOPROXY_NEURON_DRA:-https://proxy.golang.org} GOFLAGS=-mod=mod GOWORK=off
upstream=$(go mod download -json "k8s.io/kubernetes@$version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
mkdir -p "$dir"
{
  echo "// Wrapper module that builds kube-apiserver, kube-controller-manager, kube-scheduler and kubelet"
  echo "// from the published k8s.io/kubernetes $version (see localcluster/BUILD.md); written by"
  echo "// localcluster/go/new-kube-module.sh, then \`go mod tidy\`."
  echo "module neuron-dra/localcluster/go/kube/1.$minor"
  echo
  grep -E '^go ' "$upstream"
  echo
  grep -E '^godebug' "$upstream"
  echo
  echo "require k8s.io/kubernetes $version"
  echo
  echo "replace ("
  grep -E '^\s+k8s.io/[a-z-]+ v0.0.0$' "$upstream" | awk -v r="v0.$minor.$patch" '{print "\t" $1 " => " $1 " " r}'
  echo ")"
} > "$dir/go.mod"
cat > "$dir/tools.go" <<'GO'
//go:build tools

// Package tools pins the main packages this module builds, so `go mod tidy` keeps every
// module they need in go.mod/go.sum. It is never compiled (build tag "tools").
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
cd "$dir" && go mod tidy
echo "wrote $dir"
