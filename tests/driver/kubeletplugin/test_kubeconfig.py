"""driver/kubeletplugin/_kubeconfig.py and kube.py without an API server: connection settings from the environment and
kubeconfig files, and the errors that name what is wrong. (Calls against a real kube-apiserver:
test_driver_apiserver.py, rbac.)"""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from neuron_dra.driver.kubeletplugin._kube import ApiClient, ApiClientError, ApiException, KubeApi, api_client
from neuron_dra.driver.kubeletplugin._kubeconfig import (
    ClusterConfig,
    KubeConfigError,
    incluster_config,
    load_kubeconfig,
)


def test_incluster_config_needs_the_service_environment(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set"):
        incluster_config({}, tmp_path)
    with pytest.raises(KubeConfigError, match=r"token does not exist"):
        incluster_config({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}, tmp_path)


def test_incluster_config_reads_the_projected_token_and_ca(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t1\n")
    (tmp_path / "ca.crt").write_text("x")
    cfg = incluster_config({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}, tmp_path)
    assert cfg == ClusterConfig(server="https://[fd00::1]:6443", ca_file=str(tmp_path / "ca.crt"),
                                token_file=str(tmp_path / "token"))


def kubeconfig(path: Path, user: dict[str, object], server: str = "https://127.0.0.1:6443") -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": user}], "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    return path


def test_kubeconfig_errors_name_the_file_and_what_is_allowed(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="exec or auth-provider plugins are not supported"):
        load_kubeconfig(str(kubeconfig(tmp_path / "exec", {"exec": {"command": "aws"}})))
    with pytest.raises(KubeConfigError, match=r"server 'http://x' is not allowed: an https:// URL is required"):
        load_kubeconfig(str(kubeconfig(tmp_path / "http", {"token": "t"}, server="http://x")))
    with pytest.raises(KubeConfigError, match=str(tmp_path / "missing")):
        load_kubeconfig(str(tmp_path / "missing"))


class _Handler(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str | None]] = []

    def do_GET(self) -> None:
        type(self).seen.append(("GET", self.path, self.headers.get("Authorization")))
        if self.path.startswith("/missing"):
            self.send_response(404)
            body = b'{"kind":"Status","code":404}'
        elif "watch=true" in self.path:
            self.send_response(200)
            body = b'{"type":"ADDED","object":{"n":1}}\n\n{"type":"DELETED","object":{"n":2}}\n'
        else:
            self.send_response(200)
            body = json.dumps({"path": self.path}).encode()
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def https_server(tmp_path: Path) -> Iterator[str]:
    """A loopback HTTPS server with a self-signed certificate (made with the cryptography package)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    import ipaddress
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(key, hashes.SHA256()))
    (tmp_path / "server.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "server.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                            serialization.PrivateFormat.PKCS8,
                                                            serialization.NoEncryption()))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Handler.seen = []
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_requests_verify_the_ca_from_kubeconfig_data_and_send_the_token(https_server: str, tmp_path: Path) -> None:
    ca = base64.b64encode((tmp_path / "server.crt").read_bytes()).decode()
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": https_server, "certificate-authority-data": ca}}],
        "users": [{"name": "u", "user": {"token": "secret"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    api = KubeApi(api_client(str(path)))
    assert api.call("GET", "/apis/x", query={"a": "b c", "skip": None}) == {"path": "/apis/x?a=b+c"}
    assert api.call("GET", "/apis/y") == {"path": "/apis/y"}  # the same keep-alive connection
    with pytest.raises(ApiException) as info:
        api.call("GET", "/missing")
    assert info.value.status == 404
    events = list(api.watch("/apis/w", {}, 5, 5))
    assert events == [{"type": "ADDED", "object": {"n": 1}}, {"type": "DELETED", "object": {"n": 2}}]
    assert {auth for _, _, auth in _Handler.seen} == {"Bearer secret"}


def test_an_unknown_ca_is_refused(https_server: str) -> None:
    api = KubeApi(ApiClient(ClusterConfig(server=https_server, token="t")))
    with pytest.raises(ApiClientError, match=r"GET /apis/x: SSL\w*Error: .*CERTIFICATE_VERIFY_FAILED"):
        api.call("GET", "/apis/x")


def test_a_json_kubeconfig_reads_like_the_yaml_one(tmp_path: Path) -> None:
    as_yaml = kubeconfig(tmp_path / "yaml", {"token": "t"})
    as_json = tmp_path / "json"
    as_json.write_text(json.dumps(yaml.safe_load(as_yaml.read_text())))
    a, b = load_kubeconfig(str(as_yaml)), load_kubeconfig(str(as_json))
    assert (a.server, a.token, a.insecure) == (b.server, b.token, b.insecure) == ("https://127.0.0.1:6443", "t", True)
