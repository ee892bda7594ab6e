"""lib.counters under two real PostgreSQL transactions: a writer that waits on a review's row locks
counts what that review committed (SQLite serialises writers, so there is nothing to race there)."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, text
from sqlmodel import Session, col, select

import lib.db
from lib import counters, importer, inspector, otlp
from lib.api import _import_body
from lib.auth import system_actor
from lib.config import get_settings
from lib.corrections import BulkReview, ReviewConflict, add_judgment, record_review, record_reviews
from lib.db import WRITE_ATTEMPTS, create_db_engine, must_retry, session_scope, write_retrying
from lib.models import EvaluationSnapshot, JudgeVersion, Judgment
from lib.second_opinion import SecondOpinion, store_second_opinion
from lib.source_records import SourceEvaluation, SourceVerdict
from tests.conftest import PgDatabase
from tests.test_counters import T0, _decisions_of_rows, _record, _snapshot_of_counters, _stored_decisions
from tests.waiting import wait_until


@pytest.fixture
def pg_engine(_pg_worker_database: PgDatabase) -> Iterator[Engine]:
    """An empty migrated PostgreSQL database (these tests need row locks; no SQLite variant)."""
    _pg_worker_database.empty()
    eng = create_db_engine(_pg_worker_database.url)
    yield eng
    eng.dispose()


def _wait_until_blocked(engine: Engine, worker: threading.Thread) -> None:
    """Until another backend waits on a row lock (or the worker finished without waiting)."""
    with engine.connect() as conn:

        def blocked() -> bool:
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
            conn.rollback()
            return bool(waiting)

        wait_until(lambda: not worker.is_alive() or blocked(), "the second writer to wait on the row lock")


def _assert_recount_keeps(engine: Engine, kept: Any) -> None:
    """Rebuild every counter from the rows: what the racing writes kept must come out the same."""
    with session_scope(engine) as s:
        counters.recount(session=s)
    with session_scope(engine) as s:
        assert _snapshot_of_counters(s) == kept


def _two_judgments(
    engine: Engine, seed: int, judge: dict[str, int], user: dict[str, int] | None = None
) -> list[tuple[int, int]]:
    """One imported evaluation with two judgments: their (id, version), in id order."""
    rec = _record(random.Random(seed), 0)
    rec["judge_scores"] = judge
    if user is not None:
        rec["user_scores"] = user
    with session_scope(engine) as s:
        importer.import_evaluations(session=s, records=[rec])
    with session_scope(engine) as s:
        rows = s.exec(select(Judgment.id, Judgment.version).order_by(col(Judgment.id))).all()
    return [(int(i), int(v)) for i, v in rows if i is not None]


def _blocked_writer(
    engine: Engine, write: Callable[[Session], None]
) -> tuple[threading.Thread, list[BaseException]]:
    """`write` in its own transaction on another thread, started and waited for until it waits on a
    lock the caller's open transaction holds; what it raised is in the list once the thread ends."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with session_scope(engine) as s:
                write(s)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    _wait_until_blocked(engine, worker)
    return worker, errors


def _wait_behind(engine: Engine, first: Callable[[Session], None], then: Callable[[Session], None]) -> None:
    """`first` in an open transaction, then `then` in another until it waits on `first`'s locks;
    `first` commits and `then` must finish without an error."""
    with engine.connect() as conn, Session(bind=conn) as holding:
        first(holding)
        worker, errors = _blocked_writer(engine, then)
        holding.commit()
    worker.join(30)
    assert not worker.is_alive() and not errors, errors


@pytest.mark.parametrize("target", ["same judgment", "other judgment of the evaluation"])
def test_a_second_opinion_waiting_on_a_review_leaves_exact_counters(pg_engine: Engine, target: str) -> None:
    """A review of J1 holds its locks uncommitted while a second opinion is stored on J1 (the flush
    hook's retraction) or on J2 (the evaluation's recount): the counters kept equal a recount."""
    (j1, v1), (j2, _) = _two_judgments(
        pg_engine, 1, judge={"truthfulness": 4, "helpfulness": 5}, user={"truthfulness": 2, "helpfulness": 3}
    )
    opinion_on = j1 if target == "same judgment" else j2

    def second_opinion(s: Session) -> None:
        opinion = SecondOpinion(judgment_id=opinion_on, action="validated", decision="4")
        store_second_opinion(session=s, opinion=opinion, reviewer="bob")

    def review(s: Session) -> None:
        record_review(session=s, judgment_id=j1, expected_version=v1, action="confirm", reviewer="ayse")

    _wait_behind(pg_engine, review, second_opinion)
    with session_scope(pg_engine) as s:
        kept = _snapshot_of_counters(s)
        reviewed = (
            s.connection().execute(text("SELECT judgments_reviewed FROM evaluation_snapshots")).scalar_one()
        )
    assert reviewed == 1
    _assert_recount_keeps(pg_engine, kept)


def test_a_review_of_two_judgments_and_a_review_of_the_second_never_deadlock(pg_engine: Engine) -> None:
    """A queue item's settlement reviews J1 then J2 in one transaction; meanwhile a reviewer's review
    of J2 starts. Every review takes the counters' lock before it locks its judgment, so the lone
    review waits whole and then meets a clean ReviewConflict. Before, the lock came after the
    judgment's UPDATE: the lone review held J2 waiting for the lock, the settlement held the lock
    waiting for J2, and PostgreSQL refused one of them with a deadlock."""
    (j1, v1), (j2, v2) = _two_judgments(pg_engine, 2, judge={"truthfulness": 4, "helpfulness": 5})

    def lone_review(s: Session) -> None:
        record_review(session=s, judgment_id=j2, expected_version=v2, action="confirm", reviewer="bob")

    with pg_engine.connect() as conn, Session(bind=conn) as settling:
        record_review(
            session=settling, judgment_id=j1, expected_version=v1, action="confirm", reviewer="ayse"
        )
        worker, errors = _blocked_writer(pg_engine, lone_review)
        record_review(
            session=settling, judgment_id=j2, expected_version=v2, action="confirm", reviewer="ayse"
        )
        settling.commit()
    worker.join(30)
    assert not worker.is_alive()
    assert [type(e).__name__ for e in errors] == ["ReviewConflict"], errors
    with session_scope(pg_engine) as s:
        assert {j.reviewer for j in s.exec(select(Judgment)).all()} == {"ayse"}


def test_a_review_waiting_on_another_writer_of_its_evaluation_keeps_both_decisions(pg_engine: Engine) -> None:
    """A bulk review of J2 (no review lock: `judgments_change`) holds the evaluation's row
    uncommitted while a reviewer's review of J1 reaches it. The review locks the row before it
    recomputes the evaluation's `reviewer_decisions`, so the recompute runs after the bulk review
    committed and holds both: an UPDATE that had waited on the row would re-check the row alone and
    write the decisions from before the bulk review's commit (J1's only)."""
    (j1, v1), (j2, _) = _two_judgments(pg_engine, 3, judge={"truthfulness": 4, "helpfulness": 5})
    with session_scope(pg_engine) as s:
        second = s.get(Judgment, j2)
        assert second is not None
        bulk = BulkReview(second.change_id, second.decision, "ayse", None, T0)

    def bulk_review(s: Session) -> None:
        assert record_reviews(session=s, reviews=[bulk]).applied == 1

    def review(s: Session) -> None:
        record_review(session=s, judgment_id=j1, expected_version=v1, action="confirm", reviewer="bob")

    _wait_behind(pg_engine, bulk_review, review)
    with session_scope(pg_engine) as s:
        stored = _stored_decisions(s)
        assert stored == _decisions_of_rows(s)
        assert sorted(m for m, _ in next(iter(stored.values()))) == ["helpfulness", "truthfulness"]


@pytest.mark.parametrize("change", ["archive", "restore"])
def test_a_review_waiting_on_an_archive_of_its_evaluation_leaves_exact_counters(
    pg_engine: Engine, change: str
) -> None:
    """An archive (or restore) of an evaluation holds its row uncommitted, having retracted (added)
    the evaluation's judgments as they were, J1 unreviewed; a review of J1 then runs until it waits
    on that row. Every counter the review moves, the judge-version counts included, must be moved
    after it has the row: moved before, they read the evaluation as still live (archived) and kept
    J1's review in the counts of an archived evaluation, or lost it from a restored one (review8 F1)."""
    (j1, v1), _ = _two_judgments(pg_engine, 7, judge={"truthfulness": 4, "helpfulness": 5})
    with session_scope(pg_engine) as s:
        snapshot_id = s.get(Judgment, j1).snapshot_id  # type: ignore[union-attr]
        if change == "restore":
            assert inspector.archive_evaluation(session=s, snapshot_id=snapshot_id, reviewer="ayse")

    def archive_or_restore(s: Session) -> None:
        change_it = inspector.archive_evaluation if change == "archive" else inspector.restore_evaluation
        assert change_it(session=s, snapshot_id=snapshot_id, reviewer="ayse")

    def review(s: Session) -> None:
        record_review(session=s, judgment_id=j1, expected_version=v1, action="confirm", reviewer="bob")

    _wait_behind(pg_engine, archive_or_restore, review)
    with session_scope(pg_engine) as s:
        kept = _snapshot_of_counters(s)
        assert s.get(Judgment, j1).reviewer == "bob"  # type: ignore[union-attr]
    with session_scope(pg_engine) as s:
        counters.recount(session=s)
    with session_scope(pg_engine) as s:
        recounted = _snapshot_of_counters(s)
    assert bool(recounted["judge_version_totals"]) == (change == "restore")
    assert kept == recounted


def test_a_bulk_review_waiting_on_a_review_skips_its_judgment(pg_engine: Engine) -> None:
    """A reviewer's overrule of J1 is uncommitted when a bulk review of J1 and J2 reads them (J1 still
    unreviewed) and then waits on J1's row. Once the review commits, the bulk review reads J1 again
    under the lock and skips it: before, it wrote from its first read, overwrote the overrule and
    gave both audit events version 2 (review8 F5)."""
    (j1, v1), (j2, _) = _two_judgments(pg_engine, 5, judge={"truthfulness": 4, "helpfulness": 5})
    with session_scope(pg_engine) as s:
        bulk = [BulkReview(s.get(Judgment, j).change_id, "4", "loader", None, T0) for j in (j1, j2)]  # type: ignore[union-attr]
    done: list[Any] = []

    def bulk_review(s: Session) -> None:
        done.append(record_reviews(session=s, reviews=bulk))

    with pg_engine.connect() as conn, Session(bind=conn) as holding:
        record_review(
            session=holding, judgment_id=j1, expected_version=v1, action="overrule", user_decision="2",
            reviewer="bob", reason="too generous",
        )  # fmt: skip
        worker, errors = _blocked_writer(pg_engine, bulk_review)
        holding.commit()
    worker.join(30)
    assert not worker.is_alive() and not errors, errors
    assert [(d.applied, d.already_reviewed) for d in done] == [(1, 1)]
    with session_scope(pg_engine) as s:
        first, second = s.get(Judgment, j1), s.get(Judgment, j2)
        assert first is not None and second is not None
        assert (first.reviewer, first.user_decision, first.version) == ("bob", "2", v1 + 1)
        assert second.reviewer == "loader"
        events = (
            s.connection()
            .execute(text("SELECT judgment_id, reviewer, version FROM judgment_events ORDER BY id"))
            .all()
        )
        assert sorted(map(tuple, events)) == sorted([(j1, "bob", v1 + 1), (j2, "loader", second.version)])
        kept = _snapshot_of_counters(s)
    _assert_recount_keeps(pg_engine, kept)


@pytest.mark.parametrize("change", ["restore", "archive"])
def test_a_rejudge_that_keeps_a_reviewed_entry_racing_a_restore_leaves_exact_counters(
    pg_engine: Engine, change: str
) -> None:
    """A re-judge of a reviewed judgment that keeps the reviewer's entry writes only a verdict: its
    flush retracts and re-adds the judgment. A restore (or archive) of the evaluation run to its
    commit between those statements must wait for the re-judge: before, the flush did not lock the
    evaluation, the restore counted the judgment and the re-add counted it again (review8 F7)."""
    (j1, v1), _ = _two_judgments(pg_engine, 6, judge={"truthfulness": 4, "helpfulness": 5})
    with session_scope(pg_engine) as s:
        record_review(session=s, judgment_id=j1, expected_version=v1, action="confirm", reviewer="bob")
    with session_scope(pg_engine) as s:
        j = s.get(Judgment, j1)
        assert j is not None and j.snapshot_id is not None
        snapshot_id, change_id, decision, product, metric = (
            j.snapshot_id,
            j.change_id,
            j.decision,
            j.product,
            j.metric,
        )
        version = JudgeVersion(product=product, name="r8", content_hash="r8", created_by="r8", origin="demo")
        s.add(version)
        s.flush()
        version_id = version.id
        if change == "restore":
            assert inspector.archive_evaluation(session=s, snapshot_id=snapshot_id, reviewer="ayse")

    other: list[threading.Thread] = []

    def other_writer() -> None:
        with session_scope(pg_engine) as s2:
            change_it = inspector.restore_evaluation if change == "restore" else inspector.archive_evaluation
            assert change_it(session=s2, snapshot_id=snapshot_id, reviewer="ayse")

    def start_the_other_writer(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        if statement.startswith("INSERT INTO judge_verdicts") and not other:
            other.append(threading.Thread(target=other_writer))
            other[0].start()
            _wait_until_blocked(pg_engine, other[0])  # it waits on the evaluation's row (before: ran through)

    with pg_engine.connect() as conn:
        event.listen(conn, "before_cursor_execute", start_the_other_writer)
        with Session(bind=conn) as s:
            fresh = Judgment(
                change_id=change_id, product=product, metric=metric, snapshot_id=snapshot_id, decision=decision,
                timestamp=T0 + timedelta(days=2), judge_version_id=version_id,
            )  # fmt: skip
            add_judgment(session=s, judgment=fresh, reviewer="importer")
            s.commit()
    assert other
    other[0].join(30)
    assert not other[0].is_alive()
    with session_scope(pg_engine) as s:
        kept = _snapshot_of_counters(s)
    _assert_recount_keeps(pg_engine, kept)


def test_a_review_does_not_wait_on_a_row_that_merely_references_its_evaluation(pg_engine: Engine) -> None:
    """An open transaction that inserted a row pointing at the evaluation (a chat message, a queue
    item: the foreign key check holds FOR KEY SHARE on the evaluation's row) must not hold its
    reviews, nor, behind the review lock, every other review (review5 F1: FOR UPDATE waited)."""
    (j1, v1), _ = _two_judgments(pg_engine, 4, judge={"truthfulness": 4, "helpfulness": 5})
    with session_scope(pg_engine) as s:
        snapshot_id = s.get(Judgment, j1).snapshot_id  # type: ignore[union-attr]
    with pg_engine.connect() as holder:
        holder.execute(
            text(
                "INSERT INTO chat_messages (id, chat_id, client_message_id, is_complete, snapshot_id, role, "
                "content, selected_metrics, created_at) VALUES ('m1', '', 'c1', false, :s, 'user', 'hi', '[]', now())"
            ),
            {"s": snapshot_id},
        )
        with session_scope(pg_engine) as s:
            s.connection().execute(text("SET LOCAL lock_timeout = '2s'"))  # waiting fails the test
            record_review(session=s, judgment_id=j1, expected_version=v1, action="confirm", reviewer="bob")
        holder.rollback()
    with session_scope(pg_engine) as s:
        assert _stored_decisions(s) == _decisions_of_rows(s)
        assert any(_stored_decisions(s).values())


def test_the_review_lock_is_taken_once_a_transaction(pg_engine: Engine) -> None:
    """`one_writer_at_a_time` sends its lock once per transaction (a queue's settlement takes the
    review lock before its first judgment's row, then each review asks again), and again in the next."""
    from sqlalchemy import event

    from lib.locks import PG_REVIEW_COUNTERS_LOCK, one_writer_at_a_time, one_writer_per_product

    sent: list[str] = []

    def count(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        if "pg_advisory_xact_lock" in statement:
            sent.append(statement)

    event.listen(pg_engine, "before_cursor_execute", count)
    try:
        with Session(pg_engine) as s:
            for _ in range(3):
                one_writer_at_a_time(s, PG_REVIEW_COUNTERS_LOCK)
            s.commit()
            assert len(sent) == 1
            one_writer_at_a_time(s, PG_REVIEW_COUNTERS_LOCK)
            s.rollback()
            with s.begin_nested():  # rolled back to: PostgreSQL released the lock taken inside
                one_writer_at_a_time(s, PG_REVIEW_COUNTERS_LOCK)
                s.get_nested_transaction().rollback()  # type: ignore[union-attr]
            one_writer_at_a_time(s, PG_REVIEW_COUNTERS_LOCK)
            s.commit()
        assert len(sent) == 4
        sent.clear()
        with Session(pg_engine) as s:  # per product: once a product and transaction, each product's own
            one_writer_per_product(s, PG_REVIEW_COUNTERS_LOCK, ["P"])
            one_writer_per_product(s, PG_REVIEW_COUNTERS_LOCK, ["Q", "P", "Q"])
            one_writer_per_product(s, PG_REVIEW_COUNTERS_LOCK, ["P"])
            s.commit()
        assert len(sent) == 2
    finally:
        event.remove(pg_engine, "before_cursor_execute", count)


def _deadlock_a_review(
    engine: Engine, then: Callable[[Session], None], *, attempts: int
) -> tuple[list[Any], list[BaseException]]:
    """Stage one lock cycle whose victim is a review run by `write_retrying`: an open transaction
    locks the evaluation's row as a writer that takes no reviews' lock does (late verdicts extending
    it: `counters.lock_snapshots`; an archive takes the reviews' lock first since locks1); ayse's
    review of J1 takes the review lock and J1, then waits on the evaluation's row; the open
    transaction then runs `then` (a review of the same evaluation: it waits on the review lock), and
    commits once PostgreSQL aborted one of the two. The review waited first, so its deadlock check
    runs first (the holder's is put off to be sure) and it is the victim. Returns what the review
    returned and what it raised."""
    (j1, v1), _ = _two_judgments(engine, 7, judge={"truthfulness": 4, "helpfulness": 5})
    results: list[Any] = []
    errors: list[BaseException] = []

    def review() -> None:
        def work(s: Session) -> int:
            done = record_review(
                session=s, judgment_id=j1, expected_version=v1, action="confirm", reviewer="ayse"
            )
            return done.version

        try:
            results.append(write_retrying(engine, work, attempts=attempts))
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    with engine.connect() as conn, Session(bind=conn) as holding:
        holding.execute(text("SET LOCAL deadlock_timeout = '5s'"))  # the test user is a superuser
        sid = holding.exec(select(Judgment.snapshot_id).where(col(Judgment.id) == j1)).one()
        counters.lock_snapshots(session=holding, where=col(EvaluationSnapshot.id) == sid)
        worker = threading.Thread(target=review)
        worker.start()
        _wait_until_blocked(engine, worker)
        then(holding)  # waits on the review's lock until PostgreSQL aborts the review
        holding.commit()
    worker.join(30)
    assert not worker.is_alive()
    return results, errors


def _review_second(decision: str | None) -> Callable[[Session], None]:
    def run(s: Session) -> None:
        j1, j2 = s.exec(select(Judgment).order_by(col(Judgment.id))).all()
        target = j2 if decision is None else j1
        action = "confirm" if decision is None else "overrule"
        record_review(
            session=s, judgment_id=target.id or 0, expected_version=target.version, action=action,
            user_decision=decision, reviewer="bob", reason=None if decision is None else "no",
        )  # fmt: skip

    return run


def test_a_deadlocked_review_is_retried_and_both_writes_land(pg_engine: Engine) -> None:
    """The victim of a deadlock (review8 F4) is run again whole: bob's review of J2 and ayse's review
    of J1 are both stored, and the counters kept equal a recount."""
    results, errors = _deadlock_a_review(pg_engine, _review_second(None), attempts=WRITE_ATTEMPTS)
    assert not errors, errors
    assert len(results) == 1
    with session_scope(pg_engine) as s:
        reviewers = s.exec(select(Judgment.reviewer).order_by(col(Judgment.id))).all()
        assert list(reviewers) == ["ayse", "bob"]
        kept = _snapshot_of_counters(s)
    _assert_recount_keeps(pg_engine, kept)


def test_the_staged_review_deadlocks_without_retries(pg_engine: Engine) -> None:
    """The staging above is a real lock cycle: with one attempt the review ends in DeadlockDetected."""
    results, errors = _deadlock_a_review(pg_engine, _review_second(None), attempts=1)
    assert not results and len(errors) == 1 and must_retry(errors[0]), errors


def test_a_retried_review_after_a_lost_race_still_conflicts(pg_engine: Engine) -> None:
    """Bob's overrule of J1 is the transaction that wins the cycle: ayse's review, run again, reads J1
    anew and meets the moved version (409 in the API), not a silent second decision."""
    results, errors = _deadlock_a_review(pg_engine, _review_second("2"), attempts=WRITE_ATTEMPTS)
    assert not results and len(errors) == 1 and isinstance(errors[0], ReviewConflict), errors
    with session_scope(pg_engine) as s:
        j1 = s.exec(select(Judgment).order_by(col(Judgment.id))).first()
        assert j1 is not None and (j1.reviewer, j1.user_decision) == ("bob", "2")


def _import_file(engine: Engine, tmp_path: Path, rec: dict[str, Any]) -> Any:
    """`python -m lib import FILE`, the Import page and a JSON Lines POST: `importer.import_path`."""
    path = tmp_path / "batch.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    return importer.import_path(engine=engine, path=path, kind="evaluations", reviewer=system_actor())


def _post_array(engine: Engine, tmp_path: Path, rec: dict[str, Any]) -> Any:
    """`POST /api/v1/evaluations` with a JSON array: what the endpoint runs on the spooled body."""
    path = tmp_path / "request.jsonl"
    path.write_text(json.dumps([rec]))
    return _import_body(engine, path, system_actor("ci"), "evaluations")


def _post_otlp(engine: Engine, _tmp_path: Path, rec: dict[str, Any]) -> Any:
    """`POST /v1/traces`: a chat span of the evaluation's product with a verdict as a span event."""
    from tests.test_otlp import Telemetry

    telemetry = Telemetry(service=rec["product"])
    telemetry.call(rec["question"], rec["model_answer"], events={"truthfulness": 4})
    return otlp.receive(
        engine=engine, signal="traces", body=telemetry.traces(), kind=otlp.PROTOBUF,
        settings=get_settings(), actor=system_actor("ci"),
    )  # fmt: skip


@pytest.mark.parametrize("entry", [_import_file, _post_array, _post_otlp], ids=["file", "api array", "otlp"])
@pytest.mark.parametrize("attempts", [WRITE_ATTEMPTS, 1], ids=["retried", "one attempt"])
def test_an_import_that_a_deadlock_aborts_is_run_again_whole(
    pg_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry: Any, attempts: int
) -> None:
    """Imports (a file, an API push, an OTLP request) are deadlock victims too: staged here, an open
    transaction archives an evaluation of product P (holding P's counter rows), the import takes the
    importers' lock and waits on those rows, and the open transaction then imports as well (waiting on
    the importers' lock): a cycle, whose victim is the import (it waited first). Run again whole, it
    lands with its evaluation and the counters equal a recount; with one attempt (main before) the
    caller met DeadlockDetected and nothing of it was stored."""
    monkeypatch.setattr(lib.db, "WRITE_ATTEMPTS", attempts)
    (j1, _), _ = _two_judgments(pg_engine, 7, judge={"truthfulness": 4, "helpfulness": 5})
    rng = random.Random(11)
    with session_scope(pg_engine) as s:
        seeded = s.get(Judgment, j1)
        assert seeded is not None and seeded.snapshot_id is not None
        sid, product = seeded.snapshot_id, seeded.product
    incoming, other = (_record(rng, n) | {"product": product} for n in (1, 2))
    results: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(entry(pg_engine, tmp_path, incoming))
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    with pg_engine.connect() as conn, Session(bind=conn) as holding:
        holding.execute(text("SET LOCAL deadlock_timeout = '5s'"))  # the test user is a superuser
        inspector.archive_evaluation(session=holding, snapshot_id=sid, reviewer="lead")
        worker = threading.Thread(target=run)
        worker.start()
        _wait_until_blocked(pg_engine, worker)
        importer.import_evaluations(session=holding, records=[other])  # waits on the importers' lock
        holding.commit()
    worker.join(30)
    assert not worker.is_alive()
    with session_scope(pg_engine) as s:
        questions = set(s.exec(select(EvaluationSnapshot.question)).all())
        kept = _snapshot_of_counters(s)
    assert other["question"] in questions
    if attempts == 1:
        assert not results and len(errors) == 1 and must_retry(errors[0]), errors
        assert incoming["question"] not in questions
    else:
        assert not errors and len(results) == 1, errors
        assert incoming["question"] in questions
    _assert_recount_keeps(pg_engine, kept)


def _imported_pair(engine: Engine) -> tuple[int, int, dict[str, Any]]:
    """One pending evaluation with two judgments (ids J1, J2) and the record it came from."""
    rec = {
        "question": "Stored?", "model_answer": "An answer.", "product": "tutor", "language": "en",
        "judge_model": "j", "created_at": T0.isoformat(), "judge_scores": {"truthfulness": 4, "helpfulness": 5},
    }  # fmt: skip
    with session_scope(engine) as s:
        importer.import_evaluations(session=s, records=[rec])
    with session_scope(engine) as s:
        j1, j2 = s.exec(select(Judgment.id).order_by(col(Judgment.id))).all()
    assert j1 is not None and j2 is not None
    return j1, j2, rec


def _bulk(engine: Engine, judgment_ids: list[int]) -> Callable[[Session], None]:
    with session_scope(engine) as s:
        rows = [s.get(Judgment, j) for j in judgment_ids]
        reviews = [BulkReview(j.change_id, j.decision, "loader", None, T0) for j in rows if j is not None]
    return lambda s: record_reviews(session=s, reviews=reviews) and None


def test_a_bulk_review_takes_the_reviews_lock_before_any_row(pg_engine: Engine) -> None:
    """A bulk review is a review: it waits for the reviews' lock before it locks a judgment. Staged: an
    open review of J1 (holding the lock, J1 and its evaluation); a bulk review of J2 waits; the open
    transaction then reviews J2 as well. Before, the bulk review locked J2 and waited on the
    evaluation's row, so the second review closed a lock cycle (DeadlockDetected); now it waits
    before J2, the review lands, and the bulk review then skips J2 as reviewed."""
    j1, j2, _ = _imported_pair(pg_engine)
    bulk = _bulk(pg_engine, [j2])
    with pg_engine.connect() as conn, Session(bind=conn) as holding:
        holding.execute(text("SET LOCAL deadlock_timeout = '5s'"))  # the bulk review checks first
        for j in (j1, j2):
            if j == j2:
                worker, errors = _blocked_writer(pg_engine, bulk)
            row = holding.get(Judgment, j)
            assert row is not None
            record_review(
                session=holding, judgment_id=j, expected_version=row.version, action="confirm", reviewer="bob"
            )
        holding.commit()
    worker.join(30)
    assert not worker.is_alive() and not errors, errors
    with session_scope(pg_engine) as s:
        assert {s.get(Judgment, j).reviewer for j in (j1, j2)} == {"bob"}  # type: ignore[union-attr]
        kept = _snapshot_of_counters(s)
    _assert_recount_keeps(pg_engine, kept)


def _rejudge(engine: Engine, judgment_id: int, *, by_another_version: bool) -> Callable[[Session], None]:
    """A re-judge of the judgment with another decision (`add_judgment`, counted by the flush hooks);
    by another judge version, it first flushes the replaced decision as that version's verdict."""
    version = None
    if by_another_version:
        other = {
            "question": "Elsewhere?",
            "product": "elsewhere",
            "judge_version": "v-b",
            "judge_scores": {"clarity": 3},
        }
        with session_scope(engine) as s:
            importer.import_evaluations(
                session=s, records=[{"model_answer": "A.", "judge_model": "j"} | other]
            )
        with session_scope(engine) as s:
            version = s.exec(select(JudgeVersion.id)).one()
    with session_scope(engine) as s:
        j = s.get(Judgment, judgment_id)
        assert j is not None
        change_id, product, metric, sid = j.change_id, j.product, j.metric, j.snapshot_id

    def rejudge(s: Session) -> None:
        fresh = Judgment(
            change_id=change_id, product=product, metric=metric, snapshot_id=sid, decision="1",
            timestamp=T0, judge_version_id=version,
        )  # fmt: skip
        add_judgment(session=s, judgment=fresh, reviewer="importer")

    return rejudge


@pytest.mark.parametrize("writer", ["bulk review", "re-judge", "re-judge by another version"])
def test_a_writer_moves_its_evaluations_counter_row_before_its_judgments_rows(
    pg_engine: Engine, writer: str
) -> None:
    """The one order of counter rows holds for a bulk review and a re-judge too: the evaluation's
    `evaluation_counts` row before its judgments' day and language rows, as an import takes them.
    Staged: the writer of J1 is held just before its first `evaluation_counts` statement (a re-judge by
    another version: its first flush's, that of the replaced decision's verdict); meanwhile an
    import of an evaluation alike (the same counter rows) runs. Before, the writer already held the
    day and language rows there, the import took the `evaluation_counts` row and waited on them, and
    the writer then waited on the import: DeadlockDetected. Now the import goes through and both land."""
    j1, _, rec = _imported_pair(pg_engine)
    if writer == "bulk review":
        bulk = _bulk(pg_engine, [j1])
    else:
        bulk = _rejudge(pg_engine, j1, by_another_version=writer.endswith("version"))

    def load(s: Session) -> None:
        importer.import_evaluations(session=s, records=[rec | {"question": "Another?"}])

    errors = _held_at(pg_engine, bulk, "INSERT INTO evaluation_counts", load)
    assert not errors, errors
    with session_scope(pg_engine) as s:
        written = s.get(Judgment, j1)
        assert written is not None
        assert (written.reviewer, written.decision) == (
            ("loader", "4") if writer == "bulk review" else (None, "1")
        )
        assert len(s.exec(select(Judgment.id).where(col(Judgment.product) == "tutor")).all()) == 4
        kept = _snapshot_of_counters(s)
    _assert_recount_keeps(pg_engine, kept)


def _held_at(
    engine: Engine,
    first: Callable[[Session], None],
    statement: str,
    then: Callable[[Session], None],
    nth: int = 1,
) -> list[BaseException]:
    """`first` in its own transaction, held just before it sends its `nth` statement starting with
    `statement`; `then` in another, until it waits on a lock (or ends); then `first` goes on. What
    either raised (a DeadlockDetected when the two closed a lock cycle)."""
    reached, go_on = threading.Event(), threading.Event()
    held: list[int] = []
    seen = [0]

    def hold(_conn: Any, _cursor: Any, sent: str, *_args: Any) -> None:
        if threading.get_ident() in held and sent.startswith(statement):
            seen[0] += 1
            if seen[0] == nth:
                held.clear()  # once
                reached.set()
                assert go_on.wait(30)

    def run_first(s: Session) -> None:
        held.append(threading.get_ident())
        first(s)

    errors: list[BaseException] = []
    event.listen(engine, "before_cursor_execute", hold)
    try:
        threads = [threading.Thread(target=_run_into, args=(engine, run_first, errors))]
        threads[0].start()
        assert reached.wait(30)
        threads.append(threading.Thread(target=_run_into, args=(engine, then, errors)))
        threads[1].start()
        _wait_until_blocked(engine, threads[1])
        go_on.set()
        for t in threads:
            t.join(30)
            assert not t.is_alive()
    finally:
        go_on.set()
        event.remove(engine, "before_cursor_execute", hold)
    return errors


def _run_into(engine: Engine, write: Callable[[Session], None], errors: list[BaseException]) -> None:
    """`write` in its own transaction; what it raised goes to `errors` (for the test thread)."""
    try:
        with session_scope(engine) as s:
            write(s)
    except BaseException as exc:
        errors.append(exc)


def test_an_otlp_request_locks_the_evaluations_it_extends_before_it_imports(
    pg_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review12 F5: a request of log records imports a waiting call of product P (taking P's counter
    rows) and adds a late verdict to E, a stored evaluation of P. An archive of E holds E's row (its
    first statement) while the request runs until it waits. The request used to take P's rows first
    and wait for E after: the archive then waited on P's rows, a cycle PostgreSQL broke by aborting
    one side. Evaluations first (docs/internals.md "Counters"): the request waits before it takes
    any counter row and both land, with no retry (one attempt) and counters equal to a recount."""
    from tests.test_otlp import Telemetry

    monkeypatch.setattr(lib.db, "WRITE_ATTEMPTS", 1)
    telemetry = Telemetry(service="P")
    stored = telemetry.call("Q1?", "A1.", events={"truthfulness": 4})
    waiting = telemetry.call("Q2?", "A2.")  # judged by the log records below
    send = {
        "engine": pg_engine,
        "kind": otlp.PROTOBUF,
        "settings": get_settings(),
        "actor": system_actor("ci"),
    }
    otlp.receive(signal="traces", body=telemetry.traces(), **send)
    with session_scope(pg_engine) as s:
        sid = s.exec(select(EvaluationSnapshot.id)).one()
    telemetry.verdict("clarity", 3, stored)  # late: E is stored
    telemetry.verdict("truthfulness", 5, waiting)  # imports Q2
    logs = telemetry.log_body()

    def request(_s: Session) -> None:  # receive opens its own session
        otlp.receive(signal="logs", body=logs, **send)

    with pg_engine.connect() as conn, Session(bind=conn) as holding:
        counters.lock_snapshots(
            session=holding, where=counters.one_evaluation(sid)
        )  # the archive's first step
        worker, errors = _blocked_writer(pg_engine, request)
        assert inspector.archive_evaluation(session=holding, snapshot_id=sid, reviewer="lead")
        holding.commit()
    worker.join(30)
    assert not worker.is_alive() and not errors, errors
    with session_scope(pg_engine) as s:
        rows = s.exec(select(EvaluationSnapshot.question, EvaluationSnapshot.deleted_at)).all()
        assert sorted((q, d is not None) for q, d in rows) == [("Q1?", True), ("Q2?", False)]
        metrics = s.exec(select(Judgment.metric).where(Judgment.snapshot_id == sid)).all()
        assert sorted(metrics) == ["clarity", "truthfulness"]
        kept = _snapshot_of_counters(s)
    _assert_recount_keeps(pg_engine, kept)


def test_an_import_takes_the_shared_agreement_rows_after_its_products_row(pg_engine: Engine) -> None:
    """An import writes its evaluations' score counts (`agreement_counts`, shared by every evaluation
    of a product, language, metric, week and score pair) after its product's counter row, as an archive
    does. Staged: an archive of E is held just before its first `agreement_counts` statement (it holds
    the product's row); meanwhile an import of an evaluation alike (the same score pair) runs. Before,
    the import took the agreement rows first and waited on the product's row, and the archive then
    waited on the import: DeadlockDetected. Now the import waits for the archive and both land."""
    rec = {
        "question": "Stored?", "model_answer": "An answer.", "product": "tutor", "language": "en",
        "judge_model": "j", "created_at": T0.isoformat(), "judge_scores": {"truthfulness": 4},
        "user_scores": {"truthfulness": 2},
    }  # fmt: skip
    with session_scope(pg_engine) as s:
        importer.import_evaluations(session=s, records=[rec])
    with session_scope(pg_engine) as s:
        sid = s.exec(select(EvaluationSnapshot.id)).one()

    def archive(s: Session) -> None:
        inspector.archive_evaluation(session=s, snapshot_id=sid, reviewer="lead")

    def load(s: Session) -> None:
        importer.import_evaluations(session=s, records=[rec | {"question": "Another?"}])

    errors = _held_at(pg_engine, archive, "INSERT INTO agreement_counts", load)
    assert not errors, errors
    with session_scope(pg_engine) as s:
        assert len(s.exec(select(EvaluationSnapshot.id)).all()) == 2
        kept = _snapshot_of_counters(s)
    _assert_recount_keeps(pg_engine, kept)


_P_AND_Q = {
    "model_answer": "An answer.", "language": "en", "judge_model": "j", "created_at": T0.isoformat(),
    "judge_scores": {"truthfulness": 4},
}  # fmt: skip


def _one_judged_evaluation_of_p_and_q(engine: Engine) -> dict[str, tuple[str, int, int]]:
    """Product → (its evaluation's id, its judgment's id and version): one evaluation each of P and Q."""
    with session_scope(engine) as s:
        importer.import_evaluations(
            session=s, records=[_P_AND_Q | {"question": f"{p}?", "product": p} for p in ("P", "Q")]
        )
    with session_scope(engine) as s:
        return {
            str(j.product): (str(j.snapshot_id), int(j.id or 0), int(j.version))
            for j in s.exec(select(Judgment)).all()
        }


def _confirm(judgment_id: int, version: int) -> Callable[[Session], None]:
    def write(s: Session) -> None:
        record_review(
            session=s, judgment_id=judgment_id, expected_version=version, action="confirm",
            user_decision=None, reviewer="bob", reason=None,
        )  # fmt: skip

    return write


def _ends_beside_an_open_import_of_p(
    engine: Engine, of_p: Callable[[Session], None], of_q: Callable[[Session], None]
) -> list[BaseException]:
    """An import of product P stays open; `of_p` waits on the rows it holds; `of_q`, a write of
    product Q, must end while the import is still open (a bound for a blocked thread, not a speed: it
    ends at once or never). What either raised."""
    errors: list[BaseException] = []
    with engine.connect() as conn, Session(bind=conn) as holding:
        importer.import_evaluations(
            session=holding, records=[_P_AND_Q | {"question": "New?", "product": "P"}]
        )
        waiting = threading.Thread(target=_run_into, args=(engine, of_p, errors))
        waiting.start()
        _wait_until_blocked(engine, waiting)
        other = threading.Thread(target=_run_into, args=(engine, of_q, errors))
        other.start()
        other.join(30)
        ended = not other.is_alive()
        holding.commit()
    waiting.join(30)
    other.join(30)
    assert ended, "the write of product Q waited for the import of product P"
    return errors


def test_an_archive_waiting_on_an_import_holds_up_no_review_of_another_product(pg_engine: Engine) -> None:
    """review15 F1: an archive of an evaluation of P waits on P's product row while an import of P
    is open. It must not hold the reviews' lock meanwhile (5aee32b made it take it first): every
    review of every product then waited out the import."""
    made = _one_judged_evaluation_of_p_and_q(pg_engine)
    e = made["P"][0]

    def archive(s: Session) -> None:
        inspector.archive_evaluation(session=s, snapshot_id=e, reviewer="lead")

    errors = _ends_beside_an_open_import_of_p(pg_engine, archive, _confirm(*made["Q"][1:]))
    assert not errors, errors
    with session_scope(pg_engine) as s:
        assert s.get(Judgment, made["Q"][1]).reviewer == "bob"  # type: ignore[union-attr]
        assert s.get(EvaluationSnapshot, e).deleted_at is not None  # type: ignore[union-attr]
        kept = _snapshot_of_counters(s)
    _assert_recount_keeps(pg_engine, kept)


def _source_evaluation(question: str, **verdicts: float) -> SourceEvaluation:
    return SourceEvaluation(
        where=question, product="P", question=question, answer="A.", created_at=T0,
        verdicts=[SourceVerdict(name=name, score=score) for name, score in verdicts.items()],
    )  # fmt: skip


def test_a_second_eval_files_late_verdicts_take_the_importers_lock_before_any_row(pg_engine: Engine) -> None:
    """review15 F2: a source file's import (`importer._import_file`) first adds the verdicts of
    evaluations already stored (`_extend_stored` -> `add_source_verdicts`), then imports the new ones.
    The late verdicts took their evaluations and counter rows before the importers' lock, which the
    new ones' write takes: another import holding that lock and needing those rows closed a cycle.
    Staged: the file's import is held at its first advisory lock while an alike import runs."""
    with session_scope(pg_engine) as s:  # P defines truthfulness and clarity; Q1 lacks clarity
        importer.import_source_evaluations(
            session=s,
            evaluations=[
                _source_evaluation("Q0", truthfulness=4, clarity=3),
                _source_evaluation("Q1", truthfulness=4),
            ],
            source="seed",
        )
    actor = system_actor("ci")

    def file_import(s: Session) -> None:  # `_import_file`'s body for another tool's file
        second = [_source_evaluation("Q1", clarity=3), _source_evaluation("Q2", clarity=3)]
        fresh, _extended, added, _reviewed, _not_taken = importer._extend_stored(s, second, actor)
        assert added == 1
        importer.import_source_evaluations(session=s, evaluations=fresh, source="second.csv")

    def other_import(s: Session) -> None:  # an API push or OTLP request of an alike evaluation
        importer.import_source_evaluations(
            session=s, evaluations=[_source_evaluation("Q3", clarity=3)], source="push"
        )

    errors = _held_at(pg_engine, file_import, "SELECT pg_advisory_xact_lock", other_import)
    assert not errors, errors
    with session_scope(pg_engine) as s:
        assert len(s.exec(select(Judgment.id).where(col(Judgment.metric) == "clarity")).all()) == 4
        kept = _snapshot_of_counters(s)
    _assert_recount_keeps(pg_engine, kept)


def test_a_review_waiting_on_an_import_holds_up_no_review_of_another_product(pg_engine: Engine) -> None:
    """review15 F3: the reviews' lock is per product (`lib.locks.one_writer_per_product`). A review of
    P waits on the counter rows an open import of P holds; a review of product Q must not wait behind
    it (with one lock for all products it waited out the import: every counter row's key holds its
    product, so no lock cycle the lock breaks spans two products)."""
    made = _one_judged_evaluation_of_p_and_q(pg_engine)
    errors = _ends_beside_an_open_import_of_p(pg_engine, _confirm(*made["P"][1:]), _confirm(*made["Q"][1:]))
    assert not errors, errors
    with session_scope(pg_engine) as s:
        assert {s.get(Judgment, made[p][1]).reviewer for p in "PQ"} == {"bob"}  # type: ignore[union-attr]
        kept = _snapshot_of_counters(s)
    _assert_recount_keeps(pg_engine, kept)
