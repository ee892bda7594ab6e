"""Text search (lib.search) on both backends: one normalisation rule, every write path, the index."""

from __future__ import annotations

import math
import random
import shutil
import string
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Engine, delete, event, insert, text, update
from sqlmodel import Session, col, select

from lib import counters, search
from lib.db import alembic_config, create_db_engine
from lib.importer import import_evaluations, import_notes
from lib.inspector import (
    EvaluationFilters,
    archive_evaluation,
    count_cap,
    count_evaluations,
    fetch_page,
    filter_conditions,
    list_evaluations,
    page_key,
    restore_evaluation,
)
from lib.models import EvaluationSnapshot, Judgment, MetricScore
from lib.notes import add_note, search_notes
from lib.search import (
    MIN_TRIGRAM_CHARS,
    SEARCHABLE,
    like_pattern,
    normalize_search_text,
    search_table_name,
    sqlite_trigram_available,
    text_match,
)
from tests.conftest import sqlite_only

QUESTIONS = {
    "s_ist": "İstanbul'da en iyi müze hangisi?",
    "s_ist_upper": "ISTANBUL TRAFİĞİ NASIL?",
    "s_odul": "Nobel Ödülü kimlere verildi?",
    "s_odul_lower": "ödülü kim aldı?",
    "s_strasse": "Wo ist die Hauptstraße?",
    "s_pct": "What does 100% mean for a_b and c\\d?",
    "s_plain": "How tall is the Eiffel Tower?",
}


def record(sid: str, question: str) -> dict[str, Any]:
    return {
        "id": sid,
        "question": question,
        "model_answer": "an answer",
        "product": "acme",
        "language": "tr",
        "created_at": "2025-01-10T12:00:00Z",
        "user_scores": {"clarity": 4},
        "judge_scores": {"clarity": 3},
    }


@pytest.fixture
def seeded(engine: Engine) -> Iterator[Session]:
    with Session(engine, expire_on_commit=False) as session:
        import_evaluations(
            session=session, records=[record(sid, q) for sid, q in QUESTIONS.items()], reviewer="tester"
        )
        session.commit()
        yield session


def found(session: Session, query: str) -> set[str]:
    filters = EvaluationFilters(text=query)
    rows = list_evaluations(session=session, filters=filters, limit=100).rows
    assert count_evaluations(session=session, filters=filters) == len(rows)
    return {r.id for r in rows}


# --------------------------------------------------------------------------------------------
# The rule


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("İstanbul", "istanbul"),
        ("ISTANBUL", "istanbul"),
        ("ıstanbul", "istanbul"),
        ("I\u0307stanbul", "istanbul"),  # I + combining dot above, decomposed
        ("i\u0307stanbul", "istanbul"),  # what "İstanbul".lower() gives
        ("Ödülü", "ödülü"),
        ("O\u0308dülü", "ödülü"),  # decomposed Ö composes under NFKC
        ("Straße", "strasse"),
        ("ﬁle", "file"),  # ligature, NFKC
        ("ＡＢＣ", "abc"),  # full width, NFKC
        ("100% a_b", "100% a_b"),
        ("", ""),
    ],
)
def test_normalisation_folds_case_turkish_i_and_compatibility_forms(raw: str, normalised: str) -> None:
    assert normalize_search_text(raw) == normalised


def test_normalisation_keeps_accents_apart() -> None:
    assert normalize_search_text("ödül") != normalize_search_text("odul")


def test_like_pattern_escapes_its_metacharacters() -> None:
    assert like_pattern("1%_\\x") == "%1\\%\\_\\\\x%"


def test_text_match_refuses_a_table_without_search_text() -> None:
    with pytest.raises(ValueError, match="has no search text"):
        text_match(EvaluationSnapshot.__table__.metadata.tables["judgments"], "x")


# --------------------------------------------------------------------------------------------
# The Evaluations text filter on both backends


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("istanbul", {"s_ist", "s_ist_upper"}),
        ("İstanbul", {"s_ist", "s_ist_upper"}),
        ("ISTANBUL", {"s_ist", "s_ist_upper"}),
        ("ıstanbul", {"s_ist", "s_ist_upper"}),
        ("trafiği", {"s_ist_upper"}),
        ("ödülü", {"s_odul", "s_odul_lower"}),
        ("Ödülü", {"s_odul", "s_odul_lower"}),
        ("ÖDÜLÜ", {"s_odul", "s_odul_lower"}),
        ("odulu", set()),
        ("HAUPTSTRASSE", {"s_strasse"}),
        ("hauptstraße", {"s_strasse"}),
        ("eiffel tower", {"s_plain"}),
        ("tower?", {"s_plain"}),
        ("nowhere", set()),
    ],
)
def test_text_filter_is_unicode_aware(seeded: Session, query: str, expected: set[str]) -> None:
    assert found(seeded, query) == expected


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("%", {"s_pct"}),
        ("_", {"s_pct"}),
        ("\\", {"s_pct"}),
        ("100%", {"s_pct"}),
        ("0% mean", {"s_pct"}),
        ("a_b", {"s_pct"}),
        ("c\\d", {"s_pct"}),
        ("a%b", set()),  # as a wildcard it would match "a_b"
        ("100_", set()),  # as a wildcard it would match "100%"
        ("c_d", set()),
        ('"', set()),
        ('a" OR "b', set()),  # FTS5 syntax is text here, never an operator
    ],
)
def test_text_filter_takes_metacharacters_literally(seeded: Session, query: str, expected: set[str]) -> None:
    assert found(seeded, query) == expected


@pytest.mark.parametrize("query", ["is", "İs", "ö", "ı", "%"])
def test_short_queries_fall_back_to_like_on_the_normalised_text(seeded: Session, query: str) -> None:
    needle = normalize_search_text(query)
    assert len(needle) < MIN_TRIGRAM_CHARS
    expected = {sid for sid, q in QUESTIONS.items() if needle in normalize_search_text(q)}
    assert expected
    assert found(seeded, query) == expected


# --------------------------------------------------------------------------------------------
# Every write path keeps the search text (and the SQLite index) current


def test_orm_insert_and_question_update_are_searchable(engine: Engine) -> None:
    with Session(engine) as session:
        session.add(EvaluationSnapshot(id="s_orm", question="İzmir'de hava", model_answer="a", product="p"))
        session.commit()
    with Session(engine) as session:
        assert found(session, "izmir") == {"s_orm"}
        snapshot = session.get(EvaluationSnapshot, "s_orm")
        assert snapshot is not None
        snapshot.question = "Ankara'da hava"
        session.commit()
    with Session(engine) as session:
        assert found(session, "izmir") == set()
        assert found(session, "ANKARA") == {"s_orm"}


def test_core_insert_without_search_text_gets_it_from_the_question(engine: Engine) -> None:
    # bench/gen.py and other bulk writers insert plain dicts: the column default fills search_text.
    rows = [
        {
            "id": f"s_core{i}",
            "question": q,
            "model_answer": "a",
            "product": "p",
            "source_key": f"k{i}",
            "bonus_metrics": [],
            "user_scores_json": {},
            "judge_scores_json": {},
        }
        for i, q in enumerate(["Şişli'deki İŞ", "plain text"])
    ]
    with Session(engine) as session:
        session.execute(insert(EvaluationSnapshot), rows)
        counters.recount(session=session)  # as bulk writers do: the list's counts include them
        session.commit()
        assert found(session, "şişli'deki iş") == {"s_core0"}
        stored = session.exec(
            select(EvaluationSnapshot.search_text).where(col(EvaluationSnapshot.id) == "s_core0")
        )
        assert stored.one() == "şişli'deki iş"


def test_deleted_rows_leave_the_index(seeded: Session) -> None:
    for child in (Judgment, MetricScore):
        seeded.execute(delete(child).where(col(child.snapshot_id) == "s_odul"))
    seeded.execute(delete(EvaluationSnapshot).where(col(EvaluationSnapshot.id) == "s_odul"))
    seeded.commit()
    assert found(seeded, "ödülü") == {"s_odul_lower"}


def test_archived_rows_are_found_only_in_the_archived_list(seeded: Session) -> None:
    seeded.execute(
        update(EvaluationSnapshot)
        .where(col(EvaluationSnapshot.id) == "s_ist")
        .values(deleted_at=text("CURRENT_TIMESTAMP"))
    )
    counters.recount(session=seeded)  # a raw write: the list's counts follow through a recount
    seeded.commit()
    assert found(seeded, "istanbul") == {"s_ist_upper"}
    archived = list_evaluations(
        session=seeded, filters=EvaluationFilters(text="istanbul", archived=True)
    ).rows
    assert [r.id for r in archived] == ["s_ist"]


def test_stored_search_text_is_the_normalised_question(seeded: Session) -> None:
    rows = seeded.exec(select(EvaluationSnapshot.id, EvaluationSnapshot.search_text)).all()
    assert {sid: t for sid, t in rows} == {sid: normalize_search_text(q) for sid, q in QUESTIONS.items()}


# --------------------------------------------------------------------------------------------
# Notes share the rule


def test_note_search_is_unicode_aware(session: Session) -> None:
    add_note(
        session=session,
        language="tr",
        note_type="TIP",
        content="İstanbul soruları için kaynak ver",
        created_by="t",
    )
    import_notes(
        session=session,
        records=[
            {
                "timestamp": "2025-01-01T00:00:00Z",
                "language": "tr",
                "note_type": "PATTERN",
                "content": "ÖDÜLÜ sorularında tarih kontrol et",
                "session_id": "s1",
            }
        ],
        reviewer="t",
    )
    session.commit()
    assert [n.content for n in search_notes(session, "istanbul")] == ["İstanbul soruları için kaynak ver"]
    assert [n.content for n in search_notes(session, "ödülü")] == ["ÖDÜLÜ sorularında tarih kontrol et"]
    assert [n.content for n in search_notes(session, "ıi")] == []


# --------------------------------------------------------------------------------------------
# The index is used, and survives in the head schema


def _plan(session: Session, query: str) -> str:
    stmt = select(EvaluationSnapshot.id).where(text_match(EvaluationSnapshot.__table__, query))
    bind = session.get_bind()
    compiled = stmt.compile(bind, compile_kwargs={"literal_binds": True})
    prefix = "EXPLAIN QUERY PLAN " if bind.dialect.name == "sqlite" else "EXPLAIN "
    return "\n".join(str(r[-1]) for r in session.connection().exec_driver_sql(prefix + str(compiled)).all())


def test_search_reads_the_trigram_index(seeded: Session) -> None:
    if seeded.get_bind().dialect.name == "sqlite":
        if not sqlite_trigram_available():
            pytest.skip("this Python's SQLite has no FTS5 trigram tokenizer: the LIKE fallback is the design")
        plan = _plan(seeded, "istanbul")
        # A bare condition, not "(rowid IN (...)) = 1", which no index can serve.
        assert "SEARCH evaluation_snapshots USING INTEGER PRIMARY KEY (rowid=?)" in plan
        assert "VIRTUAL TABLE INDEX" in plan and search_table_name("evaluation_snapshots") in plan
        assert "VIRTUAL TABLE" not in _plan(seeded, "is")  # under three characters: LIKE
    else:
        seeded.connection().exec_driver_sql("SET LOCAL enable_seqscan = off")
        # On 7 rows the planner would rather walk a btree index and test each row.
        seeded.connection().exec_driver_sql("SET LOCAL enable_indexscan = off")
        assert "ix_evaluation_snapshots_search_trgm" in _plan(seeded, "istanbul")


def test_head_schema_keeps_the_search_index(engine: Engine) -> None:
    # A later SQLite migration that rebuilds a searchable table drops its triggers: this catches it.
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            if not sqlite_trigram_available():
                pytest.skip("no FTS5 trigram tokenizer in this Python's SQLite")
            names = set(conn.exec_driver_sql("SELECT name FROM sqlite_master").scalars())
            for table in SEARCHABLE:
                fts = search_table_name(table)
                assert {fts, f"{fts}_ai", f"{fts}_ad", f"{fts}_au"} <= names
        else:
            names = set(conn.exec_driver_sql("SELECT indexname FROM pg_indexes").scalars())
            assert {f"ix_{table}_search_trgm" for table in SEARCHABLE} <= names


def _long_question(seed: int) -> str:
    """Over 8 KB of random words: text that does not compress below a btree entry's 2,704 bytes."""
    rng = random.Random(seed)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(3_000)]
    return " ".join(rng.choice(words) for _ in range(1_600)) + " needle phrase"


def _migrate(engine: Engine, action: Any, target: str) -> None:
    with engine.connect() as conn:
        cfg = alembic_config(engine)
        cfg.attributes["connection"] = conn
        action(cfg, target)
        conn.commit()


def test_a_long_question_is_imported_and_found(engine: Engine) -> None:
    question = _long_question(1)
    assert len(question.encode()) > 8_000
    with Session(engine) as session:
        import_evaluations(session=session, records=[record("s_long", question)], reviewer="tester")
        session.commit()
        assert found(session, "needle phrase") == {"s_long"}


def test_migrating_to_head_over_a_long_question_keeps_it_searchable(engine: Engine) -> None:
    # Written at head (today's code writes today's tables), then taken back to before 0014 and up again.
    with Session(engine) as session:
        import_evaluations(session=session, records=[record("s_long", _long_question(2))], reviewer="tester")
        session.commit()
    _migrate(engine, command.downgrade, "0013")
    _migrate(engine, command.upgrade, "head")
    with Session(engine) as session:
        assert found(session, "needle phrase") == {"s_long"}


def test_migration_backfills_existing_rows(tmp_path: Path, _sqlite_migrated: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = create_db_engine(url)
    cfg = alembic_config(engine)
    command.upgrade(cfg, "0007")
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO evaluation_snapshots (id, created_at, question, model_answer, product, language, "
            "bonus_metrics, user_scores_json, judge_scores_json, evidence_count, evidence_highlighted, "
            "evidence_unlocated, evidence_unverified, chat_turn_count, max_chat_turns, status) VALUES "
            "('s_old', '2025-01-01 00:00:00', 'İSTANBUL ödülü', 'a', 'p', 'tr', '[]', '{}', '{}', "
            "0, 0, 0, 0, 0, 15, 'active')"
        )
    command.upgrade(cfg, "head")
    with Session(engine) as session:
        assert found(session, "istanbul ödülü") == {"s_old"}
        assert found(session, "ıs") == {"s_old"}
    engine.dispose()
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_a_large_import_gives_sqlite_the_statistics_to_search_by_the_index(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not sqlite_trigram_available():
        pytest.skip("no FTS5 trigram tokenizer in this Python's SQLite")
    from lib import importer

    def plan(session: Session) -> str:
        stmt = select(EvaluationSnapshot.id).where(*filter_conditions(EvaluationFilters(text="istanbul")))
        sql = str(stmt.compile(sqlite_engine, compile_kwargs={"literal_binds": True}))
        return " ".join(str(r[-1]) for r in session.connection().exec_driver_sql("EXPLAIN QUERY PLAN " + sql))

    monkeypatch.setattr(importer, "STATISTICS_AFTER_ROWS", 100)
    records = [
        record(f"s_{i}", f"question {i} about İstanbul" if i < 3 else f"question {i}") for i in range(200)
    ]
    with Session(sqlite_engine) as session:
        # Without statistics SQLite scans the live-list index and probes the search index per row.
        assert "USING INTEGER PRIMARY KEY" not in plan(session)
        import_evaluations(session=session, records=records, reviewer="tester")
        session.commit()
        assert "SEARCH evaluation_snapshots USING INTEGER PRIMARY KEY (rowid=?)" in plan(session)
        assert found(session, "ISTANBUL") == {"s_0", "s_1", "s_2"}


# --------------------------------------------------------------------------------------------
# Rare and common queries (issue 19): every plan lists the same rows, counts stop at the cap


def _many(engine: Engine) -> Session:
    """12 evaluations, 8 of them about "password" (common once RARE_MATCHES is lowered), spread in
    time and gap so order and keyset paging matter; two "password" ones archived."""
    records = []
    for i in range(12):
        rec = record(f"s_{i:02d}", f"Reset my PASSWORD please, case {i}" if i % 3 else f"Other topic {i}")
        rec["created_at"] = f"2025-01-{10 + i % 5:02d}T12:00:00Z"  # ties on created_at: id breaks them
        rec["user_scores"] = {"clarity": 1 + i % 5} if i % 4 else {}  # some without a gap
        records.append(rec)
    session = Session(engine, expire_on_commit=False)
    import_evaluations(session=session, records=records, reviewer="tester")
    session.commit()
    for sid in ("s_04", "s_07"):
        assert archive_evaluation(session=session, snapshot_id=sid, reviewer="tester")
    session.commit()
    return session


def _expected_ids(session: Session, filters: EvaluationFilters) -> list[str]:
    """The reference, in Python from the rows: the normalised question contains the normalised query,
    the live or archived rows, in list order (gap descending, gapless last, then newest, then id)."""
    needle = normalize_search_text(filters.text)
    rows = [
        r
        for r in session.exec(select(EvaluationSnapshot)).all()
        if (r.deleted_at is not None) == filters.archived and needle in normalize_search_text(r.question)
    ]
    rows.sort(key=lambda r: (r.created_at, r.id), reverse=True)
    if filters.sort != "newest":
        gap = "weighted_gap" if filters.sort == "weighted_gap" else "max_metric_gap"
        rows.sort(key=lambda r: -getattr(r, gap) if getattr(r, gap) is not None else math.inf)  # stable
    return [r.id for r in rows]


def _paged_ids(session: Session, filters: EvaluationFilters, limit: int) -> list[str]:
    """Every page in turn, each after the previous page's key (how the page pages on)."""
    ids: list[str] = []
    after = None
    while True:
        rows = fetch_page(session=session, filters=filters, limit=limit, after=after)
        ids += [r.id for r in rows]
        if len(rows) < limit:
            return ids
        after = page_key(rows[-1], filters.sort)


@pytest.mark.parametrize("sort", ["newest", "weighted_gap", "max_gap"])
@pytest.mark.parametrize("archived", [False, True])
def test_rare_and_common_queries_list_what_the_scan_lists(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, sort: str, archived: bool
) -> None:
    # SQLite's live list picks a plan by RARE_MATCHES (0: every query common; 1,000: every one rare);
    # the archived list, PostgreSQL and a SQLite without the index have one plan whatever it is.
    split = engine.dialect.name == "sqlite" and sqlite_trigram_available() and not archived
    with _many(engine) as session:
        for rare_matches in (0, 1_000) if split else (search.RARE_MATCHES,):
            monkeypatch.setattr(search, "RARE_MATCHES", rare_matches)
            for query in ("password", "CASE 1", "other topic 6", "ı", "no such words"):
                filters = EvaluationFilters(text=query, sort=sort, archived=archived)  # type: ignore[arg-type]
                expected = _expected_ids(session, filters)
                assert expected or query in ("no such words", "ı") or archived
                assert _paged_ids(session, filters, limit=3) == expected
                assert [
                    r.id for r in fetch_page(session=session, filters=filters, offset=2, limit=3)
                ] == expected[2:5]
                assert count_evaluations(session=session, filters=filters) == len(expected)


def test_a_common_page_walks_the_list_and_a_rare_one_starts_from_the_index(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    if engine.dialect.name != "sqlite" or not sqlite_trigram_available():
        pytest.skip("the rare/common split is SQLite's (PostgreSQL's planner picks from the GIN statistics)")
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    with _many(engine) as session:
        filters = EvaluationFilters(text="password")
        monkeypatch.setattr(search, "RARE_MATCHES", 5)  # 8 match: common
        statements.clear()
        fetch_page(session=session, filters=filters, limit=3)
        page_sql = statements[-2]  # the ids; the last statement reads their rows
        assert "LIKE" in page_sql and "MATCH" not in page_sql
        monkeypatch.setattr(search, "RARE_MATCHES", 8)  # 8 match: rare
        statements.clear()
        fetch_page(session=session, filters=filters, limit=3)
        assert "MATCH" in statements[-2] and "LIKE" not in statements[-2]


@pytest.mark.parametrize(
    ("cap", "expected"),
    [
        (10, 6),
        (6, 6),
        (5, 6),
        (2, 3),
    ],  # 6 live "password" rows (+2 archived): exact up to the cap, then cap + 1
)
def test_text_count_stops_at_the_cap_and_never_counts_archived_rows(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, cap: int, expected: int
) -> None:
    monkeypatch.setattr(counters, "TEXT_COUNT_CAP", cap)  # a text filter's own cap ("1,000+")
    with _many(engine) as session:
        total = count_evaluations(session=session, filters=EvaluationFilters(text="password"))
        assert total == expected
        assert counters.count_label(total, cap) == (f"{cap:,}+" if expected > cap else f"{expected:,}")
        # With the product filter too, the count is the same (the other, row-reading form).
        both = EvaluationFilters(text="password", product="acme")
        assert count_evaluations(session=session, filters=both) == expected


@sqlite_only
@pytest.mark.parametrize(("rare", "from_index"), [(2, False), (10, True)])  # 6 live "password" rows
def test_a_common_text_with_other_filters_is_counted_by_walking_the_list(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, rare: int, from_index: bool
) -> None:
    # Above `search.RARE_MATCHES`, starting from the text index would read every match's row whatever
    # the other filters keep; the walk of the list index tests them first and stops at the cap.
    monkeypatch.setattr(search, "RARE_MATCHES", rare)
    if engine.dialect.name != "sqlite" or not sqlite_trigram_available():
        pytest.skip(
            "the index-or-walk choice is SQLite's (PostgreSQL's planner picks from the GIN statistics)"
        )
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    with _many(engine) as session:
        filters = EvaluationFilters(text="password", date_to=date(2025, 1, 12))
        expected = [
            sid
            for sid in _expected_ids(session, EvaluationFilters(text="password"))
            if session.get(EvaluationSnapshot, sid).created_at.date() <= date(2025, 1, 12)  # type: ignore[union-attr]
        ]
        assert 0 < len(expected) < 6
        statements.clear()
        assert count_evaluations(session=session, filters=filters) == len(expected)
        assert ("MATCH" in statements[-1]) == from_index
        assert ("LIKE" in statements[-1]) != from_index


@sqlite_only
def test_a_text_over_the_text_cap_but_under_the_list_cap_with_filters_counts_from_the_index(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The lower text cap stops the count sooner; it does not move the index-or-walk crossover, which
    # stays the list cap's: a walk for a text in fewer rows could read the whole list index.
    if engine.dialect.name != "sqlite" or not sqlite_trigram_available():
        pytest.skip("the index-or-walk choice is SQLite's")
    monkeypatch.setattr(counters, "TEXT_COUNT_CAP", 1)  # 6 live "password" rows: over it
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    with _many(engine) as session:
        filters = EvaluationFilters(text="password", date_to=date(2025, 1, 12))
        assert len(_expected_ids(session, filters)) > 1
        statements.clear()
        total = count_evaluations(session=session, filters=filters)
        assert total == 2 and counters.count_label(total, count_cap(filters)) == "1+"
        assert "MATCH" in statements[-1] and "LIKE" not in statements[-1]


def _index_holds(session: Session, phrase: str) -> set[str]:
    """The ids SQLite's FTS index itself returns for `phrase` (no condition around it)."""
    fts = search_table_name("evaluation_snapshots")
    rows = session.connection().exec_driver_sql(
        f"SELECT s.id FROM {fts} JOIN evaluation_snapshots s ON s.rowid = {fts}.rowid WHERE {fts} MATCH ?",
        (f'"{phrase}"',),
    )
    return {r[0] for r in rows}


def test_the_evaluation_index_holds_live_rows_through_archive_restore_edit_and_delete(engine: Engine) -> None:
    if engine.dialect.name != "sqlite" or not sqlite_trigram_available():
        pytest.skip("SQLite's FTS index (PostgreSQL's GIN index holds every row)")
    with _many(engine) as session:
        live = {f"s_{i:02d}" for i in range(12) if i % 3} - {"s_04", "s_07"}
        assert _index_holds(session, "password") == live
        assert restore_evaluation(session=session, snapshot_id="s_04", reviewer="tester")
        session.execute(
            update(EvaluationSnapshot)
            .where(col(EvaluationSnapshot.id) == "s_07")
            .values(question="no longer about that", search_text="no longer about that")
        )
        assert archive_evaluation(session=session, snapshot_id="s_05", reviewer="tester")
        session.execute(delete(Judgment).where(col(Judgment.snapshot_id).in_(["s_07", "s_08"])))
        session.execute(delete(MetricScore).where(col(MetricScore.snapshot_id).in_(["s_07", "s_08"])))
        session.execute(delete(EvaluationSnapshot).where(col(EvaluationSnapshot.id).in_(["s_07", "s_08"])))
        session.commit()
        live = (live | {"s_04"}) - {"s_05", "s_08"}
        assert _index_holds(session, "password") == live
        assert _index_holds(session, "no longer") == set()  # s_07 was archived when edited, then deleted
        # The plain condition still finds archived rows (by their stored text), the lists split them.
        everything = select(EvaluationSnapshot.id).where(text_match(EvaluationSnapshot.__table__, "password"))
        assert set(session.exec(everything).all()) == live | {"s_05"}
        archived = EvaluationFilters(text="password", archived=True)
        assert [r.id for r in fetch_page(session=session, filters=archived)] == ["s_05"]
        assert count_evaluations(session=session, filters=archived) == 1


@sqlite_only
def test_the_lists_use_the_index_exactly_where_index_covers_says(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not sqlite_trigram_available():
        pytest.skip("no FTS5 trigram tokenizer in this Python's SQLite")
    table = EvaluationSnapshot.__table__.name
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    with _many(engine) as session:
        rows = session.exec(select(EvaluationSnapshot)).all()
        for archived in (False, True):
            in_list = {
                r.id for r in rows if (r.deleted_at is not None) == archived and "password" in r.search_text
            }
            assert (_index_holds(session, "password") == in_list) == search.index_covers(
                table, archived=archived
            )
        # The inspector asks the predicate, not its own copy of the rule: told the index holds no
        # list, the live list reads no index and still lists the same rows.
        monkeypatch.setattr(search, "index_covers", lambda *_a, **_k: False)
        filters = EvaluationFilters(text="password")
        statements.clear()
        assert [r.id for r in fetch_page(session=session, filters=filters, limit=100)] == _expected_ids(
            session, filters
        )
        assert count_evaluations(session=session, filters=filters) == len(_expected_ids(session, filters))
        assert not any("MATCH" in sql for sql in statements)


def test_migration_0014_takes_archived_rows_out_of_the_index_and_back(tmp_path: Path) -> None:
    if not sqlite_trigram_available():
        pytest.skip("no FTS5 trigram tokenizer in this Python's SQLite")
    engine = create_db_engine(f"sqlite:///{tmp_path / 'm.db'}")
    cfg = alembic_config(engine)
    command.upgrade(cfg, "0013")
    with engine.begin() as conn:
        for sid, deleted in (("s_live", "NULL"), ("s_gone", "'2025-02-01 00:00:00'")):
            conn.exec_driver_sql(
                "INSERT INTO evaluation_snapshots (id, created_at, question, model_answer, product, language, "
                "bonus_metrics, user_scores_json, judge_scores_json, evidence_count, evidence_highlighted, "
                "evidence_unlocated, evidence_unverified, chat_turn_count, max_chat_turns, status, deleted_at, "
                f"search_text) VALUES ('{sid}', '2025-01-01 00:00:00', 'password', 'a', 'p', 'en', '[]', '{{}}', "
                f"'{{}}', 0, 0, 0, 0, 0, 15, 'active', {deleted}, 'password')"
            )
    with Session(engine) as session:
        assert _index_holds(session, "password") == {"s_live", "s_gone"}
    command.upgrade(cfg, "0014")
    with Session(engine) as session:
        assert _index_holds(session, "password") == {"s_live"}
    command.downgrade(cfg, "0013")
    with Session(engine) as session:
        assert _index_holds(session, "password") == {"s_live", "s_gone"}
    engine.dispose()
