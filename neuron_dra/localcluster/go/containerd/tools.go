//go:build tools

// Package tools pins containerd's main packages so `go mod tidy` keeps every module they need in
// go.mod/go.sum. It is never compiled (build tag "tools"); build.py builds the binaries with
// `go build -o DIR/ <packages>` from this directory.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
