"""marti.rpc.client.calls.call in a forked child: a call gRPC's fork handling cut ("Closed on fork") is made once more.

In a child, gRPC closes the connections it inherited, and a call started meanwhile fails with CANCELLED
"Stream removed (Closed on fork)" before anything is sent (about 1 call in 100 right after a fork: docs/operations.md).
A process is a child here when its pid differs from the one ``marti.rpc.client.calls`` was imported in."""

from __future__ import annotations

import grpc
import pytest

from marti.errors import CancelledError
from marti.rpc.client import calls


class _Cut(grpc.RpcError):
    def __init__(self, details: str = "Stream removed (Closed on fork)") -> None:
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.CANCELLED

    def details(self) -> str:
        return self._details


class _Method:
    """A multi-callable that raises the given errors first, then answers ``"ok"``."""

    def __init__(self, *errors: grpc.RpcError) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self, request, timeout=None):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


@pytest.fixture
def in_a_child(monkeypatch):
    monkeypatch.setattr(calls, "_IMPORTED_IN", -1)


def test_a_call_cut_by_the_fork_is_made_again_in_the_child(in_a_child):
    method = _Method(_Cut())
    assert calls.call(method, object(), timeout_s=1) == "ok"
    assert method.calls == 2


def test_only_once_and_only_for_the_fork(in_a_child):
    twice = _Method(_Cut(), _Cut())
    with pytest.raises(CancelledError, match="Closed on fork"):
        calls.call(twice, object(), timeout_s=1)
    assert twice.calls == 2
    other = _Method(_Cut("Cancelled by the client"))
    with pytest.raises(CancelledError):
        calls.call(other, object(), timeout_s=1)
    assert other.calls == 1


def test_the_process_that_imported_it_never_makes_a_call_again():
    method = _Method(_Cut())
    with pytest.raises(CancelledError):
        calls.call(method, object(), timeout_s=1)
    assert method.calls == 1
