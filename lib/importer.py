"""Bulk import of evaluations, judgments, notes and metric sets (SPEC §6): all or nothing.

A file is validated completely before anything is written; the first fault refuses the whole file
with its name, line (or record) and field. Validated rows are spooled to an anonymous temporary
file, so memory stays bounded by one chunk however long the file is, and are then written in one
transaction with bulk Core inserts. JSONL lines over `MAX_LINE_BYTES` are refused after reading
only that many bytes.

Identity, so that importing the same file twice never duplicates rows:

- evaluations: the record's ``id`` when it has one, and always its ``source_key``, the SHA-256 of
  the JSON array ``[product, question, model_answer, model_name or ""]``. A record whose id or
  source key is already stored, or appeared earlier in the same file, is skipped (the first one
  wins). The same answer judged again by another judge model is therefore the same evaluation.
- judgments (seed-004 cache): ``change_id``. An entry whose change id is already stored is skipped,
  never overwritten: reviews made in Overrule since the cache was written must not be lost.
- notes: ``(session_id, timestamp, note_type, content)`` after the normalization `lib.notes`
  applies to every note (type upper-cased, language lower-cased, content on one line).
- metric definitions: ``(product, slug)``; an existing definition is updated in place.

Other decisions: an evaluation's snapshot id is its ``id`` or ``snap_<created, UTC>_<first 8 hex
of the source key>`` (lengthened 4 digits at a time only if taken). Each judged metric becomes an
unreviewed `Judgment` ``"{snapshot_id}:{slug}"`` whose decision is the score as text (``f"{x:g}"``).
``weighted_gap``/``judge_meta_score`` absent from a record are computed (SPEC §5) only when some
metric is scored on both sides; otherwise they stay empty rather than claim a perfect judge. A
cache entry carrying a ``user_decision`` is stored as reviewed at its timestamp by the importing
reviewer (the cache does not say who), with "imported" and "overruled"/"confirmed" audit events.
"""

from __future__ import annotations

import hashlib
import json
import math
import pickle
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import IO, Any

from sqlalchemy import JSON, Engine, Table, Text, bindparam, cast, insert, select
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from lib import notes
from lib.corrections import require_reviewer
from lib.db import session_scope
from lib.evidence import HIGHLIGHT_STAGES, stage_counts, verify_evidence_map
from lib.metrics import (
    MetricSpec,
    judge_meta_score,
    metrics_for_product,
    parse_metric_definition,
    resolve_metric_key,
    upsert_metric_definitions,
    weighted_gap,
)
from lib.models import (
    CACHE_DECISIONS,
    EvaluationSnapshot,
    Judgment,
    JudgmentEvent,
    MetricDefinition,
    SessionNote,
    compute_was_corrected,
    utcnow,
)

KINDS = ("evaluations", "judgments", "notes", "metrics")
MIB = 1024 * 1024
# A JSONL line holds one record; anything longer is a broken or hostile file, refused unread.
MAX_LINE_BYTES = 10 * MIB
# JSON documents (cache, metric list) must be parsed whole; this caps the memory that takes.
MAX_DOCUMENT_BYTES = 128 * MIB
CHUNK_ROWS = 1000
SQLITE_IMPORT_CACHE_KIB = 128 * 1024
SUPPORTED_CACHE_VERSIONS = ("1.0",)

_BOM = b"\xef\xbb\xbf"
_CACHE_HEAD = re.compile(r'\{\s*"(cache_version|judgments)"\s*:')
_SNAPSHOTS: Table = EvaluationSnapshot.__table__  # type: ignore[attr-defined]
_JUDGMENTS: Table = Judgment.__table__  # type: ignore[attr-defined]
_NOTES: Table = SessionNote.__table__  # type: ignore[attr-defined]
_METRIC_DEFS: Table = MetricDefinition.__table__  # type: ignore[attr-defined]
_EVENTS: Table = JudgmentEvent.__table__  # type: ignore[attr-defined]


class ImportFailed(Exception):
    """A file that cannot be imported; the message names the file, line and field at fault."""


@dataclass
class ImportReport:
    """What an import did, for the CLI, the upload page and the demo builder."""

    kind: str
    inserted: int
    skipped: int
    judgments: int = 0
    source: str = ""
    updated: int = 0

    def summary(self) -> str:
        """One line for a human: counts of inserted, skipped (or updated) rows and judgments."""
        parts = [f"{self.inserted} inserted"]
        if self.kind == "metrics":
            parts.append(f"{self.updated} updated")
        else:
            parts.append(f"{self.skipped} already present (skipped)")
        if self.kind == "evaluations":
            parts.append(f"{self.judgments} judgments")
        return f"{self.kind}: " + ", ".join(parts)


class _Invalid(Exception):
    """A fault inside one record; the caller adds where the record is."""

    def __init__(self, field_name: str | None, message: str) -> None:
        super().__init__(message)
        self.field_name = field_name
        self.message = message


def _failure(where: str, exc: _Invalid) -> ImportFailed:
    if exc.field_name:
        return ImportFailed(f"{where}, field {exc.field_name!r}: {exc.message}")
    return ImportFailed(f"{where}: {exc.message}")


# ---------------------------------------------------------------------------------------------
# Field checks shared by every kind


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number" if isinstance(value, int | float) else "?"
    )


@cache
def _column_limit(table: Table, column: str) -> int | None:
    return getattr(table.c[column].type, "length", None)


def _text(
    record: dict[str, Any],
    name: str,
    *,
    table: Table | None = None,
    required: bool = False,
    path: str | None = None,
) -> str | None:
    """A string field, checked for presence, type, NUL characters and the column's length."""
    value = record.get(name)
    if value is None:
        if required:
            raise _Invalid(path or name, "is required")
        return None
    if value.__class__ is not str:
        raise _Invalid(path or name, f"must be a string, got {_type_name(value)}")
    if required and not value.strip():
        raise _Invalid(path or name, "must not be empty")
    if "\x00" in value:
        # PostgreSQL text cannot hold NUL; refusing keeps both backends identical.
        raise _Invalid(path or name, "contains a NUL character, which cannot be stored")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            # JSON escapes such as "\ud800" decode to lone surrogates that no database can store.
            raise _Invalid(path or name, "contains invalid Unicode (an unpaired surrogate)") from None
    if table is not None:
        limit = _column_limit(table, name)
        if limit is not None and len(value) > limit:
            raise _Invalid(path or name, f"is {len(value)} characters long; at most {limit} allowed")
    return value


def _number(value: Any, label: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Invalid(label, f"must be a number, got {_type_name(value)}")
    try:
        number = float(value)
    except OverflowError:
        raise _Invalid(label, "is too large") from None
    if not math.isfinite(number):
        raise _Invalid(label, "must be a finite number")
    return number


def _timestamp(value: Any, label: str, *, required: bool) -> datetime | None:
    """An ISO 8601 time as aware UTC; a time without offset is taken to be UTC."""
    if value is None:
        if required:
            raise _Invalid(label, "is required")
        return None
    if not isinstance(value, str):
        raise _Invalid(label, f"must be an ISO 8601 time string, got {_type_name(value)}")
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise _Invalid(label, f"{value[:40]!r} is not an ISO 8601 time") from None
    return moment.replace(tzinfo=UTC) if moment.utcoffset() is None else moment.astimezone(UTC)


def _record_object(record: Any) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise _Invalid(None, f"expected a JSON object, got {_type_name(record)}")
    return record


# ---------------------------------------------------------------------------------------------
# Spooling validated rows


class _Spool:
    """Validated rows in chunks on an anonymous temporary file: bounded memory for any file size."""

    def __init__(self) -> None:
        self._file: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        self._buffer: list[Any] = []
        self._chunks = 0

    def add(self, item: Any) -> None:
        self._buffer.append(item)
        if len(self._buffer) >= CHUNK_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self._buffer:
            pickle.dump(self._buffer, self._file, protocol=pickle.HIGHEST_PROTOCOL)
            self._chunks += 1
            self._buffer = []

    def chunks(self) -> Iterator[list[Any]]:
        self._flush()
        self._file.seek(0)
        for _ in range(self._chunks):
            # Safe: this process wrote the file a moment ago and nothing else can reach it (unlinked).
            yield pickle.load(self._file)  # noqa: S301

    def close(self) -> None:
        self._file.close()


def _existing(session: Session, column: Any, values: Sequence[Any]) -> set[Any]:
    """Which of `values` the column already holds (indexed IN lookups in slices)."""
    found: set[Any] = set()
    for i in range(0, len(values), 500):
        part = values[i : i + 500]
        if part:
            found.update(session.execute(select(column).where(column.in_(part))).scalars())
    return found


_SNAPSHOT_JSON_COLUMNS = ("bonus_metrics", "user_scores_json", "judge_scores_json", "evidence_json")


def _encode_json_columns(row: dict[str, Any], columns: Sequence[str]) -> dict[str, Any]:
    """The row with its JSON columns serialized once, now (as SQLAlchemy's JSON type would)."""
    for column in columns:
        row[_json_key(column)] = json.dumps(row.pop(column))
    return row


def _json_key(column: str) -> str:
    # A bind parameter may not share its column's name in an INSERT, hence the suffix.
    return f"{column}__json"


@cache
def _bulk_insert(table: Table, dialect: str) -> Any:
    """INSERT for `table` whose JSON columns take pre-serialized text (`<column>__json` keys).

    Rows reach the spool with their JSON already encoded, so a chunk pickles and loads as flat
    strings instead of thousands of nested dicts, and nothing is serialized twice. SQLite stores
    the text as is (as its JSON type would); PostgreSQL casts the text to json.
    """
    values: dict[str, Any] = {}
    for column in table.columns:
        if isinstance(column.type, JSON):
            param = bindparam(_json_key(column.name), type_=Text())
            values[column.name] = param if dialect == "sqlite" else cast(param, column.type)
    return insert(table).values(values) if values else insert(table)


def _write_rows(session: Session, table: Table, rows: list[dict[str, Any]]) -> None:
    """One bulk Core insert (executemany / insertmanyvalues), never one ORM object per row."""
    if not rows:
        return
    try:
        session.execute(_bulk_insert(table, session.get_bind().dialect.name), rows)
    except IntegrityError as exc:
        detail = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else ""
        raise ImportFailed(
            f"the database refused these {table.name} rows ({detail}); another import probably "
            "stored the same rows at the same time: run this one again"
        ) from exc


@contextmanager
def _roomy_sqlite_cache(session: Session) -> Iterator[None]:
    """A bigger SQLite page cache while bulk writing: index pages stop being evicted and re-read."""
    if session.get_bind().dialect.name != "sqlite":
        yield
        return
    conn = session.connection()
    previous = int(conn.exec_driver_sql("PRAGMA cache_size").scalar() or -2000)
    conn.exec_driver_sql(f"PRAGMA cache_size=-{SQLITE_IMPORT_CACHE_KIB}")
    try:
        yield
    finally:
        conn.exec_driver_sql(f"PRAGMA cache_size={previous}")


# ---------------------------------------------------------------------------------------------
# Evaluations


def source_key_of(product: str, question: str, model_answer: str, model_name: str | None) -> str:
    """The identity of an evaluation across re-imports: SHA-256 of its product, question, answer, model."""
    payload = json.dumps([product, question, model_answer, model_name or ""], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _snapshot_id(created: datetime, source_key: str, taken: Callable[[str], bool]) -> str:
    """`snap_<time>_<8 hex of the source key>`, lengthened only when that id is already taken."""
    stem = f"snap_{created:%Y%m%d_%H%M%S}_"
    # Records without created_at share the import's second, so 8 hex digits can collide in big files.
    for length in range(8, 64 - len(stem) + 1, 4):
        candidate = stem + source_key[:length]
        if not taken(candidate):
            return candidate
    raise ImportFailed(f"cannot find a free snapshot id for source key {source_key}")


class _MetricSet:
    """A product's metrics with an exact key → slug lookup (slugs and display names, never lower())."""

    def __init__(self, product: str, specs: list[MetricSpec]) -> None:
        self.product = product
        self.specs = specs
        self.by_slug = {s.slug: s for s in specs}
        self.keys = {s.display_name: s.slug for s in specs} | {s.slug: s.slug for s in specs}

    def resolve(self, key: Any, label: str) -> str:
        if not isinstance(key, str):
            raise _Invalid(label, f"metric name must be a string, got {_type_name(key)}")
        slug = self.keys.get(key)
        if slug is None:
            try:
                resolve_metric_key(key, self.specs, self.product)
            except ValueError as exc:
                raise _Invalid(label, str(exc)) from None
        return slug  # type: ignore[return-value]


def _scores(raw: Any, name: str, metrics: _MetricSet) -> dict[str, dict[str, Any]]:
    """`{key: number | {"score", "reason"|"rationale"}}` → `{slug: {"score", "reason"}}`, validated."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _Invalid(name, f"must be an object of {{metric: score}}, got {_type_name(raw)}")
    out: dict[str, dict[str, Any]] = {}
    for key, value in raw.items():
        # Labels are built only on the error paths: this loop runs for every score of every line.
        slug = metrics.keys.get(key) or metrics.resolve(key, f"{name}.{key}")
        if slug in out:
            raise _Invalid(f"{name}.{key}", f"metric {slug!r} is given twice (as slug and display name)")
        reason = None
        if value.__class__ is dict:
            if "score" not in value:
                raise _Invalid(f"{name}.{key}.score", "is required when a score is an object")
            reason = value.get("reason")
            reason_key = "reason" if reason is not None else "rationale"
            reason = value.get(reason_key)
            if reason is not None and (
                reason.__class__ is not str or "\x00" in reason or not reason.isascii()
            ):
                reason = _text(value, reason_key, path=f"{name}.{key}.{reason_key}")
            value = value["score"]
        if value is not None:
            try:
                number = metrics.by_slug[slug].validate(value)
            except ValueError as exc:
                raise _Invalid(f"{name}.{key}", str(exc)) from None
            except OverflowError:
                raise _Invalid(f"{name}.{key}", "score is too large") from None
            value = value if value.__class__ is int else number
        out[slug] = {"score": value, "reason": reason}
    return out


def _evidence_items(raw: Any, metrics: _MetricSet) -> dict[str, list[dict[str, Any]]]:
    """Evidence as `{metric: [items]}` or the seed shape `{metric: {"evidence": [items]}}`, checked."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _Invalid("evidence", f"must be an object of {{metric: [items]}}, got {_type_name(raw)}")
    out: dict[str, list[dict[str, Any]]] = {}
    for key, value in raw.items():
        label = f"evidence.{key}"
        slug = metrics.resolve(key, label)
        if slug in out:
            raise _Invalid(label, f"metric {slug!r} is given twice (as slug and display name)")
        if isinstance(value, dict):
            label += ".evidence"
            value = value.get("evidence") or []
        if not isinstance(value, list):
            raise _Invalid(label, f"must be a list of evidence items, got {_type_name(value)}")
        items = []
        for i, item in enumerate(value):
            item_label = f"{label}[{i}]"
            if not isinstance(item, dict):
                raise _Invalid(item_label, f"must be an object, got {_type_name(item)}")
            _text(item, "quote", required=True, path=f"{item_label}.quote")
            for end in ("start", "end"):
                pos = item.get(end)
                if pos is not None and (isinstance(pos, bool) or not isinstance(pos, int)):
                    raise _Invalid(
                        f"{item_label}.{end}", f"must be an integer or null, got {_type_name(pos)}"
                    )
            items.append(dict(item))
        out[slug] = items
    return out


@dataclass
class _Prepared:
    """Validated rows waiting in a spool, plus what validation already decided."""

    spool: _Spool
    source: str
    skipped: int = 0
    used_ids: set[str] = field(default_factory=set)

    def close(self) -> None:
        self.spool.close()


def _evaluation_row(
    record: Any, metric_set: Callable[[str], _MetricSet], reviewer: str
) -> tuple[dict[str, Any], list[tuple[str, Any, str | None]], bool]:
    """One record → (snapshot row, judged metrics, whether the id was given), or _Invalid."""
    record = _record_object(record)
    question = _text(record, "question", required=True)
    answer = _text(record, "model_answer", required=True)
    product = _text(record, "product", table=_SNAPSHOTS, required=True).strip()  # type: ignore[union-attr]
    assert question is not None and answer is not None
    if record.get("user_scores") is None and record.get("judge_scores") is None:
        raise _Invalid("user_scores", "is required (user_scores and/or judge_scores)")
    metrics = metric_set(product)
    user = _scores(record.get("user_scores"), "user_scores", metrics)
    judge = _scores(record.get("judge_scores"), "judge_scores", metrics)
    if not user and not judge:
        raise _Invalid("user_scores", "user_scores and judge_scores are both empty")
    evidence = _evidence_items(record.get("evidence"), metrics)

    model_name = _text(record, "model_name", table=_SNAPSHOTS)
    snapshot_id = _text(record, "id", table=_SNAPSHOTS)
    if snapshot_id is not None and not snapshot_id.strip():
        raise _Invalid("id", "must not be empty")
    question_id = record.get("question_id")
    if isinstance(question_id, int) and not isinstance(question_id, bool):
        question_id = str(question_id)
    question_id = _text({"question_id": question_id}, "question_id", table=_SNAPSHOTS)

    primary = record.get("primary_metric")
    primary = metrics.resolve(primary, "primary_metric") if primary is not None else metrics.specs[0].slug
    bonus_raw = record.get("bonus_metrics") or []
    if not isinstance(bonus_raw, list):
        raise _Invalid("bonus_metrics", f"must be a list of metric names, got {_type_name(bonus_raw)}")
    bonus: list[str] = []
    for i, key in enumerate(bonus_raw):
        slug = metrics.resolve(key, f"bonus_metrics[{i}]")
        if slug not in bonus:
            bonus.append(slug)

    # Seed-002 evidence shape: every scored or evidenced metric, in the rubric's order.
    evidence_json: dict[str, Any] = {}
    rescaled_gaps: list[float] = []
    for spec in metrics.specs:
        if spec.slug not in user and spec.slug not in judge and spec.slug not in evidence:
            continue
        u = user.get(spec.slug, {})
        j = judge.get(spec.slug, {})
        us, js = u.get("score"), j.get("score")
        if us is not None and js is not None:
            rescaled_gaps.append(spec.rescaled_gap(us, js))
        evidence_json[spec.slug] = {
            "user_score": us,
            "judge_score": js,
            "metric_gap": round(abs(us - js), 4) if us is not None and js is not None else None,
            "user_reason": u.get("reason"),
            "judge_reason": j.get("reason"),
            "evidence": evidence.get(spec.slug, []),
        }
    evidence_json = verify_evidence_map(answer, evidence_json)
    counts = stage_counts(evidence_json)

    given_gap = record.get("weighted_gap")
    if given_gap is not None:
        gap: float | None = _number(given_gap, "weighted_gap")
        if gap < 0:  # type: ignore[operator]
            raise _Invalid("weighted_gap", "must not be negative")
    else:
        # No metric scored on both sides means there is no gap to weigh, not a perfect judge.
        gap = weighted_gap(metrics.specs, user, judge, primary, bonus) if rescaled_gaps else None
    given_meta = record.get("judge_meta_score")
    if given_meta is not None:
        meta_value = _number(given_meta, "judge_meta_score")
        if not meta_value.is_integer() or not 1 <= meta_value <= 5:
            raise _Invalid("judge_meta_score", f"must be a whole number from 1 to 5, got {given_meta}")
        meta: int | None = int(meta_value)
    else:
        meta = judge_meta_score(gap) if gap is not None else None

    created = _timestamp(record.get("created_at"), "created_at", required=False) or utcnow()
    key = source_key_of(product, question, answer, model_name)
    row = {
        "id": snapshot_id,
        "created_at": created,
        "question_id": question_id,
        "question": question,
        "model_answer": answer,
        "model_name": model_name,
        "judge_model": _text(record, "judge_model", table=_SNAPSHOTS),
        "product": product,
        "language": _text(record, "language", table=_SNAPSHOTS) or "en",
        "category": _text(record, "category", table=_SNAPSHOTS),
        "primary_metric": primary,
        "bonus_metrics": bonus,
        "user_scores_json": user,
        "judge_scores_json": judge,
        "evidence_json": evidence_json,
        "judge_meta_score": meta,
        "weighted_gap": gap,
        "max_metric_gap": round(max(rescaled_gaps), 4) if rescaled_gaps else None,
        "evidence_count": sum(counts.values()),
        "evidence_highlighted": sum(counts[s] for s in HIGHLIGHT_STAGES),
        "evidence_unlocated": counts["whitespace"],
        "evidence_unverified": counts["unverified"],
        "overall_feedback": _text(record, "overall_feedback"),
        "status": "active",
        "source_key": key,
        "created_by": reviewer,
    }
    judged = [(slug, s["score"], s["reason"]) for slug, s in judge.items() if s["score"] is not None]
    return row, judged, snapshot_id is not None


def _prepare_evaluations(
    *, session: Session, records: Iterable[tuple[str, Any]], source: str, reviewer: str
) -> _Prepared:
    """Validate every record (raising ImportFailed at the first fault) and spool the rows."""
    prepared = _Prepared(spool=_Spool(), source=source)
    metric_sets: dict[str, _MetricSet] = {}
    seen_keys: set[str] = set()

    def metric_set(product: str) -> _MetricSet:
        if product not in metric_sets:
            metric_sets[product] = _MetricSet(product, metrics_for_product(session=session, product=product))
        return metric_sets[product]

    try:
        for where, record in records:
            try:
                row, judged, explicit = _evaluation_row(record, metric_set, reviewer)
            except _Invalid as exc:
                raise _failure(where, exc) from None
            if row["source_key"] in seen_keys or (explicit and row["id"] in prepared.used_ids):
                prepared.skipped += 1
                continue
            if not explicit:
                row["id"] = _snapshot_id(row["created_at"], row["source_key"], prepared.used_ids.__contains__)
            seen_keys.add(row["source_key"])
            prepared.used_ids.add(row["id"])
            prepared.spool.add((_encode_json_columns(row, _SNAPSHOT_JSON_COLUMNS), judged, explicit))
    except BaseException:
        prepared.close()
        raise
    return prepared


def _judgment_rows(row: Mapping[str, Any], judged: list[tuple[str, Any, str | None]]) -> list[dict[str, Any]]:
    """One unreviewed Judgment per judged metric of a snapshot; the decision is the score as text."""
    return [
        {
            "change_id": f"{row['id']}:{slug}",
            "product": row["product"],
            "metric": slug,
            "snapshot_id": row["id"],
            "decision": f"{score:g}",
            "reasoning": reason,
            "judge_model": row["judge_model"],
            "timestamp": row["created_at"],
            "version": 1,
            "was_corrected": False,
        }
        for slug, score, reason in judged
    ]


def build_snapshot_rows(
    record: Mapping[str, Any], metrics: Sequence[MetricSpec], *, reviewer: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One evaluation record → (snapshot row, judgment rows), validated as an import would; for the judge.

    The record must carry its `id`. Rows use the model's field names and plain values, ready for
    `EvaluationSnapshot(**row)` and `Judgment(**judgment)`. ImportFailed names the field at fault.
    """
    metric_set = _MetricSet(str(record.get("product") or "").strip(), list(metrics))
    try:
        row, judged, _explicit = _evaluation_row(record, lambda _product: metric_set, reviewer)
    except _Invalid as exc:
        raise _failure("evaluation", exc) from None
    if not row["id"]:
        raise ImportFailed("evaluation, field 'id': is required")
    return row, _judgment_rows(row, judged)


def _free_snapshot_id(session: Session, row: dict[str, Any], used_ids: set[str]) -> str:
    """A longer generated id for a row whose id an unrelated stored snapshot already uses."""

    def taken(candidate: str) -> bool:
        return candidate in used_ids or bool(_existing(session, _SNAPSHOTS.c.id, [candidate]))

    snapshot_id = _snapshot_id(row["created_at"], row["source_key"], taken)
    used_ids.add(snapshot_id)
    return snapshot_id


def _write_evaluations(session: Session, prepared: _Prepared) -> ImportReport:
    """Insert the spooled snapshots and their judgments, skipping what the database already holds."""
    inserted = judgments = 0
    skipped = prepared.skipped
    with _roomy_sqlite_cache(session):
        for chunk in prepared.spool.chunks():
            existing_ids = _existing(session, _SNAPSHOTS.c.id, [row["id"] for row, _, _ in chunk])
            existing_keys = _existing(
                session, _SNAPSHOTS.c.source_key, [row["source_key"] for row, _, _ in chunk]
            )
            rows: list[dict[str, Any]] = []
            judgment_rows: list[dict[str, Any]] = []
            for row, judged, explicit in chunk:
                if row["source_key"] in existing_keys or (explicit and row["id"] in existing_ids):
                    skipped += 1
                    continue
                if row["id"] in existing_ids:
                    row["id"] = _free_snapshot_id(session, row, prepared.used_ids)
                rows.append(row)
                judgment_rows.extend(_judgment_rows(row, judged))
            _write_rows(session, _SNAPSHOTS, rows)
            taken_changes = _existing(
                session, _JUDGMENTS.c.change_id, [j["change_id"] for j in judgment_rows]
            )
            judgment_rows = [j for j in judgment_rows if j["change_id"] not in taken_changes]
            _write_rows(session, _JUDGMENTS, judgment_rows)
            inserted += len(rows)
            judgments += len(judgment_rows)
    return ImportReport("evaluations", inserted, skipped, judgments, prepared.source)


def import_evaluations(
    *,
    session: Session,
    records: Iterable[dict[str, Any]],
    source: str = "<records>",
    reviewer: str = "import",
) -> ImportReport:
    """Validate parsed evaluation records and bulk insert them with their judgments, all or nothing."""
    numbered = ((f"{source} record {i}", record) for i, record in enumerate(records, start=1))
    prepared = _prepare_evaluations(session=session, records=numbered, source=source, reviewer=reviewer)
    try:
        return _write_evaluations(session, prepared)
    finally:
        prepared.close()


# ---------------------------------------------------------------------------------------------
# Notes


def _note_row(record: Any, reviewer: str) -> dict[str, Any]:
    """One seed-000 note record → a session_notes row, normalized exactly as `lib.notes.add_note` does."""
    record = _record_object(record)
    raw_type = _text(record, "note_type", required=True)
    try:
        note_type = notes.normalize_note_type(raw_type or "")
    except ValueError as exc:
        raise _Invalid("note_type", str(exc)) from None
    try:
        language = notes.normalize_language(_text(record, "language"))
    except ValueError as exc:
        raise _Invalid("language", str(exc)) from None
    content = notes.clean_content(_text(record, "content", required=True) or "")
    if not content:
        raise _Invalid("content", "must not be empty")
    if len(content) > notes.MAX_CONTENT_CHARS:
        raise _Invalid(
            "content", f"is {len(content)} characters long; at most {notes.MAX_CONTENT_CHARS} allowed"
        )
    code = (_text(record, "phelps_code", table=_NOTES) or "").strip() or None
    confidence = record.get("confidence")
    if confidence is not None:
        confidence = _number(confidence, "confidence")
        if not 0.0 <= confidence <= 1.0:
            raise _Invalid("confidence", f"{confidence:g} is outside 0–1")
    if note_type != "SUCCESS":
        # Seed convention: other types pass "" and 0.0 for "no code, no confidence".
        if code is not None:
            raise _Invalid("phelps_code", f"only SUCCESS notes carry a code; this is a {note_type} note")
        if confidence:
            raise _Invalid("confidence", f"only SUCCESS notes carry a confidence; this is a {note_type} note")
        confidence = None
    session_id = (_text(record, "session_id", table=_NOTES, required=True) or "").strip()
    return {
        "timestamp": _timestamp(record.get("timestamp"), "timestamp", required=True),
        "language": language,
        "note_type": note_type,
        "content": content,
        "phelps_code": code,
        "confidence": confidence,
        "session_id": session_id,
        "pinned": False,
        "auto_pinned": False,
        _json_key("prerequisites"): json.dumps({}),
        "created_by": reviewer,
    }


def _note_identity(row: Mapping[str, Any]) -> tuple[str, datetime, str, str]:
    return row["session_id"], row["timestamp"], row["note_type"], row["content"]


def _prepare_notes(*, records: Iterable[tuple[str, Any]], source: str, reviewer: str) -> _Prepared:
    prepared = _Prepared(spool=_Spool(), source=source)
    seen: set[tuple[str, datetime, str, str]] = set()
    try:
        for where, record in records:
            try:
                row = _note_row(record, reviewer)
            except _Invalid as exc:
                raise _failure(where, exc) from None
            identity = _note_identity(row)
            if identity in seen:
                prepared.skipped += 1
                continue
            seen.add(identity)
            prepared.spool.add(row)
    except BaseException:
        prepared.close()
        raise
    return prepared


def _write_notes(session: Session, prepared: _Prepared) -> ImportReport:
    inserted, skipped = 0, prepared.skipped
    for chunk in prepared.spool.chunks():
        sessions = sorted({row["session_id"] for row in chunk})
        stored: set[tuple[str, datetime, str, str]] = set()
        for i in range(0, len(sessions), 500):
            result = session.execute(
                select(_NOTES.c.session_id, _NOTES.c.timestamp, _NOTES.c.note_type, _NOTES.c.content).where(
                    _NOTES.c.session_id.in_(sessions[i : i + 500])
                )
            )
            stored.update((s, t, n, c) for s, t, n, c in result)
        rows = [row for row in chunk if _note_identity(row) not in stored]
        skipped += len(chunk) - len(rows)
        _write_rows(session, _NOTES, rows)
        inserted += len(rows)
    if inserted:
        notes.invalidate_notes_cache(session)
    return ImportReport("notes", inserted, skipped, source=prepared.source)


def import_notes(
    *,
    session: Session,
    records: Iterable[dict[str, Any]],
    source: str = "<records>",
    reviewer: str = "import",
) -> ImportReport:
    """Validate seed-000 note records and bulk insert the ones not stored yet, all or nothing."""
    numbered = ((f"{source} record {i}", record) for i, record in enumerate(records, start=1))
    prepared = _prepare_notes(records=numbered, source=source, reviewer=reviewer)
    try:
        return _write_notes(session, prepared)
    finally:
        prepared.close()


# ---------------------------------------------------------------------------------------------
# Judgments (seed-004 JSON cache)


def _cache_judgment_row(key: str, entry: Any, reviewer: str) -> dict[str, Any]:
    entry = _record_object(entry)
    _text({"change_id": key}, "change_id", table=_JUDGMENTS, required=True)
    if "change_id" in entry and entry["change_id"] != key:
        raise _Invalid("change_id", f"{entry['change_id']!r} differs from its key in 'judgments'")
    decision = _text(entry, "decision", required=True)
    if decision not in CACHE_DECISIONS:
        raise _Invalid("decision", f"{decision!r} is not one of {', '.join(CACHE_DECISIONS)}")
    user_decision = _text(entry, "user_decision")
    if user_decision is not None and user_decision not in CACHE_DECISIONS:
        raise _Invalid("user_decision", f"{user_decision!r} is not one of {', '.join(CACHE_DECISIONS)}")
    confidence = entry.get("confidence")
    if confidence is not None:
        confidence = _number(confidence, "confidence")
    timestamp = _timestamp(entry.get("timestamp"), "timestamp", required=True)
    reviewed = user_decision is not None
    return {
        "change_id": key,
        "product": _text(entry, "product", table=_JUDGMENTS, required=True).strip(),  # type: ignore[union-attr]
        "metric": None,
        "snapshot_id": None,
        "decision": decision,
        "confidence": confidence,
        "reasoning": _text(entry, "reasoning"),
        "user_decision": user_decision,
        "user_reasoning": _text(entry, "user_reasoning"),
        # The cache does not say who reviewed an entry; the import's author vouches for it.
        "reviewer": reviewer if reviewed else None,
        "timestamp": timestamp,
        "reviewed_at": timestamp if reviewed else None,
        # Like a judgment reviewed in Overrule: version 1 judged, version 2 reviewed.
        "version": 2 if reviewed else 1,
        "was_corrected": compute_was_corrected(decision, user_decision),
        "url": _text(entry, "url"),
        "description": _text(entry, "description"),
        "ai_provider": _text(entry, "ai_provider", table=_JUDGMENTS),
    }


def import_judgments_cache(
    *, session: Session, data: Any, source: str = "<cache>", reviewer: str = "import"
) -> ImportReport:
    """Import a seed-004 JSON cache; entries whose change_id is stored are skipped, never overwritten."""
    if not isinstance(data, Mapping):
        raise ImportFailed(f"{source}: expected a JSON object with 'cache_version' and 'judgments'")
    version = data.get("cache_version")
    if version is None:
        raise ImportFailed(f"{source}, field 'cache_version': is missing; this is not a seed-004 cache")
    if version not in SUPPORTED_CACHE_VERSIONS:
        raise ImportFailed(
            f"{source}, field 'cache_version': unsupported version {version!r} "
            f"(supported: {', '.join(SUPPORTED_CACHE_VERSIONS)})"
        )
    entries = data.get("judgments")
    if not isinstance(entries, Mapping):
        raise ImportFailed(
            f"{source}, field 'judgments': must be an object of {{change_id: judgment}}, got {_type_name(entries)}"
        )
    rows = []
    for key, entry in entries.items():
        try:
            rows.append(_cache_judgment_row(key, entry, reviewer))
        except _Invalid as exc:
            raise _failure(f"{source}, judgment {key!r}", exc) from None
    stored = _existing(session, _JUDGMENTS.c.change_id, [row["change_id"] for row in rows])
    fresh = [row for row in rows if row["change_id"] not in stored]
    for i in range(0, len(fresh), CHUNK_ROWS):
        chunk = fresh[i : i + CHUNK_ROWS]
        _write_rows(session, _JUDGMENTS, chunk)
        _write_rows(session, _EVENTS, _cache_events(session, chunk, reviewer))
    return ImportReport("judgments", len(fresh), len(rows) - len(fresh), source=source)


def _cache_events(session: Session, rows: list[dict[str, Any]], reviewer: str) -> list[dict[str, Any]]:
    """Audit trail of imported cache entries: "imported", then the review the cache carried, if any."""
    found = session.execute(
        select(_JUDGMENTS.c.change_id, _JUDGMENTS.c.id).where(
            _JUDGMENTS.c.change_id.in_([row["change_id"] for row in rows])
        )
    )
    ids = {change_id: judgment_id for change_id, judgment_id in found}
    now = utcnow()
    events = []
    for row in rows:
        base = {
            "judgment_id": ids[row["change_id"]],
            "change_id": row["change_id"],
            "reviewer": reviewer,
            "at": now,
        }
        events.append(
            {**base, "action": "imported", "from_decision": None, "to_decision": row["decision"], "reason": None,
             "version": 1}
        )  # fmt: skip
        if row["user_decision"] is not None:
            events.append(
                {**base, "action": "overruled" if row["was_corrected"] else "confirmed",
                 "from_decision": row["decision"], "to_decision": row["user_decision"],
                 "reason": row["user_reasoning"], "version": 2}
            )  # fmt: skip
    return events


# ---------------------------------------------------------------------------------------------
# Metric definitions


def import_metrics(*, session: Session, data: Any, source: str = "<metrics>") -> ImportReport:
    """Create or update metric definitions from a JSON list; one bad entry refuses the whole list."""
    if not isinstance(data, list):
        raise ImportFailed(
            f"{source}: expected a JSON list of {{product, slug, display_name, min, max, description}}"
        )
    seen: set[tuple[str, str]] = set()
    for i, raw in enumerate(data, start=1):
        where = f"{source} item {i}"
        try:
            spec = parse_metric_definition(raw)
        except (ValueError, OverflowError) as exc:
            raise ImportFailed(f"{where}: {exc}") from None
        try:
            # parse_metric_definition str()s these; a number or object there is a broken file.
            for name in ("product", "slug", "display_name", "description"):
                _text(raw, name, table=_METRIC_DEFS if name != "description" else None)
        except _Invalid as exc:
            raise _failure(where, exc) from None
        identity = (str(raw["product"]).strip(), spec.slug)
        if identity in seen:
            raise ImportFailed(
                f"{where}, field 'slug': {spec.slug!r} is defined twice for product {identity[0]!r}"
            )
        seen.add(identity)
    stored = {
        (product, slug)
        for product, slug in session.execute(select(MetricDefinition.product, MetricDefinition.slug))
    }
    count = upsert_metric_definitions(session=session, definitions=data)
    session.flush()
    updated = len(seen & stored)
    return ImportReport("metrics", count - updated, 0, source=source, updated=updated)


# ---------------------------------------------------------------------------------------------
# Files


def _jsonl_records(path: Path, source: str) -> Iterator[tuple[str, Any]]:
    """(location, parsed object) per non-blank line; refuses overlong lines without reading them whole."""
    with path.open("rb") as fh:
        lineno = 0
        while True:
            raw = fh.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            lineno += 1
            where = f"{source} line {lineno}"
            if len(raw) > MAX_LINE_BYTES:
                raise ImportFailed(
                    f"{where}: the line is longer than the {MAX_LINE_BYTES // MIB} MB limit for one record"
                )
            yield where, _parse_json(raw.removeprefix(_BOM) if lineno == 1 else raw, where)


def _parse_json(raw: bytes, where: str) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ImportFailed(f"{where}: not valid UTF-8 text (byte {exc.start + 1})") from None
    if not text.strip():
        return _BLANK
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ImportFailed(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # integers over 4300 digits, absurd nesting
        raise ImportFailed(f"{where}: invalid JSON ({_reason(exc)})") from None


_BLANK = object()


def _reason(exc: Exception) -> str:
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]


def _nonblank(records: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    return ((where, obj) for where, obj in records if obj is not _BLANK)


def _check_document_size(size: int, source: str) -> None:
    if size > MAX_DOCUMENT_BYTES:
        raise ImportFailed(
            f"{source}: {size // MIB} MB is over the {MAX_DOCUMENT_BYTES // MIB} MB limit for a JSON document"
        )


def _parse_document(raw: bytes, source: str) -> Any:
    """A whole JSON document (cache or metric list); errors give line and column."""
    raw = raw.removeprefix(_BOM)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ImportFailed(f"{source}: not valid UTF-8 text (byte {exc.start + 1})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ImportFailed(
            f"{source} line {exc.lineno}: invalid JSON ({exc.msg} at column {exc.colno})"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise ImportFailed(f"{source}: invalid JSON ({_reason(exc)})") from None


def _read_document(path: Path, source: str) -> Any:
    """A whole JSON document from a file, size-capped before it is read."""
    _check_document_size(path.stat().st_size, source)
    return _parse_document(path.read_bytes(), source)


def import_cache_bytes(*, session: Session, raw: bytes, source: str, reviewer: str | None) -> ImportReport:
    """Import an uploaded seed-004 cache file (the Corrections page); any fault writes nothing.

    Every ImportFailed message ends with "nothing was imported", for the page to show as is.
    """
    name = require_reviewer(reviewer)
    try:
        _check_document_size(len(raw), source)
        data = _parse_document(raw, source)
        return import_judgments_cache(session=session, data=data, source=source, reviewer=name)
    except ImportFailed as exc:
        raise ImportFailed(f"{exc}; nothing was imported") from None


def _kind_of_document(data: Any, source: str) -> str:
    if isinstance(data, Mapping) and ("cache_version" in data or "judgments" in data):
        return "judgments"
    if isinstance(data, list) and data and isinstance(data[0], Mapping) and "slug" in data[0]:
        return "metrics"
    raise ImportFailed(
        f"{source}: cannot tell what this file holds; pass --kind evaluations|judgments|notes|metrics"
    )


def detect_kind(path: Path, source: str | None = None) -> tuple[str, Any]:
    """The file's kind and, when telling it required parsing the whole document, that document.

    A JSON list is a metric set; an object starting with "cache_version"/"judgments" is a seed-004
    cache; otherwise the first JSONL object decides: "note_type" → notes, "model_answer" →
    evaluations. A pretty-printed document, whose first line alone is not JSON, is parsed whole.
    """
    source = source or path.name
    with path.open("rb") as fh:
        head = fh.read(64 * 1024).removeprefix(_BOM).decode("utf-8", errors="replace").lstrip()
    if not head:
        raise ImportFailed(f"{source}: the file is empty")
    if head.startswith("["):
        data = _read_document(path, source)
        return _kind_of_document(data, source), data
    if _CACHE_HEAD.match(head):
        return "judgments", None
    try:
        first = next(_nonblank(_jsonl_records(path, source)), None)
    except ImportFailed:
        if not _first_line_is_incomplete(path):
            raise
        data = _read_document(path, source)
        return _kind_of_document(data, source), data
    if first is None:
        raise ImportFailed(f"{source}: the file is empty")
    obj = first[1]
    if isinstance(obj, Mapping):
        if "note_type" in obj:
            return "notes", None
        if "model_answer" in obj:
            return "evaluations", None
    return _kind_of_document(obj, source), None


def _first_line_is_incomplete(path: Path) -> bool:
    """True when the first non-blank line is a JSON prefix cut short (a multi-line document)."""
    with path.open("rb") as fh:
        line = ""
        while not line:
            raw = fh.readline(MAX_LINE_BYTES + 1)
            if not raw or len(raw) > MAX_LINE_BYTES:
                return False
            line = raw.removeprefix(_BOM).decode("utf-8", errors="replace").strip()
    try:
        json.loads(line)
    except json.JSONDecodeError as exc:
        return exc.pos >= len(line)
    except RecursionError:
        return False
    return False


def import_path(*, engine: Engine, path: Path, kind: str | None, reviewer: str) -> ImportReport:
    """Import one file, detecting its kind when not given; a bad file is refused whole."""
    try:
        return _import_file(engine=engine, path=path, kind=kind, reviewer=reviewer)
    except ImportFailed as exc:
        raise ImportFailed(f"{exc}; nothing was imported") from None


def _import_file(*, engine: Engine, path: Path, kind: str | None, reviewer: str) -> ImportReport:
    source = path.name
    if not path.is_file():
        raise ImportFailed(f"{path}: no such file")
    if kind is not None and kind not in KINDS:
        raise ImportFailed(f"unknown kind {kind!r}; choose one of {', '.join(KINDS)}")
    document = None
    if kind is None:
        kind, document = detect_kind(path, source)
    if kind in ("evaluations", "notes"):
        records = _nonblank(_jsonl_records(path, source))
        # Validate under a read-only session: SQLite's write lock is held only for the inserts.
        with session_scope(engine, read_only=True) as session:
            if kind == "evaluations":
                prepared = _prepare_evaluations(
                    session=session, records=records, source=source, reviewer=reviewer
                )
            else:
                prepared = _prepare_notes(records=records, source=source, reviewer=reviewer)
        try:
            with session_scope(engine) as session:
                if kind == "evaluations":
                    return _write_evaluations(session, prepared)
                return _write_notes(session, prepared)
        finally:
            prepared.close()
    data = document if document is not None else _read_document(path, source)
    with session_scope(engine) as session:
        if kind == "judgments":
            return import_judgments_cache(session=session, data=data, source=source, reviewer=reviewer)
        return import_metrics(session=session, data=data, source=source)
