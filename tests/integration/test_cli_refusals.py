"""Services started from the CLI refuse what they cannot do in one line, with real processes, as a user meets it:

* a port another server listens on: "address in use" naming the port, exit 1, no traceback, and the running
  server keeps its port (gRPC's default ``SO_REUSEPORT`` let a second server share it and split the clients);
* ``marti up`` beside a running broker: it names the port instead of printing "all services SERVING";
* a bad setting (flag or ``MARTI_<SERVICE>_*`` variable): one line naming the setting, where it came from and the
  value, exit 2, no traceback (pydantic printed 20 lines);
* a missing, malformed or misspelt ``marti store --config`` tables file: one line naming the file, exit 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from faults.procs import start

from marti.command.stack import DEFAULT_PORTS
from marti.rpc.client.health import check_health
from marti.rpc.serving.bind import port_in_use


def _marti(
    *args: str, env: dict[str, str] | None = None, timeout_s: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "marti.command.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=dict(os.environ, **(env or {})),
    )


def _one_line(stderr: str) -> str:
    """The process's only stderr line (asserting there is exactly one and no traceback)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.fixture(scope="module")
def broker():
    """A running ``marti broker --port 0`` (its port is the taken one)."""
    svc = start("broker")
    yield svc
    svc.stop()


@pytest.mark.parametrize("name", ["broker", "env-server", "store", "trainer"])
def test_a_second_server_on_a_taken_port_refuses_naming_it(broker, name):
    port = broker.address.rsplit(":", 1)[1]
    out = _marti(name, "--port", port, timeout_s=15)
    assert out.returncode == 1, out
    line = _one_line(out.stderr)
    assert "address in use" in line and f"port {port}" in line, line
    assert "listening on" not in out.stdout
    assert check_health(broker.address, "marti.api.broker.v1.BrokerService") == "SERVING"


def test_a_taken_metrics_port_is_refused_naming_it(broker):
    port = broker.address.rsplit(":", 1)[1]
    out = _marti("store", "--port", "0", "--metrics-port", port)
    assert out.returncode == 1, out
    line = _one_line(out.stderr)
    assert "metrics endpoint" in line and "address in use" in line and f"port {port}" in line, line


def test_marti_up_beside_a_running_broker_names_the_port():
    port = DEFAULT_PORTS["broker"]
    holder = None
    try:
        if not port_in_use("127.0.0.1", port):  # else another process holds it already: the same situation
            holder = subprocess.Popen(
                [sys.executable, "-m", "marti.command.main", "broker", "--port", str(port)],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            assert "listening on" in holder.stdout.readline()
        out = _marti("up", "--no-trainer", timeout_s=30)
        assert out.returncode == 1, out
        assert "all services SERVING" not in out.stdout
        assert "address in use" in out.stderr and f"port {port}" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr, out.stderr
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()


@pytest.mark.parametrize(
    ("name", "args", "env", "expected"),
    [
        ("broker", [], {"MARTI_BROKER_PORT": "abc"}, "setting port (MARTI_BROKER_PORT) = 'abc'"),
        ("store", ["--port", "-5"], {}, "setting port (--port) = -5"),
        (
            "env-server",
            ["--port", "0"],
            {"MARTI_ENV_ALLOWED_MODULES": "not json"},
            "setting allowed_modules (MARTI_ENV_ALLOWED_MODULES) = 'not json'",
        ),
        (  # a setting checked against another: was a SessionManager traceback, exit 1
            "env-server",
            ["--port", "0", "--idempotency-results", "65"],
            {},
            "idempotency_results must be in 1..idempotency_window (64), got 65",
        ),
        (
            "trainer",
            ["--port", "0"],
            {"MARTI_TRAINER_GRACE_S": "-1"},
            "setting grace_s (MARTI_TRAINER_GRACE_S) = '-1'",
        ),
        (
            "store",
            ["--port", "0"],
            {"MARTI_STORE_LOG_LEVEL": "loud"},
            "setting log_level (MARTI_STORE_LOG_LEVEL)",
        ),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(name, args, env, expected):
    out = _marti(name, *args, env=env)
    assert out.returncode == 2, out
    line = _one_line(out.stderr)
    assert line.startswith(f"marti {name}: error: {expected}"), line


#: (service, flag, a value beyond what the setting must fit); what each did before it was refused
_OUT_OF_BOUNDS = [
    ("store", "--max-message-bytes", "99999999999"),  # gRPC's C int: an OverflowError traceback, exit 1
    ("broker", "--keepalive-time-ms", "99999999999"),  # the same
    ("store", "--max-concurrent-rpcs", "3000000000"),  # the same
    ("store", "--default-timeout-ms", "99999999999999"),  # served; a call without timeout_ms: INTERNAL
    ("store", "--snapshot-interval-s", "1e12"),  # served; the snapshot thread died at once: no snapshot ever
    ("store", "--sqlite-synchronous", "BOGUS"),  # accepted without a --data-dir, refused unnamed with one
    ("store", "--sqlite-page-size", "1000"),  # the same
]


@pytest.mark.parametrize(("name", "flag", "value"), _OUT_OF_BOUNDS)
def test_a_setting_beyond_its_bounds_is_one_line_naming_it(name, flag, value):
    out = _marti(name, "--port", "0", flag, value)
    assert out.returncode == 2, out
    setting = flag[2:].replace("-", "_")
    assert _one_line(out.stderr).startswith(f"marti {name}: error: setting {setting} ({flag}) = "), out.stderr


def test_marti_health_refuses_an_address_without_a_port():
    out = _marti("health", "localhost")
    assert out.returncode == 2, out
    assert "'localhost' cannot be dialed: it has no port" in _one_line(out.stderr)


def _ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_a_bare_ipv6_host_is_bracketed_and_served():
    """``marti broker --host ::1`` binds ``[::1]`` (gRPC refused the bare literal with a C-core log line)."""
    svc = start("broker", "--host", "::1")
    try:
        assert svc.address.startswith("[::1]:"), svc.address
        assert check_health(svc.address, "marti.api.broker.v1.BrokerService") == "SERVING"
    finally:
        svc.stop()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, "cannot read tables config file '{path}': No such file or directory"),
        (
            "tables:\n  - {name: r, preset: prioritized, max_sise: 100}\n",
            "tables config '{path}': bad config for table 'r': max_sise: Extra inputs are not permitted",
        ),
        ("tables:\n  - {name: r\n  x: [\n", "tables config '{path}': not valid YAML: expected ',' or '}}'"),
        (  # was served, and every ListTables and GetTableInfo failed with INTERNAL (protobuf's int64)
            "tables:\n  - {name: r, max_size: 1180591620717411303424}\n",
            "tables config '{path}': bad config for table 'r': max_size: Input should be less than or equal to "
            "9223372036854775807",
        ),
        (  # was served as a table of 10 items (pydantic converted the string)
            "tables:\n  - {name: r, max_size: '10'}\n",
            "tables config '{path}': bad config for table 'r': max_size: Value error, must be an integer, not str",
        ),
    ],
)
def test_a_bad_store_tables_file_is_one_line_naming_it(tmp_path, text, expected):
    path = tmp_path / "tables.yaml"
    if text is not None:
        path.write_text(text)
    res = _marti("store", "--port", "0", "--config", str(path))
    assert res.returncode == 2, res.stderr
    assert expected.format(path=path) in _one_line(res.stderr)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("", "''"),  # an empty prefix matched every module: entry_point='os:system' ran a shell command
        ("mymod.,pettingzoo.", "'mymod.,pettingzoo.'"),  # one prefix with a comma in it: matched no module
        ("my mod.", "'my mod.'"),
    ],
)
def test_an_allowed_modules_entry_that_is_no_module_prefix_is_refused(value, shown):
    """``marti env-server --allowed-modules ""`` started a server whose empty prefix let a client import any
    module (``marti.make("pettingzoo", entry_point="os:system", kwargs={"command": ...})`` ran the command), and a
    comma-separated value was one prefix that matched nothing, silently. Each entry must now be a module-name
    prefix (``pkg.``, ``pkg.sub``); a bad one stops the server with one line naming it, from a flag or the
    variable alike."""
    for args, env, source in (
        (["--allowed-modules", value], {}, "--allowed-modules"),
        ([], {"MARTI_ENV_ALLOWED_MODULES": json.dumps([value])}, "MARTI_ENV_ALLOWED_MODULES"),
    ):
        out = _marti("env-server", "--port", "0", *args, env=env, timeout_s=30)
        assert out.returncode == 2, out
        line = _one_line(out.stderr)
        assert line.startswith(f"marti env-server: error: setting allowed_modules ({source})"), line
        assert f"entry {shown} is not a module-name prefix" in line, line
        assert "listening on" not in out.stdout


@pytest.mark.parametrize(
    ("name", "args", "env", "expected"),
    [
        ("broker", ["--token", ""], {}, ("setting token (--token) = ''", "an empty token can never be sent")),
        ("store", [], {"MARTI_STORE_TOKEN": ""}, ("setting token (MARTI_STORE_TOKEN) = ''", "empty token")),
        ("env-server", ["--token", "s\u00e9cret"], {}, ("setting token (--token) = <hidden>", "non-ASCII")),
        ("broker", [], {"MARTI_TOKEN": "s\u00e9cret"}, ("MARTI_TOKEN must be printable ASCII", "position 1")),
    ],
)
def test_a_token_no_client_can_send_is_refused_without_showing_it(name, args, env, expected):
    """A server started with ``--token ""`` (say ``--token "$TOKEN"`` with the variable empty), an empty
    ``MARTI_<SERVICE>_TOKEN``, or a token that is not printable ASCII served, and refused every call: no client can
    send an empty token (``token=""`` sends none) nor one gRPC metadata cannot carry. Such a setting now stops the
    server with one line naming it and where it came from, never showing the token."""
    out = _marti(name, "--port", "0", *args, env=env, timeout_s=20)
    assert out.returncode == 2, out
    line = _one_line(out.stderr)
    assert line.startswith(f"marti {name}: error: ") and all(part in line for part in expected), line
    assert "s\u00e9cret" not in out.stderr and "listening on" not in out.stdout
