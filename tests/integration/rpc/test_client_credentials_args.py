"""Every SDK client refuses a bad ``token``, ``tls_ca_file`` or text argument at construction, typed and named.

Issue 29 item 14: ``token=5`` or ``token=["a", 1]`` gave a raw ``TypeError``, ``tls_ca_file=5`` a ``TypeError``
and a missing CA file a raw ``FileNotFoundError``. The one check is ``marti.rpc.client.channel`` (``_resolve_token``
and ``read_pem``), used by every client's channel. Item 10: text UTF-8 cannot carry (a lone surrogate) raised a
raw ``UnicodeEncodeError``. Nothing is dialed: the address is a closed local port.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from marti.clients.broker.async_client import AsyncMartiCommClient
from marti.clients.broker.sync_client import MartiCommClient
from marti.clients.env.async_client import AsyncEnvClient
from marti.clients.env.sync_client import EnvClient
from marti.clients.experience.async_client import AsyncExperienceSharingClient
from marti.clients.experience.sync_client import ExperienceSharingClient
from marti.clients.inference.async_client import AsyncInferenceClient
from marti.clients.inference.sync_client import InferenceClient
from marti.clients.trainer.async_client import AsyncTrainerClient
from marti.clients.trainer.sync_client import TrainerClient
from marti.errors import InvalidArgumentError, NotFoundError

ADDRESS = "127.0.0.1:1"

#: name -> constructor taking ``**kw`` (token / tls_ca_file)
CLIENTS: dict[str, Callable[..., Any]] = {
    "experience": lambda **kw: ExperienceSharingClient(agent_id="a", address=ADDRESS, **kw),
    "experience_aio": lambda **kw: AsyncExperienceSharingClient(agent_id="a", address=ADDRESS, **kw),
    "broker": lambda **kw: MartiCommClient("a", address=ADDRESS, **kw),
    "broker_aio": lambda **kw: AsyncMartiCommClient("a", address=ADDRESS, **kw),
    "env": lambda **kw: EnvClient(ADDRESS, **kw),
    "env_aio": lambda **kw: AsyncEnvClient(ADDRESS, **kw),
    "inference": lambda **kw: InferenceClient(ADDRESS, **kw),
    "inference_aio": lambda **kw: AsyncInferenceClient(ADDRESS, **kw),
    "trainer": lambda **kw: TrainerClient(ADDRESS, **kw),
    "trainer_aio": lambda **kw: AsyncTrainerClient(ADDRESS, **kw),
}

#: name -> (keyword arguments, error class, text the message must contain)
BAD: dict[str, tuple[dict[str, Any], type, str]] = {
    "token_int": ({"token": 5}, InvalidArgumentError, "token"),
    "token_list": ({"token": ["a", 1]}, InvalidArgumentError, "token"),
    "tls_ca_file_int": ({"tls_ca_file": 5}, InvalidArgumentError, "tls_ca_file"),
    "tls_ca_file_missing": ({"tls_ca_file": "no/such/ca.pem"}, NotFoundError, "no/such/ca.pem"),
    "tls_ca_file_directory": ({"tls_ca_file": "/"}, InvalidArgumentError, "tls_ca_file"),
}


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_bad_credentials_argument_is_named(client: str, case: str) -> None:
    kwargs, error, named = BAD[case]
    with pytest.raises(error) as info:
        CLIENTS[client](**kwargs)
    assert named in str(info.value), str(info.value)


#: name -> (constructor with a lone surrogate in one text argument, the argument's name)
SURROGATE_TEXT: dict[str, tuple[Callable[[], Any], str]] = {
    "broker_agent_id": (lambda: MartiCommClient("a\udcff", address=ADDRESS), "agent_id"),
    "broker_session": (lambda: MartiCommClient("a", session="s\udcff", address=ADDRESS), "session"),
    "broker_topic": (lambda: MartiCommClient("a", topics=["t\udcff"], address=ADDRESS), "topics[0]"),
    "experience_agent_id": (lambda: ExperienceSharingClient(agent_id="a\udcff", address=ADDRESS), "agent_id"),
    "token": (lambda: EnvClient(ADDRESS, token="t\udcff"), "token"),
}


@pytest.mark.parametrize("case", sorted(SURROGATE_TEXT))
def test_text_argument_utf8_cannot_carry_is_named(case: str) -> None:
    """A lone surrogate in a client's text argument is an InvalidArgumentError naming it, not a raw
    UnicodeEncodeError from protobuf (issue 29 item 10)."""
    build, named = SURROGATE_TEXT[case]
    with pytest.raises(InvalidArgumentError) as info:
        build()
    assert named in str(info.value), str(info.value)
