"""The pieces by which the API server reaches kubelets (localcluster/controlplane/kubeletaccess.py,
nodes/nodens.NodeNamespace.forward): the hosts file, the mount namespace it is bound in, certificates, RBAC,
kubelet settings, the host->node forwarder."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from neuron_dra.localcluster.controlplane import kubeletaccess, pki
from neuron_dra.localcluster.nodes import kubelet
from neuron_dra.localcluster.nodes.nodens import (
    NodeNamespace,
    NodeNamespaceError,
    NodeNamespacePaths,
    NodeNetwork,
    host_listening,
)

needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="mount namespaces need root and util-linux unshare")


def test_hosts_file_maps_each_node_name_to_loopback_and_keeps_localhost() -> None:
    text = kubeletaccess.hosts_text(["trn2-48xlarge-1", "trn1-32xlarge-1"])
    lines = [line.split() for line in text.splitlines()]
    assert ["127.0.0.1", "localhost"] in lines
    assert ["127.0.0.1", "trn2-48xlarge-1"] in lines and ["127.0.0.1", "trn1-32xlarge-1"] in lines


@pytest.mark.parametrize("bad", ["Trn2", "a b", "-x", "x\n127.0.0.2 evil", "", "a" * 254])
def test_hosts_file_refuses_a_name_that_is_not_a_node_name(bad: str) -> None:
    with pytest.raises(kubeletaccess.KubeletAccessError, match=r"node name .* is not allowed: a node name is a "
                                                               r"lower-case RFC 1123 subdomain"):
        kubeletaccess.hosts_text([bad])


def test_hosts_file_is_bounded() -> None:
    with pytest.raises(kubeletaccess.KubeletAccessError, match=r"1001 node names, at most 1000 are allowed"):
        kubeletaccess.hosts_text([f"n{i}" for i in range(1001)])


@needs_root
@pytest.mark.process
def test_the_prefix_shows_the_hosts_file_as_etc_hosts_to_its_program_only(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(kubeletaccess.hosts_text(["trn2-48xlarge-1"]))
    before = Path("/etc/hosts").read_bytes()
    seen = subprocess.run([*kubeletaccess.namespace_prefix(hosts), "cat", "/etc/hosts"], capture_output=True,
                          text=True, timeout=30, check=True).stdout
    assert seen == hosts.read_text()
    assert Path("/etc/hosts").read_bytes() == before


def test_apiserver_env_adds_node_names_to_no_proxy_and_keeps_the_rest() -> None:
    env = kubeletaccess.apiserver_env(["n1", "n2"], {"NO_PROXY": "example.com", "HTTPS_PROXY": "http://p:3128"})
    assert env["NO_PROXY"] == "example.com,n1,n2" and env["no_proxy"] == "n1,n2"
    assert env["HTTPS_PROXY"] == "http://p:3128"


def test_apiserver_args_name_the_client_certificate_the_ca_and_prefer_the_hostname(tmp_path: Path) -> None:
    ca = pki.make_ca(tmp_path)
    client = kubeletaccess.client_cert(ca, tmp_path)
    args = kubeletaccess.apiserver_args(client, ca.cert)
    assert f"--kubelet-client-certificate={client.cert}" in args and f"--kubelet-client-key={client.key}" in args
    assert f"--kubelet-certificate-authority={ca.cert}" in args
    assert "--kubelet-preferred-address-types=Hostname,InternalIP" in args


def test_the_rbac_binding_grants_the_kubelet_api_role_to_the_client_certificates_user(tmp_path: Path) -> None:
    cert = x509.load_pem_x509_certificate(kubeletaccess.client_cert(pki.make_ca(tmp_path), tmp_path).cert.read_bytes())
    (cn,) = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    binding = kubeletaccess.cluster_role_binding()
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "system:kubelet-api-admin"}
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": cn.value}]


def test_kubelet_serving_certificate_is_for_the_node_name_and_signed_by_the_ca(tmp_path: Path) -> None:
    ca = pki.make_ca(tmp_path)
    pair = kubeletaccess.serving_cert(ca, tmp_path / "kubelet", "trn2-48xlarge-1", ["10.201.1.2"])
    cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["trn2-48xlarge-1"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.201.1.2", "127.0.0.1"]
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert.read_bytes()))
    with pytest.raises(kubeletaccess.KubeletAccessError, match=r"node name 'N_1' is not allowed"):
        kubeletaccess.serving_cert(ca, tmp_path, "N_1", [])


def _spec(tmp_path: Path, serving: pki.CertPair | None) -> kubelet.KubeletSpec:
    return kubelet.KubeletSpec("n1", {}, (), "aws:///x/i-1", "10.201.1.2", tmp_path / "ca.crt", 20001, 20002, 36,
                               serving_cert=serving)


def test_a_reachable_kubelet_authenticates_and_authorizes_as_a_real_node_does(tmp_path: Path) -> None:
    paths = kubelet.KubeletPaths(tmp_path, tmp_path / "r")
    serving = pki.CertPair(tmp_path / "s.crt", tmp_path / "s.key")
    config = kubelet.kubelet_config(_spec(tmp_path, serving), paths)
    assert config["authentication"] == {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                                        "x509": {"clientCAFile": str(tmp_path / "ca.crt")}}
    assert config["authorization"] == {"mode": "Webhook"}
    assert (config["tlsCertFile"], config["tlsPrivateKeyFile"]) == (str(serving.cert), str(serving.key))


def test_a_kubelet_nobody_reaches_keeps_its_loopback_only_settings(tmp_path: Path) -> None:
    config = kubelet.kubelet_config(_spec(tmp_path, None), kubelet.KubeletPaths(tmp_path, tmp_path / "r"))
    assert config["authorization"] == {"mode": "AlwaysAllow"}
    assert "tlsCertFile" not in config and config["authentication"]["webhook"] == {"enabled": False}


@pytest.mark.parametrize(("name", "host_port", "node_port", "error"), [
    ("a/b", 1, 1, r"forward name 'a/b' is not allowed: use 1-20 letters, digits or '-'"),
    ("x" * 21, 1, 1, r"is not allowed"),
    ("ok", 0, 1, r"forward ok: host_port 0 is not a TCP port \(1-65535\)"),
    ("ok", 1, 70000, r"forward ok: node_port 70000 is not a TCP port"),
])
def test_forward_refuses_bad_names_and_ports(tmp_path: Path, name: str, host_port: int, node_port: int,
                                             error: str) -> None:
    ns = NodeNamespace(NodeNamespacePaths(tmp_path, tmp_path / "r"), kubelet.KubeletPaths(tmp_path, tmp_path / "r"),
                       tmp_path / "host", NodeNetwork(1), api_port=1)
    ns.pid = 1  # validation comes before anything is started
    with pytest.raises(NodeNamespaceError, match=error):
        ns.forward(name, host_port, node_port, 60)


@needs_root
@pytest.mark.slow
@pytest.mark.process
def test_forward_reaches_a_server_inside_the_node_from_the_hosts_loopback(tmp_path: Path) -> None:
    if shutil.which("socat") is None:
        pytest.skip("socat is not installed (apt-get install -y socat)")
    base, runtime = tmp_path / "node", tmp_path / "r"
    kpaths = kubelet.KubeletPaths(base, runtime)
    ports = kubelet.PortAllocator()
    kubelet.prepare(_spec(tmp_path, None), kpaths, lambda user, groups, path: None)
    (tmp_path / "host").mkdir()
    ns = NodeNamespace(NodeNamespacePaths(base, runtime), kpaths, tmp_path / "host", NodeNetwork(77),
                       api_port=ports.take())
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "hello").write_text("from inside the node\n")
    ns.start(lifetime_s=120)
    server = None
    try:
        node_port, host_port = ports.take(), ports.take()
        server = subprocess.Popen([*ns.enter_net, "python3", "-m", "http.server", "--bind", "127.0.0.1",
                                   str(node_port), "--directory", str(tmp_path / "www")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        sock = ns.forward("www", host_port, node_port, lifetime_s=120)
        assert sock.is_socket()
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + 20
        while True:
            try:
                with opener.open(f"http://127.0.0.1:{host_port}/hello", timeout=2) as r:
                    assert r.read() == b"from inside the node\n"
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        with pytest.raises(OSError):  # the server itself is in the node's network namespace only
            opener.open(f"http://127.0.0.1:{node_port}/hello", timeout=2)
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        ns.stop()
    assert not host_listening(host_port)
