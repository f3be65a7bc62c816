"""Test and benchmark support: the daemon with claims read from a directory instead of the API server.

Not in the package (the wheel and image ship no test support): `python -m tests.support.claims_dir_daemon --claims-
dir DIR <daemon flags>` runs a daemon process (kill -9, RSS) without an API server, publishing no ResourceSlices.
Claims are JSON files `DIR/<namespace>_<name>.json`, read on every lookup; `DIR/<namespace>_<name>.delay` holds
seconds to wait before answering, and a file `DIR/unavailable` makes every lookup fail as an unreachable API server
does.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from neuron_dra.driver.daemon.failpoints import CrashPoints
from neuron_dra.driver.daemon.main import run_daemon
from neuron_dra.driver.daemon.options import parse_options, with_socket_names
from neuron_dra.driver.kubeletplugin import _logs as logs
from neuron_dra.driver.kubeletplugin._claimref import ClaimLookupError

UNAVAILABLE = "unavailable"


class DirectoryClaimLookup:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, namespace: str, name: str) -> Path:
        return self.directory / f"{namespace}_{name}.json"

    def put(self, claim: Mapping[str, Any]) -> None:
        meta = claim["metadata"]
        path = self.path(meta["namespace"], meta["name"])
        tmp = path.with_name("." + path.name + ".tmp")
        tmp.write_text(json.dumps(claim), encoding="utf-8")
        tmp.replace(path)

    def delete(self, namespace: str, name: str) -> None:
        self.path(namespace, name).unlink(missing_ok=True)

    def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        if (self.directory / UNAVAILABLE).exists():
            raise ClaimLookupError("API server unavailable (test switch)")
        delay = self.directory / f"{namespace}_{name}.delay"
        if delay.exists():
            time.sleep(float(delay.read_text()))
        try:
            data: dict[str, Any] = json.loads(self.path(namespace, name).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        return data


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != "--claims-dir":
        print("usage: python -m tests.support.claims_dir_daemon --claims-dir DIR [neuron-dra-driver flags]",
              file=sys.stderr)
        return 2
    claims_dir = Path(args[1])
    options = parse_options(args[2:], os.environ)
    logs.configure(options.log_level)
    options = with_socket_names(options, None)  # no API server: per-instance names only when asked for
    return run_daemon(options, DirectoryClaimLookup(claims_dir), None, CrashPoints.from_env(os.environ))


if __name__ == "__main__":
    sys.exit(main())
