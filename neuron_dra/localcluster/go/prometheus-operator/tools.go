//go:build tools

// Package tools pins controller-gen and the monitoring.coreos.com API types so `go mod tidy` keeps every
// module they need in go.mod/go.sum. It is never compiled (build tag "tools").
package tools

import (
	_ "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"
)
