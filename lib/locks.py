"""PostgreSQL advisory locks: which writes wait for each other, and the one way a write takes its lock.

Below every module that writes (lib.db, lib.counters, the importer, the demo loader, OTLP) so each
can import it without an import cycle. Any constants work; they only have to be the same for every
Overrule process on one server.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlmodel import Session

PG_MIGRATION_LOCK = 7_140_512
PG_DEMO_LOCK = 7_140_513  # serialises concurrent first starts of several replicas
PG_IMPORT_LOCK = 7_140_514  # one import writes at a time (lib.importer)
PG_REVIEW_COUNTERS_LOCK = 7_140_515  # reviews move counter rows one transaction at a time (lib.counters)


def one_writer_at_a_time(session: Session, key: int) -> None:
    """Make this write transaction wait until no other holds `key`, and hold it until commit.

    PostgreSQL: a transaction-scoped advisory lock. Read committed gives each later statement a
    fresh snapshot, so the reads after the wait see what the previous holder committed (an import
    then skips rows another one just stored, instead of colliding with them at its insert).
    SQLite: nothing to do, a writing transaction (BEGIN IMMEDIATE) is the only one already.

    A transaction that already took `key` sends nothing: the lock is held to its end (a queue's
    settlement takes the review lock before its judgment's row, then each review would again).
    """
    if session.get_bind().dialect.name != "postgresql":
        return
    taken: dict[int, Any] = session.info.setdefault(_TAKEN, {})
    held = taken.get(key)
    if held is not None and held.is_active:
        return
    session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})
    # The innermost transaction: a savepoint rolled back releases what was taken inside it.
    taken[key] = session.get_nested_transaction() or session.get_transaction()


# session.info key: advisory lock -> the transaction (or savepoint) that took it, while it is open.
_TAKEN = "overrule_advisory_xact_locks"
