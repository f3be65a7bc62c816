"""How the API server reaches the kubelets' API (`kubectl logs/exec/port-forward`), authenticated as on a real
cluster (docs/real-runtime.md, "How the API server reaches the kubelets").

The API server prefers the Node's `Hostname` address and runs in a mount namespace with the cluster's own hosts
file over /etc/hosts (every containerd node's name on 127.0.0.1); on the host a forwarder on 127.0.0.1:<kubelet
port> carries each connection into the node (nodens.NodeNamespace.forward). It presents a client certificate
for KUBELET_CLIENT_USER, bound to `system:kubelet-api-admin` for the kubelets' Webhook authorization, and
verifies each kubelet's serving certificate from the same CA. The fake runtime's kubelets are not in the hosts
file and keep their loopback-only AlwaysAllow settings.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from neuron_dra.localcluster.controlplane import pki

KUBELET_CLIENT_USER = "kube-apiserver-kubelet-client"  # kubeadm's name for the same certificate
KUBELET_API_ROLE = "system:kubelet-api-admin"  # RBAC bootstrap policy: nodes/proxy, nodes/log, nodes/stats, ...
BINDING_NAME = "neuron-dra-local:kube-apiserver-kubelet-client"
PREFERRED_ADDRESS_TYPES = ("Hostname", "InternalIP")
MAX_HOSTS = 1000
# RFC 1123 subdomain: the names a Node may have.
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class KubeletAccessError(ValueError):
    """A setting of the API server's access to kubelets is invalid; the message names it."""


def client_cert(ca: pki.CertPair, pki_dir: Path) -> pki.CertPair:
    """The API server's client certificate towards kubelets (CN = KUBELET_CLIENT_USER, no groups)."""
    return pki.issue(ca, pki_dir, "apiserver-kubelet-client", common_name=KUBELET_CLIENT_USER, client=True)


def serving_cert(ca: pki.CertPair, directory: Path, node: str, ip_addresses: Sequence[str]) -> pki.CertPair:
    """A kubelet's serving certificate for the name the API server dials (the node name) and its addresses."""
    _check_name(node)
    return pki.issue(ca, directory, "kubelet-serving", common_name=f"system:node:{node}", server=True,
                     dns_names=[node], ip_addresses=[*ip_addresses, "127.0.0.1"])


def apiserver_args(client: pki.CertPair, ca_file: Path) -> list[str]:
    return [
        f"--kubelet-client-certificate={client.cert}",
        f"--kubelet-client-key={client.key}",
        f"--kubelet-certificate-authority={ca_file}",
        f"--kubelet-preferred-address-types={','.join(PREFERRED_ADDRESS_TYPES)}",
    ]


def hosts_text(node_names: Sequence[str]) -> str:
    """The API server's /etc/hosts: localhost, and each node name on 127.0.0.1 (where its forwarder listens)."""
    if len(node_names) > MAX_HOSTS:
        raise KubeletAccessError(f"kubelet hosts: {len(node_names)} node names, at most {MAX_HOSTS} are allowed")
    for name in node_names:
        _check_name(name)
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"127.0.0.1\t{name}" for name in node_names]
    return "\n".join(lines) + "\n"


def namespace_prefix(hosts_file: Path) -> list[str]:
    """The command prefix that runs a program in a new mount namespace with `hosts_file` over /etc/hosts."""
    script = f"mount --bind {shlex.quote(str(hosts_file))} /etc/hosts && exec \"$@\""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]


def apiserver_env(node_names: Sequence[str], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The API server's environment: as `base` (default os.environ), with the node names added to NO_PROXY: its
    kubelet client honours *_PROXY variables (`k8s.io/apimachinery/pkg/util/net/http.go`, SetTransportDefaults:
    http.ProxyFromEnvironment), and Go bypasses a proxy by itself for loopback IPs and `localhost` only."""
    env = dict(os.environ if base is None else base)
    for var in ("NO_PROXY", "no_proxy"):
        current = [p for p in env.get(var, "").split(",") if p]
        env[var] = ",".join([*current, *node_names])
    return env


def cluster_role_binding() -> dict[str, Any]:
    """Binds KUBELET_API_ROLE to the API server's kubelet client user, as kubeadm does."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": BINDING_NAME},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": KUBELET_API_ROLE},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": KUBELET_CLIENT_USER}],
    }


def _check_name(name: str) -> None:
    if len(name) > 253 or not _NODE_NAME.fullmatch(name):
        raise KubeletAccessError(f"node name {name!r} is not allowed: a node name is a lower-case RFC 1123 "
                                 "subdomain (letters, digits, '-', '.'; at most 253 characters)")
