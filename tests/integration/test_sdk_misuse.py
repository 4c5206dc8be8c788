"""Property-based misuse of the public SDK: wrong types and absurd values give only ``marti.errors``, naming
the argument.

Each public method of the broker, store, env, env-pool, inference and trainer clients (sync and aio), their
constructors, ``marti.make`` and ``marti.report_reward`` is called against real servers (one server on a free
port hosting the broker, env server, store, an idle trainer and a scripted inference service) with valid
arguments except one, drawn by hypothesis from hostile values: None, text, bytes, NaN and infinities, negative
numbers and zero, integers past 64 bits, lists, dicts, arbitrary objects. A call may succeed (the value was
acceptable after all); if it raises, the error must be a :class:`marti.errors.MartiError`, and an
:class:`~marti.errors.InvalidArgumentError` or :class:`~marti.errors.OutOfRangeError` must name the argument (or,
for a text value such as an unknown id, the value itself). Other marti errors answer about the servers' state
(an unknown id, a state version that moved on, a sample that found nothing in time) and need not.

Hypothesis profiles: ``misuse`` (the default here: few examples per method, the file in well under a minute on
one core) and ``misuse-deep`` (``HYPOTHESIS_PROFILE=misuse-deep``, many more).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sdk_servers import ScriptedInference, serve_sdk_services

import marti
import marti.aio
from marti.clients.env import AsyncEnvClient, AsyncEnvPool, EnvClient, EnvPool
from marti.errors import InvalidArgumentError, MartiError, OutOfRangeError
from marti.rpc.client.channel import MAX_TIMEOUT_S

TOKEN = "misuse-token"
ENV = "collaborative_task_solving"

settings.register_profile(
    "misuse", max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None
)
settings.register_profile(
    "misuse-deep", max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "misuse")
if not PROFILE.startswith("misuse"):
    PROFILE = "misuse"


class _Opaque:
    """An object no SDK argument accepts."""

    def __repr__(self) -> str:
        return "<opaque>"


def _absurd_number(x: float) -> bool:
    """True unless ``x`` is a positive number up to :data:`MAX_TIMEOUT_S` (30 days in seconds): those are
    plausible values, not misuse (``get_messages(timeout_s=1211810)`` rightly waits 14 days for a message, so
    such a value would only hang the test; the limit itself is tested with 2**63 and the other sampled values)."""
    return not (0 < x <= MAX_TIMEOUT_S) or isinstance(x, bool)


#: Values no well-typed caller passes where a specific id, count, duration or mapping is expected.
HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.sampled_from([0, -1, -(2**70), 2**70, 2**63, math.nan, math.inf, -math.inf, -0.5]),
    st.integers(min_value=-(2**80), max_value=2**80).filter(_absurd_number),
    st.floats(allow_nan=True, allow_infinity=True).filter(_absurd_number),
    st.lists(st.one_of(st.integers(), st.none()), max_size=3),
    st.dictionaries(
        st.one_of(st.text(max_size=3), st.integers()), st.one_of(st.integers(), st.none()), max_size=2
    ),
    st.builds(_Opaque),
)


@dataclass
class World:
    """The servers' address and the valid objects each case starts from."""

    address: str
    env_session: str = ""
    table: str = "misuse_table"
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    """One public callable and its valid arguments.

    Attributes:
        name: Test id.
        call: ``(world, kwargs) -> result`` (a coroutine for aio flavours).
        good: ``world -> kwargs`` that make a valid call.
        attack: The argument names to replace with hostile values (default: every key of ``good``).
    """

    name: str
    call: Callable[[World, dict[str, Any], list], Any]
    good: Callable[[World], dict[str, Any]]
    attack: tuple[str, ...] = ()


def _client(cls: type, *lead: Any, **kw: Any) -> Callable[[World, list], Any]:
    """A factory of ``cls(*lead, address, token=...)`` remembered in ``opened`` for closing."""

    def make(world: World, opened: list) -> Any:
        args = (*lead, world.address) if lead else (world.address,)
        client = cls(*args, token=TOKEN, **kw)
        opened.append(client)
        return client

    return make


def method(name: str, factory: Callable[[World, list], Any], meth: str, good, attack=()) -> Case:
    """A case calling ``factory(world).meth(**kwargs)``."""
    return Case(name, lambda w, kw, opened: getattr(factory(w, opened), meth)(**kw), good, tuple(attack))


def ctor(name: str, cls: type, good, attack=()) -> Case:
    """A case constructing ``cls(**kwargs)`` (closed afterwards)."""

    def call(w: World, kw: dict, opened: list) -> Any:
        client = cls(**kw)
        opened.append(client)
        return client

    return Case(name, call, good, tuple(attack))


def _trajectory(**kw: Any) -> marti.Trajectory:
    return marti.Trajectory(episode_id="ep-m", agent_id="m1", episode_return=1.0, **kw)


def _cases(flavour: str) -> list[Case]:
    aio = flavour == "aio"
    comm = marti.aio.MartiCommClient if aio else marti.MartiCommClient
    store = marti.aio.ExperienceSharingClient if aio else marti.ExperienceSharingClient
    env = AsyncEnvClient if aio else EnvClient
    pool = AsyncEnvPool if aio else EnvPool
    infer = marti.aio.InferenceClient if aio else marti.InferenceClient
    trainer = marti.aio.TrainerClient if aio else marti.TrainerClient
    broker_c, store_c = _client(comm, "m1", session="misuse"), _client(store, "m1")
    env_c, pool_c, inf_c, tr_c = _client(env), _client(pool), _client(infer), _client(trainer)
    cases = [
        ctor(
            "broker.init",
            comm,
            lambda w: {
                "agent_id": "m2",
                "address": w.address,
                "session": "misuse",
                "token": TOKEN,
                "batching_size": 4,
                "max_batch_bytes": 4096,
                "update_frequency_s": 0.01,
                "compression_level": 1,
                "timeout_s": 5.0,
                "max_frame_bytes": 1 << 20,
                "dedup_memory": 10,
                "topics": ["t"],
            },
            attack=(
                "agent_id",
                "session",
                "batching_size",
                "max_batch_bytes",
                "update_frequency_s",
                "compression_level",
                "timeout_s",
                "max_frame_bytes",
                "dedup_memory",
                "topics",
            ),
        ),
        method(
            "broker.send_message",
            broker_c,
            "send_message",
            lambda w: {"receiver_id": "m2", "message": {"a": 1}, "ttl_s": 5.0},
        ),
        method("broker.broadcast", broker_c, "broadcast", lambda w: {"message": {"a": 1}, "ttl_s": 5.0}),
        method(
            "broker.broadcast_state",
            broker_c,
            "broadcast_state",
            lambda w: {"state": {"turn": 1}, "expected_version": None},
        ),
        method("broker.publish", broker_c, "publish", lambda w: {"topic": "t", "message": [1], "ttl_s": 1.0}),
        method(
            "broker.get_messages", broker_c, "get_messages", lambda w: {"max_messages": 4, "timeout_s": 0.0}
        ),
        method("broker.ack", broker_c, "ack", lambda w: {"message_ids": ["x"]}),
        method("broker.flush", broker_c, "flush", lambda w: {"acks": True}),
        method("broker.get_agent_states", broker_c, "get_agent_states", lambda w: {"exclude_self": True}),
        method("broker.get_broker_stats", broker_c, "get_broker_stats", lambda w: {"whole_broker": False}),
        ctor(
            "store.init",
            store,
            lambda w: {
                "agent_id": "m1",
                "address": w.address,
                "token": TOKEN,
                "timeout_s": 5.0,
                "chunk_bytes": 1 << 16,
            },
            attack=("agent_id", "timeout_s", "chunk_bytes"),
        ),
        method(
            "store.share_experience",
            store_c,
            "share_experience",
            lambda w: {"trajectory": _trajectory(), "table": w.table, "priority": 1.0, "timeout_s": 2.0},
        ),
        method(
            "store.share_experiences",
            store_c,
            "share_experiences",
            lambda w: {
                "trajectories": [_trajectory()],
                "table": w.table,
                "priorities": [1.0],
                "timeout_s": 2.0,
                "batch_items": 8,
            },
        ),
        method(
            "store.insert",
            store_c,
            "insert",
            lambda w: {"table": w.table, "trajectories": [_trajectory()], "timeout_s": 2.0, "batch_items": 8},
        ),
        method(
            "store.delete",
            store_c,
            "delete",
            lambda w: {"table": w.table, "episode_ids": ["ep-gone"], "timeout_s": 2.0},
        ),
        method(
            "store.sample",
            store_c,
            "sample",
            lambda w: {
                "table": w.table,
                "batch_size": 1,
                "timeout_s": 0.5,
                "agent_ids": None,
                "min_policy_version": 0,
                "max_age_s": 0.0,
                "allow_partial": True,
            },
        ),
        method(
            "store.sample_batch",
            store_c,
            "sample_batch",
            lambda w: {
                "table": w.table,
                "batch_size": 1,
                "timeout_s": 0.5,
                "roles": None,
                "allow_partial": True,
                "current_policy_version": 3,
                "whole_groups": False,
            },
        ),
        method(
            "store.get_items",
            store_c,
            "get_items",
            lambda w: {"episode_id": "ep-m", "agent_id": "m1", "policy_version": 0, "tables": [w.table]},
        ),
        method(
            "store.get_trajectories",
            store_c,
            "get_trajectories",
            lambda w: {"episode_id": "ep-m", "session": None, "tables": [w.table]},
        ),
        method(
            "store.get_all_experiences",
            store_c,
            "get_all_experiences",
            lambda w: {"episode_id": "ep-m", "session": None},
        ),
        method("store.create_table", store_c, "create_table", lambda w: {"name": "fresh", "config": None}),
        method(
            "store.update_priorities",
            store_c,
            "update_priorities",
            lambda w: {"table": w.table, "priorities": {0: 1.0}},
        ),
        method("store.info", store_c, "info", lambda w: {"table": w.table}),
        ctor(
            "env.init",
            env,
            lambda w: {"address": w.address, "token": TOKEN, "timeout_s": 5.0},
            attack=("timeout_s",),
        ),
        method(
            "env.create_session",
            env_c,
            "create_session",
            lambda w: {"env_id": ENV, "config": {"num_agents": 2}, "seed": 1},
        ),
        method(
            "env.reset", env_c, "reset", lambda w: {"session_id": w.env_session, "seed": 1, "options": None}
        ),
        method(
            "env.step",
            env_c,
            "step",
            lambda w: {"session_id": w.env_session, "actions": {"agent_1": "task_1: 1"}},
        ),
        method(
            "env.batch_step",
            env_c,
            "batch_step",
            lambda w: {"steps": [(w.env_session, {"agent_1": "task_1: 1"})]},
        ),
        method("env.close_session", env_c, "close_session", lambda w: {"session_id": "no-such-session"}),
        ctor(
            "pool.init",
            pool,
            lambda w: {"addresses": [w.address], "token": TOKEN, "timeout_s": 5.0},
            attack=("addresses", "timeout_s"),
        ),
        method("pool.create_session", pool_c, "create_session", lambda w: {"env_id": ENV, "seed": 1}),
        method("pool.server_of", pool_c, "server_of", lambda w: {"session_id": w.env_session}),
        ctor(
            "inference.init",
            infer,
            lambda w: {"address": w.address, "token": TOKEN, "timeout_s": 5.0},
            attack=("timeout_s",),
        ),
        method(
            "inference.generate",
            inf_c,
            "generate",
            lambda w: {
                "model": "a1",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
                "temperature": 1.0,
                "top_p": 1.0,
                "top_k": 0,
                "stop": (),
                "seed": 1,
                "n": 1,
                "episode_id": "",
                "group_id": "",
                "timeout_s": 5.0,
            },
        ),
        method(
            "inference.report_reward",
            inf_c,
            "report_reward",
            lambda w: {
                "episode_id": "ep-r",
                "rewards": {"a1": 1.0},
                "group_id": "",
                "group_size": 0,
                "timeout_s": 5.0,
            },
        ),
        ctor(
            "trainer.init",
            trainer,
            lambda w: {"address": w.address, "token": TOKEN, "timeout_s": 5.0},
            attack=("timeout_s",),
        ),
        method("trainer.get_job", tr_c, "get_job", lambda w: {"job_id": "no-such-job"}),
        method("trainer.stop_job", tr_c, "stop_job", lambda w: {"job_id": "no-such-job"}),
        method(
            "trainer.save_checkpoint",
            tr_c,
            "save_checkpoint",
            lambda w: {"job_id": "no-such-job", "timeout_s": 5.0},
        ),
        method(
            "trainer.submit_job",
            tr_c,
            "submit_job",
            lambda w: {"config_yaml": "{}", "overrides": ()},
            attack=("config_yaml",),  # a valid config would start a job, so a bad override meets a bad config
        ),
    ]
    if not aio:
        cases += [
            Case(
                "marti.make",
                lambda w, kw, opened: opened.append(marti.make(**kw)),
                lambda w: {
                    "env_id": ENV,
                    "address": w.address,
                    "token": TOKEN,
                    "seed": 1,
                    "timeout_s": 5.0,
                    "transport": "unary",
                },
                ("env_id", "seed", "timeout_s", "transport"),
            ),
            Case(
                "marti.make.local",
                lambda w, kw, opened: opened.append(marti.make(**kw)),
                lambda w: {"env_id": ENV, "seed": 1, "num_agents": 2},
                ("env_id", "seed", "num_agents"),
            ),
            method("pool.make", pool_c, "make", lambda w: {"env_id": ENV, "seed": 1, "transport": "unary"}),
            Case(
                "marti.report_reward",
                lambda w, kw, opened: marti.report_reward(**kw),
                lambda w: {
                    "address": w.address,
                    "episode_id": "ep-r2",
                    "rewards": {"a1": 1.0},
                    "token": TOKEN,
                    "timeout_s": 5.0,
                },
                ("episode_id", "rewards", "timeout_s"),
            ),
        ]
    return cases


CASES = [
    pytest.param(flavour, case, id=f"{flavour}-{case.name}")
    for flavour in ("sync", "aio")
    for case in _cases(flavour)
]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[World]:
    """The servers, a store table holding one item, and a live env session."""
    with serve_sdk_services(
        tmp_path_factory.mktemp("store"), TOKEN, ScriptedInference(), trainer=True
    ) as address:
        w = World(address)
        with marti.ExperienceSharingClient("m1", address, token=TOKEN) as store:
            store.create_table(w.table, preset="uniform")  # sampling leaves the items in place
            store.share_experiences([_trajectory(), _trajectory()], table=w.table)
        with EnvClient(address, token=TOKEN) as env:
            w.env_session = env.create_session(ENV, seed=1).session_id
        yield w


#: Words an error may use for an argument instead of its name.
ALIASES = {"addresses": "env server address", "config_yaml": "SubmitJob"}


def _names_argument(err: MartiError, arg: str, value: Any) -> bool:
    """Whether ``err`` names ``arg`` (or its alias), or, for a text value, the value itself, or, for a mapping,
    one of its keys (an unknown agent in ``actions``)."""
    text = str(err)
    if arg in text or ALIASES.get(arg, arg) in text:
        return True
    if isinstance(value, str) and value and repr(value) in text:
        return True
    return isinstance(value, dict) and any(repr(k) in text for k in value)


def _close(opened: list, loop: asyncio.AbstractEventLoop) -> None:
    for client in reversed(opened):
        out = client.close()
        if inspect.isawaitable(out):
            loop.run_until_complete(out)


@pytest.mark.parametrize(("flavour", "case"), CASES)
def test_hostile_argument_gives_a_named_marti_error(world: World, flavour: str, case: Case) -> None:
    """One argument at a time replaced by a hostile value: success, or a MartiError naming the argument."""
    attackable = case.attack or tuple(case.good(world))
    loop = asyncio.new_event_loop()

    @settings(settings.get_profile(PROFILE))
    @given(arg=st.sampled_from(attackable), value=HOSTILE)
    def check(arg: str, value: Any) -> None:
        kwargs = {**case.good(world), arg: value}
        opened: list = []
        try:
            out = case.call(world, kwargs, opened)
            if inspect.isawaitable(out):
                loop.run_until_complete(asyncio.wait_for(out, 30))
        except (InvalidArgumentError, OutOfRangeError) as err:
            assert _names_argument(err, arg, value), (
                f"{case.name}({arg}={value!r}): {type(err).__name__}: {err}"
            )
        except MartiError:
            pass  # about the servers' state, not the argument
        except Exception as err:  # noqa: BLE001 - the point: anything else is a bug
            pytest.fail(f"{case.name}({arg}={value!r}) raised {type(err).__name__}: {err}")
        finally:
            _close(opened, loop)

    try:
        check()
    finally:
        loop.close()
