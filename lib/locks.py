"""PostgreSQL advisory locks: which writes wait for each other, and the one way a write takes its lock.

Below every module that writes (lib.db, lib.counters, the importer, the demo loader, OTLP) so each
can import it without an import cycle. Any constants work; they only have to be the same for every
Overrule process on one server.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import text
from sqlmodel import Session

PG_MIGRATION_LOCK = 7_140_512
PG_DEMO_LOCK = 7_140_513  # serialises concurrent first starts of several replicas
PG_IMPORT_LOCK = 7_140_514  # one import writes at a time (lib.importer)
# Reviews of one product move its counter rows one transaction at a time (lib.counters): taken per
# product (`one_writer_per_product`), since every counter row's key holds its product.
PG_REVIEW_COUNTERS_LOCK = 7_140_515


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
    _take(session, key, "SELECT pg_advisory_xact_lock(:k)", {"k": key})


# session.info key: advisory lock -> the transaction (or savepoint) that took it, while it is open.
_TAKEN = "overrule_advisory_xact_locks"


def _take(session: Session, lock: Any, statement: str, params: dict[str, Any]) -> None:
    """Send `statement` (it takes `lock`) unless this transaction holds `lock` already."""
    held = session.info.setdefault(_TAKEN, {}).get(lock)
    if held is not None and held.is_active:
        return
    session.execute(text(statement), params)
    _taken(session, lock)


def _taken(session: Session, lock: Any) -> None:
    """Note `lock` as held by the innermost transaction: a savepoint rolled back releases what was
    taken inside it."""
    session.info.setdefault(_TAKEN, {})[lock] = session.get_nested_transaction() or session.get_transaction()


def one_writer_per_product(session: Session, key: int, products: Iterable[str]) -> None:
    """`one_writer_at_a_time` for each of `products` (in sorted order), under `key`: writers of one
    product wait for each other, writers of different products do not.

    Why per product: the reviews' lock breaks lock cycles among counter rows, and every counter row
    has its product in its key, so no cycle spans two products. One lock for all products made a
    review waiting on an import of its product hold up every reviewer of every other product for the
    rest of the import (review15 F1, F3). PostgreSQL's two-key advisory lock (`key`, the product's
    hash): two products that share a hash only wait for each other, as all did before.
    """
    if session.get_bind().dialect.name != "postgresql":
        return
    for product in sorted(set(products)):
        _take(
            session,
            (key, product),
            "SELECT pg_advisory_xact_lock(:k, hashtext(:p))",
            {"k": key, "p": product},
        )


def one_writer_per_product_of_judgment(session: Session, key: int, judgment_id: int) -> None:
    """`one_writer_per_product` for the product of judgment `judgment_id`, read and locked in one
    statement (a queue's settlement knows the judgment, not its product, and takes the lock before
    the judgment's row). The judgment's row is not locked by it."""
    if session.get_bind().dialect.name != "postgresql":
        return
    product = session.execute(
        text("SELECT product, pg_advisory_xact_lock(:k, hashtext(product)) FROM judgments WHERE id = :j"),
        {"k": key, "j": judgment_id},
    ).scalar_one()
    _taken(session, (key, product))
