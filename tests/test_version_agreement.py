"""Agreement by judge version (issue 28): every figure equals a recomputation from the raw judgments.

Random data goes through the real write paths (imports naming versions, reviews, undos, re-judges
that keep reviewed entries, archiving); the reference figures are computed here from the judgment
and verdict rows themselves, with scikit-learn's kappa, not from the counts the page reads.
"""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import Engine, text
from sqlmodel import Session, col, select

from lib import importer, inspector, version_agreement
from lib.corrections import add_judgment, parse_score, record_review, undo_review
from lib.db import session_scope
from lib.judge_versions import version_by_name
from lib.metrics import upsert_metric_definitions
from lib.models import UNVERSIONED, EvaluationSnapshot, JudgeVerdict, Judgment
from lib.version_agreement import VersionFilters
from tests.kappa import cohen_kappa_score

pytestmark = pytest.mark.timeout(300)

PRODUCT = "acme"
RUBRIC = [
    {"product": PRODUCT, "slug": "coherence", "display_name": "Coherence", "min": 1, "max": 3},
    {"product": PRODUCT, "slug": "fluency", "display_name": "Fluency", "min": 1, "max": 5},
    {
        "product": PRODUCT,
        "slug": "grounded",
        "display_name": "Grounded",
        "min": 0,
        "max": 1,
        "integer_scale": False,
    },
]
SCALES = {"coherence": (1, 3, True), "fluency": (1, 5, True), "grounded": (0, 1, False)}
T0 = datetime(2026, 9, 7, 9, tzinfo=UTC)
VERSIONS = (None, "v1", "v2")


def _score(rng: random.Random, metric: str) -> float:
    low, high, integer = SCALES[metric]
    return float(rng.randint(int(low), int(high))) if integer else rng.choice((0.0, 0.5, 1.0))


def build(engine: Engine, seed: int) -> None:
    """Evaluations judged by v1, v2 or no version, reviewed, undone, re-judged and archived at random."""
    rng = random.Random(seed)
    with session_scope(engine) as s:
        upsert_metric_definitions(session=s, definitions=RUBRIC)
        records = []
        for n in range(45):
            record: dict[str, Any] = {
                "question": f"q{n}",
                "model_answer": f"a{n}",
                "product": PRODUCT,
                "language": rng.choice(("en", "tr")),
                "created_at": (T0 + timedelta(days=rng.randint(0, 40))).isoformat(),
                "judge_scores": {m: _score(rng, m) for m in SCALES if rng.random() < 0.9},
            }
            version = rng.choice(VERSIONS)
            if version:
                record["judge_version"] = version
            records.append(record)
        importer.import_evaluations(session=s, records=records, reviewer="lead")
        importer.import_judgments_cache(
            session=s,
            data={"cache_version": "1.0", "judgments": {
                f"c{n}": {"product": PRODUCT, "decision": rng.choice(("INCLUDE", "EXCLUDE")),
                          "user_decision": rng.choice(("INCLUDE", "EXCLUDE", None)),
                          "timestamp": (T0 + timedelta(days=n)).isoformat(), "judge_version": "v1"}
                for n in range(25)}},
            reviewer="lead",
        )  # fmt: skip
    with session_scope(engine) as s:
        ids = [j.id for j in s.exec(select(Judgment).where(col(Judgment.metric).is_not(None))).all()]
    for judgment_id in ids:
        if rng.random() > 0.7:
            continue
        with session_scope(engine) as s:
            j = s.get(Judgment, judgment_id)
            assert j is not None and j.metric is not None
            other = _score(rng, j.metric)
            overrule = rng.random() < 0.4 and parse_score(j.decision) != other
            record_review(
                session=s, judgment_id=judgment_id, expected_version=j.version,
                action="overrule" if overrule else "confirm", user_decision=other if overrule else None,
                reviewer=rng.choice(("ayse", "ben")), reason="because",
            )  # fmt: skip
        if rng.random() < 0.1:
            with session_scope(engine) as s:
                j = s.get(Judgment, judgment_id)
                assert j is not None
                undo_review(
                    session=s, judgment_id=judgment_id, expected_version=j.version, reviewer=j.reviewer
                )
    # Re-judges with v2 (and one with v1): kept beside reviewed entries, replacing unreviewed ones.
    with session_scope(engine) as s:
        v1, v2 = version_by_name(s, PRODUCT, "v1"), version_by_name(s, PRODUCT, "v2")
        assert v1 is not None and v2 is not None
        chosen = [
            j
            for j in s.exec(select(Judgment).where(col(Judgment.metric).is_not(None))).all()
            if rng.random() < 0.45
        ]
        for j in chosen:
            target = v2 if rng.random() < 0.8 else v1
            fresh = Judgment(
                change_id=j.change_id, product=j.product, metric=j.metric, snapshot_id=j.snapshot_id,
                decision=str(_score(rng, j.metric or "fluency")).removesuffix(".0"),
                timestamp=T0 + timedelta(days=rng.randint(41, 60)), judge_version_id=target.id,
            )  # fmt: skip
            s.expunge(j)
            add_judgment(session=s, judgment=fresh, reviewer="lead")
    with session_scope(engine) as s:
        snapshots = s.exec(select(EvaluationSnapshot.id)).all()
        for snapshot_id in rng.sample(list(snapshots), 6):
            inspector.archive_evaluation(session=s, snapshot_id=snapshot_id, reviewer="lead")


def raw_pairs(session: Session) -> dict[tuple[str, int, str], list[tuple[str, str]]]:
    """(product, version id, metric) → [(version's decision, reviewer decision)] from the rows themselves."""
    live = {s.id for s in session.exec(select(EvaluationSnapshot)).all() if s.deleted_at is None}
    verdicts = defaultdict(list)
    for v in session.exec(select(JudgeVerdict)).all():
        verdicts[v.judgment_id].append((v.judge_version_id, v.decision))
    out: dict[tuple[str, int, str], list[tuple[str, str]]] = defaultdict(list)
    for j in session.exec(select(Judgment)).all():
        if j.reviewed_at is None or j.user_decision is None or (j.snapshot_id and j.snapshot_id not in live):
            continue
        for version_id, decision in [(j.judge_version_id or UNVERSIONED, j.decision), *verdicts[j.id]]:
            out[(j.product, version_id, j.metric or "")].append((decision, j.user_decision))
    return out


def reference(metric: str, pairs: list[tuple[str, str]]) -> dict[str, float]:
    if metric not in SCALES:
        d, h = [p[0] for p in pairs], [p[1] for p in pairs]
        kappa = cohen_kappa_score(d, h) if len(set(d) | set(h)) > 1 else float("nan")
        return {"pairs": len(pairs), "exact_agreement": float(np.mean([a == b for a, b in pairs])),
                "within_1_agreement": float("nan"), "mean_gap": float("nan"), "kappa": kappa}  # fmt: skip
    low, high, integer = SCALES[metric]
    d = np.array([float(a) for a, _ in pairs])
    h = np.array([float(b) for _, b in pairs])
    gap = np.abs(d - h) * 4 / (high - low)
    kappa = float("nan")
    if integer:
        labels = list(range(int(low), int(high) + 1))
        used = set(d) | set(h)
        kappa = cohen_kappa_score(d, h, labels=labels, weights="quadratic") if len(used) > 1 else float("nan")
    return {
        "pairs": len(pairs),
        "exact_agreement": float(np.mean(d == h)),
        "within_1_agreement": float(np.mean(gap <= 1 + 1e-9)),
        "mean_gap": float(np.mean(gap)),
        "kappa": kappa,
    }


# One random build per dialect (the week arithmetic differs): every figure of the tab is checked on it.
@pytest.mark.parametrize(("db_url", "seed"), [("sqlite", 11), ("postgresql", 12)], indirect=["db_url"])
def test_agreement_per_version_equals_a_recomputation_from_raw_judgments(engine: Engine, seed: int) -> None:
    build(engine, seed)
    _check_same_items(engine)
    _check_timeline(engine)
    with Session(engine) as s:
        expected = raw_pairs(s)
        table = version_agreement.agreement_by_version(session=s, filters=VersionFilters(resamples=200))
    assert len(expected) >= 8  # unversioned, v1 and v2 × metrics, and v1's labels
    assert {v for _, v, _ in expected} >= {UNVERSIONED, 1, 2}
    found = {(r.product, int(r.version_id), r.metric): r for r in table.itertuples()}
    assert set(found) == set(expected)
    for key, pairs in expected.items():
        want, got = reference(key[2], pairs), found[key]
        assert got.pairs == want["pairs"], key
        for measure in version_agreement.MEASURES:
            value = getattr(got, measure)
            if np.isnan(want[measure]):
                assert np.isnan(value), (key, measure)
            else:
                assert value == pytest.approx(want[measure], abs=1e-9), (key, measure)
                lo, hi = getattr(got, f"{measure}_lo"), getattr(got, f"{measure}_hi")
                if want["pairs"] >= 5 and np.isfinite(lo):
                    assert lo - 1e-9 <= value <= hi + 1e-9 or measure == "kappa", (
                        key,
                        measure,
                        lo,
                        value,
                        hi,
                    )


def _check_same_items(engine: Engine) -> None:
    """Same items only uses only the judgments both versions judged; apart, each side all its own."""
    with Session(engine) as s:
        choices = {c.name: c for c in version_agreement.version_choices(session=s)}
        pairs = raw_pairs(s)
        both = version_agreement.compare_versions(
            session=s,
            a=choices["v1"],
            b=choices["v2"],
            same_items=True,
            filters=VersionFilters(resamples=200),
        )
        apart = version_agreement.compare_versions(
            session=s, a=choices["v1"], b=choices["v2"], filters=VersionFilters(resamples=200)
        )
        # The judgments both judged, from the rows.
        v_rows = s.exec(select(JudgeVerdict)).all()
        judged: dict[int, set[int]] = defaultdict(set)
        for j in s.exec(select(Judgment)).all():
            judged[j.id or 0].add(j.judge_version_id or 0)
        for v in v_rows:
            judged[v.judgment_id].add(v.judge_version_id)
        live = {x.id for x in s.exec(select(EvaluationSnapshot)).all() if x.deleted_at is None}
        shared = [
            j for j in s.exec(select(Judgment)).all()
            if {1, 2} <= judged[j.id or 0] and j.reviewed_at is not None and j.user_decision is not None
            and (j.snapshot_id is None or j.snapshot_id in live)
        ]  # fmt: skip
        decisions: dict[tuple[int, int], str] = {
            (j.id or 0, j.judge_version_id or 0): j.decision for j in shared
        }
        decisions.update({(v.judgment_id, v.judge_version_id): v.decision for v in v_rows})
        swapped = version_agreement.compare_versions(
            session=s,
            a=choices["v2"],
            b=choices["v1"],
            same_items=True,
            filters=VersionFilters(resamples=200),
        )
    assert both.shared_items == len(shared) > 0 and not both.cautions
    assert int(both.frame["pairs_a"].sum()) == int(both.frame["pairs_b"].sum()) == len(shared)
    # Every figure of the paired comparison is the shared judgments' own, on each side (the counts it
    # reads keep a pair once, lower version first: B before A must read the same pairs turned round).
    flipped = {r.metric: r for r in swapped.frame.itertuples()}
    for row in both.frame.itertuples():
        mine = [j for j in shared if (j.metric or "") == row.metric]
        side_a = reference(row.metric, [(decisions[(j.id or 0, 1)], j.user_decision or "") for j in mine])
        side_b = reference(row.metric, [(decisions[(j.id or 0, 2)], j.user_decision or "") for j in mine])
        assert row.pairs_a == row.pairs_b == len(mine) == flipped[row.metric].pairs_a
        for measure in version_agreement.MEASURES:
            for got, want in ((getattr(row, f"{measure}_a"), side_a[measure]),
                              (getattr(row, f"{measure}_b"), side_b[measure]),
                              (getattr(flipped[row.metric], f"{measure}_a"), side_b[measure])):  # fmt: skip
                assert np.isnan(got) if np.isnan(want) else got == pytest.approx(want, abs=1e-9), (
                    row.metric,
                    measure,
                )
    # Apart, each side reads all its own pairs; together the pairs are the shared items only.
    by_metric = {r.metric: r for r in apart.frame.itertuples()}
    for metric in ("coherence", "fluency"):
        assert by_metric[metric].pairs_a == len(pairs[(PRODUCT, 1, metric)])
        assert by_metric[metric].pairs_b == len(pairs[(PRODUCT, 2, metric)])
        want = (
            reference(metric, pairs[(PRODUCT, 2, metric)])["exact_agreement"]
            - reference(metric, pairs[(PRODUCT, 1, metric)])["exact_agreement"]
        )
        assert by_metric[metric].exact_agreement_difference == pytest.approx(want)
        assert (
            by_metric[metric].exact_agreement_difference_lo <= by_metric[metric].exact_agreement_difference_hi
        )


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_caution_names_different_weeks_and_languages(engine: Engine) -> None:
    # v1 judged English items in September; v2 Turkish items in November.
    with session_scope(engine) as s:
        upsert_metric_definitions(session=s, definitions=RUBRIC)
        records = [
            {"question": f"q{n}", "model_answer": "a", "product": PRODUCT, "language": "en" if n < 10 else "tr",
             "created_at": (T0 + timedelta(days=0 if n < 10 else 60)).isoformat(),
             "judge_scores": {"fluency": 3}, "judge_version": "v1" if n < 10 else "v2"}
            for n in range(20)
        ]  # fmt: skip
        importer.import_evaluations(session=s, records=records, reviewer="lead")
        for j in s.exec(select(Judgment)).all():
            assert j.id is not None
            record_review(
                session=s, judgment_id=j.id, expected_version=j.version, action="confirm", reviewer="ayse"
            )
    with Session(engine) as s:
        choices = {c.name: c for c in version_agreement.version_choices(session=s)}
        result = version_agreement.compare_versions(session=s, a=choices["v1"], b=choices["v2"])
    text = " ".join(result.cautions)
    assert "different languages (v1: en 100%; v2: tr 100%)" in text
    assert "different weeks (v1: week of 2026-09-07; v2: week of 2026-11-02)" in text
    assert "No reviewed judgment was judged by both" in text


def _check_timeline(engine: Engine) -> None:
    """The timeline counts every reviewed pair once per week and marks where each version starts."""
    parsed: list[object] = []

    def counted_parse(value: object) -> float | None:
        parsed.append(value)
        return parse_score(value)

    with Session(engine) as s:  # what an undone review leaves: a count row at 0, in a week of its own
        s.connection().execute(
            text(
                "INSERT INTO judge_version_counts (judge_version_id, product, language, metric, week, "
                "decision, human, n) SELECT judge_version_id, product, language, metric, :week, decision, "
                "human, 0 FROM judge_version_counts WHERE product = :product LIMIT 1"
            ),
            {"week": date(2001, 1, 1), "product": PRODUCT},
        )
        s.commit()
    with Session(engine) as s, pytest.MonkeyPatch.context() as patch:
        patch.setattr(version_agreement, "parse_score", counted_parse)
        line = version_agreement.timeline(session=s, filters=VersionFilters(products=(PRODUCT,)))
        patch.undo()
        pairs = {k: p for k, p in raw_pairs(s).items() if k[0] == PRODUCT}
    assert int(line.weekly["pairs"].sum()) == sum(len(p) for p in pairs.values())
    assert (line.weekly["pairs"] > 0).all()  # no week of nothing but rows at 0 (their rates: 0 / 0)
    # Pooled over weeks and metrics, each version's exact and within-1 pairs are the raw pairs'.
    for version_id in {v for _, v, _ in pairs}:
        mine = line.weekly[line.weekly["version_id"] == version_id]
        got = [round(float((mine[f"{m}_agreement"] * mine["pairs"]).sum())) for m in ("exact", "within_1")]
        want = [0, 0]
        for (_, v, metric), found in pairs.items():
            if v == version_id:
                measures = reference(metric, found)
                within = measures["exact_agreement" if metric not in SCALES else "within_1_agreement"]
                want[0] += round(measures["exact_agreement"] * len(found))
                want[1] += round(within * len(found))
        assert got == want
    # Score texts are parsed once per distinct text of a (version, metric), not once per count row
    # (the rows fill up with weeks: 108k at 1M evaluations, a second of the Analytics page).
    distinct = sum(len({t for pair in found for t in pair}) for found in pairs.values())
    assert len(parsed) <= 2 * distinct
    # The counts a render read once give the same timeline as the timeline's own read.
    with Session(engine) as s:
        filters = VersionFilters(products=(PRODUCT,))
        shared = version_agreement.timeline(
            session=s, filters=filters, counts=version_agreement.read_counts(s, filters)
        )
        with pytest.raises(ValueError, match="other filters"):  # never another filter's counts
            version_agreement.timeline(
                session=s, filters=filters, counts=version_agreement.read_counts(s, VersionFilters())
            )
    pd.testing.assert_frame_equal(shared.weekly, line.weekly)
    assert set(line.starts["version"]) == {"unversioned", "v1", "v2"}
    for row in line.starts.itertuples():
        part = line.weekly[line.weekly["version_id"] == row.version_id]
        assert row.first_week == part["week"].min()
