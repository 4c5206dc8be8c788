"""One resolver for a job's service addresses and token: flags/settings over the config's ``services`` section."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from marti.config import ServicesConfig
from marti.errors import InvalidArgumentError
from services.trainer.job.connections.addresses import resolve_addresses, with_started

ROOT = Path(__file__).resolve().parents[4]


def test_a_given_value_wins_over_the_section_and_tls_is_for_the_given_services_only():
    section = ServicesConfig(broker="b:1", env="e:1", token="from-config", tls_ca_file="ca.pem")
    addresses, missing = resolve_addresses(section, broker="flag:2", token="from-flag")
    assert (addresses.broker, addresses.env, addresses.store, addresses.token) == (
        "flag:2",
        "e:1",
        "",
        "from-flag",
    )
    assert missing == ("store",)
    assert (addresses.ca_for("broker"), addresses.ca_for("env"), addresses.ca_for("store")) == (
        "ca.pem",
    ) * 2 + (None,)
    assert resolve_addresses(section)[0].token == "from-config"


def test_started_services_fill_the_missing_ones_in_plaintext():
    addresses, missing = resolve_addresses(ServicesConfig(env="e:1", tls_ca_file="ca.pem"), token="t")
    assert missing == ("broker", "store")
    filled = with_started(addresses, {"broker": "127.0.0.1:5", "store": "127.0.0.1:6"})
    assert (filled.broker, filled.env, filled.store, filled.token) == (
        "127.0.0.1:5",
        "e:1",
        "127.0.0.1:6",
        "t",
    )
    assert filled.tls_services == {"env"} and filled.ca_for("store") is None


def test_nothing_anywhere_is_every_service_missing_and_no_token():
    addresses, missing = resolve_addresses()
    assert missing == ("broker", "env", "store") and addresses.token is None and not addresses.tls_services


def test_a_bad_env_pool_entry_is_named():
    with pytest.raises(InvalidArgumentError, match="nohost"):
        resolve_addresses(env="a:1,nohost")


def test_no_entry_point_builds_addresses_itself():
    """Every place that decides a job's addresses goes through resolve_addresses (the class built in one place)."""
    builders = []
    for path in sorted(ROOT.glob("services/**/*.py")):
        if path.relative_to(ROOT).as_posix() == "services/trainer/job/connections/addresses.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", "")) == "Addresses"
            ):
                builders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not builders, f"Addresses built outside services.trainer.job.connections.addresses: {builders}"
