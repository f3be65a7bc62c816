//go:build tools

// Package tools pins the Pulumi CLI main package so `go mod tidy` keeps every module it needs
// in go.mod/go.sum. It is never compiled (build tag "tools"); the binary is built with
// `go build -o DIR/pulumi github.com/pulumi/pulumi/pkg/v3/cmd/pulumi` from this directory.
package tools

import (
	_ "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi"
)
