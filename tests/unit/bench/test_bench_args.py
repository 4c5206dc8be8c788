"""The checks every ``marti bench`` shares (``benchmarks.report``), and the bad values ``marti bench env`` and
``marti bench broker`` refuse before they start anything: exit 2 with the option and the value named."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from benchmarks import broker, env, report


@pytest.mark.parametrize("text, value", [("1", 1), ("64", 64)])
def test_positive_int_accepts_one_and_more(text, value):
    assert report.positive_int(text) == value


@pytest.mark.parametrize("text", ["0", "-5", "x", "1.5", ""])
def test_positive_int_refuses_the_rest_naming_it(text):
    with pytest.raises(argparse.ArgumentTypeError, match="must be an integer >= 1, got"):
        report.positive_int(text)


def test_non_negative_int_takes_zero_and_refuses_below():
    assert report.non_negative_int("0") == 0
    with pytest.raises(argparse.ArgumentTypeError, match="must be an integer >= 0, got -1"):
        report.non_negative_int("-1")


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "-inf", "x"])
def test_positive_float_refuses_zero_negative_and_non_finite(text):
    with pytest.raises(argparse.ArgumentTypeError, match="must be a finite number > 0, got"):
        report.positive_float(text)
    assert report.positive_float("0.5") == 0.5


def test_json_is_strict_non_finite_numbers_become_null(tmp_path):
    path = tmp_path / "out.json"
    report.write_json(path, {"a": math.nan, "b": [1.0, math.inf, {"c": -math.inf}], "d": (2, 3), "e": "nan"})

    def refuse(token):
        raise AssertionError(token)

    assert json.loads(path.read_text(), parse_constant=refuse) == {
        "a": None,
        "b": [1.0, None, {"c": None}],
        "d": [2, 3],
        "e": "nan",
    }


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sessions", "0"], "argument --sessions: must be an integer >= 1, got 0"),
        (["--steps", "-5"], "argument --steps: must be an integer >= 1, got -5"),
        (["--rounds", "0"], "argument --rounds: must be an integer >= 1, got 0"),
        (["--json", "/nonexistent-dir/x.json"], "--json /nonexistent-dir/x.json: the folder"),
    ],
)
def test_bench_env_refuses_bad_values_before_starting(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        env.main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--messages", "-5"], "argument --messages: must be an integer >= 1, got -5"),
        (["--senders", "0"], "argument --senders: must be an integer >= 1, got 0"),
        (["--batch", "0"], "argument --batch: must be an integer >= 1, got 0"),
        (["--paced-seconds", "nan"], "argument --paced-seconds: must be a finite number > 0, got nan"),
        (["--paced-seconds", "0.5"], "--paced-seconds 0.5 must be >= 1"),
        (["--arms", ""], "--arms '' names no arm"),
        (["--messages", "10"], "--messages 10 must be at least 4 x --senders (32)"),
        (["--ray-messages", "4"], "--ray-messages 4 must be at least --senders (8)"),
        (["--json", "/nonexistent-dir/x.json"], "--json /nonexistent-dir/x.json: the folder"),
    ],
)
def test_bench_broker_refuses_bad_values_before_starting(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        broker.main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_a_broker_target_whose_number_is_not_a_number_is_missed():
    nan_lat = {"n": 1, "wall": 1.0, "lat": [math.nan], "call_lat": [math.nan], "wire": None, "raw": None}
    _, numbers, missed = broker.targets({"paced": nan_lat, "lone": nan_lat})
    assert math.isnan(numbers["paced_p99_ms"]) and missed == ["p99", "lone p99"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sessions", "0"], "argument --sessions: must be an integer >= 1, got 0"),
        (["--paced-rate", "nan"], "argument --paced-rate: must be a finite number > 0, got nan"),
        (["--quick", "--procs", "50"], "--procs 50 must not exceed --sessions (20) or --agents (20)"),
        (["--quick", "--broker-sessions", "30"], "--broker-sessions 30 must not exceed --agents (20)"),
    ],
)
def test_bench_scale_refuses_bad_values_naming_them(argv, message, capsys):
    from benchmarks import scale

    with pytest.raises(SystemExit) as info:
        scale.main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_a_json_path_that_is_a_folder_is_refused_first(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        env.main(["--json", str(tmp_path)])
    assert info.value.code == 2 and f"--json {tmp_path}: is a folder, not a file" in capsys.readouterr().err


def test_markdown_table_is_the_one_printer_and_refuses_a_ragged_row():
    from benchmarks.report import markdown_table

    text = markdown_table(["arm", "s"], [["a", "1.00"], ["b", 2]], "lr")
    assert text.splitlines() == ["| arm | s |", "|---|---:|", "| a | 1.00 |", "| b | 2 |"]
    with pytest.raises(ValueError, match="2 columns"):
        markdown_table(["arm", "s"], [["a"]], "lr")
    with pytest.raises(ValueError, match="align"):
        markdown_table(["arm", "s"], [], "lx")


def test_positive_int_list_keeps_the_order_and_refuses_a_repeated_value_naming_it():
    assert report.positive_int_list("8, 1,64") == [8, 1, 64]
    with pytest.raises(argparse.ArgumentTypeError, match="names 2, 4 more than once, got '2,4,2,4'"):
        report.positive_int_list("2,4,2,4")


def _no_run(*args, **kwargs):
    raise AssertionError("the benchmark ran")


@pytest.mark.parametrize(
    ("bench", "patched", "argv", "message"),
    [
        ("rollout", "run", ["--steps", "0"], "argument --steps: must be an integer >= 1, got 0"),
        ("rollout", "run", ["--warmup", "-1"], "argument --warmup: must be an integer >= 0, got -1"),
        (
            "rollout",
            "run",
            ["--json", "/nonexistent-dir/x.json"],
            "--json /nonexistent-dir/x.json: the folder",
        ),
        ("gateway", "run_all", ["--clients", "2,2"], "argument --clients: names 2 more than once"),
        ("gateway", "run_all", ["--requests", "0"], "argument --requests: must be an integer >= 1, got 0"),
        (
            "gateway",
            "run_all",
            ["--max-tokens", "-3"],
            "argument --max-tokens: must be an integer >= 1, got -3",
        ),
        (
            "gateway",
            "run_all",
            ["--json", "/nonexistent-dir/x.json"],
            "--json /nonexistent-dir/x.json: the folder",
        ),
        ("store", "bench_marti", ["--clients", "1,4,1"], "argument --clients: names 1 more than once"),
        (
            "team_comparison",
            "run_arm",
            ["--json", "/nonexistent-dir/x.json"],
            "--json /nonexistent-dir/x.json: ",
        ),
    ],
)
def test_other_benches_refuse_bad_values_naming_them_before_running(
    bench, patched, argv, message, monkeypatch, capsys
):
    import importlib

    module = importlib.import_module(f"benchmarks.{bench}")
    monkeypatch.setattr(module, patched, _no_run)
    with pytest.raises(SystemExit) as info:
        module.main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err
