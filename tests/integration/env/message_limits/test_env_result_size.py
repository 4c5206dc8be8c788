"""A result the env server cannot send (an env's observations over its gRPC message limit) is an in-band
``ResourceExhaustedError`` naming the session and the limit: on the ``Session`` stream it used to end the stream,
and the server closed every session on it (each client then saw ``SessionLostError``)."""

from __future__ import annotations

import pytest

from marti.clients.env import EnvClient
from tests.integration.env.message_limits.oversized import check_batches, check_stream_step, check_unary_step
from tests.integration.env.two_text_agents import serve_echo

LIMIT = 256 * 1024  # the server's max_message_bytes in these tests
BIG = 2 * LIMIT  # characters of the observation a "big" action asks for


@pytest.fixture
def address():
    with serve_echo("echo_size", BIG, max_message_bytes=LIMIT) as address:
        yield address


def test_a_step_result_over_the_limit_keeps_the_stream_and_its_sessions(address):
    with EnvClient(address, timeout_s=10) as client:
        check_stream_step(client, "echo_size", f"max_message_bytes={LIMIT}")


def test_a_batch_over_the_limit_fails_only_its_large_items(address):
    """Each result fits alone but not all together: the largest fail in-band (each naming its session), the
    others come back; on the stream and over the unary BatchStep."""
    with EnvClient(address, timeout_s=10) as client:
        for error in check_batches(client, "echo_size"):
            assert f"max_message_bytes={LIMIT}" in str(error)


def test_a_unary_step_over_the_limit_names_the_session(address):
    with EnvClient(address, timeout_s=10) as client:
        check_unary_step(client, "echo_size", f"max_message_bytes={LIMIT}")
