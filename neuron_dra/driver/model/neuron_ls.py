"""Running `neuron-ls` and reading its JSON, whichever version of the Neuron tools the host has (docs/neuron-ls.md).

Neuron 2.34 replaced `--json-output` (a list of devices) with `--output-format json` (top-level instance and
UltraServer fields beside the devices). We ask for the new format first and fall back to the old flag when the tool
refuses it or prints something else. The run is bounded in time and in output; every way it can go wrong is a
NeuronLsError naming the command and what it said, which discovery turns into one warning: the devices are then
published from sysfs alone.

Parsed with the json module and explicit checks (not pydantic: the daemon never loads pydantic, see
catalog_schema.py); each check names the field, the value and what is allowed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NEURON_LS = "opt/aws/neuron/bin/neuron-ls"
# Newest first: Neuron 2.34+ (docs/neuron-ls.md §1), then the tools before 2.34.
FLAGS: tuple[tuple[str, ...], ...] = (("--output-format", "json"), ("--json-output",))
TIMEOUT_S = 20.0  # for all attempts together
MAX_OUTPUT_BYTES = 1 << 20  # a 16-device host prints about 10 KiB
MAX_STDERR_KEPT = 4096
SHOWN_CHARS = 200  # of what the tool said, in a warning
MAX_FIELDS = 64  # top-level fields kept
MAX_FIELD_CHARS = 256
ETXTBSY_ATTEMPTS = 6  # 0.04 + 0.08 + ... + 0.64 s of waiting at most

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_SHORT_BDF = re.compile(r"^[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


class NeuronLsError(Exception):
    """neuron-ls gave nothing usable: names each command tried and what it said."""


@dataclass(frozen=True)
class LsDevice:
    """What neuron-ls prints for one device that discovery uses (docs/neuron-ls.md §2)."""

    index: int
    bdf: str  # normalized, `0000:cc:00.0`
    numa_node: int | None
    memory_bytes: int
    connected_to: tuple[int, ...]


@dataclass(frozen=True)
class LsOutput:
    flags: str  # the flags that answered, e.g. `--output-format json`
    devices: Mapping[int, LsDevice]
    fields: tuple[tuple[str, str], ...] = ()  # top-level scalars, nested objects flattened one level (`a.b`)


class _Refused(NeuronLsError):
    """One attempt failed; `older` says whether the older flag is worth a try (not after a hang or a flood)."""

    def __init__(self, said: str, older: bool = True) -> None:
        super().__init__(said)
        self.older = older


def _shown(text: str) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "...")


def normalize_bdf(text: str) -> str:
    """`cc:00.0` or `0000:cc:00.0` -> `0000:cc:00.0` (lower case); ValueError otherwise."""
    t = text.strip().lower()
    if _SHORT_BDF.match(t):
        t = "0000:" + t
    if not _BDF.match(t):
        raise ValueError(f"not a PCI address: {text!r}")
    return t


def _int(where: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _Refused(f"{where} is {value!r}; expected an integer >= {minimum}")
    return value


def _device(where: str, entry: Any) -> LsDevice:
    if not isinstance(entry, Mapping):
        raise _Refused(f"{where} is {_shown(json.dumps(entry))}; expected an object per device")
    for name in ("neuron_device", "bdf", "memory_size"):
        if name not in entry:
            raise _Refused(f"{where} has no {name!r}")
    index = _int(f"{where}.neuron_device", entry["neuron_device"], 0)
    bdf_raw = entry["bdf"]
    try:
        if not isinstance(bdf_raw, str):
            raise ValueError
        bdf = normalize_bdf(bdf_raw)
    except ValueError:
        raise _Refused(f"{where}.bdf is {bdf_raw!r}; expected a PCI address like 'cc:00.0'") from None
    numa_raw = entry.get("numa_node")  # a string in the documented output; -1 where the kernel knows none
    numa: int | None = None
    if numa_raw not in (None, "", "-1", -1):
        text = str(numa_raw) if isinstance(numa_raw, str | int) and not isinstance(numa_raw, bool) else ""
        if not text.isdigit():
            raise _Refused(f"{where}.numa_node is {numa_raw!r}; expected a NUMA node like '1'")
        numa = int(text)
    connected_raw = entry.get("connected_to")  # null on single-device hosts
    if connected_raw is None:
        connected: tuple[int, ...] = ()
    elif isinstance(connected_raw, list):
        connected = tuple(_int(f"{where}.connected_to[{i}]", x, 0) for i, x in enumerate(connected_raw))
    else:
        raise _Refused(f"{where}.connected_to is {connected_raw!r}; expected a list of device indexes or null")
    return LsDevice(index, bdf, numa, _int(f"{where}.memory_size", entry["memory_size"], 1), connected)


def _fields(data: Mapping[str, Any], skip: str) -> tuple[tuple[str, str], ...]:
    def scalar(v: Any) -> str | None:
        if v is None or isinstance(v, str | int | float | bool):
            return json.dumps(v) if not isinstance(v, str) else v[:MAX_FIELD_CHARS]
        return None

    out: list[tuple[str, str]] = []
    for key, value in data.items():
        if key == skip:
            continue
        items = value.items() if isinstance(value, Mapping) else [("", value)]
        for sub, v in items:
            s = scalar(v)
            if s is not None and len(out) < MAX_FIELDS:
                out.append((f"{key}.{sub}" if sub else str(key), s))
    return tuple(out)


def parse(text: str, flags: str) -> LsOutput:
    """Either format: a list of devices (`--json-output`) or an object holding `neuron_devices` (or `devices`)
    beside top-level fields (`--output-format json`). NeuronLsError names what is wrong."""
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as e:
        raise _Refused(f"not JSON ({e.msg} at line {e.lineno} column {e.colno}): {_shown(text)}") from e
    except RecursionError as e:  # nested deeper than the decoder goes
        raise _Refused(f"JSON nested too deeply: {_shown(text[:100])}") from e
    fields: tuple[tuple[str, str], ...] = ()
    if isinstance(data, Mapping):
        keys = [k for k in ("neuron_devices", "devices") if k in data]
        if len(keys) != 1:
            raise _Refused(f"an object without a device list ('neuron_devices'): keys {sorted(data)[:10]}")
        fields = _fields(data, keys[0])
        where, data = keys[0], data[keys[0]]
    else:
        where = "devices"
    if not isinstance(data, list):
        raise _Refused(f"{where} is {_shown(json.dumps(data))}; expected a list of devices")
    devices: dict[int, LsDevice] = {}
    for i, entry in enumerate(data):
        dev = _device(f"{where}[{i}]", entry)
        if dev.index in devices:
            raise _Refused(f"{where}[{i}] lists device {dev.index} a second time")
        devices[dev.index] = dev
    return LsOutput(flags, devices, fields)


def _popen(argv: list[str]) -> subprocess.Popen[bytes]:
    """Popen, retried a few times on ETXTBSY: a process forked elsewhere while the file was open for writing holds
    that descriptor until its own exec (an emulated host written and run by one process, or a package update)."""
    attempt = 0
    while True:
        try:
            # Its own session, so a hung tool's children go with it.
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as e:
            attempt += 1
            if e.errno != errno.ETXTBSY or attempt >= ETXTBSY_ATTEMPTS:
                raise
            time.sleep(0.02 * 2 ** attempt)


def _run(argv: list[str], deadline: float, timeout: float) -> tuple[int, str, str]:
    """Exit status, stdout and (the start of) stderr, within the deadline and MAX_OUTPUT_BYTES."""
    try:
        proc = _popen(argv)
    except OSError as e:
        raise _Refused(f"could not run: {e}", older=False) from e
    assert proc.stdout is not None and proc.stderr is not None
    out, err = bytearray(), bytearray()
    ended = False
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, out)
            sel.register(proc.stderr, selectors.EVENT_READ, err)
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _Refused(f"did not finish within {timeout:g} s", older=False)
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                    elif key.data is out:
                        if len(out) + len(chunk) > MAX_OUTPUT_BYTES:
                            start = _shown(out[:100].decode("utf-8", "replace"))
                            raise _Refused(f"printed more than {MAX_OUTPUT_BYTES} bytes: {start}", older=False)
                        out += chunk
                    elif len(err) < MAX_STDERR_KEPT:
                        err += chunk[: MAX_STDERR_KEPT - len(err)]
        try:
            code = proc.wait(max(deadline - time.monotonic(), 0.001))
        except subprocess.TimeoutExpired:
            raise _Refused(f"did not exit within {timeout:g} s", older=False) from None
        ended = True
        return code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    finally:
        if not ended:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the group we started (start_new_session)
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def find(root: Path) -> str | None:
    """The host's neuron-ls: under the host root, or on PATH when the root is `/`; None when not installed."""
    candidate = root / NEURON_LS
    if candidate.exists() or candidate.is_symlink():
        return str(candidate)
    return shutil.which("neuron-ls") if root == Path("/") else None


def run(exe: str, timeout: float = TIMEOUT_S) -> LsOutput:
    """Ask `exe` for the new format, then the old; NeuronLsError naming every command tried when neither answers."""
    deadline = time.monotonic() + timeout
    said: list[str] = []
    for flags in FLAGS:
        command = " ".join((exe, *flags))
        try:
            if not os.access(exe, os.X_OK):
                raise _Refused("present but not executable", older=False)
            code, out, err = _run([exe, *flags], deadline, timeout)
            if code != 0:
                raise _Refused(f"exited {code}: {_shown(err.strip() or out.strip())}")
            return parse(out, " ".join(flags))
        except _Refused as e:
            said.append(f"{command}: {e}")
            if not e.older:
                break
    raise NeuronLsError("; ".join(said))
