"""The SDK clients' bearer token: read from ``MARTI_TOKEN`` / ``MARTI_<SERVICE>_TOKEN`` when not given, and
refused at construction (before any rpc, without echoing it) when it cannot travel as gRPC metadata.

Every client flavour is covered: ``marti.MartiCommClient``, ``marti.ExperienceSharingClient``,
``marti.clients.env.EnvClient``, ``marti.make(address=...)`` and the ``marti.aio`` twins.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

import pytest

import marti
import marti.aio
from marti.clients.env import EnvClient
from marti.errors import InvalidArgumentError, UnauthenticatedError
from marti.rpc.client.channel import make_channel
from marti.rpc.settings import ServerSettings
from marti.rpc.testing import serve_in_thread

TOKEN = "env-s3cret"
ENV_VARS = (
    "MARTI_TOKEN",
    "MARTI_BROKER_TOKEN",
    "MARTI_ENV_TOKEN",
    "MARTI_STORE_TOKEN",
    "MARTI_TRAINER_TOKEN",
)


@pytest.fixture(scope="module")
def address(tmp_path_factory) -> Iterator[str]:
    """Broker, env server and store hosted by one real server on a free port, requiring ``TOKEN``."""
    from services.comm_broker.servicer import broker_service
    from services.comm_broker.settings import BrokerSettings
    from services.env_server.servicer import env_service
    from services.env_server.settings import EnvServerSettings
    from services.experience_store.__main__ import make_spec
    from services.experience_store.settings import StoreSettings

    tmp = tmp_path_factory.mktemp("store")

    def specs():
        store_spec, _ = make_spec(StoreSettings(port=0, data_dir=str(tmp), default_timeout_ms=500))
        return [broker_service(BrokerSettings(port=0)), env_service(EnvServerSettings(port=0)), store_spec]

    with serve_in_thread(specs, ServerSettings(host="127.0.0.1", port=0, token=TOKEN)) as server:
        yield server.address


@pytest.fixture(autouse=True)
def clean_env(monkeypatch) -> None:
    """No token variable leaks in from the shell running the tests."""
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)


def _broker(addr: str, **kw) -> None:
    marti.MartiCommClient("a1", addr, session="tok", timeout_s=5, **kw).close()


def _store(addr: str, **kw) -> None:
    client = marti.ExperienceSharingClient("a1", addr, timeout_s=5, **kw)
    try:
        client.list_tables()
    finally:
        client.close()


def _env(addr: str, **kw) -> None:
    client = EnvClient(addr, timeout_s=5, **kw)
    try:
        client.list_envs()
    finally:
        client.close()


def _make(addr: str, **kw) -> None:
    marti.make("collaborative_task_solving", address=addr, timeout_s=5, **kw).close()


async def _aio_broker(addr: str, **kw) -> None:
    client = marti.aio.MartiCommClient("a1", addr, session="tok", timeout_s=5, **kw)
    try:
        await client.connect()
    finally:
        await client.close()


async def _aio_store(addr: str, **kw) -> None:
    client = marti.aio.ExperienceSharingClient("a1", addr, timeout_s=5, **kw)
    try:
        await client.list_tables()
    finally:
        await client.close()


async def _aio_env(addr: str, **kw) -> None:
    client = marti.aio.EnvClient(addr, timeout_s=5, **kw)
    try:
        await client.list_envs()
    finally:
        await client.close()


SYNC: dict[str, tuple[str, Callable[..., None]]] = {
    "broker": ("MARTI_BROKER_TOKEN", _broker),
    "store": ("MARTI_STORE_TOKEN", _store),
    "env": ("MARTI_ENV_TOKEN", _env),
    "make": ("MARTI_ENV_TOKEN", _make),
}
AIO: dict[str, tuple[str, Callable[..., Awaitable[None]]]] = {
    "aio-broker": ("MARTI_BROKER_TOKEN", _aio_broker),
    "aio-store": ("MARTI_STORE_TOKEN", _aio_store),
    "aio-env": ("MARTI_ENV_TOKEN", _aio_env),
}


@pytest.mark.parametrize("name", list(SYNC))
def test_sync_clients_fall_back_to_marti_token(address, monkeypatch, name):
    service_var, use = SYNC[name]
    with pytest.raises(UnauthenticatedError):
        use(address)
    monkeypatch.setenv("MARTI_TOKEN", TOKEN)
    use(address)
    # the service-specific variable comes first, as on the server
    monkeypatch.setenv(service_var, "wrong")
    with pytest.raises(UnauthenticatedError):
        use(address)
    monkeypatch.setenv("MARTI_TOKEN", "wrong")
    monkeypatch.setenv(service_var, TOKEN)
    use(address)
    # an explicit token wins over both variables
    with pytest.raises(UnauthenticatedError):
        use(address, token="explicit-wrong")
    monkeypatch.setenv(service_var, "wrong")
    use(address, token=TOKEN)


@pytest.mark.parametrize("name", list(AIO))
async def test_aio_clients_fall_back_to_marti_token(address, monkeypatch, name):
    service_var, use = AIO[name]
    with pytest.raises(UnauthenticatedError):
        await use(address)
    monkeypatch.setenv("MARTI_TOKEN", TOKEN)
    await use(address)
    monkeypatch.setenv(service_var, "wrong")
    with pytest.raises(UnauthenticatedError):
        await use(address)
    monkeypatch.setenv(service_var, TOKEN)
    monkeypatch.setenv("MARTI_TOKEN", "wrong")
    await use(address)
    with pytest.raises(UnauthenticatedError):
        await use(address, token="explicit-wrong")
    monkeypatch.setenv(service_var, "wrong")
    await use(address, token=TOKEN)


def test_resolve_token_precedence(monkeypatch):
    from marti.rpc.client.channel import resolve_token

    assert resolve_token(None, "broker") is None
    monkeypatch.setenv("MARTI_TOKEN", "shared")
    assert resolve_token(None, "broker") == "shared"
    assert resolve_token(None) == "shared"
    monkeypatch.setenv("MARTI_BROKER_TOKEN", "own")
    assert resolve_token(None, "broker") == "own"
    assert resolve_token(None, "env") == "shared"
    assert resolve_token("explicit", "broker") == "explicit"
    # an empty variable counts as unset (as the server's MARTI_TOKEN fallback treats it)
    monkeypatch.setenv("MARTI_BROKER_TOKEN", "")
    assert resolve_token(None, "broker") == "shared"
    with pytest.raises(InvalidArgumentError, match="unknown service 'nope'"):
        resolve_token(None, "nope")


SECRET = "s3cr\u00e9t-value"  # non-ASCII at position 4
BAD_TOKENS = {
    "non-ascii": (SECRET, "non-ASCII character at position 4"),
    "newline": ("abc\ndef", "control character at position 3"),
    "nul": ("ab\x00", "control character at position 2"),
    "del": ("ab\x7f", "control character at position 2"),
}


@pytest.mark.parametrize("label", list(BAD_TOKENS))
@pytest.mark.parametrize("name", [*SYNC, *AIO])
async def test_bad_token_is_refused_at_construction(label, name):
    """The clients dial nothing (address 127.0.0.1:1) and still fail at once, naming the problem only."""
    token, where = BAD_TOKENS[label]
    use = {**SYNC, **AIO}[name][1]
    with pytest.raises(InvalidArgumentError) as info:
        result = use("127.0.0.1:1", token=token)
        if result is not None:
            await result
    message = str(info.value)
    assert "token must be printable ASCII (gRPC metadata)" in message
    assert where in message
    assert token not in message and "cr\u00e9t" not in message


@pytest.mark.parametrize("aio", [False, True])
def test_bad_token_from_the_environment_names_the_variable(monkeypatch, aio):
    monkeypatch.setenv("MARTI_TOKEN", "tok\u00e8n")
    with pytest.raises(InvalidArgumentError, match=r"MARTI_TOKEN must be printable ASCII .* position 3"):
        make_channel("127.0.0.1:1", aio=aio)
    monkeypatch.setenv("MARTI_STORE_TOKEN", "a\rb")
    with pytest.raises(
        InvalidArgumentError, match=r"MARTI_STORE_TOKEN must be .* control character at position 1"
    ):
        make_channel("127.0.0.1:1", aio=aio, service="store")


def test_bad_token_refused_with_tls_too(tmp_path):
    """The TLS path (call credentials) validates the same way, before reading any certificate."""
    with pytest.raises(InvalidArgumentError, match="non-ASCII character at position 0"):
        make_channel("127.0.0.1:1", token="\u00fc", tls_ca_file=str(tmp_path / "absent.pem"))
