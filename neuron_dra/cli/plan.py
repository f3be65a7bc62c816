"""`neuron-dra plan`: run the Pulumi stack offline under mocks and print resources or manifests, or (`--diff OLD`)
what changes from an older config.

The program, its mocks and the rendering are components/plan.py's; the diff is components/plan_diff.py's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from neuron_dra.components.plan import (
    PlanError,
    Project,
    helm_notice,
    kubernetes_manifests,
    load_config_file,
    load_stack_outputs,
    plan,
    plan_program,
    render_table,
    render_yaml,
    user_error,
)
from neuron_dra.components.plan_diff import diff_runs, render_diff

HELP = (
    "Run a Pulumi program offline under Pulumi mocks and print the resource tree with key inputs (-o table) or "
    "every Kubernetes manifest it applies (-o yaml). Without --program: this package's default stack "
    "(neuron_dra.components.stack, what its Pulumi.yaml + __main__.py run), with --config FILE as its stack "
    "config (Pulumi.<stack>.yaml format; without it the defaults apply). With --program DIR: your own project, "
    "DIR/Pulumi.yaml (name, main, config defaults) and DIR/Pulumi.<--stack>.yaml (or --config FILE), running "
    "its main program (default __main__.py) with DIR as working directory and first on sys.path; its "
    "pulumi.export values are printed. pulumi.StackReference outputs come from --stack-outputs FILE. AWS is not "
    "contacted: ids, ARNs, AZ offerings and a built image's digest are placeholders (-o yaml refuses a built "
    "image: set neuron-dra:driverImage to the image to deploy). With --diff OLD: what `pulumi up` would create, "
    "update, replace and delete going from the stack config OLD to the new one (--config FILE, or the defaults), "
    "what replaces nodes and what changes what running claims get (docs/upgrades.md)."
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", type=Path,
                        help="stack config file with a top-level `config:` mapping (Pulumi.<stack>.yaml format)")
    parser.add_argument("-o", "--output", choices=("table", "yaml"), default="table",
                        help="table: resource tree with key inputs; yaml: the Kubernetes manifests (default table)")
    parser.add_argument("--stack", default="plan", metavar="NAME",
                        help="stack name the program sees (default plan; the default stack's cluster name: "
                             "neuron-dra-NAME; with --program, DIR/Pulumi.NAME.yaml is its config)")
    parser.add_argument("--program", metavar="DIR", type=Path,
                        help="your own Pulumi project directory (Pulumi.yaml and its main program) instead of the "
                             "default stack")
    parser.add_argument("--stack-outputs", metavar="FILE", type=Path,
                        help="YAML mapping of stack names (org/project/stack) to the outputs a "
                             "pulumi.StackReference to them reads")
    parser.add_argument("--diff", metavar="OLD", type=Path,
                        help="the stack config deployed now (Pulumi.<stack>.yaml format): print what changes from it "
                             "to the new config instead of the plan")


def built_images(result: Any) -> list[str]:
    """The manifests' container images that the plan builds (docker-build Images, whose digest offline is a
    placeholder), as `namespace/name` of the object that runs each."""
    tags = [tag for image in result.of_type("docker-build:index:Image") for tag in image.plain_inputs.get("tags") or ()]
    out = []
    for manifest in kubernetes_manifests(result):
        pod = manifest.get("spec", {}).get("template", {}).get("spec", {})
        for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            if any(str(container.get("image", "")).startswith(f"{tag}@") for tag in tags):
                meta = manifest.get("metadata", {})
                out.append(f"the image of {manifest.get('kind')} {meta.get('namespace')}/{meta.get('name')}")
    return out


def run(args: argparse.Namespace) -> int:
    old: Any = None
    if args.diff is not None and args.output == "yaml":
        print("neuron-dra plan: --diff prints a table of changes; -o yaml renders one config", file=sys.stderr)
        return 2
    try:
        outputs = load_stack_outputs(args.stack_outputs) if args.stack_outputs else None
        if args.program is not None:
            project = Project.load(args.program)
            stack_file = args.config or project.directory / f"Pulumi.{args.stack}.yaml"
            config = load_config_file(stack_file, project.name) if stack_file.is_file() or args.config else {}
            if args.diff is not None:
                old = _old_run(args.diff, lambda c: plan_program(project, c, args.stack, outputs), project.name)
            result = plan_program(project, config, args.stack, outputs, old.exports if old else None)
        else:
            if outputs is not None:
                raise PlanError("--stack-outputs is for --program: the default stack reads no StackReference")
            config = load_config_file(args.config) if args.config else {}
            if args.diff is not None:
                old = _old_run(args.diff, lambda c: plan(c, stack=args.stack))
            # The new run reads the old one's exports as its stack's last outputs (a driver rename is refused).
            result = plan(config, stack=args.stack, previous=old.exports if old else None)
    except PlanError as e:
        print(f"neuron-dra plan: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        ours = user_error(e)
        if ours is None:
            raise
        print(f"neuron-dra plan: {ours}", file=sys.stderr)
        return 1
    if old is not None:
        sys.stdout.write(render_diff(diff_runs(old, result)))
        return 0
    if args.output == "yaml":
        built = built_images(result)
        if built:
            print(f"neuron-dra plan: -o yaml prints only images that exist, and {', '.join(built)} would be built "
                  "by pulumi up (its digest is known only then); set neuron-dra:driverImage to the image to deploy, "
                  "best by digest (repo@sha256:<digest>)", file=sys.stderr)
            return 2
    sys.stdout.write(render_yaml(result) if args.output == "yaml" else render_table(result))
    notice = helm_notice(result) if args.output == "yaml" else None
    if notice:
        print(notice, file=sys.stderr)
    return 0


def _old_run(path: Path, run_plan: Any, project: str = "neuron-dra") -> Any:
    """The plan of the OLD config; its errors name --diff."""
    config = load_config_file(path, project, "--diff")
    try:
        return run_plan(config)
    except Exception as e:
        ours = user_error(e)
        if ours is None:
            raise
        raise PlanError(f"--diff {path}: the old config does not plan: {ours}") from e
