"""A reviewer's remembered choices (lib.preferences), on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from lib.db import session_scope
from lib.preferences import MAX_PREFERENCE_CHARS, load_preference, save_preference


def test_a_saved_preference_comes_back_for_its_reviewer_only(engine: Engine) -> None:
    with session_scope(engine) as s:
        assert load_preference(session=s, reviewer="ayse", name="review") == {}
        save_preference(session=s, reviewer="ayse", name="review", value={"queue": 3, "product": "acme"})
        save_preference(session=s, reviewer="ben", name="review", value={"queue": None})
    with session_scope(engine, read_only=True) as s:
        assert load_preference(session=s, reviewer="ayse", name="review") == {"queue": 3, "product": "acme"}
        assert load_preference(session=s, reviewer="ben", name="review") == {"queue": None}
        assert load_preference(session=s, reviewer="ayse", name="other") == {}


def test_saving_again_replaces_the_whole_value(engine: Engine) -> None:
    with session_scope(engine) as s:
        save_preference(session=s, reviewer="ayse", name="review", value={"queue": 3, "product": "acme"})
    with session_scope(engine) as s:
        save_preference(session=s, reviewer="ayse", name="review", value={"order": "largest_gap"})
    with session_scope(engine, read_only=True) as s:
        assert load_preference(session=s, reviewer="ayse", name="review") == {"order": "largest_gap"}


@pytest.mark.parametrize(
    ("reviewer", "name", "value", "message"),
    [
        ("", "review", {}, "belongs to a reviewer"),
        ("ayse", "", {}, "1 to 64"),
        ("ayse", "review", ["not", "an", "object"], "JSON object"),
        ("ayse", "review", {"x": "y" * MAX_PREFERENCE_CHARS}, "at most"),
    ],
)
def test_a_bad_preference_is_refused_and_nothing_is_stored(
    engine: Engine, reviewer, name, value, message
) -> None:
    with session_scope(engine) as s, pytest.raises(ValueError, match=message):
        save_preference(session=s, reviewer=reviewer, name=name, value=value)
    with session_scope(engine, read_only=True) as s:
        assert load_preference(session=s, reviewer="ayse", name="review") == {}
