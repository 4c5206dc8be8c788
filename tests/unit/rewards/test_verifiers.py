"""Built-in verifiers and answer extraction (marti.rewards.verifiers / answers), math-verify on real LaTeX."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marti.errors import InvalidArgumentError
from marti.rewards import extract_answer, make_verifier
from marti.rewards.answers import last_boxed, parse_number
from marti.rewards.verifiers import exact, math, multiple_choice, numeric, regex

REASONING = "Let me think step by step. First 2 + 3 = 5, then 5 * 7 = 35.\n"


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        (REASONING + r"So the result is \boxed{\frac{1}{\sqrt{2}}}.", r"\frac{1}{\sqrt{2}}"),
        (r"\boxed{1} at first, then \boxed{ {a}+{b} }", "{a}+{b}"),
        (REASONING + "Answer: Paris", "Paris"),
        (REASONING + "Final answer: **$x^2$**.", "x^2"),
        (REASONING + "so the answer is 42.", "42"),
        ("推理……\n答案是：巴黎。", "巴黎"),
        ("推理……\n答案：３/4", "３/4"),
        (REASONING, None),
        ("I reanswer: no. The answer to part 1 is below", None),
        (r"\boxed{never closed", None),
    ],
)
def test_extract_answer_finds_the_answer_after_the_reasoning(text: str, answer: str | None) -> None:
    assert extract_answer(text) == answer


def test_last_boxed_keeps_nested_braces() -> None:
    assert last_boxed(r"x \boxed{\frac{a}{b^{2}}} y") == r"\frac{a}{b^{2}}"
    assert last_boxed(r"\boxed{\boxed{1}}") == "1"
    assert last_boxed(r"\boxed{1} then \boxed{2") == "1"  # the last box is never closed


class _TooManyLines(Exception):
    pass


def _lines_run(func, *args, limit: int) -> int:
    """Call ``func(*args)`` counting the Python lines its own frame runs; raise :class:`_TooManyLines` past
    ``limit`` (so a quadratic scan stops early instead of running for minutes). A count, not a clock: the
    same on a loaded machine."""
    count = 0

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
            if count > limit:
                raise _TooManyLines(count)
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code is func.__code__ else None

    previous = sys.gettrace()  # a coverage tool's, say: put back after
    sys.settrace(tracer)
    try:
        func(*args)
    finally:
        sys.settrace(previous)
    return count


def test_last_boxed_reads_many_unclosed_boxes_in_one_pass() -> None:
    """Lines run grow with the text's length, not length x boxes (rescanning to the end for each unclosed box
    was quadratic: about 3,000 x 21,000 / 2 iterations here)."""
    text = "\\boxed{7} " + "\\boxed{" * 3_000
    assert last_boxed(text) == "7"
    assert _lines_run(last_boxed, text, limit=10 * len(text)) > len(text)  # the bound is about one pass


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", 42.0),
        ("-2.5", -2.5),
        ("3/4", 0.75),
        ("1,234,567.5", 1234567.5),
        (r"\frac{3}{4}", 0.75),
        ("$50$", 50.0),
        ("50%", 50.0),
        ("1e-3", 0.001),
        ("−7", -7.0),
        ("１２", 12.0),
        ("1e99999999999", None),
        ("1,23", None),
        ("1/0", None),
        ("abc", None),
        ("", None),
    ],
)
def test_parse_number_reads_the_documented_forms(text: str, value: float | None) -> None:
    assert parse_number(text) == value


def test_exact_ignores_case_and_whitespace_unless_told() -> None:
    assert exact(REASONING + "Answer:   New   York ", "new york") == 1.0
    assert exact("Straße", "STRASSE") == 1.0
    assert exact("Answer: Paris", "paris", ignore_case=False) == 0.0
    assert exact("Answer: 北京", "北京") == 1.0
    assert exact("Answer: 北京", "上海") == 0.0


def test_numeric_tolerances_and_reasoning() -> None:
    assert numeric(REASONING + "The answer is 1,234.", "1234") == 1.0
    assert numeric(REASONING + "Answer: 42 apples", "42") == 1.0
    assert numeric(REASONING, "35") == 1.0  # no answer line: the last number of the reply
    assert numeric(REASONING, "5") == 0.0
    assert numeric(r"\boxed{\frac{3}{4}}", "0.75") == 1.0
    assert numeric("Answer: 10.5", "10", tolerance=0.1) == 1.0
    assert numeric("Answer: 10.5", "10") == 0.0
    assert numeric("Answer: 0.001", "0", abs_tolerance=0.01) == 1.0
    assert numeric("no number here", "3") == 0.0


def test_numeric_label_that_is_not_a_number_is_named() -> None:
    with pytest.raises(InvalidArgumentError, match="label 'seven' is not a number"):
        numeric("7", "seven")


@pytest.mark.parametrize(
    "reply",
    [
        "B",
        "(B)",
        "[B]",
        "B.",
        "B) 42",
        "Answer: B",
        "the answer is B.",
        "Answer: **b**",
        "I think (A) is wrong, so (B)",
    ],
)
def test_multiple_choice_reads_the_chosen_letter(reply: str) -> None:
    assert multiple_choice(reply, "(B)") == 1.0
    assert multiple_choice(reply, "C") == 0.0


def test_multiple_choice_does_not_read_a_word_as_a_letter() -> None:
    assert multiple_choice("I am not sure", "I") == 0.0
    assert multiple_choice("A good question", "A") == 0.0
    with pytest.raises(InvalidArgumentError, match="not one of ABCD"):
        multiple_choice("A", "Z", letters="ABCD")


@pytest.mark.parametrize(
    ("reply", "label"),
    [
        (REASONING + r"Therefore \boxed{\frac{1}{2}}.", "0.5"),
        (REASONING + r"Therefore \boxed{0.5}.", r"\frac{1}{2}"),
        (r"The answer is $\sqrt{2}$.", "2^{1/2}"),
        (r"\boxed{\dfrac{\sqrt{3}}{2}}", r"$\frac{\sqrt3}{2}$"),
        (r"So $x = \boxed{(x+1)^2}$", "x^2+2x+1"),
        (r"\boxed{\{1, 2\}}", r"\{2,1\}"),
        ("所以答案是 $\\frac{3}{4}$。", "0.75"),
    ],
)
def test_math_verify_accepts_equivalent_latex(reply: str, label: str) -> None:
    assert math(reply, label) == 1.0


@pytest.mark.parametrize(
    ("reply", "label"),
    [(r"\boxed{\frac{1}{3}}", "0.5"), (r"\boxed{\sqrt{3}}", r"\sqrt{2}"), ("no answer at all", "7")],
)
def test_math_verify_rejects_different_answers(reply: str, label: str) -> None:
    assert math(reply, label) == 0.0


def test_math_label_that_is_a_word_is_compared_as_text() -> None:
    assert math("答案是：巴黎", "巴黎") == 1.0
    assert math("答案是：北京", "巴黎") == 0.0


def test_math_bounds_the_answer_length() -> None:
    assert math("\\boxed{" + "1+" * 600 + "1}", "601") == 0.0  # longer than max_chars: wrong, no parse
    assert math("\\boxed{" + "1+" * 600 + "1}", "601", max_chars=2000) == 1.0
    with pytest.raises(InvalidArgumentError, match="above max_chars=10"):
        math("1", "12345678901", max_chars=10)


def test_math_works_from_a_worker_thread() -> None:
    """The env server calls envs from gRPC worker threads: math-verify's SIGALRM timeout would raise there."""
    out: list[object] = []

    def work() -> None:
        try:
            out.append(math(r"\boxed{\frac{1}{2}}", "0.5"))
        except Exception as e:  # noqa: BLE001 - the test reports it
            out.append(e)

    worker = threading.Thread(target=work)
    worker.start()
    worker.join(30)
    assert out == [1.0]


def test_math_answer_that_never_finishes_is_wrong_after_the_timeout_and_the_next_one_is_scored(
    caplog,
) -> None:
    """sympy computes 9^(9^(9^9)) for ever, holding the GIL: math-verify's worker process is killed instead."""
    out: list[object] = []

    def work() -> None:
        start = time.monotonic()
        out.append(math(r"\boxed{9^{9^{9^{9}}}}", "5", math_timeout_s=1.0))
        out.append(time.monotonic() - start)
        out.append(math(r"\boxed{\frac{10}{2}}", "5", math_timeout_s=1.0))

    worker = threading.Thread(target=work)  # as in the env server: not the main thread
    worker.start()
    worker.join(60)
    assert out[0] == 0.0 and out[1] < 30 and out[2] == 1.0, out
    assert "took over math_timeout_s=1.0 on answer '9^{9^{9^{9}}}'" in caplog.text


def test_regex_extracts_group_one_of_the_last_match() -> None:
    assert regex("final=42; final=43", "43", pattern=r"final=(\d+)") == 1.0
    assert regex("final=42; final=43", "42", pattern=r"final=(\d+)") == 0.0
    assert regex("VERDICT: Yes", "yes", pattern=r"VERDICT: \w+") == 0.0
    assert regex("VERDICT: Yes", "verdict: yes", pattern=r"VERDICT: \w+", ignore_case=True) == 1.0
    assert regex("nothing", "x", pattern=r"final=(\d+)") == 0.0


def test_make_verifier_binds_checked_options() -> None:
    assert make_verifier("numeric", tolerance=0.1)("about 10.5", "10") == 1.0
    assert make_verifier("regex", pattern=r"<(.+?)>")("<β>", "β") == 1.0
    assert make_verifier("exact", ignore_case=None)("A", "a") == 1.0  # None: the default


@pytest.mark.parametrize(
    ("kind", "options", "message"),
    [
        ("fuzzy", {}, "unknown verifier 'fuzzy' .verifiers: exact, numeric, multiple_choice, math, regex"),
        ("numeric", {"pattern": "x"}, "verifier 'numeric' takes no option 'pattern' .its options: tolerance"),
        ("regex", {}, "verifier 'regex' needs the option 'pattern'"),
        ("regex", {"pattern": "("}, "pattern '\\(' does not compile"),
        ("numeric", {"tolerance": -1}, "'tolerance' must be a finite number >= 0"),
        ("numeric", {"tolerance": float("nan")}, "'tolerance' must be a finite number >= 0"),
        ("exact", {"ignore_case": "yes"}, "'ignore_case' must be true or false"),
        ("multiple_choice", {"letters": "AAB"}, "'letters' must be a non-empty string of distinct letters"),
        ("math", {"max_chars": 0}, "'max_chars' must be an integer >= 1"),
        ("math", {"math_timeout_s": 0}, "'math_timeout_s' must be a number > 0"),
    ],
)
def test_make_verifier_refuses_bad_kinds_and_options(kind: str, options: dict, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        make_verifier(kind, **options)


def test_verifier_refuses_non_text_inputs() -> None:
    with pytest.raises(InvalidArgumentError, match="exact verifier: label must be str, got int 3"):
        exact("3", 3)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12))
def test_numeric_reads_back_any_written_float(x: float) -> None:
    assert numeric(REASONING + f"The answer is {x!r}.", repr(x)) == 1.0
    if abs(x) > 1e-6:
        assert numeric(REASONING + f"The answer is {x * 1.001!r}.", repr(x)) == 0.0


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="{}\\"), min_size=1))
def test_exact_matches_any_boxed_unicode_text(label: str) -> None:
    assert exact(REASONING + "\\boxed{" + label + "}", label) == 1.0


_SLOW = r"(?:(?:a+)+$|(a+!))"  # backtracks about 2**n steps on "a" * n + "!" before its second branch matches


def test_a_regex_match_over_its_time_limit_is_no_match_and_the_worker_is_replaced(caplog) -> None:
    """``re`` has no time limit: ``(a+)+$`` on ``"a" * 30 + "!"`` took 73 s in the verifier's own process. The
    match runs in a worker killed past ``REGEX_TIMEOUT_S`` (1 s): just under the bound (n=21, about 0.05 s)
    the match is found; far over it (n=30, about a minute) the reply is no match within the bound."""

    from marti.rewards.math_worker import REGEX_TIMEOUT_S, last_match_in_worker

    assert REGEX_TIMEOUT_S == 1.0
    assert last_match_in_worker(r"final=(\d+)", "final=42; final=43") == "43"  # a worker started
    assert last_match_in_worker(_SLOW, "a" * 21 + "!") == "a" * 21 + "!"
    start = time.monotonic()
    assert last_match_in_worker(_SLOW, "a" * 30 + "!") is None
    assert REGEX_TIMEOUT_S <= time.monotonic() - start < REGEX_TIMEOUT_S + 2.0
    assert "took over 1.0 s on reply 'aaaa" in caplog.text
    start = time.monotonic()
    assert make_verifier("regex", pattern=r"(a+)+$")("a" * 30 + "!", "a") == 0.0  # the trial's case
    assert time.monotonic() - start < REGEX_TIMEOUT_S + 5.0  # a fresh worker's start included
    assert regex("final=42; final=43", "43", pattern=r"final=(\d+)") == 1.0  # a new worker answers


def test_the_regex_time_limit_is_an_option_of_the_verifier_and_of_the_dataset_env(caplog) -> None:
    """``regex_timeout_s``: a match that takes longer than it scores 0.0, and the warning names the limit that
    stopped it (0.2 s here, not the default 1 s; timings are not asserted, the machine may be busy); a bad value is
    refused naming it; the ``dataset_task`` env takes the key and scores with it, its majority vote included."""
    import marti

    slow = make_verifier("regex", pattern=_SLOW, regex_timeout_s=0.2)
    assert slow("a" * 30 + "!", "a") == 0.0
    assert "took over 0.2 s on reply 'aaaa" in caplog.text and "took over 1.0 s" not in caplog.text
    with pytest.raises(InvalidArgumentError, match="regex_timeout_s"):
        make_verifier("regex", pattern=_SLOW, regex_timeout_s=0)
    with pytest.raises(InvalidArgumentError, match="regex_timeout_s"):
        make_verifier("numeric", regex_timeout_s=1.0)  # not an option of another kind
    caplog.clear()
    row = {"prompt": "say a", "label": "a" * 30 + "!"}
    env = marti.make(
        "dataset_task", row=row, num_agents=3, final="majority", verifier="regex", pattern=_SLOW,
        regex_timeout_s=0.2,
    )  # fmt: skip
    try:
        env.reset(seed=0)
        *_, infos = env.step(dict.fromkeys(env.agents, "a" * 30 + "!"))
        assert infos["agent_1"]["task_completion"] == 0.0  # no vote found an answer in time
        assert caplog.text.count("took over 0.2 s") >= 3 and "took over 1.0 s" not in caplog.text
    finally:
        env.close()
