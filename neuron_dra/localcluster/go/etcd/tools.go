//go:build tools

// Package tools pins the etcd main package so `go mod tidy` keeps every module it needs
// in go.mod/go.sum. It is never compiled (build tag "tools"); the binary is built with
// `go build -o DIR/etcd go.etcd.io/etcd/server/v3` from this directory.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
