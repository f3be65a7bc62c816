//go:build tools

// kube-router for the local cluster's NetworkPolicy enforcer (netpol.py, BUILD.md): only its network policy
// controller runs (--run-firewall), inside a node's network namespace.
package tools

import _ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
