"""Unit tests of services.trainer.observe.progress: ETA arithmetic and the plain and live bars."""

from __future__ import annotations

import io

import pytest

from marti.errors import FailedPreconditionError, InvalidArgumentError
from services.trainer.observe.progress import ProgressBar, estimate_eta_s, format_duration


class StepClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_eta_formula():
    assert estimate_eta_s(30.0, 3, 5) == pytest.approx(50.0)
    assert estimate_eta_s(30.0, 0, 5) is None
    assert estimate_eta_s(30.0, 3, 0) == 0.0


def test_format_duration():
    assert format_duration(3725.9) == "1:02:05"
    assert format_duration(None) == "?" and format_duration(float("inf")) == "?"
    assert format_duration(-3) == "0:00:00"


def test_plain_lines_with_eta_and_throttling():
    clock, out = StepClock(), io.StringIO()
    with ProgressBar(4, stream=out, min_interval_s=10.0, live=False, clock=clock) as bar:
        clock.t = 5.0
        bar.update(1, {"team/reward": 0.123456})
        clock.t = 8.0
        bar.update(2)  # within 10 s of the last line: not printed
        clock.t = 20.0
        bar.update(3, {"agent_1/kl": 0.01})
        assert bar.eta_s == pytest.approx(20.0 / 3)
        clock.t = 21.0
        bar.update(4)  # the final step always prints
    lines = out.getvalue().splitlines()
    assert lines == [
        "step 1/4 [ 25%] elapsed 0:00:05 eta 0:00:15 | team/reward=0.1235",
        "step 3/4 [ 75%] elapsed 0:00:20 eta 0:00:06 | agent_1/kl=0.01",
        "step 4/4 [100%] elapsed 0:00:21 eta 0:00:00",
    ]


def test_resumed_bar_uses_only_its_own_pace():
    clock, out = StepClock(), io.StringIO()
    with ProgressBar(10, start_step=6, stream=out, min_interval_s=0, live=False, clock=clock) as bar:
        assert bar.eta_s is None
        clock.t = 4.0
        bar.update(8)
        assert bar.eta_s == pytest.approx(4.0)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"total_steps": 0}, "total_steps must be an int >= 1"),
        ({"total_steps": 5, "start_step": 6}, "start_step must be in [0, 5]"),
        ({"total_steps": 5, "min_interval_s": -1}, "min_interval_s must be >= 0"),
    ],
)
def test_bad_construction(kwargs, fragment):
    with pytest.raises(InvalidArgumentError) as info:
        ProgressBar(**kwargs)
    assert fragment in str(info.value)


def test_bad_updates():
    bar = ProgressBar(3, stream=io.StringIO(), live=False)
    with pytest.raises(FailedPreconditionError):
        bar.update(1)
    with bar:
        bar.update(2)
        with pytest.raises(InvalidArgumentError, match=r"\[2, 3\], got 1"):
            bar.update(1)
        with pytest.raises(InvalidArgumentError, match="got 4"):
            bar.update(4)


def test_live_bar_renders_with_rich():
    out = io.StringIO()
    with ProgressBar(2, stream=out, live=True) as bar:
        bar.update(1, {"team/reward": 0.5})
        bar.update(2, {"team/reward": 0.75})
    text = out.getvalue()
    assert "2/2" in text and "team/reward=0.75" in text
