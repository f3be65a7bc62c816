"""`neuron-dra plan --diff OLD`: what `pulumi up` would create, update, replace and delete going from one stack
config to another, both run offline under mocks (components/plan.py).

Which changes replace a resource has one source: the `replace_on_changes` each resource was registered with
(`k8s_objects.REPLACED_ON_CHANGE` for the Kubernetes objects, recorded by the mocks) plus the providers' own
force-new inputs for the kinds the components create (`PROVIDER_REPLACES`). On top of the resource list the diff
names what replaces nodes (a node group replaced, its Kubernetes version or launch template changed: EKS rolls
every node of the group) and what changes what a running claim gets (a node group's or pool's LNC: a NeuronCore
is LNC physical cores, so `NeuronCores(2)` gets half the physical cores when LNC goes from 2 to 1). The new run
reads the old run's exports as its own stack's previous outputs, so a driver rename is refused here as
`pulumi up` refuses it (driver.py `DriverRenameError`). docs/upgrades.md "Day two" is the guide.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from neuron_dra.components.efa_driver import class_requests
from neuron_dra.components.mocks import OfflineRun, RecordedResource
from neuron_dra.driver.deploy import LNC_LABEL
from neuron_dra.driver.model.k8s_names import device_class_selector

# Inputs whose change makes the provider itself replace the resource, for the kinds the components create:
# pulumi-kubernetes provider/pkg/provider/diff.go (its force-new list) and helm_release.go (name, namespace);
# terraform-provider-aws (ForceNew in the aws_eks_node_group, aws_placement_group, aws_ecr_repository,
# aws_eks_cluster schemas); pulumi-eks's Cluster passes `name` to aws_eks_cluster.
PROVIDER_REPLACES: Mapping[str, tuple[str, ...]] = {
    "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding": ("roleRef",),
    "kubernetes:apps/v1:DaemonSet": ("spec.selector",),
    "kubernetes:helm.sh/v3:Release": ("name", "namespace"),
    "aws:eks/nodeGroup:NodeGroup": ("amiType", "capacityType", "diskSize", "instanceTypes", "nodeGroupName",
                                    "nodeRoleArn", "remoteAccess", "subnetIds"),
    "aws:ec2/placementGroup:PlacementGroup": ("name", "strategy"),
    "aws:ecr/repository:Repository": ("name",),
    "eks:index:Cluster": ("name",),
}
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
# A launch template change is a new version, which the node group rolls out to every node; these fields are the
# template's own, not its versions'.
LAUNCH_TEMPLATE_OWN = ("tags", "tagsAll", "description", "updateDefaultVersion")
# Node group updates that replace every node (EKS's rolling update): the AMI's Kubernetes version and release.
NODE_ROLLING = ("version", "releaseVersion", "launchTemplate")
OPS = ("create", "update", "replace", "delete")


@dataclass(frozen=True)
class Change:
    """One resource's step: op (create, update, replace, delete), its type and Pulumi name, the input paths
    that differ, and those that force the replacement."""

    op: str
    type: str
    name: str
    urn: str
    fields: tuple[str, ...] = ()
    replaced_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanDiff:
    changes: tuple[Change, ...]
    unchanged: int
    nodes: tuple[str, ...]  # what replaces nodes, one line each
    claims: tuple[str, ...]  # what changes a running claim's meaning, one line each

    def of(self, op: str) -> list[Change]:
        return [c for c in self.changes if c.op == op]


def changed_paths(old: Any, new: Any, path: str = "") -> list[str]:
    """The paths (`spec.devices[0].count`) where two input values differ, leaves first found."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            out += changed_paths(old.get(key), new.get(key), f"{path}.{key}" if path else str(key))
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [p for i, (a, b) in enumerate(zip(old, new, strict=True)) for p in changed_paths(a, b, f"{path}[{i}]")]
    return [] if old == new else [path or "."]


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith((f"{prefix}.", f"{prefix}["))


def replace_paths(resource: RecordedResource) -> tuple[str, ...]:
    """The input paths whose change replaces `resource`: its replace_on_changes and its provider's force-new."""
    return tuple(dict.fromkeys([*resource.replace_on_changes, *PROVIDER_REPLACES.get(resource.type, ())]))


def _compared(run: OfflineRun[Any]) -> dict[str, RecordedResource]:
    # The project's own components hold no inputs; what they create is compared.
    return {r.urn: r for r in run.resources if not r.type.startswith("neuron-dra:")}


def diff_runs(old: OfflineRun[Any], new: OfflineRun[Any]) -> PlanDiff:
    """What `pulumi up` of `new` would do to a stack where `old` is deployed (both planned with one stack name,
    so that the same resource has the same URN)."""
    before, after = _compared(old), _compared(new)
    changes: list[Change] = []
    unchanged = 0
    for urn, res in after.items():
        prev = before.get(urn)
        if prev is None:
            changes.append(Change("create", res.type, res.name, urn))
            continue
        paths = changed_paths(prev.plain_inputs, res.plain_inputs)
        if not paths:
            unchanged += 1
            continue
        forcing = [p for p in replace_paths(res) if any(_under(c, p) for c in paths)]
        changes.append(Change("replace" if forcing else "update", res.type, res.name, urn, tuple(paths),
                              tuple(forcing)))
    changes += [Change("delete", r.type, r.name, urn) for urn, r in before.items() if urn not in after]
    changes.sort(key=lambda c: (OPS.index(c.op), c.type, c.name))
    return PlanDiff(tuple(changes), unchanged, tuple(_node_replacements(changes, before, after)),
                    tuple(_claim_meaning(before, after)))


def _group_of(resource: RecordedResource) -> str:
    """The component a resource belongs to (`ng-trn2` for a TrainiumNodeGroup's node group and template)."""
    return resource.parent.rsplit("::", 1)[-1] if "::" in resource.parent else resource.name


def _node_replacements(changes: Sequence[Change], before: Mapping[str, RecordedResource],
                       after: Mapping[str, RecordedResource]) -> Iterator[str]:
    for change in changes:
        res = after.get(change.urn) or before[change.urn]
        if change.type == NODE_GROUP and change.op == "replace":
            yield (f"node group {res.plain_inputs.get('nodeGroupName')}: the group is replaced "
                   f"({', '.join(change.replaced_by)} changed): every node goes and new ones start")
        elif change.type == NODE_GROUP and change.op == "update":
            rolling = [p for p in change.fields if any(_under(p, f) for f in NODE_ROLLING)]
            if rolling:
                old = before[change.urn].plain_inputs
                what = (f"Kubernetes {old.get('version')} -> {res.plain_inputs.get('version')}"
                        if "version" in rolling else ", ".join(rolling))
                yield (f"node group {res.plain_inputs.get('nodeGroupName')}: {what}: EKS replaces every node "
                       "(a rolling update, one node at a time)")
        elif change.type == LAUNCH_TEMPLATE and change.op in ("update", "replace"):
            fields = [p for p in change.fields if not any(_under(p, f) for f in LAUNCH_TEMPLATE_OWN)]
            if fields:
                shown = ", ".join(dict.fromkeys(p.split("[")[0].split(".")[0] for p in fields))
                yield (f"node group {_group_of(res)}: its launch template changes ({shown}): a new version, "
                       "to which EKS rolls every node of the group")


def _lnc(resource: RecordedResource) -> int | None:
    """The LNC a node group's or Karpenter pool's nodes are labelled with."""
    inputs = resource.plain_inputs
    labels = inputs.get("labels") if resource.type == NODE_GROUP else (
        ((inputs.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels")
    value = (labels or {}).get(LNC_LABEL)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _core_templates(resources: Mapping[str, RecordedResource]) -> list[str]:
    """`namespace/name` of the claim templates that request NeuronCores of a driver of the plan."""
    drivers = [c["args"][c["args"].index("--driver-name") + 1]
               for r in resources.values() if r.type == "kubernetes:apps/v1:DaemonSet"
               for c in r.plain_inputs.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
               if "--driver-name" in (c.get("args") or [])[:-1]]
    selectors = {device_class_selector(d, True) for d in drivers}
    core_classes = [r.plain_inputs["metadata"]["name"] for r in resources.values()
                    if r.type == "kubernetes:resource.k8s.io/v1:DeviceClass"
                    and any((s.get("cel") or {}).get("expression") in selectors
                            for s in r.plain_inputs.get("spec", {}).get("selectors") or [])]
    found = []
    for r in resources.values():
        if r.type == "kubernetes:resource.k8s.io/v1:ResourceClaimTemplate":
            meta = r.plain_inputs["metadata"]
            if any(class_requests(r.plain_inputs, cls) for cls in core_classes):
                found.append(f"{meta.get('namespace', 'default')}/{meta['name']}")
    return sorted(found)


def _claim_meaning(before: Mapping[str, RecordedResource], after: Mapping[str, RecordedResource]) -> Iterator[str]:
    templates = _core_templates(after)
    for urn, res in after.items():
        prev = before.get(urn)
        if prev is None or res.type not in (NODE_GROUP, "kubernetes:karpenter.sh/v1:NodePool"):
            continue
        old, new = _lnc(prev), _lnc(res)
        if old is None or new is None or old == new:
            continue
        what = "node group" if res.type == NODE_GROUP else "node pool"
        name = res.plain_inputs.get("nodeGroupName") or res.plain_inputs.get("metadata", {}).get("name")
        fewer = "half" if new * 2 == old else f"{new}/{old} of"
        more = "twice" if old * 2 == new else f"{new}/{old} times"
        ratio = fewer if new < old else more
        yield (f"{what} {name}: LNC {old} -> {new}: a NeuronCore becomes {new} physical core{'s' * (new > 1)} "
               f"instead of {old}, so a NeuronCores(2) claim gets {2 * new} physical cores instead of {2 * old} "
               f"({ratio} the cores and their memory; whole-device claims keep their devices). Claims of pods "
               f"already running keep the cores they were given until the node is replaced. Templates that "
               f"request NeuronCores: {', '.join(templates) if templates else 'none in this stack'}")


def render_diff(diff: PlanDiff) -> str:
    signs = {"create": "+", "update": "~", "replace": "+-", "delete": "-"}
    lines = []
    for change in diff.changes:
        line = f"{signs[change.op]:>2} {change.op:<8} {change.type}  {change.name}"
        if change.op == "replace":
            line += f"  (replaced: {', '.join(change.replaced_by)} cannot change in place; the old one goes first)"
        elif change.fields:
            shown = list(dict.fromkeys(change.fields))
            line += f"  ({', '.join(shown[:4])}{f', +{len(shown) - 4} more' if len(shown) > 4 else ''})"
        lines.append(line)
    if not diff.changes:
        lines.append("No changes.")
    for title, notes in (("Replaces nodes:", diff.nodes), ("Changes what running claims get:", diff.claims)):
        if notes:
            lines += ["", title, *(f"  ! {n}" for n in notes)]
    counts = ", ".join(f"{len(diff.of(op))} to {op}" for op in OPS)
    lines += ["", f"{counts}, {diff.unchanged} unchanged."]
    return "\n".join(lines) + "\n"
