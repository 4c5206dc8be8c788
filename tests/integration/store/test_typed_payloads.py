"""The SDK's reading of sampled and stored items in both forms a store may send them in (``PayloadFormat``): an
encoded item is decompressed up to the client's ``MAX_ITEM_BYTES``, and a typed one (``PAYLOAD_FORMAT_TYPED``, the
trajectory as a message) is read and checked against the same limit by the same check, over a real store on port
0 answering a raw request for typed items. Before, the SDK read only the encoded field: a typed item became an
empty trajectory (no episode, no turns), whatever its size, and nothing was refused."""

from __future__ import annotations

import re

import grpc
import pytest

import marti
from marti.api.experience.v1 import experience_pb2 as pb
from marti.api.experience.v1 import experience_service_pb2 as spb
from marti.api.experience.v1 import experience_service_pb2_grpc as sgrpc
from marti.clients.experience import protocol
from marti.clients.experience.protocol import _Base
from marti.errors import InvalidArgumentError

TURN = marti.Turn(step=0, prompt_token_ids=list(range(200)), response_token_ids=list(range(300)), reward=1.0)


@pytest.fixture
def stored(store_server):
    """A queue ``q`` holding one trajectory of a few KB; yields ``(stub, key)``."""
    addr, _ = store_server
    with marti.ExperienceSharingClient("a1", addr) as client:
        client.create_table("q", preset="queue")
        key = client.share_experience(
            marti.Trajectory(episode_id="e1", agent_id="a1", turns=[TURN]), table="q"
        )
    channel = grpc.insecure_channel(addr)
    yield sgrpc.ExperienceServiceStub(channel), key
    channel.close()


def _get_all(stub, fmt: int) -> spb.GetAllExperiencesResponse:
    (resp,) = stub.GetAllExperiences(
        spb.GetAllExperiencesRequest(episode_id="e1", tables=["q"], format=fmt), timeout=10
    )
    return resp


def _sample(stub, fmt: int) -> spb.SampleResponse:
    (resp,) = stub.Sample(
        iter([spb.SampleRequest(table="q", num_samples=1, format=fmt, timeout_ms=5000)]), timeout=10
    )
    return resp


@pytest.mark.parametrize(
    "fmt", [pb.PAYLOAD_FORMAT_TYPED, pb.PAYLOAD_FORMAT_ENCODED], ids=["typed", "encoded"]
)
def test_a_stored_item_is_read_in_either_form_and_refused_over_the_limit_alike(stored, monkeypatch, fmt):
    stub, key = stored
    resp = _get_all(stub, fmt)
    assert resp.items[0].WhichOneof("data") == ("trajectory" if fmt == pb.PAYLOAD_FORMAT_TYPED else "encoded")
    out = []
    _Base._stored(resp, out)
    assert (out[0].key, out[0].trajectory.episode_id, out[0].trajectory.turns) == (key, "e1", [TURN])
    monkeypatch.setattr(protocol, "MAX_ITEM_BYTES", 1000)  # the item is about 2 KB serialized
    with pytest.raises(InvalidArgumentError) as err:
        _Base._stored(resp, [])
    # the same limit named, whichever check of it refused (typed: the size; encoded: the frame's header)
    assert re.fullmatch(
        rf"item {key} of table 'q': payload .*marti\.clients\.experience\.MAX_ITEM_BYTES=1000",
        err.value.message,
    ), err.value.message


def test_a_sampled_typed_item_is_read_and_refused_over_the_limit(stored, monkeypatch):
    stub, key = stored
    resp = _sample(stub, pb.PAYLOAD_FORMAT_TYPED)
    assert resp.items[0].WhichOneof("data") == "trajectory"
    out = []
    _Base._sampled(resp, out)
    assert (out[0].key, out[0].trajectory.episode_id, out[0].trajectory.turns) == (key, "e1", [TURN])
    monkeypatch.setattr(protocol, "MAX_ITEM_BYTES", 1000)
    with pytest.raises(InvalidArgumentError, match=rf"item {key} of table 'q': payload of \d+ bytes .*=1000"):
        _Base._sampled(resp, [])


def test_an_item_with_no_trajectory_is_refused_not_read_as_an_empty_one():
    resp = spb.SampleResponse(items=[pb.SampledItem(key=7, table="q")])
    with pytest.raises(InvalidArgumentError, match="item 7 of table 'q': it holds neither a trajectory"):
        _Base._sampled(resp, [])
