"""Run a Pulumi program offline under mocks and record what it would create.

`neuron-dra plan`, the tests and the benchmark use this: the program runs with `preview=False`, so every
`apply` runs and every input is resolved; `RecordingMonitor` keeps each registered resource with its parent,
dependencies and resolved inputs; `PlanMocks` answers with plausible, deterministic outputs (ids, ARNs,
kubeconfig, subnets per AZ) and the AWS invokes the stack makes. AWS is never contacted.

Pulumi's runtime settings are process-wide; `run_offline` resets them at each call, so runs do not share a
root stack or config. Numbers come back from the engine as floats: `plain()` turns integral floats into ints.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import pulumi
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import settings as pulumi_settings

T = TypeVar("T")

ACCOUNT = "123456789012"
DEFAULT_REGION = "us-east-2"
ORGANIZATION = "organization"  # what the engine's file backend calls every stack's organization


# How the engine marks a secret value: {SIG_KEY: SECRET_SIG, "value": ...} (pulumi's wire format).
SIG_KEY = "4dabf18193072939515e22adb298388d"
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"


def plain(value: Any) -> Any:
    """Engine values as written in a manifest: secrets unwrapped, integral floats back to ints, recursively."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        if value.get(SIG_KEY) == SECRET_SIG:
            return plain(value.get("value"))
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def _hex(text: str, n: int = 17) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


@dataclass(frozen=True)
class RecordedResource:
    urn: str
    type: str
    name: str
    parent: str
    custom: bool
    provider: str
    inputs: Mapping[str, Any]
    dependencies: tuple[str, ...]
    # The resource options that make the engine replace instead of update (what `plan --diff` reads).
    replace_on_changes: tuple[str, ...] = ()
    delete_before_replace: bool = False

    @property
    def plain_inputs(self) -> dict[str, Any]:
        result: dict[str, Any] = plain(self.inputs)
        return result


@dataclass(frozen=True)
class RecordedInvoke:
    token: str
    args: Mapping[str, Any]


class RecordingMonitor(pulumi_mocks.MockMonitor):
    """Pulumi's mock monitor, keeping the parent and dependencies the plain Mocks API does not see."""

    def __init__(self, mocks: pulumi.runtime.Mocks) -> None:
        super().__init__(mocks)
        self.recorded: list[RecordedResource] = []

    def RegisterResource(self, request: Any) -> Any:
        response = super().RegisterResource(request)  # type: ignore[no-untyped-call]
        if request.type != "pulumi:pulumi:Stack":
            from pulumi.runtime import rpc

            inputs = rpc.deserialize_properties(request.object)
            self.recorded.append(RecordedResource(
                urn=response.urn, type=request.type, name=request.name, parent=request.parent,
                custom=bool(request.custom), provider=request.provider, inputs=inputs,
                dependencies=tuple(request.dependencies),
                replace_on_changes=tuple(request.replaceOnChanges),
                delete_before_replace=bool(request.deleteBeforeReplace),
            ))
        return response


class MissingStackOutputs(LookupError):
    """A StackReference to a stack whose outputs the mocks were not given."""


class PlanMocks(pulumi.runtime.Mocks):
    """Deterministic outputs for every resource type the stack creates, and answers to its invokes.

    `offerings`: instance type -> AZs offering it (default: every type in the region's a, b and c zones).
    `subnet_zones`: subnet id -> AZ for subnets the program is given (default: round robin over the zones).
    `stack_outputs`: stack name (`org/project/stack`) -> the outputs a `pulumi.StackReference` to it reads.
    `previous`: what the program's own stack exported at its last update, which a StackReference to the stack
        itself reads (`driver.own_previous_outputs`; default: nothing, a stack not yet deployed).
    """

    def __init__(self, region: str = DEFAULT_REGION, offerings: Mapping[str, Sequence[str]] | None = None,
                 subnet_zones: Mapping[str, str] | None = None,
                 stack_outputs: Mapping[str, Mapping[str, Any]] | None = None,
                 previous: Mapping[str, Any] | None = None) -> None:
        self.region = region
        self.previous = dict(previous or {})
        self.own_stack: str | None = None  # `org/project/stack` of the run (run_offline sets it)
        self.stack_outputs = {k: dict(v) for k, v in (stack_outputs or {}).items()}
        self.zones = tuple(f"{region}{s}" for s in "abc")
        self.offerings = {k: tuple(v) for k, v in (offerings or {}).items()}
        self.subnet_zones: dict[str, str] = dict(subnet_zones or {})
        self.invokes: list[RecordedInvoke] = []

    def zone_of(self, subnet: str) -> str:
        if subnet not in self.subnet_zones:
            self.subnet_zones[subnet] = self.zones[len(self.subnet_zones) % len(self.zones)]
        return self.subnet_zones[subnet]

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        inputs = dict(args.inputs)
        rid = f"{args.name}-{_hex(args.typ + args.name, 8)}"
        # Custom resources echo their inputs (their outputs mirror them); remote components return only the
        # outputs set below (an echoed input can clash with an output of another type, e.g. awsx natGateways).
        out: dict[str, Any] = dict(inputs) if args.custom else {}
        typ = args.typ
        if typ.startswith("aws:"):
            service = typ.split(":")[1].split("/")[0]
            out.setdefault("arn", f"arn:aws:{service}:{self.region}:{ACCOUNT}:{args.name}")
        if typ == "pulumi:pulumi:StackReference":
            name = inputs.get("name") or args.name
            if name == self.own_stack and name not in self.stack_outputs:
                self.stack_outputs[name] = self.previous
            if name not in self.stack_outputs:
                raise MissingStackOutputs(
                    f"pulumi.StackReference {name!r}: no outputs given for it (PlanMocks(stack_outputs=...), or "
                    f"neuron-dra plan --stack-outputs FILE); given: {', '.join(self.stack_outputs) or 'none'}")
            out.update(name=name, outputs=self.stack_outputs[name], secretOutputNames=[])
        elif typ == "eks:index:Cluster":
            name = inputs.get("name") or args.name
            kubeconfig = _kubeconfig(name, self.region)
            out.update(
                kubeconfig=kubeconfig,
                kubeconfigJson=json.dumps(kubeconfig),
                clusterSecurityGroupId=f"sg-{_hex(name + 'cluster')}",
                oidcProviderArn=f"arn:aws:iam::{ACCOUNT}:oidc-provider/oidc.eks.{self.region}.amazonaws.com/id/"
                                f"{_hex(name, 32).upper()}",
                oidcProviderUrl=f"oidc.eks.{self.region}.amazonaws.com/id/{_hex(name, 32).upper()}",
            )
        elif typ == "awsx:ec2:Vpc":
            zones = inputs.get("availabilityZoneNames") or list(self.zones)
            private = [f"subnet-{_hex(args.name + 'private' + z)}" for z in zones]
            public = [f"subnet-{_hex(args.name + 'public' + z)}" for z in zones]
            for subnet, zone in zip(private + public, zones + zones, strict=True):
                self.subnet_zones[subnet] = zone
            out.update(vpcId=f"vpc-{_hex(args.name)}", privateSubnetIds=private, publicSubnetIds=public)
        elif typ == "aws:ec2/securityGroup:SecurityGroup":
            rid = f"sg-{_hex(args.name)}"
        elif typ == "aws:ec2/launchTemplate:LaunchTemplate":
            rid = f"lt-{_hex(args.name)}"
            out.update(latestVersion=1, defaultVersion=1)
        elif typ in ("aws:ec2/placementGroup:PlacementGroup", "aws:iam/role:Role"):
            # Pulumi's auto-naming: the resource name and a random suffix.
            out.setdefault("name", f"{args.name}-{_hex(args.name, 7)}")
        elif typ == "aws:iam/role:Role":
            out.update(name=f"{args.name}-{_hex(args.name, 7)}",
                       arn=f"arn:aws:iam::{ACCOUNT}:role/{args.name}-{_hex(args.name, 7)}")
        elif typ == "aws:sqs/queue:Queue":
            queue = f"{args.name}-{_hex(args.name, 7)}"
            out.update(name=queue, arn=f"arn:aws:sqs:{self.region}:{ACCOUNT}:{queue}",
                       url=f"https://sqs.{self.region}.amazonaws.com/{ACCOUNT}/{queue}")
        elif typ == "aws:cloudwatch/eventRule:EventRule":
            out.setdefault("name", f"{args.name}-{_hex(args.name, 7)}")
        elif typ == "aws:ecr/repository:Repository":
            repo = f"{args.name}-{_hex(args.name, 7)}"
            out.update(name=repo, registryId=ACCOUNT,
                       repositoryUrl=f"{ACCOUNT}.dkr.ecr.{self.region}.amazonaws.com/{repo}")
        elif typ == "docker-build:index:Image":
            tags = inputs.get("tags") or [args.name]
            digest = "sha256:" + _hex(json.dumps(plain(inputs), sort_keys=True, default=str), 64)
            out.update(digest=digest, ref=f"{tags[0]}@{digest}")
        return rid, out

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        # An exception escaping a mock invoke makes Pulumi's mock monitor retry forever: report it as a failure.
        try:
            return self._answer(args), []
        except Exception as e:
            return {}, [("", f"offline mock of {args.token} failed: {e}")]

    def _answer(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        self.invokes.append(RecordedInvoke(args.token, dict(args.args)))
        token = args.token
        if token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            types = [v for f in args.args.get("filters") or [] if f.get("name") == "instance-type"
                     for v in f.get("values") or []]
            zones = sorted({z for t in types for z in self.offerings.get(t, self.zones)})
            return {"id": self.region, "locations": zones, "locationTypes": ["availability-zone"] * len(zones),
                    "instanceTypes": [types[0] if types else ""] * len(zones)}
        if token == "aws:index/getAvailabilityZones:getAvailabilityZones":
            return {"id": self.region, "names": list(self.zones),
                    "zoneIds": [f"use2-az{i + 1}" for i in range(len(self.zones))]}
        if token == "aws:ec2/getSubnets:getSubnets":
            filters = {f.get("name"): list(f.get("values") or []) for f in args.args.get("filters") or []}
            candidates = filters.get("subnet-id", [])
            wanted = set(filters.get("availability-zone", []))
            ids = [s for s in candidates if not wanted or self.zone_of(s) in wanted]
            return {"id": self.region, "ids": ids}
        if token == "aws:ec2/getSubnet:getSubnet":
            subnet = str(args.args.get("id"))
            return {"id": subnet, "availabilityZone": self.zone_of(subnet), "vpcId": "vpc-0offline00000000"}
        if token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {"id": ACCOUNT, "accountId": ACCOUNT, "arn": f"arn:aws:iam::{ACCOUNT}:user/offline-plan",
                    "userId": "AIDAOFFLINEPLAN"}
        if token == "aws:index/getRegion:getRegion":
            return {"id": self.region, "name": self.region, "region": self.region,
                    "endpoint": f"ec2.{self.region}.amazonaws.com", "description": self.region}
        if token == "aws:index/getPartition:getPartition":
            return {"id": "aws", "partition": "aws", "dnsSuffix": "amazonaws.com", "reverseDnsPrefix": "com.amazonaws"}
        if token == "aws:ecr/getAuthorizationToken:getAuthorizationToken":
            return {"id": self.region, "userName": "AWS", "password": "offline-plan-token",
                    "authorizationToken": "QVdTOm9mZmxpbmU=", "proxyEndpoint": f"https://{ACCOUNT}.dkr.ecr.aws",
                    "expiresAt": "2099-01-01T00:00:00Z"}
        return {}


def _kubeconfig(cluster: str, region: str) -> dict[str, Any]:
    server = f"https://{_hex(cluster, 32).upper()}.gr7.{region}.eks.amazonaws.com"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {"server": server, "certificate-authority-data": "T0ZGTElORQ=="}}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": cluster}}],
        "current-context": cluster,
        "users": [{"name": cluster, "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws",
            "args": ["eks", "get-token", "--cluster-name", cluster, "--region", region]}}}],
    }


@dataclass
class OfflineRun(Generic[T]):
    """What a program run under mocks created."""

    result: T
    resources: list[RecordedResource]
    invokes: list[RecordedInvoke]
    exports: dict[str, Any] = field(default_factory=dict)

    def of_type(self, typ: str) -> list[RecordedResource]:
        return [r for r in self.resources if r.type == typ]

    def one(self, typ: str, name: str | None = None) -> RecordedResource:
        found = [r for r in self.of_type(typ) if name is None or r.name == name]
        if len(found) != 1:
            raise LookupError(f"expected one {typ}{' named ' + name if name else ''}, found {len(found)}")
        return found[0]

    def by_urn(self) -> dict[str, RecordedResource]:
        return {r.urn: r for r in self.resources}

    def children(self, parent: RecordedResource | None) -> list[RecordedResource]:
        urns = self.by_urn()
        if parent is None:
            return [r for r in self.resources if r.parent not in urns]
        return [r for r in self.resources if r.parent == parent.urn]


def run_offline(
    program: Callable[[], T],
    *,
    config: Mapping[str, str] | None = None,
    project: str = "neuron-dra",
    stack: str = "plan",
    mocks: PlanMocks | None = None,
    exports: Callable[[T], Mapping[str, Any]] | None = None,
) -> OfflineRun[T]:
    """Run `program` under mocks with `config` (full keys like `neuron-dra:nodeGroups`, string values). The run's
    exports are the program's `pulumi.export()` values, updated by `exports(result)` when given.

    Exceptions raised by the program (or by an `apply` it registered) propagate, as they fail `pulumi up`.
    """
    _ensure_event_loop()
    mocks = mocks or PlanMocks()
    mocks.own_stack = f"{ORGANIZATION}/{project}/{stack}"
    monitor = RecordingMonitor(mocks)
    pulumi.runtime.set_all_config(dict(config or {}), secret_keys=[])
    pulumi_settings.set_root_resource(None)  # type: ignore[arg-type]  # a fresh root stack for this run
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=False, monitor=monitor,
                            organization=ORGANIZATION)
    holder: dict[str, Any] = {}

    @pulumi.runtime.test  # type: ignore[untyped-decorator]
    def run() -> pulumi.Output[Any]:
        result = program()
        holder["result"] = result
        # The program's own `pulumi.export()` values (the root stack's outputs), then what `exports` picks.
        root = pulumi_settings.get_root_resource()
        wanted = {**(getattr(root, "outputs", None) or {}), **(exports(result) if exports else {})}
        return pulumi.Output.from_input(dict(wanted)).apply(lambda v: holder.__setitem__("exports", v))

    try:
        run()
    except BaseException:
        _retrieve_consequences()
        raise
    return OfflineRun(holder["result"], list(monitor.recorded), list(mocks.invokes), plain(holder.get("exports", {})))


def _ensure_event_loop() -> None:
    """Pulumi's runtime makes its futures on the thread's current event loop. Once anything in the process has run
    `asyncio.run()` (a test of an asyncio server, a tool), the main thread has none and asyncio no longer makes one
    on demand ("There is no current event loop"): give it a new one."""
    try:
        loop = asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        loop = None
    if loop is None or loop.is_closed():
        asyncio.set_event_loop(asyncio.new_event_loop())


def _retrieve_consequences() -> None:
    """After a failed run: mark the exceptions of the run's other failed futures as retrieved.

    One bad value fails every Output and resource registration that depends on it; Pulumi's runtime raises the first
    and keeps the rest unawaited (in `SETTINGS.outputs` and the resources' own futures), and the next run's
    `set_mocks` drops them, so asyncio reports each as "Future exception was never retrieved" when it is collected
    (thousands of tracebacks per failed run, 200,000+ lines over the tests). The run's error was raised to the
    caller; the others are its consequences, read here so that nothing is reported twice."""
    loop = asyncio.get_event_loop_policy().get_event_loop()
    for obj in gc.get_objects():
        if isinstance(obj, asyncio.Future) and obj.done() and not obj.cancelled() and obj.get_loop() is loop:
            obj.exception()
