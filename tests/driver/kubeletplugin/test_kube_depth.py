"""Issue 42 item 2 (the client's part): an answer nested past the recursion limit is an API client error naming
it, for a plain GET and for a watch event, never a RecursionError that callers catching API errors let through."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from neuron_dra.driver.kubeletplugin._kube import ApiClientError, ClientOptions, KubeApi
from neuron_dra.driver.kubeletplugin._ratelimit import Rate
from tests.support.fake_apiserver import FakeApiServer, answer, chunked, ok, serve

pytestmark = pytest.mark.attacks

DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FakeApiServer]:
    yield from serve(tmp_path)


def test_a_deeply_nested_answer_is_an_api_client_error(server: FakeApiServer) -> None:
    server.script = answer(ok(b'{"status": ' + DEEP + b"}"))
    api = KubeApi(server.client(options=ClientOptions(rate=Rate(1000, 1000), deadline=5)))
    with pytest.raises(ApiClientError, match=r"GET /version: the answer is nested too deeply to be an API object"):
        api.call("GET", "/version")


def test_a_deeply_nested_watch_event_is_an_api_client_error(server: FakeApiServer) -> None:
    server.script = answer(chunked([b'{"type": "ADDED", "object": ' + DEEP + b"}\n"]))
    api = KubeApi(server.client(options=ClientOptions(rate=Rate(1000, 1000), deadline=5)))
    events = api.watch("/apis/resource.k8s.io/v1/resourceslices", {}, 5, 5)
    with pytest.raises(ApiClientError, match=r"\(watch\): an event nested too deeply to be an API object"):
        next(events)
