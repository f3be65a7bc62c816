"""Where the API server is and how to authenticate: a kubeconfig file (server, CA, client certificate, bearer
token or token file; no exec or auth-provider plugins) or the in-cluster service account (KUBERNETES_SERVICE_HOST
and _PORT, the projected token and CA). Without the `kubernetes` package, whose import is large and slow at
start-up (driver/README.md)."""

from __future__ import annotations

import base64
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeConfigError(RuntimeError):
    pass


@dataclass(frozen=True)
class ClusterConfig:
    """Where the API server is and how to authenticate: what the kubeconfig or the service account says."""

    server: str  # https://host:port
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    token: str | None = None
    token_file: str | None = None  # re-read every TOKEN_RELOAD_SECONDS (rotated projected tokens)
    insecure: bool = False
    temp_dir: str | None = None  # inline kubeconfig data written out for ssl; removed once the client holds it


def _kubeconfig_file(data: str, directory: Path, name: str) -> str:
    path = directory / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64decode(data))
    return str(path)


def _parse_kubeconfig(text: str) -> Any:
    """JSON (a kubeconfig may be JSON, as client-go reads it) without importing yaml; YAML otherwise. Only with
    --kubeconfig (tests, local clusters): in-cluster start-up parses nothing."""
    if text.lstrip().startswith("{"):
        return json.loads(text)
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"not YAML: {e}") from e


def load_kubeconfig(path: str) -> ClusterConfig:
    """The current context's cluster and user of a kubeconfig file (inline `*-data` fields are written to a
    private temporary directory, since ssl loads certificates from files; `api_client` removes it)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        doc = _parse_kubeconfig(text)
        by_name = {kind: {e["name"]: e[kind[:-1]] for e in doc.get(kind) or ()} for kind in
                   ("clusters", "users", "contexts")}
        context = by_name["contexts"][doc["current-context"]]
        cluster = by_name["clusters"][context["cluster"]]
        user = by_name["users"].get(context.get("user"), {}) or {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise KubeConfigError(f"cannot load kubeconfig {path}: {e!r}") from e
    if "exec" in user or "auth-provider" in user:
        raise KubeConfigError(f"kubeconfig {path}: user credentials by exec or auth-provider plugins are not "
                              "supported; use a client certificate or a token")
    base = Path(path).resolve().parent
    directory = Path(tempfile.mkdtemp(prefix="neuron-dra-kubeconfig-"))

    def file_of(key: str, name: str, section: Mapping[str, Any]) -> str | None:
        if section.get(f"{key}-data"):
            return _kubeconfig_file(section[f"{key}-data"], directory, name)
        value = section.get(key)
        return str(base / value) if value else None

    server = str(cluster.get("server", ""))
    if not server.startswith("https://"):
        raise KubeConfigError(f"kubeconfig {path}: server {server!r} is not allowed: an https:// URL is required")
    return ClusterConfig(server=server, ca_file=file_of("certificate-authority", "ca.crt", cluster),
                         cert_file=file_of("client-certificate", "client.crt", user),
                         key_file=file_of("client-key", "client.key", user), token=user.get("token"),
                         token_file=str(base / user["tokenFile"]) if user.get("tokenFile") else None,
                         insecure=bool(cluster.get("insecure-skip-tls-verify")), temp_dir=str(directory))


def incluster_config(env: Mapping[str, str], account: Path = SERVICE_ACCOUNT_DIR) -> ClusterConfig:
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubeConfigError("cannot load in-cluster config (no --kubeconfig given): KUBERNETES_SERVICE_HOST and "
                              "KUBERNETES_SERVICE_PORT are not set (not running in a pod?)")
    for name in ("token", "ca.crt"):
        if not (account / name).is_file():
            raise KubeConfigError(f"cannot load in-cluster config: {account / name} does not exist "
                                  "(is the service account token mounted?)")
    host = f"[{host}]" if ":" in host else host
    return ClusterConfig(server=f"https://{host}:{port}", ca_file=str(account / "ca.crt"),
                         token_file=str(account / "token"))
