//go:build tools

// Package tools pins the YAML language host's main package so `go mod tidy` keeps every module it needs in
// go.mod/go.sum. It is never compiled (build tag "tools"); the binary is built with
// `go build -o DIR/pulumi-language-yaml github.com/pulumi/pulumi-yaml/cmd/pulumi-language-yaml` from this
// directory (localcluster/pulumi_yaml.py).
package tools

import (
	_ "github.com/pulumi/pulumi-yaml/cmd/pulumi-language-yaml"
)
