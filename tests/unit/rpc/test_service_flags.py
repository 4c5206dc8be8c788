"""Every service command takes one flag per setting of its settings class (:func:`marti.rpc.settings.settings_parser`):
``marti store --tls-cert-file`` exists as ``marti broker``'s does, a flag's value reaches the settings, and a bad one
exits with code 2 and one line naming the flag."""

from __future__ import annotations

import pytest

from marti.rpc.settings import given_flags, load_settings, settings_parser
from services.comm_broker import __main__ as broker_main
from services.comm_broker.settings import BrokerSettings
from services.env_server import __main__ as env_main
from services.env_server.settings import EnvServerSettings
from services.experience_store import __main__ as store_main
from services.experience_store.settings import StoreSettings
from services.trainer import __main__ as trainer_main
from services.trainer.job.service.settings import TrainerSettings

COMMANDS = [
    (broker_main, BrokerSettings),
    (env_main, EnvServerSettings),
    (store_main, StoreSettings),
    (trainer_main, TrainerSettings),
]


@pytest.mark.parametrize(("module", "cls"), COMMANDS, ids=["broker", "env-server", "store", "trainer"])
def test_every_setting_is_a_flag_in_the_commands_help(module, cls, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        module.main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for name in cls.model_fields:
        assert "--" + name.replace("_", "-") in out, name
    assert "(default: " in out


@pytest.mark.parametrize(("module", "cls"), COMMANDS, ids=["broker", "env-server", "store", "trainer"])
def test_a_bad_server_flag_exits_2_naming_it_before_anything_starts(module, cls, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        module.main(["--log-level", "loud", "--grace-s", "1"])
    assert info.value.code == 2
    assert "setting log_level (--log-level) = 'loud'" in capsys.readouterr().err


def test_flags_parse_as_their_fields_types() -> None:
    parser = settings_parser(StoreSettings, "marti store", "d")
    args = parser.parse_args(
        ["--tls-cert-file", "c.pem", "--metrics-port", "9103", "--grace-s", "0.5", "--max-item-bytes", "1024"]
    )
    settings = load_settings(StoreSettings, given_flags(args), "marti store")
    assert (settings.tls_cert_file, settings.metrics_port, settings.grace_s, settings.max_item_bytes) == (
        "c.pem",
        9103,
        0.5,
        1024,
    )
    env = settings_parser(EnvServerSettings, "marti env-server", "d")
    assert env.parse_args(["--allowed-modules", "a.b", "c"]).allowed_modules == ["a.b", "c"]
    trainer = settings_parser(TrainerSettings, "marti trainer", "d")
    assert trainer.parse_args(["--no-allow-user-code"]).allow_user_code is False
    assert given_flags(trainer.parse_args([])) == {}


def test_the_trainers_token_is_the_token_its_jobs_send_unless_one_is_given(monkeypatch) -> None:
    served = []
    monkeypatch.setattr(trainer_main, "run_server", lambda specs, settings: served.append(settings) or 0)
    monkeypatch.setattr(trainer_main, "build_specs", lambda settings: [])
    trainer_main.main(["--token", "t1"])
    trainer_main.main(["--token", "t1", "--service-token", "t2"])
    assert [(s.token, s.service_token) for s in served] == [("t1", "t1"), ("t1", "t2")]


def test_a_misspelt_service_variable_is_a_warning_naming_the_closest_setting(monkeypatch, capsys) -> None:
    """``MARTI_STORE_SQLITE_SYNCRONOUS=FULL`` was ignored without a word (the store ran with NORMAL); now a warning
    names it and the setting it likely meant. ``marti train``'s ``MARTI_STORE_ADDR`` and real settings are quiet."""
    monkeypatch.setenv("MARTI_STORE_SQLITE_SYNCRONOUS", "FULL")
    monkeypatch.setenv("MARTI_STORE_ADDR", "127.0.0.1:5")
    monkeypatch.setenv("MARTI_STORE_MAX_ITEM_BYTES", "1000")
    settings = load_settings(StoreSettings, {}, "marti store")
    assert settings.sqlite_synchronous == "NORMAL" and settings.max_item_bytes == 1000
    err = capsys.readouterr().err
    assert err == (
        "marti store: warning: MARTI_STORE_SQLITE_SYNCRONOUS is not a setting of this service and is ignored; "
        "did you mean MARTI_STORE_SQLITE_SYNCHRONOUS?\n"
    )
