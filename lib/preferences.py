"""A reviewer's remembered choices (issue 26): the review page's queue and filters live in the
database, so a reload, a new tab or another device starts where the reviewer was — not in the
browser, which forgets them on a reload.

A preference is a small JSON object under a name ("review"); saving replaces it whole. Only the
reviewer's own rows are read or written, and an unknown or oversized value is refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlmodel import Session, col, select

from lib.bulk import dialect_insert
from lib.models import ReviewerPreference, utcnow

MAX_PREFERENCE_CHARS = 4_000
MAX_NAME_CHARS = 64


def load_preference(*, session: Session, reviewer: str, name: str) -> dict[str, Any]:
    """The reviewer's saved value for `name` ({} when they never saved one)."""
    value = session.exec(
        select(ReviewerPreference.value).where(
            col(ReviewerPreference.reviewer) == reviewer, col(ReviewerPreference.name) == name
        )
    ).first()
    return dict(value) if isinstance(value, Mapping) else {}


def save_preference(
    *, session: Session, reviewer: str, name: str, value: Mapping[str, Any], now: datetime | None = None
) -> dict[str, Any]:
    """Replace the reviewer's value for `name` (one upsert: two tabs saving at once do not collide)."""
    if not reviewer:
        raise ValueError("a preference belongs to a reviewer")
    if not name or len(name) > MAX_NAME_CHARS:
        raise ValueError(f"a preference name has 1 to {MAX_NAME_CHARS} characters")
    if not isinstance(value, Mapping):
        raise ValueError("a preference is a JSON object")
    text = json.dumps(dict(value), ensure_ascii=False, default=str)
    if len(text) > MAX_PREFERENCE_CHARS:
        raise ValueError(f"a preference is at most {MAX_PREFERENCE_CHARS:,} characters")
    stored = json.loads(text)
    at = now or utcnow()
    stmt = dialect_insert(session, ReviewerPreference).values(
        reviewer=reviewer, name=name, value=stored, updated_at=at
    )
    session.execute(
        stmt.on_conflict_do_update(
            index_elements=["reviewer", "name"], set_={"value": stored, "updated_at": at}
        )
    )
    return stored
