"""Delta results, pure parts: text edits and info deltas rebuild exactly what the env produced (property tests),
the session core numbers outcomes and hands the right base, and the client's :class:`DeltaCache` decodes
delta responses exactly, keeps at most ``max_sessions`` and refuses deltas that do not fit."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marti.api.env.v1 import env_pb2 as pb
from marti.clients.env import DELTA_CACHE_SESSIONS, DeltaCache, HeldResult
from marti.codec import env as c
from marti.errors import InternalError, InvalidArgumentError
from services.env_server import convert
from services.env_server.core.session_state import AgentOutcome, Outcome

TEXT = st.text(alphabet=st.sampled_from("ab\nçé😀"), max_size=300)


def _edit(base: str, new: str) -> str:
    edit = c.text_edit(base, new)
    if edit is None:
        return new
    prefix, suffix, text = edit
    assert prefix + suffix <= min(len(base), len(new))
    assert prefix + suffix >= c.MIN_EDIT_KEEP
    return c.apply_text_edit(base, pb.TextEdit(prefix=prefix, suffix=suffix, text=text))


@settings(max_examples=400, deadline=None)
@given(base=TEXT, new=TEXT)
def test_text_edit_rebuilds_any_text(base: str, new: str) -> None:
    assert _edit(base, new) == new


@settings(max_examples=400, deadline=None)
@given(
    base=TEXT,
    cut=st.tuples(st.integers(0, 300), st.integers(0, 40)),
    insert=st.text(alphabet=st.sampled_from("abc😀"), max_size=50),
)
def test_text_edit_of_a_local_change_keeps_most_of_the_text(base: str, cut, insert: str) -> None:
    i = min(cut[0], len(base))
    new = base[:i] + insert + base[i + cut[1] :]
    edit = c.text_edit(base, new)
    assert _edit(base, new) == new
    if edit is not None:  # within EDIT_GRAIN of the longest common prefix
        longest = next(
            (k for k in range(min(len(base), len(new))) if base[k] != new[k]), min(len(base), len(new))
        )
        assert longest - edit[0] <= c.EDIT_GRAIN


def test_text_edit_limits() -> None:
    assert c.text_edit("x" * (c.MIN_EDIT_KEEP - 1), "x" * (c.MIN_EDIT_KEEP - 1)) is None  # too short to pay
    assert c.text_edit("x" * c.MIN_EDIT_KEEP, "x" * c.MIN_EDIT_KEEP) == (c.MIN_EDIT_KEEP, 0, "")
    assert c.text_edit("a" * 100, "b" * 100) is None  # nothing in common
    grown = "p" * 500 + "q" * 500
    prefix, suffix, text = c.text_edit(grown[:700], grown)
    assert prefix >= 700 - c.EDIT_GRAIN and grown[:prefix] + text == grown and suffix == 0


def test_apply_text_edit_refuses_an_edit_longer_than_its_base() -> None:
    with pytest.raises(InvalidArgumentError, match="prefix=3 and suffix=2 .* of 4"):
        c.apply_text_edit("abcd", pb.TextEdit(prefix=3, suffix=2, text=""))


SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=3)
)
VALUE = st.one_of(
    SCALAR, st.lists(SCALAR, max_size=2), st.dictionaries(st.text(max_size=2), SCALAR, max_size=2)
)
INFO = st.dictionaries(st.sampled_from("abcdef"), VALUE, max_size=6)


@settings(max_examples=400, deadline=None)
@given(base=INFO, new=INFO)
def test_info_delta_merges_back_to_the_new_info_with_its_key_order(base: dict, new: dict) -> None:
    d = c.info_delta(base, new)
    if list(base) != list(new):
        assert d is None
        return
    merged = dict(base)
    merged.update(d)
    assert list(merged) == list(new)
    for k, v in new.items():
        assert type(merged[k]) is type(v)
        assert merged[k] == v or (isinstance(v, float) and math.isnan(v))
        if isinstance(v, float) and not math.isnan(v):
            assert math.copysign(1.0, merged[k]) == math.copysign(1.0, v)  # -0.0 stays -0.0


def test_info_delta_sends_a_float_whose_sign_of_zero_changed() -> None:
    """Review finding: 0.0 -> -0.0 compared equal and was left out, so the client rebuilt 0.0."""
    assert c.info_delta({"x": 0.0, "y": 1.0}, {"x": -0.0, "y": 1.0}) == {"x": -0.0}
    assert c.info_delta({"x": -0.0}, {"x": -0.0}) == {}


def test_info_delta_sends_changed_types_nans_and_containers() -> None:
    base = {"n": 1, "b": True, "f": float("nan"), "s": "x", "l": [1], "same": 2.5}
    new = {"n": 1.0, "b": 1, "f": float("nan"), "s": "x", "l": [1], "same": 2.5}
    assert list(c.info_delta(base, new)) == ["n", "b", "f", "l"]
    assert c.info_delta({"a": 1, "b": 2}, {"b": 2, "a": 1}) is None  # same keys, other order: in full


def _outcome(rid: int, obs: dict, infos: dict, agents=("a1", "a2")) -> Outcome:
    results = tuple(AgentOutcome(a, obs[a], 0.5, False, False, infos[a]) for a in obs)
    return Outcome(results, tuple(agents), (agents[0],), rid)


BASE = _outcome(
    3,
    {"a1": "problem text " * 10 + "turn 1", "a2": "other text " * 10 + "turn 1"},
    {"a1": {"turn": 1, "role": "leader", "l": [1]}, "a2": {"turn": 1, "role": "executor", "l": [1]}},
)
NEW = _outcome(
    4,
    {"a1": "problem text " * 10 + "turn 2, more", "a2": "short"},
    {"a1": {"turn": 2, "role": "leader", "l": [1]}, "a2": {"turn": 2, "role": "executor", "l": [1]}},
)


def _held(o: Outcome) -> HeldResult:
    return HeldResult(
        o.result_id, {r.agent: r.observation for r in o.results}, {r.agent: dict(r.info) for r in o.results}
    )


def test_delta_response_decodes_to_the_full_one() -> None:
    full = convert.step_to_proto(NEW)
    delta = pb.StepResponse.FromString(convert.step_to_proto(NEW, None, BASE).SerializeToString())
    assert delta.delta_base == 3 and delta.result_id == 4 == full.result_id
    assert delta.results[0].HasField("observation_edit") and not delta.results[1].HasField("observation_edit")
    assert delta.results[0].info_delta and '"role"' not in delta.infos_json and '"l":[1]' in delta.infos_json
    assert len(delta.SerializeToString()) < len(full.SerializeToString())
    cache = DeltaCache()
    got = cache.decode("s", delta, _held(BASE))
    want = DeltaCache().decode("s", full, None)
    assert got == want
    assert got.observations == {r.agent: r.observation for r in NEW.results}
    assert [list(i) for i in got.infos.values()] == [list(r.info) for r in NEW.results]
    # the cache keeps its own copies: changing what the caller got does not change the next base
    got.infos["a1"]["turn"] = 99
    got.observations["a1"] = "changed"
    held = cache.get("s")
    assert held.result_id == 4 and held.infos["a1"]["turn"] == 2 and held.observations["a1"].endswith("more")


def test_the_cache_holds_only_what_a_delta_can_need() -> None:
    """Review finding: the cache pinned every observation (an image env: 4096 sessions x its size) although only
    text is ever sent as an edit; non-scalar info values are always sent again, so they are not kept either."""
    import numpy as np

    big = np.zeros(1 << 20, dtype=np.float32)
    held = HeldResult.of(5, {"a1": "text", "a2": big}, {"a1": {"turn": 1, "img": big, "l": [1]}, "a2": {}})
    assert held.observations == {"a1": "text"}
    assert held.infos == {"a1": {"turn": 1, "img": None, "l": None}, "a2": {}}
    assert list(held.infos["a1"]) == ["turn", "img", "l"]  # key order kept for the next delta


def test_a_delta_against_another_base_is_an_internal_error() -> None:
    delta = convert.step_to_proto(NEW, None, BASE)
    with pytest.raises(InternalError, match="against result 3 .* holds none"):
        DeltaCache().decode("s", delta, None)
    with pytest.raises(InternalError, match="against result 3 .* holds 7"):
        DeltaCache().decode("s", delta, HeldResult(7, {}, {}))
    with pytest.raises(InternalError, match="bad edit for agent 'a1'"):
        DeltaCache().decode("s", delta, HeldResult(3, {"a1": "short", "a2": "x"}, _held(BASE).infos))
    with pytest.raises(InternalError, match="info delta for agent 'a1' without a base"):
        DeltaCache().decode("s", delta, HeldResult(3, _held(BASE).observations, {}))


def test_full_results_from_a_server_without_deltas_are_decoded_and_not_kept() -> None:
    old_server = convert.step_to_proto(NEW)
    old_server.result_id = 0
    cache = DeltaCache()
    assert cache.decode("s", old_server, None).observations["a2"] == "short"
    assert cache.get("s") is None and len(cache) == 0


def test_delta_cache_keeps_at_most_max_sessions_and_never_goes_back() -> None:
    assert DeltaCache().max_sessions == DELTA_CACHE_SESSIONS
    with pytest.raises(InvalidArgumentError, match="max_sessions must be >= 1, got 0"):
        DeltaCache(0)
    cache = DeltaCache(max_sessions=2)
    full = convert.step_to_proto(NEW)
    for sid in ("s1", "s2"):
        cache.decode(sid, full, None)
    cache.get("s1")  # s1 used last: s2 goes first
    cache.decode("s3", full, None)
    assert cache.get("s2") is None and cache.get("s1") is not None and len(cache) == 2
    older = convert.step_to_proto(BASE)  # result 3 arriving after result 4: 4 stays the base
    cache.decode("s1", older, None)
    assert cache.get("s1").result_id == 4
    cache.drop("s1")
    assert cache.get("s1") is None


def test_a_forked_child_gets_fresh_cache_locks() -> None:
    import os
    import signal

    from marti.clients.env import delta_cache

    class Channel:  # any weak-referenceable object stands for a channel
        pass

    channel = Channel()
    cache = delta_cache(channel)
    assert delta_cache(channel) is cache
    cache._lock.acquire()  # as if another thread held it at fork time
    try:
        pid = os.fork()
        if pid == 0:  # the child: would block for good on the parent's held lock
            signal.alarm(5)
            code = 0 if cache.get("s") is None and delta_cache(channel) is cache else 1
            os._exit(code)
    finally:
        cache._lock.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
