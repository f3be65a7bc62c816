//go:build tools

// Package tools pins Prometheus's server package so `go mod tidy` keeps every module it needs in
// go.mod/go.sum. It is never compiled (build tag "tools"); build.py builds the binary with
// `go build -o DIR/ github.com/prometheus/prometheus/cmd/prometheus` from this directory.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
)
