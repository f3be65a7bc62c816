"""The runtime environment a container needs for its Neuron devices (docs/neuron-hardware.md §3,
inferred, since AWS's driver does not document it): NEURON_RT_VISIBLE_CORES with global NeuronCore
ids for the claim's LNC, NEURON_LOGICAL_NC_CONFIG on Trainium2+, and on UltraServers the
NEURON_RT_ULTRASERVER_* variables from the host's class files."""

from __future__ import annotations

from collections.abc import Iterable

from neuron_dra.driver.model.config import EffectiveConfig
from neuron_dra.driver.model.devices import NeuronHost, UltraServer


class EnvError(ValueError):
    pass


def core_ranges(ids: Iterable[int]) -> str:
    """Sorted ids as ranges: [0,1,2,3,8,9] -> "0-3,8-9"; [5] -> "5"."""
    out: list[str] = []
    ordered = sorted(set(ids))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def effective_lnc(host: NeuronHost, config: EffectiveConfig, node_lnc: int | None = None) -> int:
    """The claim's LNC, else the node's (docs/neuron-cores.md §2), else the family's default."""
    if config.logical_neuron_core is not None:
        return config.logical_neuron_core
    if node_lnc is not None and host.spec.lnc_supported:
        return node_lnc
    return host.spec.family.default_lnc


def visible_cores(host: NeuronHost, indexes: Iterable[int], lnc: int) -> str:
    return core_ranges(core for i in indexes for core in host.global_core_ids(i, lnc))


def ultraserver_env(ultraserver: UltraServer | None, mode: int | None, instance_type: str) -> tuple[str, ...]:
    """Mode 4 uses the 4-node ids, mode 2 the 2-node ids, mode 1 (each node alone) only the mode."""
    if ultraserver is None:
        raise EnvError(f"this {instance_type} host has no UltraServer class files (server_id_4, node_id_4, ...)")
    chosen = mode if mode is not None else ultraserver.mode
    if chosen is None:
        raise EnvError("no UltraServer mode: the claim sets no UltraServerConfig ultraserverMode and the host's "
                       "ultraserver_mode file is empty; allowed modes: 1, 2, 4")
    env = [f"NEURON_RT_ULTRASERVER_MODE={chosen}"]
    if chosen == 4:
        env += [f"NEURON_RT_ULTRASERVER_SERVER_ID={ultraserver.server_id_4}",
                f"NEURON_RT_ULTRASERVER_NODE_ID={ultraserver.node_id_4}"]
    elif chosen == 2:
        env += [f"NEURON_RT_ULTRASERVER_SERVER_ID={ultraserver.server_id_2}",
                f"NEURON_RT_ULTRASERVER_NODE_ID={ultraserver.node_id_2}"]
    return tuple(env)


def request_env(host: NeuronHost, indexes: Iterable[int], config: EffectiveConfig,
                ultraserver: UltraServer | None, with_ultraserver: bool, *, node_lnc: int | None = None,
                core_ids: Iterable[int] = ()) -> tuple[str, ...]:
    """Environment for the containers of one request of a claim: the cores of its whole devices (`indexes`) and
    its NeuronCores (`core_ids`: NEURON_RT_VISIBLE_CORES ids at the node's LNC, docs/neuron-cores.md §1-2)."""
    lnc = effective_lnc(host, config, node_lnc)
    cores = sorted(set(core_ids))
    if cores and host.spec.lnc_supported and lnc != node_lnc:
        raise EnvError(f"logicalNeuronCore {lnc}: NeuronCores are published at the node's LNC {node_lnc}; a claim "
                       f"for cores may set logicalNeuronCore {node_lnc} or leave it out")
    ids = [core for i in indexes for core in host.global_core_ids(i, lnc)] + cores
    env = [f"NEURON_RT_VISIBLE_CORES={core_ranges(ids)}"]
    if host.spec.lnc_supported:
        env.append(f"NEURON_LOGICAL_NC_CONFIG={lnc}")
    if with_ultraserver:
        env.extend(ultraserver_env(ultraserver, config.ultraserver_mode, host.instance_type))
    return tuple(env)
