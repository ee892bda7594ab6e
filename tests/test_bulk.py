"""Tests for lib.bulk: tuple inserts store what Core inserts store; deferred indexes come back."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import ColumnElement, Engine, Table, insert, select
from sqlalchemy.exc import IntegrityError

from lib import bulk, importer
from lib.models import EvaluationSnapshot, Judgment
from lib.search import normalize_search_text

JUDGMENTS: Table = Judgment.__table__  # type: ignore[attr-defined]
SNAPSHOTS: Table = EvaluationSnapshot.__table__  # type: ignore[attr-defined]
AT = datetime(2025, 3, 4, 5, 6, 7, 891011, tzinfo=UTC)


def judgment(change_id: str, **fields: object) -> dict[str, object]:
    return {
        "change_id": change_id,
        "product": "Acme",
        "decision": "INCLUDE",
        "user_decision": "EXCLUDE",
        "timestamp": AT,
        "reviewed_at": AT,
        "version": 2,
        "was_corrected": True,
        "confidence": 0.75,
        **fields,
    }


def snapshot(snapshot_id: str) -> dict[str, object]:
    return {
        "id": snapshot_id,
        "created_at": AT,
        "question": "Q?",
        "model_answer": "A.",
        "product": "Acme",
        "bonus_metrics": ["clarity"],
        "user_scores_json": {"clarity": {"score": 4, "reason": "ok ğ"}},
        "judge_scores_json": {"clarity": {"score": 2, "reason": None}},
        "evidence_json": None,
        "source_key": snapshot_id + "-key",
    }


def stored(engine: Engine, table: Table, key: str, value: str) -> dict[str, object]:
    with engine.connect() as conn:
        row = conn.execute(select(table).where(table.c[key] == value)).mappings().one()
    return {k: v for k, v in row.items() if k not in ("id", key)}


def test_tuple_inserts_store_what_a_core_insert_stores(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(insert(JUDGMENTS), [judgment("core")])
        conn.execute(insert(SNAPSHOTS), [snapshot("snap_core")])
        columns = list(judgment("x"))
        bulk.insert_tuples(conn, JUDGMENTS, columns, [tuple(judgment("tuple").values())])
        row = snapshot("snap_tuple") | {"search_text": normalize_search_text("Q?")}  # computed by Core
        bulk.insert_tuples(conn, SNAPSHOTS, list(row), [tuple(row.values())])
    assert stored(engine, JUDGMENTS, "change_id", "tuple") == stored(engine, JUDGMENTS, "change_id", "core")
    by_tuple = stored(engine, SNAPSHOTS, "id", "snap_tuple")
    by_core = stored(engine, SNAPSHOTS, "id", "snap_core")
    assert by_tuple.pop("source_key") == "snap_tuple-key"
    assert by_core.pop("source_key") == "snap_core-key"
    assert by_tuple == by_core
    assert (
        by_tuple["created_at"] == AT and by_tuple["status"] == "active" and by_tuple["max_chat_turns"] == 15
    )


def test_a_left_out_computed_default_is_refused_not_stored_empty(engine: Engine) -> None:
    row = snapshot("snap_x")
    with pytest.raises(ValueError, match="search_text has a computed default"), engine.begin() as conn:
        bulk.insert_tuples(conn, SNAPSHOTS, list(row), [tuple(row.values())])


def test_encoded_json_is_stored_as_given(engine: Engine) -> None:
    row = snapshot("snap_enc") | {"search_text": ""}
    row["user_scores_json"] = json.dumps(row["user_scores_json"])
    with engine.begin() as conn:
        bulk.insert_tuples(conn, SNAPSHOTS, list(row), [tuple(row.values())], encoded={"user_scores_json"})
    assert stored(engine, SNAPSHOTS, "id", "snap_enc")["user_scores_json"] == {
        "clarity": {"score": 4, "reason": "ok ğ"}
    }


def test_a_duplicate_raises_integrity_error_and_the_rollback_keeps_nothing(engine: Engine) -> None:
    rows = [tuple(judgment("dup").values()), tuple(judgment("dup").values())]
    with pytest.raises(IntegrityError), engine.begin() as conn:
        bulk.insert_tuples(conn, JUDGMENTS, list(judgment("x")), rows)
    with engine.connect() as conn:
        assert conn.execute(select(JUDGMENTS.c.id)).first() is None


def index_definitions(engine: Engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        return sorted(bulk.secondary_indexes(conn, JUDGMENTS) + bulk.secondary_indexes(conn, SNAPSHOTS))


def test_deferred_indexes_are_dropped_inside_and_rebuilt_identically(engine: Engine) -> None:
    before = index_definitions(engine)
    assert {"ix_judgment_history", "ix_judgment_snapshot_state"} <= {name for name, _ in before}
    with engine.begin() as conn, bulk.deferred_indexes(conn, [JUDGMENTS, SNAPSHOTS]):
        assert bulk.secondary_indexes(conn, JUDGMENTS) == []
        bulk.insert_tuples(conn, JUDGMENTS, list(judgment("x")), [tuple(judgment("x").values())])
    assert index_definitions(engine) == before


def test_deferred_indexes_come_back_when_the_load_fails(engine: Engine) -> None:
    before = index_definitions(engine)
    rows = [tuple(judgment("dup").values())] * 2
    with pytest.raises(IntegrityError), engine.begin() as conn, bulk.deferred_indexes(conn, [JUDGMENTS]):
        bulk.insert_tuples(conn, JUDGMENTS, list(judgment("x")), rows)
    assert index_definitions(engine) == before


def test_a_large_import_defers_indexes_on_sqlite_only_and_leaves_them_in_place(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL a DROP INDEX holds an ACCESS EXCLUSIVE lock on the table until the import
    commits, blocking every page that reads it: the importer keeps the indexes there."""
    monkeypatch.setattr(bulk, "DEFER_MIN_ROWS", 1)
    dropped: list[str] = []
    real = bulk.secondary_indexes

    def spy(conn, table):  # type: ignore[no-untyped-def]
        found = real(conn, table)
        dropped.extend(name for name, _ in found)
        return found

    monkeypatch.setattr(bulk, "secondary_indexes", spy)
    before = index_definitions(engine)
    dropped.clear()
    lines = [
        {"question": f"Q{i}?", "model_answer": "A.", "product": "Acme", "user_scores": {"clarity": 3},
         "judge_scores": {"clarity": 4, "safety": 5}}
        for i in range(3)
    ]  # fmt: skip
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    report = importer.import_path(engine=engine, path=path, kind=None, reviewer="rita")
    assert (report.inserted, report.judgments) == (3, 6)
    if engine.dialect.name == "postgresql":
        assert dropped == []
    else:
        assert "ix_judgment_history" in dropped
    assert index_definitions(engine) == before


def test_held_values_finds_the_stored_values_across_slices(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(insert(JUDGMENTS), [judgment(c) for c in ("a", "it's", "c", "d")])
        wanted = ["a", "x", "it's", "c", "y", "d", "z"]
        assert bulk.held_values(conn, JUDGMENTS.c.change_id, wanted, slice_size=2) == {"a", "it's", "c", "d"}
        assert bulk.held_values(conn, JUDGMENTS.c.change_id, []) == set()


def test_the_import_spool_keeps_one_chunk_in_memory_and_spills_more_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(importer, "CHUNK_ROWS", 3)
    small, large = importer._Spool(), importer._Spool()
    for i in range(2):
        small.add(i)
    for i in range(7):
        large.add(i)
    assert list(small.chunks()) == [[0, 1]] and small._file is None  # no temporary file made
    assert list(large.chunks()) == [[0, 1, 2], [3, 4, 5], [6]]
    small.close()
    large.close()
    in_memory = importer._Spool(chunk_rows=5)  # an input held whole anyway (import_source_evaluations)
    for i in range(7):
        in_memory.add(i)
    assert list(in_memory.chunks()) == [[0, 1, 2, 3, 4], [5, 6]]
    in_memory.close()


class _FakeCollector:
    """gc's freeze and threshold API as `bulk.frozen_heap` uses it, recording the calls."""

    def __init__(self) -> None:
        self.frozen = 0
        self.calls: list[str] = []
        self.threshold = (700, 10, 10)
        self.callbacks: list[object] = []  # a hold's time limit (`bulk._end_a_long_hold`) while it holds

    def freeze(self) -> None:
        self.calls.append("freeze")
        self.frozen += 1

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")
        self.frozen = 0

    def get_threshold(self) -> tuple[int, int, int]:
        return self.threshold

    def set_threshold(self, *threshold: int) -> None:
        self.calls.append(f"threshold {threshold[2]}")
        self.threshold = threshold  # type: ignore[assignment]


def test_frozen_heap_freezes_at_each_entry_and_unfreezes_once_the_last_load_leaves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    collector = _FakeCollector()
    monkeypatch.setattr(bulk, "gc", collector)
    monkeypatch.setattr(bulk, "HEAP_FROZEN_ELSEWHERE", False)  # without the server's start-up freeze
    with bulk.frozen_heap():
        with bulk.frozen_heap():  # nested (the planned records): what was built since is frozen too
            assert collector.calls == ["freeze", "freeze"]
        assert collector.calls == ["freeze", "freeze"]  # the outer load still runs
        with pytest.raises(RuntimeError), bulk.frozen_heap():
            raise RuntimeError("a failed load leaves like any other")
    assert collector.calls == ["freeze", "freeze", "freeze", "unfreeze"]
    assert collector.frozen == 0


def test_frozen_heap_leaves_a_heap_someone_else_keeps_frozen_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Frozen by its owner (the app's server, the test suite): never frozen or unfrozen here; the
    load holds off full collections instead, once for nested blocks, and puts the threshold back
    when it leaves, after a failure too."""
    collector = _FakeCollector()
    monkeypatch.setattr(bulk, "gc", collector)
    monkeypatch.setattr(bulk, "HEAP_FROZEN_ELSEWHERE", True)  # the server's own freeze (or conftest's)
    with bulk.frozen_heap(), bulk.frozen_heap():
        assert collector.threshold == (700, 10, bulk.HELD_OFF_THRESHOLD)
    assert collector.calls == [f"threshold {bulk.HELD_OFF_THRESHOLD}", "threshold 10"]
    assert collector.threshold == (700, 10, 10)
    with pytest.raises(RuntimeError), bulk.frozen_heap():
        raise RuntimeError("a failed load leaves like any other")
    assert collector.threshold == (700, 10, 10) and "freeze" not in collector.calls
    assert collector.callbacks == []


def test_frozen_heap_never_undoes_a_freeze_made_during_a_load(monkeypatch: pytest.MonkeyPatch) -> None:
    collector = _FakeCollector()
    monkeypatch.setattr(bulk, "gc", collector)
    monkeypatch.setattr(bulk, "HEAP_FROZEN_ELSEWHERE", False)  # without the server's start-up freeze
    with bulk.frozen_heap():
        collector.freeze()  # someone else's, kept (as conftest does), while the load runs
        monkeypatch.setattr(bulk, "HEAP_FROZEN_ELSEWHERE", True)
    assert collector.calls == ["freeze", "freeze"]
    assert collector.frozen == 2


def _run_alone(script: str) -> None:
    """`script` in a process of its own (this one's heap is frozen by conftest); it prints ok."""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def _run_beside_a_load(setup: str, script: str) -> None:
    """`setup`, then a first load on a thread of its own, inside `frozen_heap` until the script sets
    `leave` (then it sets `left`), then `script`, whose own load overlaps it (`_run_alone`)."""
    _run_alone(setup + _FIRST_LOAD_INSIDE + script)


_FIRST_LOAD_INSIDE = """
entered, leave, left = threading.Event(), threading.Event(), threading.Event()

def first_load():
    with bulk.frozen_heap():
        entered.set()
        leave.wait()
    left.set()

threading.Thread(target=first_load).start()
entered.wait()
"""


def test_overlapping_loads_keep_no_cyclic_garbage_frozen() -> None:
    """Loads on two threads, each entered before the other left (an OTLP receiver under load): the
    heap was frozen at every entry and unfrozen only once no load was inside, so garbage cycles
    made meanwhile waited for as long as the overlap lasted. Now only a load alone freezes, and the
    heap is unfrozen when that load leaves, with the other still inside."""
    setup = """
import gc, threading, weakref
from lib import bulk

class Node:
    pass

gc.collect()
"""
    _run_beside_a_load(
        setup,
        """
assert gc.get_freeze_count() > 0, "a load alone freezes"
request = Node()
request.self = request  # a cycle made during the first load, garbage once this load is done with it
garbage = weakref.ref(request)
with bulk.frozen_heap():  # the second load, entered while the first is inside: no freeze of its own
    leave.set()
    left.wait()
    assert gc.get_freeze_count() == 0, "unfrozen as the load that froze left"
    del request
    gc.collect()
    assert garbage() is None, "collected while a load is still inside"
assert gc.get_freeze_count() == 0
print("ok")
""",
    )


def test_loads_in_a_heap_frozen_elsewhere_hold_off_full_collections_only_while_alone_inside() -> None:
    """The app's server keeps its start-up heap frozen (`HEAP_FROZEN_ELSEWHERE`): a load alone
    holds full collections off, the thresholds come back when it leaves even with another load
    still inside (so steady overlapping requests cannot hold them off for good), and that other
    load holds nothing of its own."""
    setup = """
import gc, threading
from lib import bulk

gc.collect()
gc.freeze()
bulk.HEAP_FROZEN_ELSEWHERE = True
before = gc.get_threshold()
"""
    _run_beside_a_load(
        setup,
        """
assert gc.get_threshold() == (*before[:2], bulk.HELD_OFF_THRESHOLD), gc.get_threshold()
with bulk.frozen_heap():  # the second load, entered while the first is inside
    leave.set()
    left.wait()
    assert gc.get_threshold() == before, "put back as the load that held it left"
assert gc.get_threshold() == before
assert gc.get_freeze_count() > 0, "the owner's freeze is kept"
print("ok")
""",
    )


def test_a_load_holds_full_collections_off_for_at_most_hold_seconds() -> None:
    """A long load (a big import, loads back to back) gets its full collections back after
    HOLD_SECONDS, at the next young collection, and leaves no callback behind (review6 R3)."""
    _run_alone("""
import gc
from lib import bulk

gc.collect()
gc.freeze()
bulk.HEAP_FROZEN_ELSEWHERE = True
bulk.HOLD_SECONDS = 0.2
before = gc.get_threshold()
with bulk.frozen_heap():
    assert gc.get_threshold() == (*before[:2], bulk.HELD_OFF_THRESHOLD)
    gc.collect(0)
    assert gc.get_threshold()[2] == bulk.HELD_OFF_THRESHOLD, "held within HOLD_SECONDS"
    bulk._held_since -= 1.0  # as if the load had run a second
    gc.collect(0)
    assert gc.get_threshold() == before, "given back past HOLD_SECONDS"
assert gc.get_threshold() == before
assert not [c for c in gc.callbacks if getattr(c, "__module__", "") == "lib.bulk"]
print("ok")
""")


def test_frozen_heap_still_collects_the_loads_garbage_and_the_rest_after_it() -> None:
    """In a process of its own (this one's heap is frozen by conftest): cyclic garbage made inside
    the block is collected inside it; garbage among the frozen objects once the block is left."""
    script = """
import gc, weakref
from lib import bulk

class Node:
    pass

def cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)

gc.collect()
assert gc.get_freeze_count() == 0
before = Node()
before.self = before
old = weakref.ref(before)
with bulk.frozen_heap():
    assert gc.get_freeze_count() > 0
    del before
    new = cycle()
    gc.collect()
    assert new() is None, "the load's own cyclic garbage is collected inside the block"
    assert old() is not None, "frozen: not walked until the block is left"
assert gc.get_freeze_count() == 0
gc.collect()
assert old() is None, "unfrozen, then collected"
print("ok")
"""
    _run_alone(script)


def test_among_rows_finds_exactly_the_rows_a_python_filter_finds(engine: Engine) -> None:
    """`(columns…) IN rows` as one bound value each way: text with quotes, non-ASCII letters, separators,
    JSON or digits, and integers, match the stored values exactly; no rows match nothing."""
    products = ["O'Brien", 'say "hi"', "İstanbul ÇAĞRI", "a|b", "[1, 2]", "3", "plain"]
    rows = [
        judgment(f"c{n}", product=product, decision=decision, version=version)
        for n, (product, decision, version) in enumerate(
            (p, d, v) for p in products for d in ("INCLUDE", "3") for v in (2, 3)
        )
    ]
    with engine.begin() as conn:
        bulk.insert_tuples(conn, JUDGMENTS, list(rows[0]), [tuple(r.values()) for r in rows])
    wanted = [("O'Brien", "3", 2), ("İstanbul ÇAĞRI", "INCLUDE", 3), ("a|b", "3", 3), ("3", "INCLUDE", 2),
              ("[1, 2]", "3", 2), ("absent", "INCLUDE", 2), ("plain", "3", 4)]  # fmt: skip
    columns = (JUDGMENTS.c.product, JUDGMENTS.c.decision, JUDGMENTS.c.version)
    with engine.connect() as conn:
        for keys in (wanted, wanted[:1], []):
            found = conn.execute(
                select(JUDGMENTS.c.change_id).where(bulk.among_rows(conn, columns, keys))
            ).scalars()
            expected = {r["change_id"] for r in rows if (r["product"], r["decision"], r["version"]) in keys}
            assert set(found) == expected
    assert len({r["change_id"] for r in rows if (r["product"], r["decision"], r["version"]) in wanted}) == 5


def test_a_key_longer_than_its_column_matches_nothing(engine: Engine) -> None:
    """A key one character longer than `product` (200) must not match the stored value it begins
    with: PostgreSQL's `::VARCHAR(200)[]` cast truncated it, and both helpers matched (review8 F2)."""
    stored = "x" * 200
    rows = [judgment("c1", product=stored, decision="3", version=2)]
    with engine.begin() as conn:
        bulk.insert_tuples(conn, JUDGMENTS, list(rows[0]), [tuple(r.values()) for r in rows])
    product, version = JUDGMENTS.c.product, JUDGMENTS.c.version
    with engine.connect() as conn:

        def found(where: ColumnElement[bool]) -> list[str]:
            return list(conn.execute(select(JUDGMENTS.c.change_id).where(where)).scalars())

        assert found(bulk.among(conn, product, [stored])) == ["c1"]
        assert found(bulk.among_rows(conn, (product, version), [(stored, 2)])) == ["c1"]
        assert found(bulk.among(conn, product, [stored + "x"])) == []
        assert found(bulk.among_rows(conn, (product, version), [(stored + "x", 2)])) == []
