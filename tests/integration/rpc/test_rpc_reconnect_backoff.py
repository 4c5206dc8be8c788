"""Recovery: an SDK client whose server went away for a while finds it again within the capped reconnect backoff
(``marti.rpc.options.reconnect_options``) once it is back on the same port, instead of gRPC's default backoff,
which grows by x1.6 per attempt towards 120 s.

While the server is away a plain TCP listener holds its port and closes every connection it accepts: each is one
failed connection attempt of the client's channel, so the test sees when the channel tried. The real server comes
back just after an attempt made once the outage is over, so the next attempt comes one full backoff interval
later. After 5.5 s of outage that interval is at least 3.3 s with gRPC's defaults (the fourth interval, 4.1 s
-20% jitter, or a later one) and at most 2.4 s with the cap (2 s +20%).

Marked slow: about 9 s, the outage the default backoff needs to grow past the cap.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from marti.clients.env import EnvClient
from marti.errors import UnavailableError
from marti.rpc.options import MAX_RECONNECT_BACKOFF_MS
from marti.rpc.settings import ServerSettings
from marti.rpc.testing import ServerThread

#: Seconds the server stays away (long enough for gRPC's default backoff to pass 3.3 s per attempt).
OUTAGE_S = 5.5
#: Longest wait allowed from the server's return to the first successful call, seconds: the cap plus its jitter,
#: plus polling and call latency; below the 3.3 s the default backoff would need.
RECOVERY_BOUND_S = 3.0


def _env_server(port: int) -> ServerThread:
    from services.env_server.servicer import env_service
    from services.env_server.settings import EnvServerSettings

    thread = ServerThread(lambda: [env_service(EnvServerSettings(port=0))], ServerSettings(port=port))
    thread.start()
    return thread


class _Refuser:
    """Holds a port and closes every connection it accepts, recording when each came (a failed attempt)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.attempts: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.attempts.append(time.monotonic())
            conn.close()

    def close(self) -> None:
        """Stop accepting and free the port (idempotent)."""
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def _keep_calling(client: EnvClient, stop: threading.Event, successes: list[float]) -> None:
    """Call the server every 50 ms (as an agent would), noting when calls succeed."""
    while not stop.is_set():
        try:
            client.list_envs()
            successes.append(time.monotonic())
        except UnavailableError:
            pass
        time.sleep(0.05)


@pytest.mark.slow
def test_client_reconnects_within_the_cap_after_a_long_outage():
    assert MAX_RECONNECT_BACKOFF_MS * 1.2 / 1000 < RECOVERY_BOUND_S
    server = _env_server(0)
    port = server.server.port
    # no retries inside a call: the test measures the channel's redial, not the retry policy's waits
    client = EnvClient(f"127.0.0.1:{port}", timeout_s=1.0, options=[("grpc.enable_retries", 0)])
    assert client.list_envs()
    server.stop(grace_s=None)
    refuser = _Refuser(port)
    stop, successes = threading.Event(), []
    caller = threading.Thread(target=_keep_calling, args=(client, stop, successes), daemon=True)
    caller.start()
    back = None
    try:
        start = time.monotonic()
        deadline = start + 60
        while time.monotonic() < deadline:
            late = [t for t in refuser.attempts if t - start >= OUTAGE_S]
            if late:
                break
            time.sleep(0.01)
        assert late, f"no connection attempt after {OUTAGE_S}s: {refuser.attempts}"
        assert len(refuser.attempts) >= 3, refuser.attempts  # the channel kept trying during the outage
        refuser.close()
        server = _env_server(port)
        back = late[0]
        successes.clear()
        while not successes and time.monotonic() < back + 15:
            time.sleep(0.01)
        assert successes, "the client never reached the restarted server"
        waited = successes[0] - back
        assert waited < RECOVERY_BOUND_S, f"reconnected {waited:.2f}s after the server came back"
    finally:
        stop.set()
        caller.join(10)
        client.close()
        refuser.close()  # idempotent
        server.stop(grace_s=None)
