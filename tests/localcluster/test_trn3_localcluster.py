"""Trainium3 and catalog-file types in the local cluster's node list and the demo's topology picture."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from neuron_dra.driver.model.catalog import UnknownInstanceTypeError
from neuron_dra.driver.model.catalog_file import parse_catalog
from neuron_dra.localcluster.demo.topology_view import NodeView, render_svg, render_text
from neuron_dra.localcluster.nodes.labels import node_manifest
from neuron_dra.localcluster.nodes.topology import parse_nodes

SVG = "{http://www.w3.org/2000/svg}"
ACME = parse_catalog({"apiVersion": "neuron-dra/v1", "kind": "NeuronCatalog", "instanceTypes": {
    "acme1.24xlarge": {"family": "trn3", "devices": 8, "topology": "all-to-all"}}}, "acme.yaml")


def test_cluster_nodes_of_trn3_and_of_a_catalog_file() -> None:
    nodes = parse_nodes(["trn3.48xlarge:2", "trn3p.48xlarge"])
    assert [(n.name, n.instance_type) for n in nodes] == [
        ("trn3-48xlarge-1", "trn3.48xlarge"), ("trn3-48xlarge-2", "trn3.48xlarge"),
        ("trn3p-48xlarge-1", "trn3p.48xlarge")]
    with pytest.raises(UnknownInstanceTypeError, match="catalog file"):
        parse_nodes(["acme1.24xlarge"])
    (acme,) = parse_nodes(["acme1.24xlarge"], ACME)
    labels = node_manifest(acme.name, acme.instance_type, catalog=ACME)["metadata"]["labels"]
    assert labels["node.kubernetes.io/instance-type"] == "acme1.24xlarge"
    assert labels["eks.amazonaws.com/nodegroup"] == "trn3-group"


def test_all_to_all_text_shows_rows_of_8_on_the_switch() -> None:
    text = render_text(NodeView("trn3-a", "trn3.48xlarge", {0: "p1", 1: "p1", 15: "p2"}))
    lines = text.splitlines()
    assert lines[0] == "trn3-a (trn3.48xlarge, all-to-all)"
    assert lines[1] == "  [ 0a][ 1a][ 2.][ 3.][ 4.][ 5.][ 6.][ 7.]"
    assert lines[2] == "  [ 8.][ 9.][10.][11.][12.][13.][14.][15b]"
    assert "every device links to every other" in lines[3]
    assert render_text(NodeView("acme", "acme1.24xlarge", catalog=ACME)).splitlines()[1].count("[") == 8


def test_all_to_all_svg_draws_one_spoke_per_device_to_the_switch() -> None:
    root = ET.fromstring(render_svg([NodeView("trn3-a", "trn3.48xlarge", {3: "p1"})]))
    titles = [t.text for t in root.iter(f"{SVG}title")]
    assert "all-to-all switch" in titles and "neuron-device-3 → p1" in titles
    assert sum(1 for t in titles if t and t.endswith("(free)")) == 15
    assert len(list(root.iter(f"{SVG}line"))) == 16  # spokes, not 120 device-to-device lines
