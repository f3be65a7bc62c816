//go:build tools

// Package tools pins the Helm CLI main package so `go mod tidy` keeps every module it needs in
// go.mod/go.sum. It is never compiled (build tag "tools"); the binary is built with
// `go build -o DIR/helm helm.sh/helm/v4/cmd/helm` from this directory (localcluster/helm.py).
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
