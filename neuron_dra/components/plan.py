"""Run a Pulumi program offline under Pulumi mocks and render what it would create (`neuron-dra plan`).

Without `--program` the program is this package's default stack (`neuron_dra.components.stack`, what the
repository's `__main__.py` runs); with `--program DIR` it is the user's own project: DIR's `Pulumi.yaml` (project
name, `main`, config defaults) and `Pulumi.<stack>.yaml`, its `__main__.py` run with DIR as working directory and
first on sys.path, under the same mocks (`neuron_dra.components.mocks`).

`-o table` prints the resource tree with the inputs that matter; `-o yaml` prints every Kubernetes object the
components apply (the driver's objects and the claim templates) as multi-document YAML, for GitOps. The YAML
is read back from what the components sent to the (mocked) engine, so it is the very objects `pulumi up`
applies. Helm releases (aws-dranet, karpenter, ...) render their objects from charts, which needs the chart
repository: the YAML ends with a comment block naming each (release, namespace, chart, repository, version,
values), and stderr says so. AWS is not contacted: ids, ARNs, AZ offerings and the image digest are placeholders.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.runtime.settings import get_root_resource

from neuron_dra.components.claims import ClaimTemplateCheckError
from neuron_dra.components.driver import DriverRenameError
from neuron_dra.components.mocks import DEFAULT_REGION, MissingStackOutputs, PlanMocks, run_offline
from neuron_dra.components.stack import build_stack, settings_from_pulumi_config
from neuron_dra.driver.deploy import exporter
from neuron_dra.driver.errortext import shown
from neuron_dra.driver.model import bounded_yaml
from neuron_dra.driver.model.errors import NotAllowed

# The order objects are applied in; also the order of `-o yaml`.
KIND_ORDER = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
              "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "NetworkPolicy", "ConfigMap",
              "DeviceClass", "DaemonSet", "Deployment", "ResourceClaimTemplate", "EC2NodeClass", "NodePool")


class PlanError(Exception):
    """A plan that cannot run; the message is for the user."""


# Top-level keys of a Pulumi stack config file (Pulumi.<stack>.yaml).
STACK_FILE_KEYS = ("config", "secretsprovider", "encryptedkey", "encryptionsalt", "environment")


def load_config_file(path: Path, project: str = "neuron-dra", what: str = "--config") -> dict[str, str]:
    """A stack config file as the engine passes it to programs: full keys (`project:` for keys without one),
    string values, JSON for structures."""
    document = _read_yaml(path, what)
    if document is None:
        return {}
    if not isinstance(document, Mapping) or not isinstance(document.get("config", {}), Mapping):
        raise PlanError(f"{what} {path}: expected a mapping with a `config:` mapping of settings")
    # A misspelt `config:` would otherwise plan the default stack without a word (issue 14).
    unknown = sorted(str(k) for k in document if k not in STACK_FILE_KEYS)
    if unknown:
        raise PlanError(f"{what} {path}: unknown top-level key {shown(unknown[0])}; a stack config file has "
                        f"{', '.join(STACK_FILE_KEYS)} (the settings go under `config:`)")
    return _flatten(path, document, project)  # bounded_yaml's nesting bound keeps json.dumps from recursing deep


def _flatten(path: Path, document: Mapping[str, Any], project: str) -> dict[str, str]:
    config: dict[str, str] = {}
    for key, value in (document.get("config") or {}).items():
        full_key = key if ":" in str(key) else f"{project}:{key}"
        if isinstance(value, Mapping) and set(value) == {"secure"}:
            raise PlanError(f"--config {path}: {shown(full_key)} is an encrypted secret; plan cannot decrypt it, "
                            "put a placeholder value in a copy of the file")
        if isinstance(value, str):
            config[full_key] = value
        elif isinstance(value, bool):
            config[full_key] = "true" if value else "false"
        else:
            config[full_key] = json.dumps(value)
    return config


def plan(config: Mapping[str, str], stack: str = "plan", previous: Mapping[str, Any] | None = None) -> Any:
    """Run the stack under mocks; returns the OfflineRun. `previous`: the stack's exports at its last update
    (what its StackReference to itself reads; `plan --diff` passes the old config's)."""
    mocks = PlanMocks(region=config.get("aws:region", DEFAULT_REGION), previous=previous)

    def program() -> Any:
        return build_stack(settings_from_pulumi_config("neuron-dra"), stack=stack)

    return run_offline(program, config=config, project="neuron-dra", stack=stack, mocks=mocks,
                       exports=lambda result: result.exports)


def _read_yaml(path: Path, what: str) -> Any:
    """A stack config, Pulumi.yaml or stack-outputs file, parsed within bounded_yaml's bounds (size, nesting,
    aliases): deep nesting is refused as it is composed, not after PyYAML's recursion gives up."""
    try:
        return bounded_yaml.load(bounded_yaml.read(str(path)))
    except OSError as e:
        raise PlanError(f"cannot read {what} {path}: {e.strerror}") from e
    except bounded_yaml.YamlError as e:
        raise PlanError(f"{what} {path}: {e}") from e


@dataclass(frozen=True)
class Project:
    """A user's Pulumi project directory as the engine reads it."""

    directory: Path
    name: str
    main: Path
    defaults: Mapping[str, str]  # config defaults declared in Pulumi.yaml, as full keys

    @classmethod
    def load(cls, directory: Path) -> Project:
        path = directory / "Pulumi.yaml"
        if not path.is_file():
            raise PlanError(f"--program {directory}: no Pulumi.yaml there (a Pulumi project directory has one)")
        doc = _read_yaml(path, "--program")
        if not isinstance(doc, Mapping) or not isinstance(doc.get("name"), str) or not doc["name"]:
            raise PlanError(f"--program {path}: expected a mapping with the project's `name`")
        name = doc["name"]
        main = directory / str(doc.get("main") or ".")
        if main.is_dir():
            main = main / "__main__.py"
        if not main.is_file():
            raise PlanError(f"--program {directory}: no program at {main} (Pulumi.yaml `main`, default "
                            "__main__.py)")
        declared = doc.get("config") or {}
        if not isinstance(declared, Mapping):
            raise PlanError(f"--program {path}: `config` must be a mapping of declared settings")
        defaults = _flatten(path, {"config": {k: v["default"] for k, v in declared.items()
                                              if isinstance(v, Mapping) and "default" in v}}, name)
        return cls(directory.resolve(), name, main.resolve(), defaults)


def load_stack_outputs(path: Path) -> dict[str, dict[str, Any]]:
    doc = _read_yaml(path, "--stack-outputs")
    if doc is None:
        return {}
    if not isinstance(doc, Mapping) or not all(isinstance(v, Mapping) for v in doc.values()):
        raise PlanError(f"--stack-outputs {path}: expected a mapping of stack names to mappings of outputs")
    return {str(k): dict(v) for k, v in doc.items()}


def plan_program(project: Project, config: Mapping[str, str], stack: str,
                 stack_outputs: Mapping[str, Mapping[str, Any]] | None = None,
                 previous: Mapping[str, Any] | None = None) -> Any:
    """Run the user's program under mocks: DIR as working directory and first on sys.path, `__name__` set to
    `__main__` as the Python language host does; returns the OfflineRun (its exports: the program's)."""
    values = {**project.defaults, **config}
    mocks = PlanMocks(region=values.get("aws:region", DEFAULT_REGION), stack_outputs=stack_outputs,
                      previous=previous)

    def program() -> Any:
        runpy.run_path(str(project.main), run_name="__main__")
        return get_root_resource()

    def exports(root: Any) -> Mapping[str, Any]:
        return dict(getattr(root, "outputs", {}) or {}) if isinstance(root, pulumi.Resource) else {}

    cwd, path = os.getcwd(), list(sys.path)
    os.chdir(project.directory)
    sys.path.insert(0, str(project.directory))
    try:
        return run_offline(program, config=values, project=project.name, stack=stack, mocks=mocks,
                           exports=exports)
    finally:
        os.chdir(cwd)
        sys.path[:] = path


def kubernetes_manifests(run: Any) -> list[dict[str, Any]]:
    """The Kubernetes objects of a plan, as manifests, in apply order."""
    objects = []
    for resource in run.resources:
        inputs = resource.plain_inputs if resource.type.startswith("kubernetes:") and resource.custom else {}
        if "apiVersion" in inputs and "kind" in inputs:  # not a Helm release (its chart renders its objects)
            objects.append(inputs)

    def rank(m: Mapping[str, Any]) -> tuple[int, str, str]:
        kind = m.get("kind", "")
        meta = m.get("metadata", {})
        order = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
        return order, meta.get("namespace", ""), meta.get("name", "")

    return sorted(objects, key=rank)


def _summary(resource: Any) -> str:
    i = resource.plain_inputs
    t = resource.type
    if t.startswith("kubernetes:") and "metadata" in i:
        meta = i["metadata"]
        where = f"{meta['namespace']}/" if meta.get("namespace") else ""
        extra = ""
        if i.get("kind") == "DaemonSet":
            extra = f" image={i['spec']['template']['spec']['containers'][0]['image']}"
        return f"{where}{meta.get('name')}{extra}"
    if t == "kubernetes:helm.sh/v3:Release":
        image = i.get("values", {}).get("image", {})
        shown_image = f" image={image.get('repository')}:{image.get('tag')}" if image.get("repository") else ""
        return f"{i.get('namespace')}/{i.get('name')} chart={i.get('chart')} {i.get('version')}{shown_image}"
    if t == "eks:index:Cluster":
        return f"name={i.get('name')} version={i.get('version')} auth={i.get('authenticationMode')}"
    if t == "awsx:ec2:Vpc":
        return f"cidr={i.get('cidrBlock')} azs={','.join(i.get('availabilityZoneNames') or [])}"
    if t == "aws:eks/nodeGroup:NodeGroup":
        sc = i.get("scalingConfig", {})
        return (f"name={i.get('nodeGroupName')} ami={i.get('amiType')} capacity={i.get('capacityType')} "
                f"types={','.join(i.get('instanceTypes') or ['(launch template)'])} "
                f"size={sc.get('minSize')}/{sc.get('desiredSize')}/{sc.get('maxSize')} "
                f"subnets={','.join(i.get('subnetIds') or [])}")
    if t == "aws:ec2/launchTemplate:LaunchTemplate":
        nics = i.get("networkInterfaces") or []
        kinds = [n.get("interfaceType") for n in nics]
        md = i.get("metadataOptions", {})
        root = (i.get("blockDeviceMappings") or [{}])[0].get("ebs", {})
        parts = [f"efa={len(nics)}" + (f" ({kinds.count('efa')} efa, {kinds.count('efa-only')} efa-only)" if nics
                                       else ""),
                 f"imds={md.get('httpTokens')}/hop{md.get('httpPutResponseHopLimit')}",
                 f"root={root.get('volumeSize')}GiB {root.get('volumeType')} encrypted={root.get('encrypted')}"]
        if i.get("placement"):
            parts.append(f"placement={i['placement'].get('groupName')}")
        if i.get("instanceMarketOptions"):
            target = i.get("capacityReservationSpecification", {}).get("capacityReservationTarget", {})
            parts.append(f"capacity-block={target.get('capacityReservationId')} type={i.get('instanceType')}")
        return " ".join(parts)
    if t == "aws:eks/addon:Addon":
        return f"{i.get('addonName')} {i.get('addonVersion') or '(default version)'}"
    if t == "aws:iam/rolePolicyAttachment:RolePolicyAttachment":
        return str(i.get("policyArn"))
    if t in ("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
             "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"):
        return f"protocol={i.get('ipProtocol')} self-referencing"
    if t == "aws:ec2/placementGroup:PlacementGroup":
        return f"strategy={i.get('strategy')}"
    if t == "docker-build:index:Image":
        return f"tags={','.join(i.get('tags') or [])} platforms={','.join(i.get('platforms') or [])}"
    return ""


def driver_images(run: Any) -> list[str]:
    """Which image each driver DaemonSet runs: built here (from which context, pushed where) or given (pinned by
    digest, or a tag that floats)."""
    builds = run.of_type("docker-build:index:Image")
    out = []
    for resource in run.resources:
        inputs = resource.plain_inputs
        if not (resource.type == "kubernetes:apps/v1:DaemonSet" and "spec" in inputs):
            continue
        meta = inputs.get("metadata", {})
        if (meta.get("labels") or {}).get("app.kubernetes.io/component") == exporter.COMPONENT:
            continue  # neuron-monitor beside the driver (AWS's image, deploy/exporter.py): not a driver
        ref = inputs["spec"]["template"]["spec"]["containers"][0]["image"]
        name = f"{meta.get('namespace')}/{meta.get('name')}"
        built = [b for b in builds if any(ref.startswith(f"{tag}@") for tag in b.plain_inputs.get("tags") or ())]
        if built:
            i = built[0].plain_inputs
            out.append(f"{name} runs an image built here from {i['context']['location']} "
                       f"({i['dockerfile']['location']}), pushed to {ref.split('@')[0]} and pinned by digest")
        elif "@sha256:" in ref:
            out.append(f"{name} runs the given image {ref}, pinned by digest")
        else:
            out.append(f"{name} runs the given image {ref}: a tag, which floats (give repo@sha256:<digest> to "
                       "pin it)")
    return out


def render_table(run: Any) -> str:
    lines: list[str] = []

    def walk(parent: Any, depth: int) -> None:
        for child in run.children(parent):
            if child.type.startswith("pulumi:providers:"):
                summary = "(Kubernetes provider from the cluster's kubeconfig)"
            else:
                summary = _summary(child)
            lines.append(f"{'  ' * depth}{child.type}  {child.name}" + (f"  {summary}" if summary else ""))
            walk(child, depth + 1)

    walk(None, 0)
    lines.append("")
    lines += [f"Driver image: {line}" for line in driver_images(run)]
    lines.append(f"{len(run.resources)} resources. Exports:")
    for key, value in run.exports.items():
        shown = "[secret]" if key == "kubeconfig" else json.dumps(value)
        lines.append(f"  {key}: {shown}")
    return "\n".join(lines) + "\n"


def helm_releases(run: Any) -> list[dict[str, Any]]:
    """The Helm releases of a plan (which `-o yaml` cannot render offline): release, namespace, chart,
    repository, version and values, as the components gave them."""
    out = []
    for resource in run.resources:
        if not resource.type.startswith("kubernetes:helm.sh/"):
            continue
        i = resource.plain_inputs
        chart = str(i.get("chart") or "")
        # An OCI chart names its repository itself (oci://registry/path/chart).
        repository = (i.get("repositoryOpts") or {}).get("repo") or (
            chart.rsplit("/", 1)[0] if chart.startswith("oci://") else None)
        out.append({"release": i.get("name") or resource.name, "namespace": i.get("namespace", "default"),
                    "chart": chart, "repository": repository,
                    "version": i.get("version"), "values": i.get("values") or {}})
    return out


HELM_HEADER = ("Helm releases this plan installs, not rendered above (their charts render their objects; "
               "install them with helm or your GitOps tool's HelmRelease):")


def render_yaml(run: Any) -> str:
    text = "".join(f"# Driver image: {line}\n" for line in driver_images(run))
    text += yaml.safe_dump_all(kubernetes_manifests(run), sort_keys=True, default_flow_style=False)
    releases = helm_releases(run)
    if releases:
        block = yaml.safe_dump(releases, sort_keys=False, default_flow_style=False)
        text += "".join(f"# {line}".rstrip() + "\n" for line in [HELM_HEADER, *block.splitlines()])
    return text


def helm_notice(run: Any) -> str | None:
    """What stderr says under `-o yaml` when the plan has Helm releases."""
    releases = helm_releases(run)
    if not releases:
        return None
    names = ", ".join(f"{r['release']} ({r['chart']} {r['version']})" for r in releases)
    return (f"neuron-dra plan: {len(releases)} Helm release{'s' * (len(releases) > 1)} not rendered as "
            f"manifests: {names}; listed in the comment block at the end of the YAML")


def user_error(exc: BaseException) -> BaseException | None:
    """Our own error behind Pulumi's wrapping (errors raised in `apply` come back as causes)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, NotAllowed | ClaimTemplateCheckError | MissingStackOutputs | DriverRenameError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
