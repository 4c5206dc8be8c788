"""The remote reward client against real HTTP servers on port 0 (OpenRLHF ``--remote_rm_url`` protocol)."""

from __future__ import annotations

import json
import pickle
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from marti.errors import DeadlineExceededError, InvalidArgumentError, UnavailableError
from marti.rewards import RemoteRewardScorer

#: A behaviour: (request number from 0, decoded JSON body) -> (HTTP status, answer bytes).
Behaviour = Callable[[int, dict], tuple[int, bytes]]

PROMPTS = ["2+2=", "Résous \\(x^2=4\\) : x="]
COMPLETIONS = [" 4", " 2"]
COLUMNS = {"label": ["4", "2"], "source": ["a", "b"]}
EXPECTED = [float(len(p + c)) for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]  # what length_reward gives


def length_reward(n: int, body: dict) -> tuple[int, bytes]:
    """A well-behaved server: reward = the query's length (so the test can tell which query got which)."""
    return 200, json.dumps({"rewards": [float(len(q)) for q in body["query"]], "extra": 1}).encode()


class Server:
    """A ThreadingHTTPServer on 127.0.0.1:0 answering POSTs with ``behaviour``; records every body it got."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.bodies: list[dict] = []
        self.release = (
            threading.Event()
        )  # set at teardown: wakes handlers that sleep past the client's timeout
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.bodies.append(body)
                status, answer = behaviour(len(server.bodies) - 1, body)
                if status == 0:  # drop the connection without answering
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/get_reward"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def serve() -> Iterator[Callable[[Behaviour], Server]]:
    servers: list[Server] = []

    def start(behaviour: Behaviour) -> Server:
        servers.append(Server(behaviour))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


def test_protocol_fields_batches_and_order(serve):
    server = serve(length_reward)
    with RemoteRewardScorer(server.url, batch_size=1, timeout_s=5) as rm:
        scores = rm.score(PROMPTS, COMPLETIONS, COLUMNS)
    assert scores == EXPECTED
    assert server.bodies == [
        {"query": [PROMPTS[0] + COMPLETIONS[0]], "prompts": [PROMPTS[0]], "labels": ["4"]},
        {"query": [PROMPTS[1] + COMPLETIONS[1]], "prompts": [PROMPTS[1]], "labels": ["2"]},
    ]  # one POST per batch_size completions, Unicode intact, labels from label_key
    with RemoteRewardScorer(server.url, label_key=None) as rm:
        assert rm.score(PROMPTS, COMPLETIONS, {}) == scores
    assert server.bodies[-1]["labels"] == ["", ""]


def test_server_slower_than_timeout_is_deadline_exceeded_after_retries(serve):
    holder: list[Server] = []

    def slow(n: int, body: dict) -> tuple[int, bytes]:
        holder[0].release.wait(10)
        return length_reward(n, body)

    holder.append(serve(slow))
    rm = RemoteRewardScorer(holder[0].url, timeout_s=0.3, retries=1, backoff_s=0.05)
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceededError) as err:
        rm.score(PROMPTS, COMPLETIONS, COLUMNS)
    assert time.monotonic() - t0 < 8  # 2 x 0.3 s and a backoff; unbounded, each attempt waits 10 s
    assert (
        holder[0].url in str(err.value)
        and "timeout_s=0.3" in str(err.value)
        and "2 attempt" in str(err.value)
    )
    assert len(holder[0].bodies) == 2  # retried once
    rm.close()


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (b"<html>oops</html>", ["not JSON", "<html>oops"]),
        (b'{"scores": [1, 2]}', ["no 'rewards'", "scores"]),
        (b'{"rewards": [1.0, "high"]}', ["index 1", "'high'"]),
        (b'{"rewards": [1.0, NaN]}', ["index 1", "nan"]),
        (b'{"rewards": [1.0, 2.0, 3.0]}', ["3 scores for 2 completions", "expected 2, got 3"]),
    ],
)
def test_garbage_answers_are_typed_errors_naming_the_url(serve, answer, words):
    server = serve(lambda n, body: (200, answer))
    with pytest.raises(InvalidArgumentError) as err:
        RemoteRewardScorer(server.url, retries=3, backoff_s=0).score(PROMPTS, COMPLETIONS, COLUMNS)
    msg = str(err.value)
    assert server.url in msg and all(w in msg for w in words), msg
    assert len(server.bodies) == 1  # a malformed answer is not retried


@pytest.mark.parametrize("failure", [(500, b"overloaded"), (0, b"")], ids=["http-500", "dropped-connection"])
def test_fails_once_then_succeeds_with_retry(serve, failure):
    server = serve(lambda n, body: failure if n == 0 else length_reward(n, body))
    rm = RemoteRewardScorer(server.url, retries=2, backoff_s=0.01)
    assert rm.score(PROMPTS, COMPLETIONS, COLUMNS) == EXPECTED
    assert len(server.bodies) == 2
    always = serve(lambda n, body: failure)
    with pytest.raises(UnavailableError, match="HTTP 500|unreachable") as err:
        RemoteRewardScorer(always.url, retries=1, backoff_s=0.01).score(PROMPTS, COMPLETIONS, COLUMNS)
    assert always.url in str(err.value) and len(always.bodies) == 2


def test_4xx_is_not_retried_and_names_status_and_body(serve):
    server = serve(lambda n, body: (422, b'{"detail": "labels missing"}'))
    with pytest.raises(InvalidArgumentError, match="HTTP 422.*labels missing"):
        RemoteRewardScorer(server.url, retries=3).score(PROMPTS, COMPLETIONS, COLUMNS)
    assert len(server.bodies) == 1


def test_unreachable_server_is_unavailable_naming_the_url():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/get_reward"
    sock.close()  # nothing listens there now
    with pytest.raises(UnavailableError, match=f"{url}.*unreachable.*2 attempt"):
        RemoteRewardScorer(url, retries=1, backoff_s=0.01, timeout_s=2).score(PROMPTS, COMPLETIONS, COLUMNS)


def test_bad_arguments_are_refused_before_any_request():
    for kwargs in ({"timeout_s": 0}, {"batch_size": 0}, {"retries": -1}, {"backoff_s": -1.0}):
        with pytest.raises(InvalidArgumentError, match=next(iter(kwargs))):
            RemoteRewardScorer("http://localhost:5000/get_reward", **kwargs)
    for url in ("localhost:5000", "ftp://h/x", "http://", 5000):
        with pytest.raises(InvalidArgumentError, match="url"):
            RemoteRewardScorer(url)
    rm = RemoteRewardScorer("http://localhost:1/get_reward")
    with pytest.raises(InvalidArgumentError, match="label_key column 'label'"):
        rm.score(["p"], ["c"], {"answer": ["x"]})
    with pytest.raises(InvalidArgumentError, match="cannot be sent as JSON"):
        rm.score(["p"], ["c"], {"label": [float("nan")]})
    assert pickle.loads(pickle.dumps(rm)).url == rm.url
