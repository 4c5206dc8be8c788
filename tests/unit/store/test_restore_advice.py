"""A stored item whose priority the table's config cannot weigh stops the store with advice that opens it, also
when the config did not change (an older version took priority 1e300 under ``priority_exponent`` 1, before
weights over 1e280 were refused): the advice "start with the table's old config" could not help there."""

from __future__ import annotations

import re
import sqlite3

import pytest

from marti.errors import InvalidArgumentError
from marti.types.experience import parse_table_config
from services.experience_store.core.storage import SqliteStorage
from services.experience_store.core.store import ExperienceStore

from .helpers import item

PRIORITIZED = {"name": "p", "sampler": "prioritized", "remover": "prioritized", "priority_exponent": 1.0}


def _old_store_with_a_big_priority(tmp_path) -> int:
    """A data dir as an older version left it: table ``p`` (prioritized, alpha 1) holding one item of priority
    1e300 (written under a uniform config, which takes it, then the stored config set to the prioritized one)."""
    s = ExperienceStore(SqliteStorage(tmp_path), [parse_table_config({"name": "p", "preset": "uniform"})])
    (key,) = s.insert("p", [item(priority=1e300)], 0)
    s.close()
    storage = SqliteStorage(tmp_path)
    storage.save_table("p", parse_table_config(PRIORITIZED).model_dump_json())
    storage.close()
    return key


def _open(tmp_path, **config) -> ExperienceStore:
    """The store on ``tmp_path`` with table ``p`` given as :data:`PRIORITIZED` changed by ``config``."""
    return ExperienceStore(SqliteStorage(tmp_path), [parse_table_config({**PRIORITIZED, **config})])


def _refusal(tmp_path, tables) -> str:
    """The message of the InvalidArgumentError a store on ``tmp_path`` given ``tables`` stops with."""
    storage = SqliteStorage(tmp_path)
    try:
        with pytest.raises(InvalidArgumentError) as err:
            ExperienceStore(storage, tables)
    finally:
        storage.close()
    return str(err.value)


def test_the_advice_for_an_unchanged_config_names_an_exponent_that_opens_the_table(tmp_path):
    key = _old_store_with_a_big_priority(tmp_path)
    said = _refusal(tmp_path, [])  # the stored config, unchanged
    assert f"table 'p': the priority of its item {key} is 1e+300" in said
    assert "priority_exponent is at most 0.9333 or whose sampler and remover are not prioritized" in said
    assert "at most 0.9333" in _refusal(
        tmp_path, [parse_table_config({**PRIORITIZED, "priority_exponent": 0.9334})]
    )
    s = _open(tmp_path, priority_exponent=0.9333)  # as advised: it opens; lower the priority, restart
    s.update_priorities("p", {key: 5.0})
    s.close()
    s = _open(tmp_path)
    assert [r.priority for r in s.table("p").records()] == [5.0]
    s.close()


def test_the_advice_with_samplers_that_are_not_prioritized_opens_the_table_too(tmp_path):
    _old_store_with_a_big_priority(tmp_path)
    s = _open(tmp_path, sampler="uniform", remover="fifo")  # as advised: it opens; delete the item, restart
    assert s.delete("p", ["ep1"]) == 1
    s.close()
    s = _open(tmp_path)
    assert len(s.table("p")) == 0
    s.close()


def test_a_priority_no_config_takes_is_named_a_damaged_database(tmp_path):
    key = _old_store_with_a_big_priority(tmp_path)
    with sqlite3.connect(tmp_path / "store.sqlite") as db:
        db.execute("UPDATE items SET priority = ? WHERE key = ?", (float("inf"), key))
    db.close()
    uniform = parse_table_config({**PRIORITIZED, "sampler": "uniform", "remover": "fifo"})
    assert re.search(r"no config opens it: .* \(the database is damaged\)", _refusal(tmp_path, [uniform]))
