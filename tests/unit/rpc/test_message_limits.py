"""marti.rpc.client.message_limits: the limits make_channel records for each channel, the metadata telling a server the
receive limit, and the server's reading of it."""

from __future__ import annotations

import re

import grpc
import pytest

from marti.errors import InvalidArgumentError
from marti.rpc.client.channel import make_channel
from marti.rpc.client.guard import ClientChannel
from marti.rpc.client.message_limits import (
    RECEIVE_LIMIT_KEY,
    client_receive_limit,
    receive_limit,
    receive_limit_metadata,
    record_limits,
    send_limit,
)
from marti.rpc.settings import DEFAULT_MAX_MESSAGE_BYTES

ADDRESS = "127.0.0.1:1"  # never dialed: a channel connects on its first call


@pytest.mark.parametrize("aio", [False, True], ids=["sync", "aio"])
def test_make_channel_records_its_limits(aio):
    channel = make_channel(ADDRESS, token="", aio=aio, options=[("grpc.max_receive_message_length", 1000)])
    assert receive_limit(channel) == 1000
    assert send_limit(channel) == DEFAULT_MAX_MESSAGE_BYTES
    assert receive_limit(ClientChannel(channel, "a client")) == 1000  # a client's wrapper is seen through


def test_a_channel_with_a_token_records_its_limits():
    channel = make_channel(ADDRESS, token="t", max_message_bytes=2000)
    assert (send_limit(channel), receive_limit(channel)) == (2000, 2000)
    channel.close()


def test_no_limit_and_unknown_channels():
    unlimited = make_channel(
        ADDRESS,
        token="",
        options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)],
    )
    assert receive_limit(unlimited) == -1 and send_limit(unlimited) is None
    raw = grpc.insecure_channel(ADDRESS)
    assert receive_limit(raw) is None and send_limit(raw) is None
    assert receive_limit(object()) is None
    for channel in (unlimited, raw):
        channel.close()


@pytest.mark.parametrize("bad", ["4194304", 1000.0, True, -2], ids=repr)
def test_each_limit_is_recorded_on_its_own(bad):
    """A limit option gRPC does not take leaves that limit unknown, and the other one known."""
    receive_bad = make_channel(
        ADDRESS, token="", max_message_bytes=2000, options=[("grpc.max_receive_message_length", bad)]
    )
    assert (send_limit(receive_bad), receive_limit(receive_bad)) == (2000, None)
    send_bad = make_channel(
        ADDRESS, token="", max_message_bytes=2000, options=[("grpc.max_send_message_length", bad)]
    )
    assert (send_limit(send_bad), receive_limit(send_bad)) == (None, 2000)
    for channel in (receive_bad, send_bad):
        channel.close()


class _Channel:
    """Something :func:`record_limits` can be given (it only keeps a weak reference)."""


def test_a_limit_missing_from_the_options_is_unknown_and_the_other_known():
    send_only, receive_only = _Channel(), _Channel()
    assert record_limits(send_only, [("grpc.max_send_message_length", 100)]) is send_only
    assert (send_limit(send_only), receive_limit(send_only)) == (100, None)
    record_limits(receive_only, [("grpc.max_receive_message_length", -1)])
    assert (send_limit(receive_only), receive_limit(receive_only)) == (None, -1)


def test_the_metadata_tells_a_known_limit_only():
    assert receive_limit_metadata(1000) == ((RECEIVE_LIMIT_KEY, "1000"),)
    assert receive_limit_metadata(0) == ((RECEIVE_LIMIT_KEY, "0"),)
    assert receive_limit_metadata(-1) == () and receive_limit_metadata(None) == ()


@pytest.mark.parametrize(
    ("metadata", "limit"),
    [
        ((), None),
        (None, None),
        ((("x-request-id", "r"),), None),
        (((RECEIVE_LIMIT_KEY, "1000"),), 1000),
        (((RECEIVE_LIMIT_KEY, b"1000"),), 1000),
        (((RECEIVE_LIMIT_KEY, "0"),), 0),
        (((RECEIVE_LIMIT_KEY, "-1"),), None),
    ],
)
def test_the_server_reads_the_told_limit(metadata, limit):
    assert client_receive_limit(metadata) == limit


@pytest.mark.parametrize("value", ["abc", "-2", "1e6", "", "+5", "٣"])
def test_a_bad_told_limit_is_refused_naming_it(value):
    with pytest.raises(InvalidArgumentError, match=re.escape(f"{RECEIVE_LIMIT_KEY}={value!r}")):
        client_receive_limit(((RECEIVE_LIMIT_KEY, value),))
