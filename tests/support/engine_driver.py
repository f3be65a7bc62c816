"""Run one Automation API step of an inline Pulumi program and print its result as one JSON line.

Used by the real-engine tests as a subprocess (`python engine_driver.py SPEC_JSON`), so that each step runs in a
fresh process like a user's script, and so that a separate project's virtualenv Python can run it: this file
imports nothing but Pulumi and the program it is given. SPEC_JSON:
    work_dir      a directory with the project's Pulumi.yaml
    project       project name (for a work_dir without Pulumi.yaml)
    stack         stack name
    program       `module:function` (the inline program); `sys_path` entries are put first on sys.path
    pulumi_root   directory whose bin/ holds the `pulumi` CLI (and the provider plugins, found on PATH)
    config        the stack's whole config (`ns:key` -> string); keys not in it are removed
    step          up | preview | destroy | config-only
The result: seconds, events (each resource step: op, type, urn, diffs), warnings (the engine's warning
diagnostics, e.g. a plugin older than the SDK expects), and changes/outputs per step.
The environment carries PULUMI_HOME, PULUMI_BACKEND_URL, PULUMI_CONFIG_PASSPHRASE and friends.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from typing import Any

from pulumi import automation as auto


def _project_name(work_dir: str) -> str:
    import yaml

    with open(os.path.join(work_dir, "Pulumi.yaml")) as f:
        name: str = yaml.safe_load(f)["name"]
    return name


def main(argv: list[str]) -> int:
    spec: dict[str, Any] = json.loads(argv[1])
    for entry in reversed(spec.get("sys_path", [])):
        sys.path.insert(0, entry)
    module, function = spec["program"].split(":")
    program = getattr(importlib.import_module(module), function)
    opts = auto.LocalWorkspaceOptions(
        work_dir=spec["work_dir"],
        env_vars={k: v for k, v in os.environ.items() if k.startswith("PULUMI_")},
        pulumi_command=auto.PulumiCommand(root=spec["pulumi_root"], skip_version_check=True),
    )
    # The Automation API wants the project name with an inline program, even when work_dir has a Pulumi.yaml.
    project = spec.get("project") or _project_name(spec["work_dir"])
    stack = auto.create_or_select_stack(stack_name=spec["stack"], project_name=project, program=program, opts=opts)
    wanted: dict[str, str] = spec.get("config", {})
    for key in stack.get_all_config():
        if key not in wanted:
            stack.remove_config(key)
    if wanted:
        stack.set_all_config({k: auto.ConfigValue(v) for k, v in wanted.items()})

    events: list[dict[str, Any]] = []
    warnings: list[str] = []

    def collect(event: auto.EngineEvent) -> None:
        diagnostic = event.diagnostic_event
        if diagnostic is not None and diagnostic.severity == "warning":
            warnings.append(diagnostic.message.strip())
        pre = event.resource_pre_event
        if pre is not None and pre.metadata is not None:
            meta = pre.metadata
            events.append({"op": str(meta.op.value if hasattr(meta.op, "value") else meta.op), "type": meta.type,
                           "urn": meta.urn, "diffs": sorted(meta.diffs or []),
                           "detailed": sorted((meta.detailed_diff or {}).keys())})

    started = time.monotonic()
    result: dict[str, Any] = {}
    step = spec["step"]
    if step == "up":
        up = stack.up(on_event=collect)
        result["changes"] = dict(up.summary.resource_changes or {})
        result["outputs"] = {k: v.value for k, v in up.outputs.items()}
    elif step == "preview":
        preview = stack.preview(diff=True, on_event=collect)
        result["changes"] = dict(preview.change_summary)
    elif step == "destroy":
        destroyed = stack.destroy(on_event=collect)
        result["changes"] = dict(destroyed.summary.resource_changes or {})
    elif step != "config-only":
        raise SystemExit(f"unknown step {step!r}: up, preview, destroy or config-only")
    result["seconds"] = round(time.monotonic() - started, 2)
    result["events"] = events
    result["warnings"] = warnings
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
