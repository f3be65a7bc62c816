"""Pictures of a node's Neuron device topology with allocated devices marked: terminal text and SVG.

Used by `neuron-dra demo` to show where the scheduler placed each claim. Pure functions of the
catalog and an allocation map, so they are easy to test and reuse.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape

from neuron_dra.driver.model.catalog import BUILTIN, Catalog, InstanceSpec, TopologyKind, expected_neighbours

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac")
FREE = "#eeeeee"


@dataclass(frozen=True)
class NodeView:
    """One node to draw: its name, instance type and which pod holds each device."""

    node_name: str
    instance_type: str
    owners: Mapping[int, str] = field(default_factory=dict)  # device index -> pod (or claim) name
    catalog: Catalog = field(default=BUILTIN, repr=False)  # where the instance type is described
    ultraserver: str = ""  # the UltraServer the node is part of; "": none
    ultraserver_node: int = 0  # its position in it
    group: str = ""  # the group device (pool) a job pod on the node shares with its UltraServer peers

    @property
    def spec(self) -> InstanceSpec:
        return self.catalog.spec(self.instance_type)


def legend_letters(views: Sequence[NodeView]) -> dict[str, str]:
    """A stable letter per owner across all nodes: a, b, c ... (then A-Z)."""
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    owners: list[str] = []
    for v in views:
        for i in sorted(v.owners):
            if v.owners[i] not in owners:
                owners.append(v.owners[i])
    return {o: letters[i % len(letters)] for i, o in enumerate(owners)}


def _cell(index: int, owner: str | None, letters: Mapping[str, str]) -> str:
    mark = letters[owner] if owner is not None else "."
    return f"[{index:>2}{mark}]"


def render_text(view: NodeView, letters: Mapping[str, str] | None = None) -> str:
    """A node as text: the 4x4 torus as a grid (links wrap), rings as a loop, all-to-all hosts as rows of 8 on
    their switch, single devices as one cell."""
    letters = letters if letters is not None else legend_letters([view])
    spec = view.spec
    title = f"{view.node_name} ({spec.instance_type}, {spec.topology.value})"
    if view.ultraserver:
        title += f" UltraServer {view.ultraserver} node {view.ultraserver_node}"
        if view.group:
            title += f", group device {view.group}"
    lines = [title]
    if spec.topology is TopologyKind.TORUS_4X4:
        for row in range(4):
            cells = [_cell(row * 4 + col, view.owners.get(row * 4 + col), letters) for col in range(4)]
            lines.append("  " + "--".join(cells) + "--(wraps)")
            lines.append("  " + "".join("  |    " for _ in range(4)).rstrip())
        lines.append("  (columns wrap top to bottom)")
    elif spec.topology is TopologyKind.RING:
        cells = [_cell(i, view.owners.get(i), letters) for i in range(spec.device_count)]
        lines.append("  " + "--".join(cells) + "--(back to 0)")
    elif spec.topology is TopologyKind.ALL_TO_ALL:
        for start in range(0, spec.device_count, 8):
            cells = [_cell(i, view.owners.get(i), letters) for i in range(start, min(start + 8, spec.device_count))]
            lines.append("  " + "".join(cells))
        lines.append("  (all-to-all: every device links to every other through the switch)")
    else:
        lines.append("  " + _cell(0, view.owners.get(0), letters))
    return "\n".join(lines)


def render_legend(letters: Mapping[str, str]) -> str:
    return "  ".join(f"{letter}={owner}" for owner, letter in letters.items()) + "  .=free"


def _positions(spec: InstanceSpec, size: float) -> dict[int, tuple[float, float]]:
    if spec.topology is TopologyKind.TORUS_4X4:
        step = size / 4
        return {i: (step * (i % 4) + step / 2, step * (i // 4) + step / 2) for i in range(16)}
    if spec.topology is TopologyKind.RING:
        n = spec.device_count
        r = size * 0.38
        return {i: (size / 2 + r * math.sin(2 * math.pi * i / n), size / 2 - r * math.cos(2 * math.pi * i / n))
                for i in range(n)}
    if spec.topology is TopologyKind.ALL_TO_ALL:
        n = spec.device_count
        r = size * 0.4
        return {i: (size / 2 + r * math.sin(2 * math.pi * i / n), size / 2 - r * math.cos(2 * math.pi * i / n))
                for i in range(n)}
    return {0: (size / 2, size / 2)}


def _svg_links(spec: InstanceSpec, pos: Mapping[int, tuple[float, float]], panel: int, ox: float) -> list[str]:
    """The links of one node's panel: spokes to a switch for all-to-all, dashed stubs for torus wrap-arounds."""
    out: list[str] = []
    drawn: set[tuple[int, int]] = set()
    if spec.topology is TopologyKind.ALL_TO_ALL:
        # One spoke per device to the switch in the middle, instead of n*(n-1)/2 crossing lines.
        cx, cy = ox + panel / 2, 30 + panel / 2
        for x, y in pos.values():
            out.append(f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{cx:.1f}" y2="{cy:.1f}" stroke="#999"/>')
        out.append(f'<g><title>all-to-all switch</title><circle cx="{cx:.1f}" cy="{cy:.1f}" r="16" '
                   f'fill="#dddddd" stroke="#333"/><text x="{cx:.1f}" y="{cy + 4:.1f}" '
                   'text-anchor="middle">switch</text></g>')
        drawn = {(min(i, j), max(i, j)) for i in range(spec.device_count) for j in expected_neighbours(spec, i)}
    for i in range(spec.device_count):
        for j in expected_neighbours(spec, i):
            a, b = min(i, j), max(i, j)
            if (a, b) in drawn:
                continue
            drawn.add((a, b))
            (x1, y1), (x2, y2) = pos[a], pos[b]
            if math.hypot(x2 - x1, y2 - y1) > panel / 3.5 and spec.topology is TopologyKind.TORUS_4X4:
                # wrap-around link: a dashed stub leaving each end instead of a line across the grid
                dx, dy = (x2 - x1), (y2 - y1)
                norm = math.hypot(dx, dy)
                ux, uy = -dx / norm * 30, -dy / norm * 30
                out.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x1 + ux:.1f}" y2="{y1 + uy:.1f}" '
                           'stroke="#999" stroke-dasharray="3,2"/>')
                out.append(f'<line x1="{x2:.1f}" y1="{y2:.1f}" x2="{x2 - ux:.1f}" y2="{y2 - uy:.1f}" '
                           'stroke="#999" stroke-dasharray="3,2"/>')
            else:
                out.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="#999"/>')
    return out


def ultraserver_spans(views: Sequence[NodeView]) -> list[tuple[int, int, NodeView]]:
    """Runs of adjacent views of one UltraServer: (first index, last index, first view)."""
    spans: list[tuple[int, int, NodeView]] = []
    for k, view in enumerate(views):
        if not view.ultraserver:
            continue
        if spans and spans[-1][1] == k - 1 and spans[-1][2].ultraserver == view.ultraserver:
            spans[-1] = (spans[-1][0], k, spans[-1][2])
        else:
            spans.append((k, k, view))
    return spans


def _svg_ultraservers(views: Sequence[NodeView], panel: int) -> list[str]:
    """A dashed frame around the panels of each UltraServer, named under them with the group devices its nodes'
    job pods share."""
    out = []
    for first, last, view in ultraserver_spans(views):
        x, w = first * panel + 3, (last - first + 1) * panel - 6
        groups = sorted({v.group for v in views[first:last + 1] if v.group})
        label = f"UltraServer {view.ultraserver} ({last - first + 1} nodes)"
        if groups:
            label += ": one job on group device " + ", ".join(groups)
        out.append(f'<g><title>{escape(label)}</title><rect x="{x}" y="2" width="{w}" height="{panel + 30}" '
                   'fill="none" stroke="#555" stroke-width="2" stroke-dasharray="8,4" rx="8"/>'
                   f'<text x="{x + 6}" y="{panel + 48}" font-weight="bold">{escape(label)}</text></g>')
    return out


def render_svg(views: Sequence[NodeView], panel: int = 260) -> str:
    """All nodes side by side as one SVG document, devices coloured by owner, links drawn; the nodes of an
    UltraServer framed together."""
    letters = legend_letters(views)
    colours = {owner: PALETTE[i % len(PALETTE)] for i, owner in enumerate(letters)}
    width = panel * max(1, len(views))
    legend_rows = math.ceil(len(letters) / 3) if letters else 1
    band = 20 if ultraserver_spans(views) else 0  # the UltraServers' names under the panels
    height = panel + 40 + band + 18 * legend_rows
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    for k, view in enumerate(views):
        spec = view.spec
        ox = k * panel
        pos = {i: (x + ox, y + 30) for i, (x, y) in _positions(spec, panel).items()}
        out.append(f'<text x="{ox + 8}" y="16" font-weight="bold">{escape(view.node_name)}</text>')
        out.append(f'<text x="{ox + 8}" y="28">{escape(spec.instance_type)} · {spec.topology.value}</text>')
        out += _svg_links(spec, pos, panel, ox)
        for i, (x, y) in pos.items():
            owner = view.owners.get(i)
            fill = colours[owner] if owner is not None else FREE
            title = f"neuron-device-{i}" + (f" → {owner}" if owner else " (free)")
            out.append(f'<g><title>{escape(title)}</title><rect x="{x - 17:.1f}" y="{y - 13:.1f}" width="34" '
                       f'height="26" rx="4" fill="{fill}" stroke="#333"/>'
                       f'<text x="{x:.1f}" y="{y + 4:.1f}" text-anchor="middle">{i}</text></g>')
    out += _svg_ultraservers(views, panel)
    for n, (owner, _letter) in enumerate(letters.items()):
        x = 8 + (n % 3) * (width / 3)
        y = panel + 44 + band + 18 * (n // 3)
        out.append(f'<rect x="{x:.1f}" y="{y - 10:.1f}" width="12" height="12" fill="{colours[owner]}"/>'
                   f'<text x="{x + 16:.1f}" y="{y:.1f}">{escape(owner)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
