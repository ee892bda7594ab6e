"""lib.metrics rubric functions called in the SPEC §5 convention `(session, ...)`, on both backends."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select

from lib.metrics import (
    DEFAULT_METRICS,
    METRIC_SLUG_MAP,
    SLUG_DISPLAY_MAP,
    display_name_to_slug,
    metrics_for_product,
    own_metrics,
    products_with_rubrics,
    slug_to_display_name,
    upsert_metric_definitions,
)
from lib.models import MetricDefinition

RUBRIC: list[dict[str, Any]] = [
    {"product": "bot", "slug": "tone", "display_name": "Tone", "min": 0, "max": 1},
    {"product": "bot", "slug": "accuracy", "display_name": "Accuracy", "min": 1, "max": 5},
]


def test_upsert_metric_definitions_takes_session_and_definitions_positionally(engine: Engine) -> None:
    with Session(engine) as s:
        assert upsert_metric_definitions(s, RUBRIC) == 2
        s.commit()
    with Session(engine) as s:
        assert [m.slug for m in metrics_for_product(s, "bot")] == ["tone", "accuracy"]


@pytest.mark.parametrize("positional", [True, False])
def test_metrics_for_product_accepts_positional_and_keyword_calls(engine: Engine, positional: bool) -> None:
    with Session(engine) as s:
        upsert_metric_definitions(session=s, definitions=RUBRIC)
        s.commit()
        specs = metrics_for_product(s, "bot") if positional else metrics_for_product(session=s, product="bot")
    assert [(m.slug, m.min_value, m.max_value, m.integer_scale) for m in specs] == [
        ("tone", 0.0, 1.0, False),
        ("accuracy", 1.0, 5.0, True),
    ]


def test_product_without_rubric_gets_the_default_set_positionally(engine: Engine) -> None:
    with Session(engine) as s:
        assert metrics_for_product(s, "unknown") == list(DEFAULT_METRICS)


def test_a_rubric_read_sees_the_sessions_unflushed_changes_and_says_whether_the_product_has_its_own(
    engine: Engine,
) -> None:
    """The read is one Core statement (built once), not an ORM query: run by the session, it sees
    what the session holds but has not flushed, as the query did (read on the connection: 5.0)."""
    with Session(engine) as s:
        assert own_metrics(s, "bot") is None
        upsert_metric_definitions(s, RUBRIC)
        s.flush()
        tone = s.exec(select(MetricDefinition).where(MetricDefinition.slug == "tone")).one()
        tone.max_value = 9.0  # pending, not flushed
        assert [(m.slug, m.max_value) for m in metrics_for_product(s, "bot")] == [
            ("tone", 9.0),
            ("accuracy", 5.0),
        ]
        own = own_metrics(s, "bot")
        assert own is not None and [m.slug for m in own] == ["tone", "accuracy"]
        assert own_metrics(s, "app") is None and metrics_for_product(s, "app") == list(DEFAULT_METRICS)


def test_products_with_rubrics_takes_the_session_positionally(engine: Engine) -> None:
    with Session(engine) as s:
        upsert_metric_definitions(s, [*RUBRIC, {**RUBRIC[0], "product": "app"}])
        s.commit()
        assert products_with_rubrics(s) == ["app", "bot"]


@pytest.mark.parametrize(("name", "slug"), sorted(METRIC_SLUG_MAP.items()))
def test_default_display_names_and_slugs_map_both_ways(name: str, slug: str) -> None:
    assert display_name_to_slug(name) == slug and slug_to_display_name(slug) == name
    assert SLUG_DISPLAY_MAP[slug] == name


@pytest.mark.parametrize("unknown", ["truthfulness", "Tone", "", "CLARITY"])
def test_an_unknown_display_name_raises(unknown: str) -> None:
    with pytest.raises(ValueError, match="unknown metric display name"):
        display_name_to_slug(unknown)


@pytest.mark.parametrize("unknown", ["Truthfulness", "tone", ""])
def test_an_unknown_slug_raises(unknown: str) -> None:
    with pytest.raises(ValueError, match="unknown metric slug"):
        slug_to_display_name(unknown)
