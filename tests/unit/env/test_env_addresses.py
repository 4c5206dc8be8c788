"""Env server address values that name several servers (marti.clients.env.addresses): the forms accepted, the
typed errors for bad ones (in the SDK, the config and ``marti train --env``), and ``dns:///`` expansion."""

from __future__ import annotations

import argparse
import socket

import pytest

import marti
from marti.clients.env.addresses import (
    env_server_entries,
    is_env_pool,
    resolve_env_servers,
    single_env_address,
)
from marti.config import config_from_dict
from marti.errors import InvalidArgumentError, UnavailableError

BASE = {"training_name": "t", "agents": [{"name": "a", "pretrain_model": "m", "role": "planner"}]}


def test_lists_and_comma_strings_give_their_entries_once_in_order():
    assert env_server_entries(" h1:1 , [::1]:2,unix:/tmp/env.sock,h1:1") == (
        "h1:1",
        "[::1]:2",
        "unix:/tmp/env.sock",
    )
    assert env_server_entries(["h1:1", "dns:///envs:3"]) == ("h1:1", "dns:///envs:3")


def test_one_plain_address_is_not_a_pool_and_is_not_checked():
    assert not is_env_pool("localhost:50052") and not is_env_pool("anything") and not is_env_pool(None)
    assert not is_env_pool(["h:1"]) and single_env_address(["h:1"]) == "h:1"
    assert not is_env_pool("h:1,h:1")  # one server named twice
    # ... is dialed as that one address, never as the raw comma string (gRPC: "Misformatted domain name")
    assert single_env_address("h:1,h:1") == "h:1" and single_env_address(" h:1 , h:1") == "h:1"
    assert (
        single_env_address(["h:1", "h:1"]) == "h:1"
        and single_env_address("localhost:50052") == "localhost:50052"
    )
    assert is_env_pool("h:1,g:1") and is_env_pool(["h:1", "g:1"]) and is_env_pool("dns:///envs:1")


@pytest.mark.parametrize(
    ("value", "named"),
    [([], r"no env server address given \(\[\]\)"), ("h:1,,g:2", "empty env server address in 'h:1,,g:2'"),
     ("h:1,g", "'g' \\(in 'h:1,g'\\)"), ("h:1,g:0", "'g:0'"), ("h:1,g:x", "'g:x'"), ("h:1,unix:", "'unix:'"),
     ("dns:///envs", "'dns:///envs'"), ("h:1,dns://auth/envs:1", "'dns://auth/envs:1'"), (["h:1", None], "None"),
     (7, "got int 7")],
)  # fmt: skip
def test_bad_values_are_typed_errors_naming_the_entry_and_value(value, named):
    with pytest.raises(InvalidArgumentError, match=named):
        is_env_pool(value)


@pytest.mark.parametrize(
    "value",
    ["h:1,[zzz]:1", "h:1,[::1%]:1", "h:1,[::1]x:1", "h:1,g:\uff11", "h:1,g:\u0661\u0662", "h:1,[::1]:\uff12"],
)
def test_ipv6_literals_are_hex_and_ports_ascii_digits(value):
    with pytest.raises(InvalidArgumentError, match="is not host:port"):
        is_env_pool(value)


def test_good_ipv6_literals_with_a_zone_pass():
    assert env_server_entries("[fe80::1%eth0]:1,[::ffff:10.0.0.1]:2,[2001:DB8::a]:3") == (
        "[fe80::1%eth0]:1",
        "[::ffff:10.0.0.1]:2",
        "[2001:DB8::a]:3",
    )


def test_a_dns_entry_with_blanks_around_it_is_a_pool(monkeypatch):
    assert is_env_pool(" dns:///envs.marti.test:1") and is_env_pool("dns:///envs.marti.test:1 ")
    monkeypatch.setattr(
        socket,
        "getaddrinfo",
        lambda host, port, *a, **k: [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", port))],
    )
    assert resolve_env_servers(" dns:///envs.marti.test:1") == ("10.0.0.7:1",)


def test_the_config_checks_services_env_when_loaded():
    assert config_from_dict({**BASE, "services": {"env": ["h:1", "g:2"]}}).services.env == ["h:1", "g:2"]
    assert config_from_dict({**BASE, "services": {"env": "h:1,g:2"}}).services.env == "h:1,g:2"
    with pytest.raises(InvalidArgumentError, match=r"services\.env.*'g' \(in 'h:1,g'\)"):
        config_from_dict({**BASE, "services": {"env": "h:1,g"}})
    with pytest.raises(InvalidArgumentError, match="services.env"):
        config_from_dict({**BASE, "services": {"env": []}})


def test_marti_train_checks_the_env_flag_before_starting_anything():
    from services.trainer.job.cli.train_cli import service_addresses

    cfg = config_from_dict(BASE)
    args = argparse.Namespace(broker="b:1", env="h:1,,g:2", store="s:1", token=None)
    with pytest.raises(InvalidArgumentError, match="empty env server address"):
        with service_addresses(cfg, args):
            pass
    args.env = "h:1,g:2"
    with service_addresses(cfg, args) as addresses:
        assert addresses.env == "h:1,g:2"


def test_dns_entries_expand_to_one_server_per_address(monkeypatch):
    def resolve(host, port, *args, **kwargs):
        assert host == "envs.marti.test"
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", port)),
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::2", port, 0, 0)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", port)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    assert resolve_env_servers("dns:///envs.marti.test:50052,10.0.0.1:50052,h:1") == (
        "10.0.0.1:50052",
        "[fd00::2]:50052",
        "h:1",
    )

    def fail(*args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", fail)
    with pytest.raises(UnavailableError, match="'dns:///envs.marti.test:1' does not resolve"):
        resolve_env_servers(["dns:///envs.marti.test:1"])


@pytest.mark.parametrize("blank", ["", "  "])
def test_an_empty_single_address_is_refused_naming_it(blank):
    with pytest.raises(InvalidArgumentError, match=rf"^no env server address given \({blank!r}\)$"):
        single_env_address(blank)
    with pytest.raises(InvalidArgumentError, match="no env server address given"):
        marti.make("collaborative_task_solving", address=blank)
    with pytest.raises(InvalidArgumentError, match="no env server address given"):
        marti.list_envs(address=blank)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), 1e12])
def test_remote_env_clients_refuse_a_bad_timeout_at_construction(bad):
    from marti.clients.env import EnvClient, EnvPool

    with pytest.raises(InvalidArgumentError, match="timeout_s must be > 0"):
        EnvClient("127.0.0.1:1", timeout_s=bad)
    with pytest.raises(InvalidArgumentError, match="timeout_s must be > 0"):
        EnvPool(["127.0.0.1:1", "127.0.0.1:2"], timeout_s=bad)
    with pytest.raises(InvalidArgumentError, match="timeout_s must be > 0"):
        marti.make("collaborative_task_solving", address="127.0.0.1:1", timeout_s=bad)
