"""A local Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler.

Everything listens on 127.0.0.1 only, on ports picked free at start. The state of one control plane
lives in one directory:

    DIR/kubeconfig              admin kubeconfig (system:masters client certificate, embedded)
    DIR/pki/                    CA, serving and client certificates, service-account signing key
    DIR/kubeconfigs/            kubeconfigs of the controller-manager, the scheduler, minted users
    DIR/etcd-data/              etcd's data
    DIR/logs/<name>.log         each process's output
    DIR/pids/<name>.pid         each process group's id, for `stop(DIR)` from any process
    DIR/controlplane.json       ports, server URL and deadline

Every process is started by procs.spawn (under coreutils `timeout`), so it dies after `max_lifetime_s`
(default 2 h) even when whoever started it is gone; `stop(DIR)` or `ControlPlane.stop()` end it sooner.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from neuron_dra.localcluster.build import DEFAULT_MINOR, Binaries, ensure_binaries
from neuron_dra.localcluster.controlplane import kubeletaccess, pki
from neuron_dra.localcluster.controlplane.profiles import (
    DEFAULT_PROFILE,
    ControlPlaneProfile,
    get_profile,
    scheduler_config,
)
from neuron_dra.localcluster.processes import procs

DEFAULT_MAX_LIFETIME_S = 2 * 3600.0
LOOPBACK = "127.0.0.1"
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # first address of SERVICE_CIDR: the `kubernetes` Service
ISSUER = "https://kubernetes.default.svc.cluster.local"
CLUSTER_NAME = "neuron-dra-local"
# Stop order: clients of the API server first, etcd last.
PROCESS_ORDER = ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")
STATE_DIRS = ("pki", "kubeconfigs", "etcd-data", "logs", "pids", "certs", "flexvolume")

Log = Callable[[str], None]


class ControlPlaneError(RuntimeError):
    """The control plane could not be started or used; the message names the component."""


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int


@dataclass(frozen=True)
class BoundObject:
    """The object a service-account token is bound to (the token dies with it)."""

    kind: str  # Pod, Secret or Node
    name: str
    uid: str
    api_version: str = "v1"


@dataclass(frozen=True)
class Process:
    name: str
    popen: subprocess.Popen[bytes] = field(compare=False, repr=False)
    log: Path
    pid_file: Path


@dataclass(frozen=True)
class ControlPlane:
    """A running control plane. Use `ControlPlane.start(dir)`; a context manager that stops it on exit."""

    dir: Path
    server: str
    kubeconfig: Path
    ca_file: Path
    ports: Ports
    binaries: Binaries
    deadline: float  # time.time() after which every process has been killed by its timeout
    processes: tuple[Process, ...] = field(repr=False)

    @classmethod
    def start(
        cls,
        dir: Path,
        *,
        max_lifetime_s: float = DEFAULT_MAX_LIFETIME_S,
        timeout_s: float = 180.0,
        binaries: Binaries | None = None,
        kubernetes_version: str = DEFAULT_MINOR,
        extra_apiserver_args: Sequence[str] = (),
        extra_controller_manager_args: Sequence[str] = (),
        profile: str = DEFAULT_PROFILE,
        scheduler_profiling: bool = False,
        kubelet_hosts: Sequence[str] = (),
        log: Log | None = None,
    ) -> ControlPlane:
        """Start etcd, kube-apiserver, kube-controller-manager and kube-scheduler in `dir`.

        Builds the binaries first when they are not cached (minutes, once). Returns when the API
        server is ready and the controller-manager and scheduler report healthy; on failure stops
        whatever it started and raises ControlPlaneError with the failing component's log tail. `profile`
        names the components' rate limits (profiles.py: `default` or `tuned`); `scheduler_profiling`
        serves the scheduler's /debug/pprof. `kubelet_hosts`: the node names the API server resolves to
        127.0.0.1, where forwarders to their kubelets listen (kubeletaccess.py).
        """
        dir = dir.resolve()
        try:
            chosen = get_profile(profile)
        except ValueError as e:
            raise ControlPlaneError(str(e)) from e
        if max_lifetime_s < 1:
            raise ControlPlaneError(f"max_lifetime_s must be at least 1 s, got {max_lifetime_s}")
        if running(dir):
            raise ControlPlaneError(f"a control plane is already running in {dir}; call stop({str(dir)!r}) first")
        bins = binaries or ensure_binaries(kubernetes_version, log=log)
        _reset_state(dir)
        ports = _free_ports()
        files = _write_pki_and_kubeconfigs(dir, ports)
        deadline = time.time() + max_lifetime_s
        launcher = _Launcher(dir, max_lifetime_s, timeout_s, _https_context(files))
        server = f"https://{LOOPBACK}:{ports.apiserver}"
        try:
            launcher.launch("etcd", bins.etcd, _etcd_args(dir, ports), lambda: _etcd_healthy(ports.etcd_client))
            if log is not None:
                log(f"etcd {bins.etcd_version} up on {LOOPBACK}:{ports.etcd_client}")
            kubelet_args = kubeletaccess.apiserver_args(files.kubelet_client, files.ca.cert)
            apiserver_args = _apiserver_args(dir, ports, [*kubelet_args, *chosen.apiserver_args, *extra_apiserver_args])
            launcher.launch("kube-apiserver", bins.kube_apiserver, apiserver_args, f"{server}/readyz",
                            **_kubelet_hosts_launch(dir, kubelet_hosts))
            kcm_args = [*_controller_manager_args(dir, ports), *chosen.controller_manager_args,
                        *extra_controller_manager_args]
            launcher.launch("kube-controller-manager", bins.kube_controller_manager, kcm_args)
            scheduler_args = _scheduler_args(dir, ports, chosen, scheduler_profiling)
            launcher.launch("kube-scheduler", bins.kube_scheduler, scheduler_args)
            for name, port in (("kube-controller-manager", ports.controller_manager),
                               ("kube-scheduler", ports.scheduler)):
                launcher.wait(name, f"https://{LOOPBACK}:{port}/healthz")
            _bind_kubelet_client(dir / "kubeconfig")
        except BaseException:
            _stop_processes(launcher.processes)
            raise
        plane = cls(dir, server, dir / "kubeconfig", files.ca.cert, ports, bins, deadline, tuple(launcher.processes))
        (dir / "controlplane.json").write_text(json.dumps({
            "server": server, "kubeconfig": str(plane.kubeconfig), "caFile": str(plane.ca_file),
            "ports": ports.__dict__, "deadline": deadline, "kubernetes": bins.kube_version, "etcd": bins.etcd_version,
            "profile": chosen.name,
        }, indent=2))
        if log is not None:
            log(f"Kubernetes {bins.kube_version} control plane ready at {server} (kubeconfig {plane.kubeconfig})")
        return plane

    def stop(self) -> None:
        """Stop every process (TERM, then KILL after a grace period) and remove the pid files."""
        _stop_processes(list(self.processes))

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def api_client(self) -> Any:
        """A `kubernetes.client.ApiClient` for the admin kubeconfig (the caller closes it)."""
        return config.new_client_from_config(str(self.kubeconfig))

    @property
    def ca(self) -> pki.CertPair:
        """The CA that signs every certificate of this cluster (its key too: for issuing more)."""
        return pki.CertPair(self.dir / "pki" / "ca.crt", self.dir / "pki" / "ca.key")

    def client_kubeconfig(self, user: str, groups: Sequence[str] = (), *, path: Path | None = None) -> Path:
        """Mint a client certificate for `user` in `groups` (e.g. `system:node:n1`, `system:nodes`) and
        write a kubeconfig that uses it; returns its path (default DIR/kubeconfigs/user-<user>.kubeconfig)."""
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", user)
        pair = pki.issue(self.ca, self.dir / "pki" / "users", safe, common_name=user, organizations=groups, client=True)
        target = path or self.dir / "kubeconfigs" / f"user-{safe}.kubeconfig"
        _write_kubeconfig(target, self.server, self.ca_file, user, {
            "client-certificate-data": _b64(pair.cert), "client-key-data": _b64(pair.key)})
        return target

    def service_account_token(
        self,
        namespace: str,
        name: str,
        *,
        audiences: Sequence[str] = (),
        expiration_s: int = 3600,
        bound_object: BoundObject | None = None,
        create: bool = True,
    ) -> str:
        """A bound token of service account `namespace/name` from the TokenRequest API.

        `create` makes the namespace and service account first if missing. With `bound_object` the
        token is invalid once that object is gone; bound to a Pod with `spec.nodeName`, the API server
        also records the node in the token (`authentication.kubernetes.io/node-name` in user extra).
        """
        api = self.api_client()
        try:
            core = client.CoreV1Api(api)
            # Plain dicts as bodies (typed `Any`): the client serializes them as they are.
            if create:
                ns_body: Any = {"metadata": {"name": namespace}}
                sa_body: Any = {"metadata": {"name": name}}
                _create_if_missing(lambda: core.create_namespace(ns_body))
                _create_if_missing(lambda: core.create_namespaced_service_account(namespace, sa_body))
            spec: dict[str, Any] = {"audiences": list(audiences) or None, "expirationSeconds": expiration_s}
            if bound_object is not None:
                spec["boundObjectRef"] = {"apiVersion": bound_object.api_version, "kind": bound_object.kind,
                                          "name": bound_object.name, "uid": bound_object.uid}
            request: Any = {"spec": spec}
            response: Any = core.create_namespaced_service_account_token(name, namespace, request)
            token = response.status.token if response.status is not None else None
            if not token:
                raise ControlPlaneError(f"TokenRequest for service account {namespace}/{name} returned no token")
            return str(token)
        finally:
            api.close()

    def token_kubeconfig(self, token: str, user: str, path: Path) -> Path:
        """Write a kubeconfig for a bearer `token` (e.g. from `service_account_token`)."""
        _write_kubeconfig(path, self.server, self.ca_file, user, {"token": token})
        return path


def running(dir: Path) -> list[str]:
    """Names of the control-plane processes of `dir` that are still alive."""
    pids = dir.resolve() / "pids"
    return [name for name in PROCESS_ORDER if procs.running(pids / f"{name}.pid") is not None]


def stop(dir: Path, grace_s: float = 15.0) -> bool:
    """Stop the control plane of `dir` from any process (via its pid files); True if something ran."""
    pids = dir.resolve() / "pids"
    found = False
    for name in PROCESS_ORDER:
        found = procs.stop_pid_file(pids / f"{name}.pid", grace_s) or found
    return found


# --- processes ------------------------------------------------------------------------------------


class _Launcher:
    """Starts the control plane's processes and waits for each to be healthy (a URL that answers 200, or a check)."""

    def __init__(self, dir: Path, max_lifetime_s: float, timeout_s: float, https: ssl.SSLContext) -> None:
        self.dir = dir
        self.max_lifetime_s = max_lifetime_s
        self.timeout_s = timeout_s
        self.https = https
        self.processes: list[Process] = []

    def launch(self, name: str, binary: Path, args: list[str], healthy: str | Callable[[], bool] | None = None,
               prefix: Sequence[str] = (), env: dict[str, str] | None = None) -> None:
        log = self.dir / "logs" / f"{name}.log"
        pid_file = self.dir / "pids" / f"{name}.pid"
        popen = procs.spawn([*prefix, str(binary), *args], log=log, pid_file=pid_file,
                            lifetime_s=self.max_lifetime_s, cwd=self.dir, env=env)
        self.processes.append(Process(name, popen, log, pid_file))
        if healthy is not None:
            self.wait(name, healthy)

    def wait(self, name: str, healthy: str | Callable[[], bool]) -> None:
        proc = next(p for p in self.processes if p.name == name)
        check = functools.partial(_ok, self.https, healthy) if isinstance(healthy, str) else healthy

        def ready() -> bool:
            if proc.popen.poll() is not None:
                raise ControlPlaneError(f"{name} exited with {proc.popen.returncode} during start:\n{_tail(proc.log)}")
            return check()

        if not procs.wait_for(ready, self.timeout_s, 0.25):
            raise ControlPlaneError(f"{name} not healthy after {self.timeout_s:.0f} s:\n{_tail(proc.log)}")


def _stop_processes(processes: list[Process], grace_s: float = 15.0) -> None:
    by_name = {p.name: p for p in processes}
    for name in PROCESS_ORDER:
        proc = by_name.get(name)
        if proc is None:
            continue
        ref = procs.read_pid_file(proc.pid_file)
        if ref is not None:
            procs.stop(ref, grace_s, popen=proc.popen)
        proc.pid_file.unlink(missing_ok=True)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(no log: {e})"


# --- configuration --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Files:
    ca: pki.CertPair
    admin: pki.CertPair
    kubelet_client: pki.CertPair


def _reset_state(dir: Path) -> None:
    """Remove what a previous (stopped) control plane left in `dir`: a fresh CA needs fresh etcd data."""
    dir.mkdir(parents=True, exist_ok=True)
    for sub in STATE_DIRS:
        shutil.rmtree(dir / sub, ignore_errors=True)
    for sub in ("pki", "kubeconfigs", "logs", "pids"):
        (dir / sub).mkdir(mode=0o700)
    for f in ("kubeconfig", "controlplane.json", "hosts"):
        (dir / f).unlink(missing_ok=True)


def _free_ports() -> Ports:
    # All sockets stay bound until every port is picked, so the five ports differ.
    socks = []
    try:
        for _ in range(5):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
        p = [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
    return Ports(etcd_client=p[0], etcd_peer=p[1], apiserver=p[2], controller_manager=p[3], scheduler=p[4])


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def _write_kubeconfig(path: Path, server: str, ca_file: Path, user: str, credentials: dict[str, str]) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": CLUSTER_NAME, "cluster": {"server": server, "certificate-authority-data": _b64(ca_file)}}
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": CLUSTER_NAME, "context": {"cluster": CLUSTER_NAME, "user": user}}],
        "current-context": CLUSTER_NAME,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)


def _write_pki_and_kubeconfigs(dir: Path, ports: Ports) -> _Files:
    p = dir / "pki"
    ca = pki.make_ca(p)
    pki.issue(ca, p, "apiserver", common_name="kube-apiserver", server=True,
              dns_names=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                         "kubernetes.default.svc.cluster.local"],
              ip_addresses=[LOOPBACK, SERVICE_IP])
    for name in ("kube-controller-manager", "kube-scheduler"):
        pki.issue(ca, p, f"{name}-serving", common_name=name, server=True, dns_names=["localhost"],
                  ip_addresses=[LOOPBACK])
    pki.make_signing_key(p, "sa")
    # A separate CA for the aggregation layer's request-header authentication, as kubeadm does: a
    # certificate from it lets its holder assert any identity in headers, so it must not be the
    # CA that signs ordinary clients. The controller-manager and scheduler read this CA from the
    # extension-apiserver-authentication ConfigMap and log errors every few seconds without it.
    front_proxy_ca = pki.make_ca(p / "front-proxy", "neuron-dra-local-front-proxy-ca")
    pki.issue(front_proxy_ca, p / "front-proxy", "front-proxy-client", common_name="front-proxy-client", client=True)
    server = f"https://{LOOPBACK}:{ports.apiserver}"
    admin = pki.issue(ca, p, "admin", common_name="kubernetes-admin", organizations=["system:masters"], client=True)
    _write_kubeconfig(dir / "kubeconfig", server, ca.cert, "kubernetes-admin",
                      {"client-certificate-data": _b64(admin.cert), "client-key-data": _b64(admin.key)})
    for name in ("kube-controller-manager", "kube-scheduler"):
        user = f"system:{name}"  # the identities the default RBAC bootstrap policy grants
        pair = pki.issue(ca, p, name, common_name=user, client=True)
        _write_kubeconfig(dir / "kubeconfigs" / f"{name}.kubeconfig", server, ca.cert, user,
                          {"client-certificate-data": _b64(pair.cert), "client-key-data": _b64(pair.key)})
    return _Files(ca=ca, admin=admin, kubelet_client=kubeletaccess.client_cert(ca, p))


def _kubelet_hosts_launch(dir: Path, kubelet_hosts: Sequence[str]) -> dict[str, Any]:
    """How the API server is launched so that it resolves `kubelet_hosts` (nothing changes without them)."""
    if not kubelet_hosts:
        return {}
    hosts = dir / "hosts"
    hosts.write_text(kubeletaccess.hosts_text(kubelet_hosts))
    return {"prefix": kubeletaccess.namespace_prefix(hosts), "env": kubeletaccess.apiserver_env(kubelet_hosts)}


def _bind_kubelet_client(kubeconfig: Path) -> None:
    """The RBAC the kubelets' Webhook authorization asks about for the API server's kubelet client user."""
    api = config.new_client_from_config(str(kubeconfig))
    try:
        body: Any = kubeletaccess.cluster_role_binding()
        _create_if_missing(lambda: client.RbacAuthorizationV1Api(api).create_cluster_role_binding(body))
    finally:
        api.close()


def _etcd_args(dir: Path, ports: Ports) -> list[str]:
    clients = f"http://{LOOPBACK}:{ports.etcd_client}"
    peer = f"http://{LOOPBACK}:{ports.etcd_peer}"
    return [
        "--name=local",
        f"--data-dir={dir / 'etcd-data'}",
        f"--listen-client-urls={clients}",
        f"--advertise-client-urls={clients}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=local={peer}",
        "--listen-metrics-urls=",
        # A throwaway test store: skipping fsync makes every write (and so every test) much faster.
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def _apiserver_args(dir: Path, ports: Ports, extra: Sequence[str]) -> list[str]:
    p = dir / "pki"
    return [
        f"--etcd-servers=http://{LOOPBACK}:{ports.etcd_client}",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={ports.apiserver}",
        f"--advertise-address={LOOPBACK}",
        # The endpoint reconciler refuses loopback addresses for the `kubernetes` Service endpoints and
        # would log an error every 10 s; nothing in this cluster reaches the API through that Service.
        "--endpoint-reconciler-type=none",
        f"--tls-cert-file={p / 'apiserver.crt'}",
        f"--tls-private-key-file={p / 'apiserver.key'}",
        f"--client-ca-file={p / 'ca.crt'}",
        f"--service-account-issuer={ISSUER}",
        f"--service-account-key-file={p / 'sa.pub'}",
        f"--service-account-signing-key-file={p / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--requestheader-client-ca-file={p / 'front-proxy' / 'ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={p / 'front-proxy' / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={p / 'front-proxy' / 'front-proxy-client.key'}",
        "--authorization-mode=Node,RBAC",
        # Added to the default set (which already includes ServiceAccount and ValidatingAdmissionPolicy);
        # named here so the intent does not depend on the defaults.
        "--enable-admission-plugins=NodeRestriction,ValidatingAdmissionPolicy",
        "--allow-privileged=true",
        "--profiling=false",
        f"--cert-dir={dir / 'certs'}",
        "--v=1",
        *extra,
    ]


def _component_args(dir: Path, name: str, port: int) -> list[str]:
    kubeconfig = dir / "kubeconfigs" / f"{name}.kubeconfig"
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--client-ca-file={dir / 'pki' / 'ca.crt'}",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={port}",
        f"--tls-cert-file={dir / 'pki' / f'{name}-serving.crt'}",
        f"--tls-private-key-file={dir / 'pki' / f'{name}-serving.key'}",
        "--leader-elect=true",
        "--profiling=false",
        "--v=1",
    ]


def _controller_manager_args(dir: Path, ports: Ports) -> list[str]:
    p = dir / "pki"
    return [
        *_component_args(dir, "kube-controller-manager", ports.controller_manager),
        # As kubeadm does: every controller acts as its own service account, so RBAC applies per controller.
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={p / 'sa.key'}",
        f"--root-ca-file={p / 'ca.crt'}",
        f"--cluster-signing-cert-file={p / 'ca.crt'}",
        f"--cluster-signing-key-file={p / 'ca.key'}",
        f"--cluster-name={CLUSTER_NAME}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allocate-node-cidrs=false",
        # Its default is under /usr/libexec, which it would create on the host.
        f"--flex-volume-plugin-dir={dir / 'flexvolume'}",
        "--controllers=*",
    ]


def _scheduler_args(dir: Path, ports: Ports, profile: ControlPlaneProfile, profiling: bool = False) -> list[str]:
    args = _component_args(dir, "kube-scheduler", ports.scheduler)
    if not (profile.scheduler_configured or profiling):
        return args
    # The deprecated flags are ignored with --config: the file carries them (profiles.scheduler_config).
    kubeconfig = dir / "kubeconfigs" / "kube-scheduler.kubeconfig"
    config = dir / "kubeconfigs" / "kube-scheduler-config.yaml"
    config.write_text(yaml.safe_dump(scheduler_config(profile, kubeconfig, profiling), sort_keys=False))
    deprecated = ("--kubeconfig=", "--leader-elect=", "--profiling=")
    return [f"--config={config}", *(a for a in args if not a.startswith(deprecated))]


# --- health ---------------------------------------------------------------------------------------


def _https_context(files: _Files) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(files.ca.cert))
    ctx.load_cert_chain(str(files.admin.cert), str(files.admin.key))
    return ctx


def _open(url: str, ctx: ssl.SSLContext | None = None) -> Any:
    # No proxy handler: these URLs are on loopback, whatever *_proxy variables the caller has.
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if ctx is not None:
        handlers.append(urllib.request.HTTPSHandler(context=ctx))
    return urllib.request.build_opener(*handlers).open(url, timeout=3)


def _ok(ctx: ssl.SSLContext, url: str) -> bool:
    try:
        with _open(url, ctx) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _etcd_healthy(port: int) -> bool:
    try:
        with _open(f"http://{LOOPBACK}:{port}/health") as resp:
            return bool(json.loads(resp.read()).get("health") == "true")
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _create_if_missing(create: Callable[[], object]) -> None:
    try:
        create()
    except ApiException as e:
        if e.status != 409:
            raise
