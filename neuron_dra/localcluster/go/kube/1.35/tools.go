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
