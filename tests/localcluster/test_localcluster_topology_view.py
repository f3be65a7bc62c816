from __future__ import annotations

import xml.etree.ElementTree as ET

from neuron_dra.localcluster.demo.topology_view import NodeView, legend_letters, render_legend, render_svg, render_text


def test_torus_text_marks_allocated_devices() -> None:
    view = NodeView("trn2-a", "trn2.48xlarge", {4: "pod-x", 5: "pod-x", 6: "pod-x", 7: "pod-x", 15: "pod-y"})
    text = render_text(view)
    rows = [line for line in text.splitlines() if line.strip().startswith("[")]
    assert rows[0].startswith("  [ 0.]--[ 1.]")
    assert "[ 4a]--[ 5a]--[ 6a]--[ 7a]" in rows[1]
    assert "[15b]" in rows[3]
    assert render_legend(legend_letters([view])) == "a=pod-x  b=pod-y  .=free"


def test_ring_and_single_text() -> None:
    ring = render_text(NodeView("inf2", "inf2.24xlarge", {5: "seg"}))
    assert "[ 4.]--[ 5a]--(back to 0)" in ring
    assert "[ 0.]" in render_text(NodeView("one", "inf2.xlarge"))


def test_svg_is_well_formed_and_colours_owners() -> None:
    views = [NodeView("a", "trn1.32xlarge", {0: "p1", 1: "p1"}), NodeView("b", "inf2.48xlarge", {11: "p2"})]
    svg = render_svg(views)
    root = ET.fromstring(svg)
    titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert "neuron-device-0 → p1" in titles and "neuron-device-11 → p2" in titles
    assert sum(1 for t in titles if t and t.endswith("(free)")) == 16 + 12 - 3
    # torus: 32 links, of which the 8 wrap-around ones are drawn as two stubs each; ring: 12 links
    assert len(list(root.iter("{http://www.w3.org/2000/svg}line"))) == (32 - 8) + 8 * 2 + 12
