"""The broker's command line: the GC tuning flag and its edge values."""

from __future__ import annotations

import gc

import pytest

from services.comm_broker.__main__ import settings_from_args, tune_gc


@pytest.fixture
def restore_gc():
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_gc_threshold_flag_and_tuning(restore_gc):
    assert settings_from_args([]).gc_gen0_threshold == 50_000
    settings = settings_from_args(["--gc-gen0-threshold", "1234"])
    tune_gc(settings.gc_gen0_threshold)
    assert gc.get_threshold()[0] == 1234
    assert gc.get_freeze_count() > 0  # start-up objects are out of the collector's sight


def test_gc_threshold_zero_keeps_interpreter_default(restore_gc, capsys):
    gc.set_threshold(700, 10, 10)
    tune_gc(settings_from_args(["--gc-gen0-threshold", "0"]).gc_gen0_threshold)
    assert gc.get_threshold() == (700, 10, 10)
    with pytest.raises(SystemExit) as exit_info:
        settings_from_args(["--gc-gen0-threshold", "-1"])
    assert exit_info.value.code == 2
    assert "setting gc_gen0_threshold (--gc-gen0-threshold) = -1" in capsys.readouterr().err
