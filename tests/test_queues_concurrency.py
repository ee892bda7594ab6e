"""Team queues under real concurrency (issue 26): reviewers in threads, each with its own
connections, on SQLite (one writer at a time) and PostgreSQL (row locks, read committed).

3 reviewers × 100 items × overlap 2: every item gets exactly 2 labels from 2 different reviewers,
none is lost or given twice, and no reviewer ever sees an error. The default queue: reviewers
claiming at once are never handed the same evaluation.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, func, text
from sqlmodel import Session, select

from lib import corrections, queues, review_queue
from lib.auth import Actor
from lib.corrections import record_review
from lib.db import create_db_engine, session_scope
from lib.locks import PG_REVIEW_COUNTERS_LOCK, one_writer_per_product
from lib.models import (
    EvaluationSnapshot,
    Judgment,
    JudgmentEvent,
    ReviewAssignment,
    ReviewLabel,
    ReviewQueueItem,
)
from lib.queues import LabelInput, QueueSpec
from lib.review_queue import QueueFilter
from tests.test_counters_concurrency import _blocked_writer, pg_engine  # noqa: F401
from tests.test_queues import NOW, create, items, judgments_of, take
from tests.test_review_queue import evaluation

pytestmark = pytest.mark.slow

T0 = datetime(2024, 3, 1, tzinfo=UTC)
REVIEWERS = ("ana", "ben", "cem")


def _fill(engine: Engine, n: int, metrics: tuple[str, ...] = ("clarity", "truthfulness")) -> None:
    with session_scope(engine) as s:
        s.add_all(
            EvaluationSnapshot(id=f"e{i:03d}", question="q", model_answer="a", product="acme",
                               created_at=T0 + timedelta(minutes=i))
            for i in range(n)
        )  # fmt: skip
        s.flush()
        s.add_all(
            Judgment(change_id=f"e{i:03d}:{m}", product="acme", metric=m, snapshot_id=f"e{i:03d}", decision="3",
                     timestamp=T0 + timedelta(minutes=i))
            for i in range(n)
            for m in metrics
        )  # fmt: skip


def _run_all(workers: list[Callable[[], None]]) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(len(workers))

    def guarded(fn: Callable[[], None]) -> None:
        try:
            start.wait()
            fn()
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "a reviewer thread hung"
    return errors


@pytest.fixture
def url(db_url: str) -> str:
    return db_url


def test_three_reviewers_label_a_hundred_items_twice_each_without_an_error(url: str) -> None:
    engine = create_db_engine(url)
    _fill(engine, 100)
    with session_scope(engine) as s:
        queue = queues.create_queue(
            session=s, actor=Actor("lead", "lead"), spec=QueueSpec(name="team", size=100, overlap=2)
        )
        queue_id = queue.id or 0
    handed: dict[str, list[int]] = {name: [] for name in REVIEWERS}

    def reviewer(name: str) -> Callable[[], None]:
        def work() -> None:
            own = create_db_engine(url)  # each reviewer its own pool, as separate app sessions would
            try:
                while True:
                    with session_scope(own) as s:
                        got = queues.next_assignment(session=s, queue_id=queue_id, reviewer=name)
                    if got is None:
                        return
                    handed[name].append(got.item_id)
                    with session_scope(own, read_only=True) as s:
                        blind = queues.load_blind_item(
                            session=s, queue_id=queue_id, item_id=got.item_id, reviewer=name
                        )
                    # Labels that sometimes agree and sometimes not, the same for every run.
                    decision = "3" if (got.item_id + (name == "cem")) % 3 else "4"
                    labels = [LabelInput(m.judgment_id, decision, "r") for m in blind.metrics]
                    with session_scope(own) as s:
                        queues.label_item(
                            session=s, queue_id=queue_id, item_id=got.item_id, reviewer=name, labels=labels
                        )
            finally:
                own.dispose()

        return work

    errors = _run_all([reviewer(name) for name in REVIEWERS])
    assert errors == []
    for name, got in handed.items():
        assert len(got) == len(set(got)), f"{name} was handed an item twice"
    per_item = Counter(i for got in handed.values() for i in got)
    assert len(per_item) == 100 and set(per_item.values()) == {2}
    with session_scope(engine, read_only=True) as s:
        labels = s.exec(select(ReviewLabel.judgment_id, ReviewLabel.reviewer)).all()
        done = s.exec(select(ReviewQueueItem.done, ReviewQueueItem.claimed)).all()
        progress = queues.queue_progress(session=s, queue_id=queue_id)
    per_judgment = Counter(j for j, _ in labels)
    assert len(per_judgment) == 200 and set(per_judgment.values()) == {2}
    assert len(set(labels)) == len(labels) == 400
    assert set(done) == {(2, 2)}
    assert progress.items_done == 100 and progress.open == 0
    assert progress.resolved + progress.disputed == 200
    engine.dispose()


def test_reviewers_on_the_default_queue_never_get_the_same_evaluation(url: str) -> None:
    """The issue's first complaint: two reviewers were handed the same evaluation and one keystroke
    was refused. Five reviewers work the default queue to the end at once: every judgment is
    reviewed exactly once and nobody hits a conflict."""
    engine = create_db_engine(url)
    _fill(engine, 40)
    handed: dict[str, list[str]] = {}

    def reviewer(name: str) -> Callable[[], None]:
        def work() -> None:
            own = create_db_engine(url)
            try:
                while True:
                    with session_scope(own) as s:
                        item = review_queue.reserve_next(session=s, reviewer=name, filters=QueueFilter())
                        if item is None:
                            return
                        handed.setdefault(name, []).append(item.key)
                        versions = [(j.id or 0, j.version) for j in item.judgments]
                    for judgment_id, version in versions:
                        with session_scope(own) as s:
                            corrections.record_review(
                                session=s, judgment_id=judgment_id, expected_version=version, action="confirm",
                                reviewer=name,
                            )  # fmt: skip
            finally:
                own.dispose()

        return work

    names = [f"r{i}" for i in range(5)]
    assert _run_all([reviewer(n) for n in names]) == []
    keys = [k for got in handed.values() for k in got]
    assert len(keys) == len(set(keys)) == 40
    with session_scope(engine, read_only=True) as s:
        events = s.exec(select(JudgmentEvent.judgment_id)).all()
        left = s.exec(select(func.count()).select_from(ReviewAssignment)).one()
    assert len(events) == len(set(events)) == 80
    assert left == 0  # each reservation let go of once its evaluation was reviewed
    engine.dispose()


# PostgreSQL lock order of a queue's settlement (review6 R1): helpers of the counters' concurrency tests.
def test_a_settlement_and_a_lone_review_of_the_same_judgment_do_not_deadlock(pg_engine: Engine) -> None:  # noqa: F811
    """review6 R1. A lone review has taken the review lock (its first step, `_write_review_state`) and is about to
    UPDATE judgment J; a queue label that settles J locks J FOR UPDATE (queues._write_decision), then
    waits for the review lock; the lone review's UPDATE waits for J: a lock-order deadlock."""
    items(pg_engine, 1, metrics=("clarity",))
    queue_id = create(pg_engine, overlap=1)
    taken = take(pg_engine, queue_id, "ana")
    assert taken is not None
    [j] = judgments_of(pg_engine, queue_id, taken.item_id)
    assert j.id is not None

    def settle(s: Session) -> None:
        queues.label_item(
            session=s, queue_id=queue_id, item_id=taken.item_id, reviewer="ana",
            labels=[LabelInput(j.id or 0, "3", "why")], now=NOW,
        )  # fmt: skip

    lone_error: BaseException | None = None
    with pg_engine.connect() as conn, Session(bind=conn) as lone:
        one_writer_per_product(lone, PG_REVIEW_COUNTERS_LOCK, [j.product])  # what record_review does first
        worker, errors = _blocked_writer(pg_engine, settle)
        try:
            record_review(
                session=lone, judgment_id=j.id, expected_version=j.version, action="confirm", reviewer="bob"
            )
            lone.commit()
        except BaseException as exc:
            lone_error = exc
    worker.join(30)
    assert lone_error is None and not errors


def test_a_settlement_does_not_wait_on_a_row_that_merely_references_its_judgment(
    pg_engine: Engine,  # noqa: F811
) -> None:
    """review6 R1: review5 F1's shape on the judgment row: an open transaction inserted a row pointing at J2 (an
    audit event here; a label, a queue judgment, an alignment item, a verdict alike: FOR KEY SHARE).
    A label settling J1 then J2 takes the review lock at J1, then waits FOR UPDATE on J2: every
    review of any other judgment waits behind the review lock."""
    items(pg_engine, 1, metrics=("clarity", "truthfulness"))
    queue_id = create(pg_engine, overlap=1)
    evaluation(pg_engine, "zeta-000", product="zeta", metrics=("clarity",))  # outside the queue
    taken = take(pg_engine, queue_id, "ana")
    assert taken is not None
    j1, j2 = judgments_of(pg_engine, queue_id, taken.item_id)
    with session_scope(pg_engine, read_only=True) as s:
        other = s.exec(text("SELECT id, version FROM judgments WHERE change_id LIKE 'zeta-000%'")).one()  # type: ignore[call-overload]

    def settle(s: Session) -> None:
        queues.label_item(
            session=s, queue_id=queue_id, item_id=taken.item_id, reviewer="ana",
            labels=[LabelInput(j1.id or 0, "3", "why"), LabelInput(j2.id or 0, "3", "why")], now=NOW,
        )  # fmt: skip

    lone_error: BaseException | None = None
    with pg_engine.connect() as holder:
        holder.execute(
            text(
                "INSERT INTO judgment_events (judgment_id, change_id, action, reviewer, at, version) "
                "VALUES (:j, 'x', 'noted', 'someone', now(), 1)"
            ),
            {"j": j2.id},
        )
        worker, errors = _blocked_writer(pg_engine, settle)
        try:
            with session_scope(pg_engine) as s:
                s.connection().execute(text("SET LOCAL lock_timeout = '2s'"))  # waiting fails the test
                record_review(
                    session=s,
                    judgment_id=other[0],
                    expected_version=other[1],
                    action="confirm",
                    reviewer="bob",
                )
        except BaseException as exc:
            lone_error = exc
        holder.rollback()
    worker.join(30)
    assert lone_error is None and not errors
