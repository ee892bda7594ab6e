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
- interactions (seed 003): ``id``, derived from the content when absent (`lib.interaction_records`);
  a stored one gains the line's expert review only when it has none. Storing interactions
  triggers their auto-evaluation (`import_path`).

Other decisions: an evaluation's snapshot id is its ``id`` or ``snap_<created, UTC>_<first 8 hex
of the source key>`` (lengthened 4 digits at a time only if taken). Each judged metric becomes an
unreviewed `Judgment` ``"{snapshot_id}:{slug}"`` whose decision is the score as text (``corrections.format_score``).
``weighted_gap``/``judge_meta_score`` absent from a record are computed (SPEC §5) only when some
metric is scored on both sides; otherwise they stay empty rather than claim a perfect judge. A
cache entry carrying a ``user_decision`` is stored as reviewed at its timestamp by the importing
reviewer (the cache does not say who), with "imported" and "overruled"/"confirmed" audit events.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter
from pathlib import Path
from typing import IO, Any, TypeVar

from sqlalchemy import Engine, Table, bindparam, false, select
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from lib import bulk, counters, judge_versions, notes, scores, source_records
from lib.auth import Actor, Permission, authorize
from lib.corrections import require_reviewer, review_event_row
from lib.db import LoadStatistics, refresh_statistics, run_retrying, session_scope
from lib.interaction_records import interaction_rows
from lib.json_files import (
    BOM,
    MAX_LINE_BYTES,
    check_document_size,
    jsonl_records,
    nonblank,
    parse_document,
    read_document,
)
from lib.locks import PG_IMPORT_LOCK, one_writer_at_a_time
from lib.metrics import (
    DEFAULT_METRICS,
    MetricSpec,
    ScaleChange,
    metrics_for_product,
    own_metrics,
    parse_metric_definition,
    upsert_metric_definitions,
)
from lib.models import (
    CACHE_DECISIONS,
    EvaluationSnapshot,
    ExpertFeedback,
    Interaction,
    Judgment,
    JudgmentEvent,
    MetricDefinition,
    SessionNote,
    compute_was_corrected,
    utcnow,
)
from lib.prepared import built
from lib.records import (
    ImportFailed,
    InvalidField,
    check_unicode,
    located_failure,
    number_field,
    record_object,
    text_field,
    timestamp_field,
    type_name,
)
from lib.search import normalize_search_text
from lib.snapshots import (
    MetricSet,
    evaluation_row,
    gaps_follow_scales,
    snapshot_judgment_rows,
    text_source_key,
)

SOURCE_KINDS = ("promptfoo", "langfuse", "phoenix")  # other tools' result files (lib.source_files)
# How to file a source file under a product, where the import came from (`SourceOptions.via`).
PRODUCT_ADVICE = {
    "cli": "pass --product NAME",
    "api": "pass ?product=NAME",
    "page": "give the Product field a name",
}
KINDS = ("evaluations", "judgments", "notes", "metrics", "interactions", *SOURCE_KINDS)
CHUNK_ROWS = 1000
# Rows of an import whose input is in memory whole (another tool's results, an OTLP request) kept
# in memory before the spool spills: that input already holds memory of the same order.
IN_MEMORY_CHUNK_ROWS = 20_000
# Late verdict groups (`add_source_verdicts`) added in one round: an import chunk's worth.
LATE_ROUND_GROUPS = IN_MEMORY_CHUNK_ROWS
SQLITE_IMPORT_CACHE_KIB = 128 * 1024
# An import at least this large refreshes SQLite's planner statistics (lib.db.refresh_statistics).
STATISTICS_AFTER_ROWS = 1000
SUPPORTED_CACHE_VERSIONS = ("1.0",)

_Checked = TypeVar("_Checked")
_CACHE_HEAD = re.compile(r'\{\s*"(cache_version|judgments)"\s*:')
_SNAPSHOTS: Table = EvaluationSnapshot.__table__  # type: ignore[attr-defined]
_JUDGMENTS: Table = Judgment.__table__  # type: ignore[attr-defined]
_NOTES: Table = SessionNote.__table__  # type: ignore[attr-defined]
SEED_CODE_FIELD = "phelps_code"  # a note's `code` under seed 000's column name, still accepted
_METRIC_DEFS: Table = MetricDefinition.__table__  # type: ignore[attr-defined]
_EVENTS: Table = JudgmentEvent.__table__  # type: ignore[attr-defined]
_INTERACTIONS: Table = Interaction.__table__  # type: ignore[attr-defined]
_FEEDBACK: Table = ExpertFeedback.__table__  # type: ignore[attr-defined]


@dataclass
class ImportReport:
    """What an import did, for the CLI, the upload page and the demo builder."""

    kind: str
    inserted: int
    skipped: int
    judgments: int = 0
    source: str = ""
    updated: int = 0
    # Interactions: the ids stored by this import, expert reviews added, and the auto-evaluation
    # of the new unreviewed ones (a lib.precedents.RunSummary) that the import triggered.
    new_ids: list[str] = field(default_factory=list)
    expert_reviews: int = 0
    evaluation: Any = None
    # Source files (promptfoo, Langfuse, Phoenix): traces or spans without any judge result, and
    # judgments added to evaluations stored by an earlier import (an eval run on them since).
    unjudged: int = 0
    extended: int = 0
    # Langfuse: scores of a session or dataset run, skipped (Overrule imports trace scores), and
    # TEXT and CORRECTION scores, skipped (text, not a score on a scale).
    off_trace: int = 0
    text_scores: int = 0
    # Phoenix: annotations of a span and name a later one by another identifier replaced.
    superseded: int = 0
    # Langfuse v3: observation scores without their trace, skipped.
    untraced: int = 0
    # Source files: reviewers' scores stored (Langfuse ANNOTATION, Phoenix HUMAN: the evaluation's
    # reviewer side, not judgments), and scores of an evaluation name a stored evaluation has with
    # another score, not taken (review18 M3: neither was said; OTLP warns for the second).
    reviewer_scores: int = 0
    not_taken: int = 0
    # promptfoo and Langfuse files without --product: evaluations filed under the kind's default
    # product (the file names none), that product and how to name one where the import came from (review18 M4: a
    # promptfoo .jsonl went to 'promptfoo' in silence, its results.json to the product it names).
    defaulted: int = 0
    default_product: str = ""
    product_advice: str = ""
    # Evaluations: the id each inserted evaluation got, by its source key, and (source imports)
    # each accepted evaluation's source key by its index among those given: lib.otlp links its
    # spans to them without hashing their content again or reading them back.
    ids_by_source_key: dict[str, str] = field(default_factory=dict)
    source_keys: dict[int, str] = field(default_factory=dict)

    def summary(self) -> str:
        """One line for a human: counts of inserted, skipped (or updated) rows and judgments."""
        parts = [f"{self.inserted} inserted"]
        if self.kind == "metrics":
            parts.append(f"{self.updated} updated")
        else:
            # "skipped" only when nothing of the file was added to them (review19 M2)
            touched = self.extended or self.reviewer_scores
            parts.append(f"{self.skipped} already present" + ("" if touched else " (skipped)"))
        if self.kind in ("evaluations", *SOURCE_KINDS):
            parts.append(_counted(self.judgments, "judgment", "judgments"))
        if self.extended:
            parts.append(f"{self.extended} of them added to evaluations already stored")
        if self.reviewer_scores:
            scores = _counted(self.reviewer_scores, "reviewer score", "reviewer scores")
            parts.append(f"{scores} (ANNOTATION/HUMAN: the reviewer's side)")
        if self.not_taken:
            scores = _counted(self.not_taken, "score differing", "scores differing")
            parts.append(
                f"{scores} from the stored one not taken (a metric's first score is kept; re-judge it in Overrule)"
            )
        if self.unjudged and self.kind == "phoenix":
            # Phoenix's spans dataframe holds every span of the project (chains, retrievers, spans
            # an earlier eval file judged): "without a judge result" would mislead (review14 F7).
            spans = "span" if self.unjudged == 1 else "spans"
            parts.append(f"{self.unjudged:,} other {spans} in the spans file (not judged in this file)")
        elif self.unjudged:
            parts.append(f"{self.unjudged} without a judge result (not imported)")
        if self.off_trace:
            scores = _counted(self.off_trace, "session or dataset-run score", "session or dataset-run scores")
            parts.append(f"{scores} skipped (Overrule imports trace scores)")
        if self.text_scores:
            scores = _counted(self.text_scores, "TEXT or CORRECTION score", "TEXT or CORRECTION scores")
            parts.append(f"{scores} skipped (text, not a score on a scale)")
        if self.untraced:
            scores = _counted(
                self.untraced, "observation score without its", "observation scores without their"
            )
            parts.append(f"{scores} trace skipped")
        if self.superseded:
            annotations = _counted(self.superseded, "annotation", "annotations")
            parts.append(
                f"{annotations} skipped (a later one of the same span and name, by another identifier, is kept)"
            )
        if self.defaulted:
            parts.append(
                f"{self.defaulted} filed under the default product {self.default_product!r} (the file "
                f"names none: {self.product_advice})"
            )
        if self.kind == "interactions":
            parts.append(f"{self.expert_reviews} expert reviews")
        line = f"{self.kind}: " + ", ".join(parts)
        if self.evaluation is not None:
            line += "; auto-evaluated " + self.evaluation.short()
        return line


def _counted(count: int, one: str, many: str) -> str:
    """`count` and what it counts, singular for one ("1 judgment", review18 L4: "1 judgments")."""
    return f"{count} {one if count == 1 else many}"


# ---------------------------------------------------------------------------------------------
# Spooling validated rows


class _Spool:
    """Validated rows in chunks on an anonymous temporary file: bounded memory for any file size.

    The file is made only once a second chunk begins: an import of up to `chunk_rows` rows (an API
    post) keeps its one chunk in memory instead of pickling it to disk and back. Chunks are
    CHUNK_ROWS for a streamed file, whose size memory should not have to hold; an input already
    in memory whole (`import_source_evaluations`: a source file read whole, a decoded OTLP request)
    gains little from spilling and pays for it (pickling 10,000 rows there and back, ten chunks'
    lookups: ~0.1 of an OTLP request's ~2.4 CPU s), so it keeps up to IN_MEMORY_CHUNK_ROWS."""

    def __init__(self, chunk_rows: int | None = None) -> None:
        self._file: IO[bytes] | None = None
        self._buffer: list[Any] = []
        self._chunks = 0
        self._chunk_rows = chunk_rows or CHUNK_ROWS

    def add(self, item: Any) -> None:
        self._buffer.append(item)
        if len(self._buffer) >= self._chunk_rows:
            self._flush()

    def _flush(self) -> None:
        if self._buffer:
            if self._file is None:
                self._file = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
            pickle.dump(self._buffer, self._file, protocol=pickle.HIGHEST_PROTOCOL)
            self._chunks += 1
            self._buffer = []

    def chunks(self) -> Iterator[list[Any]]:
        if self._file is None:  # never spilled: the rows are all in the buffer
            if self._buffer:
                yield self._buffer
            return
        self._flush()
        self._file.seek(0)
        for _ in range(self._chunks):
            # Safe: this process wrote the file a moment ago and nothing else can reach it (unlinked).
            yield pickle.load(self._file)  # noqa: S301

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _existing(session: Session, column: Any, values: Sequence[Any]) -> set[Any]:
    """Which of `values` the column already holds (indexed IN lookups in slices); pending ORM
    changes are flushed first, as a session query would (autoflush)."""
    session.flush()
    return bulk.held_values(session.connection(), column, values)


_SNAPSHOT_JSON_COLUMNS = ("bonus_metrics", "user_scores_json", "judge_scores_json", "evidence_json")


def _encode_json_columns(row: dict[str, Any], columns: Sequence[str]) -> dict[str, Any]:
    """The row with its JSON columns serialized once, now (as SQLAlchemy's JSON type would)."""
    for column in columns:
        row[_json_key(column)] = json.dumps(row.pop(column))
    return row


def _json_key(column: str) -> str:
    # A bind parameter may not share its column's name in an INSERT, hence the suffix.
    return f"{column}__json"


class ImportConflict(ImportFailed):
    """The database refused rows another writer stored at the same moment: nothing is wrong with
    the file, and the same import a moment later skips what is now stored (the API answers 409)."""


def _write_lock(session: Session) -> None:
    """Imports write one at a time (issue 24): taken before the write phase reads what is stored,
    so two imports of the same file never both find a row missing. The second waits for the first to
    commit, then skips its rows; on PostgreSQL it used to collide with them at its insert instead."""
    one_writer_at_a_time(session, PG_IMPORT_LOCK)


def _write_rows(session: Session, table: Table, rows: list[dict[str, Any]]) -> None:
    """One bulk write of `rows` (same keys each) as tuples: executemany on SQLite, COPY on PostgreSQL.

    JSON columns arrive pre-serialized under `<column>__json` keys and are stored as that text.
    """
    if not rows:
        return
    keys = list(rows[0])
    columns = [key.removesuffix("__json") for key in keys]
    encoded = {column for key, column in zip(keys, columns, strict=True) if key != column}
    values = itemgetter(*keys) if len(keys) > 1 else (lambda row: (row[keys[0]],))
    try:
        bulk.insert_tuples(session.connection(), table, columns, map(values, rows), encoded=encoded)
    except IntegrityError as exc:
        detail = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else ""
        raise ImportConflict(
            f"the database refused these {table.name} rows ({detail}); another writer probably "
            "stored the same rows at the same time: run this one again"
        ) from exc


_CACHE_SIZE = "overrule_cache_size"  # the SQLite connection's page cache size outside imports


@contextmanager
def _roomy_sqlite_cache(session: Session) -> Iterator[None]:
    """A bigger SQLite page cache while bulk writing: index pages stop being evicted and re-read."""
    if session.get_bind().dialect.name != "sqlite":
        yield
        return
    conn = session.connection()
    # The connection's own size, read once per connection (`Connection.info` lives with it): the app
    # sets it nowhere else, and this block puts it back. Reading it again cost a statement an import.
    previous = conn.info.get(_CACHE_SIZE)
    if previous is None:
        previous = conn.info[_CACHE_SIZE] = int(conn.exec_driver_sql("PRAGMA cache_size").scalar() or -2000)
    conn.exec_driver_sql(f"PRAGMA cache_size=-{SQLITE_IMPORT_CACHE_KIB}")
    try:
        yield
    finally:
        conn.exec_driver_sql(f"PRAGMA cache_size={previous}")


# ---------------------------------------------------------------------------------------------
# Evaluations


def _snapshot_id(created: datetime, source_key: str, taken: Callable[[str], bool]) -> str:
    """`snap_<time>_<8 hex of the source key>`, lengthened only when that id is already taken."""
    stem = f"snap_{created:%Y%m%d_%H%M%S}_"
    # Records without created_at share the import's second, so 8 hex digits can collide in big files.
    for length in range(8, 64 - len(stem) + 1, 4):
        candidate = stem + source_key[:length]
        if not taken(candidate):
            return candidate
    raise ImportFailed(f"cannot find a free snapshot id for source key {source_key}")


@dataclass
class _Prepared:
    """Validated rows waiting in a spool, plus what validation already decided."""

    spool: _Spool
    source: str
    skipped: int = 0
    judgments: int = 0  # judgments the spooled rows would add: decides deferring index upkeep
    used_ids: set[str] = field(default_factory=set)
    source_keys: dict[int, str] = field(default_factory=dict)  # each valid record's, by position

    def close(self) -> None:
        self.spool.close()


def _bulk_load(prepare: Callable[[], _Prepared], write: Callable[[_Prepared], ImportReport]) -> ImportReport:
    """Every row import's one shape: `prepare` validates every record and spools its rows (the
    first fault refuses the load before a row is written), then `write` stores them; the spool is
    closed whatever happens (a spilled file is removed with it). Both phases run inside
    `bulk.frozen_heap`: the load keeps its rows alive until written, and the full collections they
    cause should walk those, not the app's heap (a load overlapping another thread's skips the
    freeze: lib.bulk). One home, so no entry (file, records, another tool's results, notes) loses
    the freeze or the close that the others keep."""
    with bulk.frozen_heap():
        prepared = prepare()
        try:
            return write(prepared)
        finally:
            prepared.close()


def _prepare_evaluations(
    *,
    session: Session,
    records: Iterable[tuple[str, Any]],
    source: str,
    reviewer: str,
    on_invalid: Callable[[int, InvalidField], None] | None = None,
    chunk_rows: int | None = None,
    rubrics: Mapping[str, list[MetricSpec]] | None = None,
) -> _Prepared:
    """Validate every record (raising ImportFailed at the first fault, or, with `on_invalid`,
    handing it the record's position and fault and leaving that record out) and spool the rows
    (`_Spool`: `chunk_rows` a chunk, CHUNK_ROWS unless given). `rubrics`: products' rubrics the
    caller read in this transaction and nothing changed since (`_SourceRubrics.unchanged`)."""
    prepared = _Prepared(spool=_Spool(chunk_rows), source=source)
    versions = _version_resolver(session, reviewer)
    metric_set = _metric_sets(session, rubrics)
    seen_keys: set[str] = set()
    # id → (where it first appeared, fingerprint of that record): a different record under the same
    # id is a conflict, refused with both places; the very same record again stays idempotent.
    seen_ids: dict[str, tuple[str, str]] = {}

    try:
        for position, (where, record) in enumerate(records):
            try:
                row, judged, explicit = evaluation_row(record, metric_set, reviewer)
                row["judge_version_id"] = versions.id_for(row["product"], _version_ref(record))
            except InvalidField as exc:
                if on_invalid is None:
                    raise located_failure(where, exc) from None
                on_invalid(position, exc)
                continue
            if explicit:
                fingerprint = _fingerprint(record)
                first = seen_ids.setdefault(row["id"], (where, fingerprint))
                if first[1] != fingerprint:
                    raise ImportFailed(
                        f"{where}, field 'id': {row['id']!r} is also the id of a different record at "
                        f"{first[0]}; give each evaluation its own id"
                    )
            prepared.source_keys[position] = row["source_key"]
            if row["source_key"] in seen_keys or (explicit and row["id"] in prepared.used_ids):
                prepared.skipped += 1
                continue
            if not explicit:
                row["id"] = _snapshot_id(row["created_at"], row["source_key"], prepared.used_ids.__contains__)
            seen_keys.add(row["source_key"])
            prepared.used_ids.add(row["id"])
            prepared.spool.add((_encode_json_columns(row, _SNAPSHOT_JSON_COLUMNS), judged, explicit))
            prepared.judgments += len(judged)
    except BaseException:
        prepared.close()
        raise
    return prepared


def _metric_sets(
    session: Session, known: Mapping[str, list[MetricSpec]] | None
) -> Callable[[str], MetricSet]:
    """A product's MetricSet, made once: from `known` (rubrics read in this transaction that nothing
    changed since), else read. The one lookup records are checked by, in an import and in late verdicts."""
    metric_sets: dict[str, MetricSet] = {}
    known = known or {}

    def metric_set(product: str) -> MetricSet:
        found = metric_sets.get(product)
        if found is None:
            specs = known.get(product)
            found = metric_sets[product] = MetricSet(
                product, specs if specs is not None else metrics_for_product(session=session, product=product)
            )
        return found

    return metric_set


def _version_ref(record: Any) -> judge_versions.VersionRef | None:
    """A record's `judge_version` (a name, or {name, ...fields}); InvalidField names what is wrong."""
    if not isinstance(record, Mapping):
        return None
    try:
        return judge_versions.parse_version_ref(record.get("judge_version"))
    except ValueError as exc:
        raise InvalidField("judge_version", str(exc)) from None


class _VersionIds:
    """Record → judge version id within one import: each (product, reference) resolved once."""

    def __init__(self, session: Session, reviewer: str) -> None:
        self._resolver = judge_versions.RefResolver(session, created_by=reviewer, origin="import")

    def id_for(self, product: str, ref: judge_versions.VersionRef | None) -> int | None:
        try:
            return self._resolver.id_for(product, ref)
        except judge_versions.VersionError as exc:
            raise InvalidField("judge_version", str(exc)) from None


def _version_resolver(session: Session, reviewer: str) -> _VersionIds:
    return _VersionIds(session, reviewer)


def _fingerprint(record: Any) -> str:
    """A digest of a record's content, whatever its key order."""
    text = json.dumps(record, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _free_snapshot_id(session: Session, row: dict[str, Any], used_ids: set[str]) -> str:
    """A longer generated id for a row whose id an unrelated stored snapshot already uses."""

    def taken(candidate: str) -> bool:
        return candidate in used_ids or bool(_existing(session, _SNAPSHOTS.c.id, [candidate]))

    snapshot_id = _snapshot_id(row["created_at"], row["source_key"], taken)
    used_ids.add(snapshot_id)
    return snapshot_id


def _write_evaluations(session: Session, prepared: _Prepared) -> ImportReport:
    """Insert the spooled snapshots and their judgments, skipping what the database already holds."""
    _write_lock(session)
    inserted = judgments = 0
    skipped = prepared.skipped
    ids_by_source_key: dict[str, str] = {}
    conn = session.connection()
    # A large load into a small table: build the secondary indexes once afterwards (sorted) rather
    # than updating them row by row; unique indexes stay, the duplicate checks below use them.
    defer = bulk.worth_deferring(conn, _JUDGMENTS, prepared.judgments)
    statistics = LoadStatistics(conn, [_JUDGMENTS.name, _SNAPSHOTS.name])
    with _roomy_sqlite_cache(session), bulk.deferred_indexes(conn, [_SNAPSHOTS, _JUDGMENTS], defer=defer):
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
                ids_by_source_key[row["source_key"]] = row["id"]
                judgment_rows.extend(snapshot_judgment_rows(row, judged))
            taken_changes = _existing(
                session, _JUDGMENTS.c.change_id, [j["change_id"] for j in judgment_rows]
            )
            judgment_rows = [j for j in judgment_rows if j["change_id"] not in taken_changes]
            # The new evaluations go in with their counters already right: no UPDATE after.
            metrics: dict[str, list[str | None]] = {row["id"]: [] for row in rows}
            for judgment in judgment_rows:
                metrics[judgment["snapshot_id"]].append(judgment["metric"])
            stated = counters.new_evaluation_counters(session=session, metrics_by_snapshot=metrics)
            for row in rows:
                row.update(stated[row["id"]])
            _write_rows(session, _SNAPSHOTS, rows)
            new_ids = [row["id"] for row in rows]
            if not defer:
                counters.snapshots_added(
                    session=session, where=counters.batch(session, _SNAPSHOTS.c.id, new_ids)
                )
            _write_rows(session, _JUDGMENTS, judgment_rows)
            statistics.wrote(len(judgment_rows))
            if not defer:  # one set-based update per counter table and batch, on the indexes
                counters.include_judgments(
                    session=session,
                    where=counters.batch(session, _JUDGMENTS.c.snapshot_id, new_ids),
                    unreviewed=True,  # snapshot_judgment_rows: an import's judgments are unreviewed
                )
            # The score counts (agreement rows, shared across the product) after the product's and the
            # judgments' counter rows, as an archive moves them: taken first, an import waited on an
            # archive's product row holding rows the archive then needed (a lock cycle, PostgreSQL).
            scores.add_snapshot_scores(session=session, snapshots=map(_scored_snapshot, rows))
            inserted += len(rows)
            judgments += len(judgment_rows)
    if defer:
        # A large load ran without the indexes a per-batch update reads: one rebuild after it is
        # linear in the table, which the load itself is at least half of.
        counters.rebuild_counts(session=session)
    if inserted >= STATISTICS_AFTER_ROWS:
        refresh_statistics(session.connection())  # a large load changes the best plans (lib.db)
    return ImportReport(
        "evaluations", inserted, skipped, judgments, prepared.source, ids_by_source_key=ids_by_source_key
    )


def _scored_snapshot(row: Mapping[str, Any]) -> scores.ScoredSnapshot:
    """The spooled row as `lib.scores` reads it (its score columns are spooled as JSON text)."""
    return scores.ScoredSnapshot(
        id=row["id"],
        product=row["product"],
        language=row["language"],
        created_at=row["created_at"],
        live=True,
        user_scores=json.loads(row[_json_key("user_scores_json")]),
        judge_scores=json.loads(row[_json_key("judge_scores_json")]),
    )


def _numbered(records: Iterable[Any], source: str) -> Iterator[tuple[str, Any]]:
    """Parsed records (not lines of a file) with where each is, as a refusal names it."""
    return ((f"{source} record {i}", record) for i, record in enumerate(records, start=1))


def import_evaluations(
    *,
    session: Session,
    records: Iterable[dict[str, Any]],
    source: str = "<records>",
    reviewer: Actor | str = "import",
) -> ImportReport:
    """Validate parsed evaluation records and bulk insert them with their judgments, all or nothing."""
    reviewer = authorize(session, reviewer, Permission.IMPORT).identity
    numbered = _numbered(records, source)
    return _bulk_load(
        lambda: _prepare_evaluations(session=session, records=numbered, source=source, reviewer=reviewer),
        lambda prepared: _write_evaluations(session, prepared),
    )


def import_source_evaluations(
    *,
    session: Session,
    evaluations: Iterable[source_records.SourceEvaluation],
    source: str,
    reviewer: Actor | str = "import",
    on_invalid: Callable[[int, ImportFailed], None] | None = None,
    via: str = "cli",
) -> ImportReport:
    """Import judge results read from another tool (promptfoo, Langfuse, Phoenix, OpenTelemetry).
    `via` says where they came from (`lib.source_records.LABEL_SCORE_ADVICE`): a refusal of a label
    without a score advises what that place offers.

    The one entry for every foreign source: `lib.source_records.plan_import` maps them to evaluation
    records and defines the metrics the product's rubric lacks, then they go through the evaluation
    import (validation, identity, idempotency) in the caller's transaction: a fault refuses it all.
    A source that answers per evaluation (OTLP's partial success, lib.otlp) passes `on_invalid`
    instead: a faulty evaluation is handed to it (its index in `evaluations`, the located fault) and
    left out, the others imported; the metric definitions are then those of the accepted ones only
    (a refused span defines no metric and widens no scale). `evaluations` is read once, in order: a generator keeps only the
    records it becomes in memory, not both.
    """
    actor = authorize(session, reviewer, Permission.IMPORT)
    rubrics = _SourceRubrics(session)
    plan = source_records.plan_import(evaluations, rubrics, on_invalid=on_invalid, via=via)
    unchanged = rubrics.unchanged(plan)
    refused: dict[int, ImportFailed] = {}  # position in plan.records → why validation refused it

    def invalid(position: int, exc: InvalidField) -> None:
        refused[position] = located_failure(plan.records[position][0], exc)

    def validate(positions: list[int]) -> _Prepared:
        def kept(position: int, exc: InvalidField) -> None:
            invalid(positions[position], exc)

        records = (
            plan.records if len(positions) == len(plan.records) else [plan.records[i] for i in positions]
        )
        prepared = _prepare_evaluations(
            session=session,
            records=records,
            source=source,
            reviewer=actor.identity,
            on_invalid=kept if on_invalid is not None else None,
            chunk_rows=IN_MEMORY_CHUNK_ROWS,  # the evaluations are in memory whole already
            rubrics=unchanged,
        )
        prepared.source_keys = {positions[i]: key for i, key in prepared.source_keys.items()}
        return prepared

    def prepare() -> _Prepared:
        prepared = _defined_then_checked(
            session, plan, actor.identity, validate, refused, tolerant=on_invalid is not None,
            discard=_Prepared.close,
        )  # fmt: skip
        plan.records = []  # spooled now: the write phase need not carry them too
        if on_invalid is not None:
            for position in sorted(refused):
                on_invalid(plan.indexes[position], refused[position])
        return prepared

    def write(prepared: _Prepared) -> ImportReport:
        report = _write_evaluations(session, prepared)
        report.source_keys = {plan.indexes[i]: key for i, key in prepared.source_keys.items()}
        return report

    # The planned records live until spooled: frozen with what came before (`bulk.frozen_heap`).
    return _bulk_load(prepare, write)


def _defined_then_checked(
    session: Session,
    plan: source_records.SourcePlan,
    identity: str,
    check: Callable[[list[int]], _Checked],
    refused: Mapping[int, ImportFailed],
    *,
    tolerant: bool,
    discard: Callable[[_Checked], object] = lambda _checked: None,
) -> _Checked:
    """Write `plan`'s metric definitions, then `check` its records (positions in `plan.records`)
    against them; `check` puts each it refuses in `refused`. The definitions go first since the
    records are checked against them; when some records are then refused (an OTLP span whose other
    score is off a fixed scale), a `tolerant` caller's definitions are taken back to a savepoint and
    written again from the accepted ones only, and those checked again (review7 F7). Not tolerant,
    a refusal raises and the caller's transaction goes whole. One rule for every source import and
    for late verdicts (`add_source_verdicts`)."""
    checkpoint = session.begin_nested() if plan.definitions and tolerant else None
    if plan.definitions:
        _define_metrics(session, plan.definitions, identity)
    checked = check(list(range(len(plan.records))))
    if checkpoint is not None and refused:
        discard(checked)
        checkpoint.rollback()
        definitions = plan.definitions_without(refused)
        if definitions:
            _define_metrics(session, definitions, identity)
        checked = check([i for i in range(len(plan.records)) if i not in refused])
    elif checkpoint is not None:
        checkpoint.commit()
    return checked


def score_stored_labels(
    session: Session,
    evaluations: list[source_records.SourceEvaluation],
    explicit: Mapping[str, float] | None = None,
    via: str | None = None,
) -> None:
    """`lib.source_records.score_labels` with the user's label scores (`explicit`, a file's
    --label-scores) and this database's stored labels (`_stored_label_scores`): the steps every
    source import applies to a label sent without a number, one wiring for the file importers
    (`_import_file`), the OTLP receiver (lib.otlp) and OTLP's late verdicts (`add_source_verdicts`'
    `stored_labels`), so a label-only `pass` gets the 0.6 the product stores for it wherever it
    arrives (review14 F3). Once an import: in one call the steps keep their documented order (a
    stored label before the number a file's partner label implies), and a label no step scores is
    looked up once. Nothing is read, and nothing but one `is None` a verdict run, when every verdict
    has a number. `via`: a file import's place, whose stored label a file's partner label
    contradicts is refused with the advice that place offers (review16 M3); None for OTLP."""
    if any(v.score is None for ev in evaluations for v in ev.verdicts):
        source_records.score_labels(evaluations, explicit, stored=_stored_label_scores(session), via=via)


def _stored_label_scores(session: Session) -> Callable[[str, str, str], set[float]]:
    """For `lib.source_records.score_labels`: the judge scores a product's metric holds for a label,
    so a label sent without a number gets the one reviewers already see for it (review7 F9).

    It reads the judgments' structured label (`Judgment.label`, migration 0032) through the partial
    index `ix_judgment_label`: one index read a label. It used to match the start of the reasoning
    ("label" or "label: explanation"), which cost a scan of the metric's judgments (0.04–0.11 s a
    label at 100k) and took any free text starting "factual: " for a label."""

    def scores(product: str, metric: str, label: str) -> set[float]:
        key = source_records.label_key(label)
        if key is None:
            return set()
        j = _JUDGMENTS.c
        rows = session.execute(
            select(j.decision)
            .where(j.product == product, j.metric == metric, j.label.is_not(None), j.label == key)
            .distinct()
            .limit(3)
        ).scalars()
        found = set()
        for decision in rows:
            try:
                found.add(float(decision))
            except ValueError:
                continue
        return found

    return scores


def _define_metrics(session: Session, definitions: list[dict[str, Any]], identity: str) -> None:
    """Write the metric definitions another tool's results imply (`plan_import`: new metrics, and
    inferred scales their scores widen) before the records they check, under the import lock (two
    requests widening one scale take the union of both); each change is audited (`_audit_scales`)."""
    _write_lock(session)
    changes: list[ScaleChange] = []
    with gaps_follow_scales(session, (str(d["product"]).strip() for d in definitions)):
        upsert_metric_definitions(session=session, definitions=definitions, changes=changes)
    _audit_scales(session, changes, identity, "an import")
    session.flush()


def _audit_scales(session: Session, changes: Sequence[ScaleChange], identity: str, by: str) -> None:
    """Each stored metric scale an import changed, in the audit trail as a change of the product's
    judge ("support-bot: 'tone' widened from 0–3 to 0–5 by an import"): a lead sees when, why and
    by whom the scale its scores are checked against moved."""
    for change in changes:
        verb = "widened" if change.widened else "set"
        judge_versions.record_change(
            session=session,
            identity=identity,
            product=change.product,
            what=f"{change.display_name!r} {verb} from {change.before} to {change.after} by {by}",
        )


def _extend_stored(
    session: Session, evaluations: Sequence[source_records.SourceEvaluation], actor: Actor, via: str = "cli"
) -> tuple[list[source_records.SourceEvaluation], int, int, int, int]:
    """Split a source file's evaluations: those not stored yet (to import), and those an earlier import
    stored (same product, question, answer and model), whose new verdicts are added to the stored
    evaluation through `add_source_verdicts` (a second Phoenix eval, a later Langfuse score): a
    judge's as judgments, a reviewer's to its user scores (review18 H2: they were left out in silence).
    Returns (to import, how many were stored already, judgments added, reviewer scores added, scores
    not taken: the stored evaluation has the name with another score); a fault raises ImportFailed,
    advising what `via` (where the file came from) offers."""
    keyed: dict[str, list[source_records.SourceEvaluation]] = {}
    fresh: list[source_records.SourceEvaluation] = []
    for ev in evaluations:
        key = text_source_key(ev.product, ev.question, ev.answer, ev.model_name)
        if key is None:
            fresh.append(ev)  # the import refuses it, naming the field
            continue
        keyed.setdefault(key, []).append(ev)
    stored: dict[str, str] = {}
    keys = list(keyed)
    for i in range(0, len(keys), 500):
        found = session.execute(
            select(_SNAPSHOTS.c.source_key, _SNAPSHOTS.c.id).where(
                _SNAPSHOTS.c.source_key.in_(keys[i : i + 500])
            )
        )
        stored.update((key, snapshot_id) for key, snapshot_id in found)
    extended = 0
    late: list[LateVerdicts] = []
    for key, group in keyed.items():
        if key not in stored:
            fresh.extend(group)
            continue
        for ev in group:
            extended += 1
            if ev.verdicts:
                late.append(LateVerdicts(stored[key], ev.verdicts, ev.where))
    counts = {"reviewer": 0, "not taken": 0}

    def kept(_index: int, _verdict: source_records.SourceVerdict, _score: float) -> None:
        counts["not taken"] += 1

    def reviewed(n: int) -> None:
        counts["reviewer"] += n

    added = (
        add_source_verdicts(
            session=session, items=late, reviewer=actor, via=via, on_kept=kept, on_reviewer=reviewed
        )
        if late
        else 0
    )
    return fresh, extended, added, counts["reviewer"], counts["not taken"]


class _SourceRubrics:
    """The rubrics one plan of source evaluations reads (`import_source_evaluations`, a round of
    `add_source_verdicts`), each product's once: called, `plan_import`'s view of a product (its
    metrics, whether it defines its own, whether it has data); `unchanged`, those the records are
    then checked against as read. The one home of both rules; each caller kept a memo of its own."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.read: dict[str, tuple[list[Any], bool, bool]] = {}  # by the product's stripped name

    def __call__(self, product: str) -> tuple[list[Any], bool, bool]:
        product = product.strip()
        found = self.read.get(product)
        if found is None:
            found = self.read[product] = self._read(product)
        return found

    def _read(self, product: str) -> tuple[list[Any], bool, bool]:
        own = own_metrics(self.session, product)  # its rows say whether it defines its own: one read
        held = built(
            self.session,
            ("an evaluation of a product",),
            lambda: select(_SNAPSHOTS.c.id).where(_SNAPSHOTS.c.product == bindparam("product")).limit(1),
        )
        return (
            own if own is not None else list(DEFAULT_METRICS),
            own is not None,
            self.session.execute(held, {"product": product}).first() is not None,
        )

    def unchanged(self, plan: source_records.SourcePlan) -> dict[str, list[MetricSpec]]:
        """The metrics read of each product `plan` writes no definition for: its records are checked
        against them (`_metric_sets`). A product it defines metrics for is read again once they are
        written (it was every product as soon as one gained a metric)."""
        defined = {str(d["product"]).strip() for d in plan.definitions}
        return {product: specs for product, (specs, *_) in self.read.items() if product not in defined}


@dataclass(frozen=True)
class LateVerdicts:
    """Judge verdicts for an evaluation already stored (`add_source_verdicts`), and where they are
    in the source, as a refusal names it."""

    snapshot_id: str
    verdicts: Sequence[source_records.SourceVerdict]
    where: str


def add_source_verdicts(
    *,
    session: Session,
    items: Sequence[LateVerdicts],
    reviewer: Actor | str = "import",
    on_invalid: Callable[[int, ImportFailed], None] | None = None,
    via: str = "cli",
    stored_labels: bool = False,
    on_kept: Callable[[int, source_records.SourceVerdict, float], None] | None = None,
    on_reviewer: Callable[[int], None] | None = None,
) -> int:
    """Judge results that arrive for evaluations already stored (OTLP evaluation events after their
    span was imported, a second Phoenix eval, a later Langfuse score): each metric an evaluation has
    no judgment for yet becomes one, mapped by `plan_import` as on import (new metrics defined), the
    snapshot's judge scores and gaps re-derived as an import would. A metric it has already is left
    as it is (a re-sent event). Returns the judgments added.

    Many groups at once (issue 29: an OTLP request of log records carries the late halves of ~80
    calls): the snapshots read in one statement, one plan and one definitions write for all, the
    judgments written by the importer's bulk writer and the snapshots' columns by one UPDATE, the
    counters moved set-based by the rules the bulk import uses. Groups of one evaluation are added
    in order, each seeing what the ones before added (a later one waits for the next round).

    A group that cannot be mapped raises ImportFailed located at its `where`, or, with `on_invalid`,
    is handed to it (its index in `items`) and changes nothing, not even the metric definitions
    (review7 F7); the other groups are added. `via` as for `import_source_evaluations`: a label
    refused for want of a score is advised what that place offers (OTLP: send the score).
    `stored_labels`: the verdicts' labels sent without a number are not scored yet (OTLP's late
    verdicts, `lib.otlp`): score them as an import does (`score_stored_labels`). A file's late
    verdicts were scored with the whole file (`_import_file`), and scoring them again only looked up
    again the labels nothing scores. `on_kept(index, verdict, stored score)`: a verdict left out
    because its evaluation has the metric with another score (OTLP says so in its answer; the
    check reads nothing more than the evaluation the group reads anyway). `on_reviewer(n)`: a
    group's `n` reviewer verdicts (`human`) for names its evaluation's reviewer side lacks, which
    go there (a file's summary counts them).

    A round holds at most LATE_ROUND_GROUPS groups, as an import of new evaluations writes at most
    IN_MEMORY_CHUNK_ROWS a chunk: a second eval file over a large project (`_extend_stored`) keeps
    one round's rows, plan and UPDATE in memory, not the file's (review12 F0)."""
    identity = authorize(session, reviewer, Permission.IMPORT).identity
    # The importers' lock before any row (an import writer; nothing to send when the caller holds it,
    # as the OTLP receiver does): a second eval file's late verdicts took evaluations and counter rows
    # first, then waited for the lock another import held while it waited on those rows (review15 F2).
    _write_lock(session)
    added = 0
    waiting = list(enumerate(items))
    while waiting:
        now: list[tuple[int, LateVerdicts]] = []
        later: list[tuple[int, LateVerdicts]] = []
        named: set[str] = set()
        for index, item in waiting:
            # A group after a full round waits too, and so do the later groups of its evaluation.
            wait = item.snapshot_id in named or len(now) >= LATE_ROUND_GROUPS
            (later if wait else now).append((index, item))
            named.add(item.snapshot_id)
        added += _add_verdicts(session, now, identity, on_invalid, via, stored_labels, on_kept, on_reviewer)
        waiting = later
    return added


_LATE_COLUMNS = (
    "id", "product", "question", "model_answer", "model_name", "judge_model", "language", "category",
    "created_at", "deleted_at", "user_scores_json", "judge_scores_json", "evidence_json", "primary_metric",
    "bonus_metrics", "overall_feedback",
)  # fmt: skip
# The snapshot columns late verdicts re-derive (lib.scores follows both sides: replace_snapshot_scores).
# The user scores too: a reviewer's verdict (a Phoenix HUMAN annotation, a Langfuse ANNOTATION) for
# a metric the evaluation's reviewer side lacks is stored there, as it is for a new evaluation.
_LATE_DERIVED = (
    "judge_scores_json", "user_scores_json", "evidence_json", "weighted_gap", "max_metric_gap", "judge_meta_score"
)  # fmt: skip


def _late_snapshots(session: Session) -> Any:
    """`SELECT <_LATE_COLUMNS> FROM evaluation_snapshots WHERE id IN :ids` (`lib.bulk.among_value`), built once.

    On PostgreSQL it locks what it reads, in id order (`counters.lock_snapshots`' order, the first
    step of docs/internals.md's "Counters"): the score rows are written live or not from the
    `deleted_at` read here, and an archive or a restore committed between an unlocked read and
    `gaps_change`'s lock left metric_scores and agreement_counts counting the wrong side (review12 F1).
    Locked, the archive waits for this transaction or this read waits for the archive's commit and
    sees its `deleted_at` (READ COMMITTED re-reads a row it waited for). SQLite serialises writers."""

    def build() -> Any:
        stmt = select(*(_SNAPSHOTS.c[name] for name in _LATE_COLUMNS)).where(
            bulk.among_template(session, _SNAPSHOTS.c.id, "ids")
        )
        if bulk.dialect_name(session) == "postgresql":
            stmt = stmt.order_by(_SNAPSHOTS.c.id).with_for_update()
        return stmt

    return built(session, ("late verdicts' evaluations",), build)


def _late_update(session: Session) -> Any:
    """The UPDATE of one evaluation gaining late verdicts (executemany): its re-derived columns and,
    its new judgments written, its counters (`counters.refreshed_columns`); built once."""
    return built(
        session,
        ("late verdicts' evaluation",),
        lambda: (
            _SNAPSHOTS.update()
            .where(_SNAPSHOTS.c.id == bindparam("b_id"))
            .values(
                {
                    **{column: bindparam(f"b_{column}") for column in _LATE_DERIVED},
                    **counters.refreshed_columns(session),
                }
            )
        ),
    )


def _add_verdicts(
    session: Session,
    entries: list[tuple[int, LateVerdicts]],
    identity: str,
    on_invalid: Callable[[int, ImportFailed], None] | None,
    via: str,
    stored_labels: bool,
    on_kept: Callable[[int, source_records.SourceVerdict, float], None] | None = None,
    on_reviewer: Callable[[int], None] | None = None,
) -> int:
    """One round of `add_source_verdicts`: `entries` (index in its items, group) name different evaluations."""
    ids = bulk.among_value(session, {item.snapshot_id for _, item in entries})
    found = {row.id: row for row in session.execute(_late_snapshots(session), {"ids": ids})}
    refusals: dict[int, ImportFailed] = {}  # index in items → why

    def refuse(index: int, exc: ImportFailed) -> None:
        if on_invalid is None:
            raise exc
        refusals[index] = exc

    rubric = _SourceRubrics(session)  # read once a product (plan_import too)
    # Each stored evaluation's judge and reviewer scores, parsed once for the split below, the check
    # and the write (`_write_late`), which only read them.
    stored: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    evaluations: list[source_records.SourceEvaluation] = []
    of_evaluation: list[tuple[int, Any]] = []  # each evaluation's (index in items, snapshot row)
    for index, item in entries:
        snapshot = found.get(item.snapshot_id)
        if snapshot is None:
            refuse(index, ImportFailed(f"{item.where}: its evaluation {item.snapshot_id!r} no longer exists"))
            continue
        have, reviewed = stored[snapshot.id] = (
            json_object(snapshot.judge_scores_json),
            json_object(snapshot.user_scores_json),
        )
        specs = rubric(snapshot.product)[0]
        new = []
        for verdict in item.verdicts:
            slug = source_records.resolve_metric(specs, verdict.name)
            if slug not in (reviewed if verdict.human else have):  # each side takes a metric once
                new.append(verdict)
            elif on_kept is not None and verdict.score is not None:  # its side's stored score kept
                side = reviewed if verdict.human else have  # review19 M2: a reviewer's, dropped unsaid
                kept = side[slug].get("score") if isinstance(side[slug], Mapping) else None
                if isinstance(kept, int | float) and kept != verdict.score:
                    on_kept(index, verdict, kept)
        if on_reviewer is not None and (reviewers := sum(v.human for v in new)):
            on_reviewer(reviewers)
        if new:
            evaluations.append(
                source_records.SourceEvaluation(
                    where=item.where,
                    product=snapshot.product,
                    question=snapshot.question,
                    answer=snapshot.model_answer,
                    verdicts=new,
                )
            )
            of_evaluation.append((index, snapshot))
    if stored_labels:  # an OTLP label arriving after its span (a file's were scored with the file)
        score_stored_labels(session, evaluations)
    plan = source_records.plan_import(
        evaluations,
        rubric,
        on_invalid=None if on_invalid is None else lambda i, exc: refuse(of_evaluation[i][0], exc),
        via=via,
    )
    refused: dict[int, ImportFailed] = {}  # position in plan.records → why the check refused it
    unchanged = rubric.unchanged(plan)

    def check(positions: list[int]) -> list[tuple[int, dict[str, Any], list[Any]]]:
        metric_set = _metric_sets(session, unchanged)  # each check anew: definitions were (re)written
        checked = []
        for position in positions:
            located, planned = plan.records[position]
            snapshot = of_evaluation[plan.indexes[position]][1]
            product = snapshot.product
            have, reviewed = stored[snapshot.id]
            evidence = {
                slug: e.get("evidence") or [] for slug, e in json_object(snapshot.evidence_json).items()
            }
            record = {
                "product": product, "question": snapshot.question, "model_answer": snapshot.model_answer,
                "model_name": snapshot.model_name, "judge_model": snapshot.judge_model,
                "language": snapshot.language, "category": snapshot.category,
                "created_at": snapshot.created_at.isoformat(),
                "user_scores": {**reviewed, **{k: v for k, v in planned.get("user_scores", {}).items() if k not in reviewed}} or None,
                "judge_scores": {**have, **{k: v for k, v in planned["judge_scores"].items() if k not in have}},
                "evidence": {k: v for k, v in evidence.items() if v} or None,
                "primary_metric": snapshot.primary_metric, "bonus_metrics": list(snapshot.bonus_metrics or []),
                "overall_feedback": snapshot.overall_feedback,
            }  # fmt: skip
            metrics = metric_set(product)
            try:
                row, judged, _ = evaluation_row(
                    {k: v for k, v in record.items() if v is not None},
                    lambda _product, metrics=metrics: metrics,
                    identity,
                )
            except InvalidField as exc:
                refused[position] = located_failure(located, exc)
                refuse(of_evaluation[plan.indexes[position]][0], refused[position])
                continue
            checked.append((position, row, [j for j in judged if j[0] not in have]))
        return checked

    checked = _defined_then_checked(session, plan, identity, check, refused, tolerant=on_invalid is not None)
    late = [(of_evaluation[plan.indexes[p]][1], row, new) for p, row, new in checked]
    added = _write_late(session, late, stored)
    if on_invalid is not None:
        for index in sorted(refusals):
            on_invalid(index, refusals[index])
    return added


def json_object(value: Any) -> dict[str, Any]:
    """A JSON object column as read by a Core select (text on some drivers), {} for none (the
    importer's late verdicts and lib.otlp's links read snapshots' columns so)."""
    if isinstance(value, str):
        value = json.loads(value)
    return dict(value) if isinstance(value, Mapping) else {}


def _write_late(
    session: Session,
    checked: list[tuple[Any, dict[str, Any], list[Any]]],
    stored: Mapping[str, tuple[dict[str, Any], dict[str, Any]]],
) -> int:
    """Store late verdicts checked by `_add_verdicts` — (stored snapshot row, its re-derived row,
    the judged metrics it lacked) each, `stored` its judge and reviewer scores as parsed — with
    every counter moved as the bulk import moves it."""
    if not checked:
        return 0
    updates: list[dict[str, Any]] = []
    before: list[scores.ScoredSnapshot] = []
    after: list[scores.ScoredSnapshot] = []
    judgment_rows: list[dict[str, Any]] = []
    for snapshot, row, new in checked:
        updates.append({"b_id": snapshot.id, **{f"b_{column}": row[column] for column in _LATE_DERIVED}})
        judge_scores, user_scores = stored[snapshot.id]
        scored = scores.ScoredSnapshot(
            id=snapshot.id,
            product=snapshot.product,
            language=snapshot.language,
            created_at=snapshot.created_at,
            live=snapshot.deleted_at is None,
            user_scores=user_scores,
            judge_scores=judge_scores,
        )
        before.append(scored)
        after.append(
            dataclasses.replace(
                scored, judge_scores=row["judge_scores_json"], user_scores=row["user_scores_json"]
            )
        )
        judgment_rows.extend(
            snapshot_judgment_rows({**row, "id": snapshot.id, "created_at": snapshot.created_at}, new)
        )
    snapshots = counters.batch(session, _SNAPSHOTS.c.id, [u["b_id"] for u in updates])
    # evaluation_counts keys the gaps and the per-evaluation counters: the evaluations leave their
    # rows (locked first), gain their judgments, are updated with counters recounted from those, and
    # join their new rows; then the judgments are counted (lib.counters.judgments_added's two halves).
    with counters.gaps_change(session=session, where=snapshots):
        _write_rows(session, _JUDGMENTS, judgment_rows)
        session.connection().execute(_late_update(session), updates)
    if judgment_rows:
        counters.include_judgments(
            session=session,
            where=counters.batch(session, _JUDGMENTS.c.change_id, [j["change_id"] for j in judgment_rows]),
            unreviewed=True,  # snapshot_judgment_rows, as an import's
        )
    scores.replace_snapshot_scores(session=session, before=before, after=after)
    return len(judgment_rows)


# ---------------------------------------------------------------------------------------------
# Notes


def _note_row(record: Any, reviewer: str) -> dict[str, Any]:
    """One seed-000 note record → a session_notes row, normalized exactly as `lib.notes.add_note` does."""
    record = record_object(record)
    raw_type = text_field(record, "note_type", required=True)
    try:
        note_type = notes.normalize_note_type(raw_type or "")
    except ValueError as exc:
        raise InvalidField("note_type", str(exc)) from None
    try:
        language = notes.normalize_language(text_field(record, "language"))
    except ValueError as exc:
        raise InvalidField("language", str(exc)) from None
    content = notes.clean_content(text_field(record, "content", required=True) or "")
    if not content:
        raise InvalidField("content", "must not be empty")
    if len(content) > notes.MAX_CONTENT_CHARS:
        raise InvalidField(
            "content", f"is {len(content)} characters long; at most {notes.MAX_CONTENT_CHARS} allowed"
        )
    # `code` is the name users read; seed 000's column name stays accepted for files written for it.
    code_key = "code" if record.get("code") is not None else SEED_CODE_FIELD
    if code_key == "code" and record.get(SEED_CODE_FIELD) not in (None, record["code"]):
        raise InvalidField("code", f"differs from {SEED_CODE_FIELD!r}, the same field's older name; give one")
    code_value = {"phelps_code": record.get(code_key)}  # checked against the column's length
    code = (text_field(code_value, "phelps_code", table=_NOTES, path=code_key) or "").strip() or None
    confidence = record.get("confidence")
    if confidence is not None:
        confidence = number_field(confidence, "confidence")
        if not 0.0 <= confidence <= 1.0:
            raise InvalidField("confidence", f"{confidence:g} is outside 0–1")
    if note_type != "SUCCESS":
        # Seed convention: other types pass "" and 0.0 for "no code, no confidence".
        if code is not None:
            raise InvalidField(code_key, f"only SUCCESS notes carry a code; this is a {note_type} note")
        if confidence:
            raise InvalidField(
                "confidence", f"only SUCCESS notes carry a confidence; this is a {note_type} note"
            )
        confidence = None
    session_id = (text_field(record, "session_id", table=_NOTES, required=True) or "").strip()
    return {
        "timestamp": timestamp_field(record.get("timestamp"), "timestamp", required=True),
        "language": language,
        "note_type": note_type,
        "content": content,
        "search_text": normalize_search_text(content),
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
            except InvalidField as exc:
                raise located_failure(where, exc) from None
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
    _write_lock(session)
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
        notes.invalidate_notes_cache(session=session)
    return ImportReport("notes", inserted, skipped, source=prepared.source)


def import_notes(
    *,
    session: Session,
    records: Iterable[dict[str, Any]],
    source: str = "<records>",
    reviewer: Actor | str = "import",
) -> ImportReport:
    """Validate seed-000 note records and bulk insert the ones not stored yet, all or nothing."""
    reviewer = authorize(session, reviewer, Permission.IMPORT).identity
    numbered = _numbered(records, source)
    return _bulk_load(
        lambda: _prepare_notes(records=numbered, source=source, reviewer=reviewer),
        lambda prepared: _write_notes(session, prepared),
    )


# ---------------------------------------------------------------------------------------------
# Interactions (seed 003)


def _prepare_interactions(*, records: Iterable[tuple[str, Any]], source: str, reviewer: str) -> _Prepared:
    """Validate every line (the first fault refuses the file) and spool (interaction, expert review)."""
    prepared = _Prepared(spool=_Spool(), source=source)
    try:
        for where, record in records:
            try:
                row, expert, _explicit = interaction_rows(record, reviewer)
            except InvalidField as exc:
                raise located_failure(where, exc) from None
            if row["id"] in prepared.used_ids:
                prepared.skipped += 1  # the first line with an id wins
                continue
            prepared.used_ids.add(row["id"])
            row = _encode_json_columns(row, ("citations",))
            if expert is not None:
                expert = _encode_json_columns(expert, ("sentence_scores",))
            prepared.spool.add((row, expert))
    except BaseException:
        prepared.close()
        raise
    return prepared


def _write_interactions(session: Session, prepared: _Prepared) -> ImportReport:
    """Insert new interactions and their expert reviews. A stored one is skipped, but gains the
    line's expert review when it has none yet (interactions first, their reviews in a later file)."""
    _write_lock(session)
    report = ImportReport("interactions", 0, prepared.skipped, source=prepared.source)
    for chunk in prepared.spool.chunks():
        existing_ids = _existing(session, _INTERACTIONS.c.id, [row["id"] for row, _ in chunk])
        rows, feedback, late_reviews = [], [], []
        for row, expert in chunk:
            if row["id"] not in existing_ids:
                rows.append(row)
                feedback.extend([expert] if expert is not None else [])
                continue
            report.skipped += 1
            late_reviews.extend([expert] if expert is not None else [])
        reviewed = _existing(session, _FEEDBACK.c.interaction_id, [f["interaction_id"] for f in late_reviews])
        feedback.extend(f for f in late_reviews if f["interaction_id"] not in reviewed)
        _write_rows(session, _INTERACTIONS, rows)
        _write_rows(session, _FEEDBACK, feedback)
        report.inserted += len(rows)
        report.expert_reviews += len(feedback)
        report.new_ids.extend(row["id"] for row in rows)
    return report


# ---------------------------------------------------------------------------------------------
# Judgments (seed-004 JSON cache)


def _cache_judgment_row(key: str, entry: Any, reviewer: str) -> dict[str, Any]:
    entry = record_object(entry)
    text_field({"change_id": key}, "change_id", table=_JUDGMENTS, required=True)
    if "change_id" in entry and entry["change_id"] != key:
        raise InvalidField("change_id", f"{entry['change_id']!r} differs from its key in 'judgments'")
    decision = text_field(entry, "decision", required=True)
    if decision not in CACHE_DECISIONS:
        raise InvalidField("decision", f"{decision!r} is not one of {', '.join(CACHE_DECISIONS)}")
    user_decision = text_field(entry, "user_decision")
    if user_decision is not None and user_decision not in CACHE_DECISIONS:
        raise InvalidField("user_decision", f"{user_decision!r} is not one of {', '.join(CACHE_DECISIONS)}")
    confidence = entry.get("confidence")
    if confidence is not None:
        confidence = number_field(confidence, "confidence")
    timestamp = timestamp_field(entry.get("timestamp"), "timestamp", required=True)
    reviewed = user_decision is not None
    return {
        "change_id": key,
        "product": text_field(entry, "product", table=_JUDGMENTS, required=True).strip(),  # type: ignore[union-attr]
        "metric": None,
        "snapshot_id": None,
        "decision": decision,
        "confidence": confidence,
        "reasoning": text_field(entry, "reasoning"),
        "user_decision": user_decision,
        "user_reasoning": text_field(entry, "user_reasoning"),
        # The cache does not say who reviewed an entry; the import's author vouches for it.
        "reviewer": reviewer if reviewed else None,
        "timestamp": timestamp,
        "reviewed_at": timestamp if reviewed else None,
        # Like a judgment reviewed in Overrule: version 1 judged, version 2 reviewed.
        "version": 2 if reviewed else 1,
        "was_corrected": compute_was_corrected(decision, user_decision),
        "url": text_field(entry, "url"),
        "description": text_field(entry, "description"),
        "ai_provider": text_field(entry, "ai_provider", table=_JUDGMENTS),
    }


def import_judgments_cache(
    *, session: Session, data: Any, source: str = "<cache>", reviewer: Actor | str = "import"
) -> ImportReport:
    """Import a seed-004 JSON cache; entries whose change_id is stored are skipped, never overwritten."""
    reviewer = authorize(session, reviewer, Permission.IMPORT).identity
    if not isinstance(data, Mapping):
        raise ImportFailed(f"{source}: expected a JSON object with 'cache_version' and 'judgments'")
    version = data.get("cache_version")
    if version is None:
        raise ImportFailed(f"{source}, field 'cache_version': is missing; this is not a judgment cache file")
    if version not in SUPPORTED_CACHE_VERSIONS:
        raise ImportFailed(
            f"{source}, field 'cache_version': unsupported version {version!r} "
            f"(supported: {', '.join(SUPPORTED_CACHE_VERSIONS)})"
        )
    entries = data.get("judgments")
    if not isinstance(entries, Mapping):
        raise ImportFailed(
            f"{source}, field 'judgments': must be an object of {{change_id: judgment}}, got {type_name(entries)}"
        )
    rows = []
    versions = _version_resolver(session, reviewer)
    for key, entry in entries.items():
        try:
            row = _cache_judgment_row(key, entry, reviewer)
            row["judge_version_id"] = versions.id_for(row["product"], _version_ref(entry))
            rows.append(row)
        except InvalidField as exc:
            raise located_failure(f"{source}, judgment {key!r}", exc) from None
    _write_lock(session)
    stored = _existing(session, _JUDGMENTS.c.change_id, [row["change_id"] for row in rows])
    fresh = [row for row in rows if row["change_id"] not in stored]
    statistics = LoadStatistics(session.connection(), [_JUDGMENTS.name])
    for i in range(0, len(fresh), CHUNK_ROWS):
        chunk = fresh[i : i + CHUNK_ROWS]
        _write_rows(session, _JUDGMENTS, chunk)
        statistics.wrote(len(chunk))
        counters.judgments_added(
            session=session,
            where=counters.batch(session, _JUDGMENTS.c.change_id, [row["change_id"] for row in chunk]),
            snapshots=false(),
        )
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
    return cache_event_rows(rows, ids, reviewer, utcnow())


def cache_event_rows(
    rows: list[dict[str, Any]], ids: Mapping[str, int], reviewer: str, at: datetime
) -> list[dict[str, Any]]:
    """The audit-trail rows of imported cache entries (`ids`: change id -> judgment id), the one rule
    for them (the importer, and bench/gen.py's code-review judgments)."""
    events = []
    for row in rows:
        base = {
            "judgment_id": ids[row["change_id"]],
            "change_id": row["change_id"],
            "reviewer": reviewer,
            "at": at,
        }
        events.append(
            {**base, "action": "imported", "from_decision": None, "to_decision": row["decision"], "reason": None,
             "version": 1}
        )  # fmt: skip
        if row["user_decision"] is not None:
            events.append(
                review_event_row(
                    judgment_id=base["judgment_id"], change_id=row["change_id"], corrected=row["was_corrected"],
                    reviewer=reviewer, at=at, from_decision=row["decision"], to_decision=row["user_decision"],
                    reason=row["user_reasoning"], version=2,
                )
            )  # fmt: skip
    return events


# ---------------------------------------------------------------------------------------------
# Metric definitions


def import_metrics(
    *, session: Session, data: Any, source: str = "<metrics>", reviewer: Actor | str = "import"
) -> ImportReport:
    """Create or update metric definitions from a JSON list; one bad entry refuses the whole list."""
    actor = authorize(session, reviewer, Permission.IMPORT)
    if not isinstance(data, list):
        raise ImportFailed(
            f"{source}: expected a JSON list of {{product, slug, display_name, min, max, description}}"
        )
    seen: set[tuple[str, str]] = set()
    for i, raw in enumerate(data, start=1):
        where = f"{source} item {i}"
        try:
            check_unicode(raw)
        except InvalidField as exc:
            raise located_failure(where, exc) from None
        try:
            spec = parse_metric_definition(raw)
        except (ValueError, OverflowError) as exc:
            raise ImportFailed(f"{where}: {exc}") from None
        try:
            # parse_metric_definition str()s these; a number or object there is a broken file.
            for name in ("product", "slug", "display_name", "description"):
                text_field(raw, name, table=_METRIC_DEFS if name != "description" else None)
        except InvalidField as exc:
            raise located_failure(where, exc) from None
        identity = (str(raw["product"]).strip(), spec.slug)
        if identity in seen:
            raise ImportFailed(
                f"{where}, field 'slug': {spec.slug!r} is defined twice for product {identity[0]!r}"
            )
        seen.add(identity)
    _write_lock(session)
    stored = {
        (product, slug)
        for product, slug in session.execute(select(MetricDefinition.product, MetricDefinition.slug))
    }
    # A user's definitions: their scales are fixed, whatever the file says about inference.
    changes: list[ScaleChange] = []
    with gaps_follow_scales(session, (product for product, _slug in seen)):
        count = upsert_metric_definitions(
            session=session, definitions=[{**raw, "scale_inferred": False} for raw in data], changes=changes
        )
    _audit_scales(session, changes, actor.identity, f"a metrics import ({source})")
    session.flush()
    updated = len(seen & stored)
    return ImportReport("metrics", count - updated, 0, source=source, updated=updated)


# ---------------------------------------------------------------------------------------------
# Files


def import_cache_bytes(
    *, session: Session, raw: bytes, source: str, reviewer: Actor | str | None
) -> ImportReport:
    """Import an uploaded seed-004 cache file (the Corrections page); any fault writes nothing.

    Every ImportFailed message ends with "nothing was imported", for the page to show as is.
    """
    require_reviewer(reviewer, Permission.IMPORT, bind=session)
    try:
        check_document_size(len(raw), source)
        data = parse_document(raw, source)
        return import_judgments_cache(session=session, data=data, source=source, reviewer=reviewer)
    except ImportFailed as exc:
        raise type(exc)(f"{exc}; nothing was imported") from None


def _kind_of_document(data: Any, source: str) -> str:
    from lib.source_files import source_shape

    if isinstance(data, Mapping) and ("cache_version" in data or "judgments" in data):
        return "judgments"
    if isinstance(data, list) and data and isinstance(data[0], Mapping) and "slug" in data[0]:
        return "metrics"
    shape = source_shape(data)
    if shape is not None:
        return shape
    raise ImportFailed(f"{source}: cannot tell what this file holds; pass --kind " + "|".join(KINDS))


def _pass(via: str, kind: str, cli: str, page: str) -> str:
    """How to import a file detection told but cannot import alone, in the terms of where it came from."""
    if via == "page":
        return f'choose {kind} under "What the file holds" and {page}'
    return f"pass --kind {kind} {cli}"


def detect_kind(path: Path, source: str | None = None, options: Any = None) -> tuple[str, Any]:
    """The file's kind and, when telling it required parsing the whole document, that document.

    A Parquet file, or a CSV whose header names a span id with label/score/explanation, is Phoenix
    span evaluations; a JSON list is a metric set (or Langfuse items); an object starting with
    "cache_version"/"judgments" is a seed-004 cache; promptfoo's results and Langfuse's export are
    told by `lib.source_files.source_shape`; otherwise the first JSONL object decides: "note_type" →
    notes, "model_answer" → evaluations, "product" + "question" + "answer" → interactions. A
    pretty-printed document, whose first line alone is not JSON, is parsed whole.

    A tool's file that needs what `options` (a `lib.source_files.SourceOptions`) does not give is
    refused naming its kind and what to pass (review14 F9): Phoenix's spans file, a promptfoo
    .jsonl's product (its lines name none); so is a Phoenix spans file given alone.
    """
    from lib.source_files import SourceOptions, file_head, phoenix_table

    source = source or path.name
    options = options or SourceOptions()
    head = file_head(path)
    table = phoenix_table(path, source, head)
    if table == "parquet":
        raise ImportFailed(
            f"{source}: a Parquet file, but not Phoenix span evaluations (no context.span_id or span_id "
            "column with label, score or explanation); Parquet is imported from Phoenix only"
        )
    if table == "spans":
        raise ImportFailed(
            f"{source}: a Phoenix spans file (span ids without label, score or explanation): import its "
            "span evaluations file instead, "
            + _pass(options.via, "phoenix", f"--spans {source}", "give this file as its spans file")
        )
    if table == "evaluations":
        if options.spans is None:
            raise ImportFailed(
                f"{source}: Phoenix span evaluations, which need the spans file they judged: "
                + _pass(options.via, "phoenix", "--spans FILE (the spans dataframe as Parquet or CSV)",
                        "give its spans file")
            )  # fmt: skip
        return "phoenix", None
    kind, document = _detect(path, source, head)
    if kind == "promptfoo-lines":
        if not options.product:
            raise ImportFailed(
                f"{source}: promptfoo results, one per line (`promptfoo eval -o results.jsonl`), whose "
                "lines name no product: "
                + _pass(options.via, "promptfoo", "--product NAME", "name its product")
            )
        kind = "promptfoo"
    # A tool's document parsed whole here is its reader's (`read_source`): one parse, not two.
    return kind, document


def _detect(path: Path, source: str, raw_head: bytes) -> tuple[str, Any]:
    head = raw_head.removeprefix(BOM).decode("utf-8", errors="replace").lstrip()
    if not head:
        raise ImportFailed(f"{source}: the file is empty")
    if head.startswith("["):
        data = read_document(path, source)
        return _kind_of_document(data, source), data
    if _CACHE_HEAD.match(head):
        return "judgments", None
    try:
        first = next(nonblank(jsonl_records(path, source)), None)
    except ImportFailed as line_error:
        if not _first_line_is_incomplete(path):
            raise
        try:  # a pretty-printed document, or JSON Lines whose first line is cut short?
            data = read_document(path, source)
        except ImportFailed:
            if _second_line_is_a_record(path):
                raise line_error from None
            raise
        return _kind_of_document(data, source), data
    if first is None:
        raise ImportFailed(f"{source}: the file is empty")
    obj = first[1]
    if isinstance(obj, Mapping):
        if "note_type" in obj:
            return "notes", None
        if "model_answer" in obj:
            return "evaluations", None
        if {"product", "question", "answer"} <= obj.keys():
            return "interactions", None
    return _kind_of_document(obj, source), None


def _check_options(kind: str, options: Any, source: str) -> None:
    """Refuse an option the kind has no use for rather than ignore it: `--product` on a file whose
    records name their own product, `--spans` on any but Phoenix (review14 F9)."""
    wasted = [
        flag
        for flag, value, kinds in (
            ("--product", options.product, SOURCE_KINDS),
            ("--label-scores", options.label_scores, SOURCE_KINDS),
            ("--spans", options.spans, ("phoenix",)),
        )
        if value and kind not in kinds
    ]
    if wasted:
        takes = "phoenix" if wasted == ["--spans"] else "promptfoo, langfuse and phoenix"
        raise ImportFailed(
            f"{source}: {' and '.join(wasted)} applies to {takes} files only, and this one holds {kind}; "
            "leave it out (or pass the --kind the file is)"
        )


def _first_line_is_incomplete(path: Path) -> bool:
    """True when the first non-blank line is a JSON prefix cut short (a multi-line document)."""
    with path.open("rb") as fh:
        line = ""
        while not line:
            raw = fh.readline(MAX_LINE_BYTES + 1)
            if not raw or len(raw) > MAX_LINE_BYTES:
                return False
            line = raw.removeprefix(BOM).decode("utf-8", errors="replace").strip()
    try:
        json.loads(line)
    except json.JSONDecodeError as exc:
        return exc.pos >= len(line)
    except RecursionError:
        return False
    return False


def _second_line_is_a_record(path: Path) -> bool:
    """True when the second non-blank line is a JSON object on its own: the file is JSON Lines."""
    with path.open("rb") as fh:
        lines = (raw.strip() for raw in iter(lambda: fh.readline(MAX_LINE_BYTES + 1), b""))
        nonblank = [line for _, line in zip(range(2), (line for line in lines if line), strict=False)]
    if len(nonblank) < 2 or len(nonblank[1]) > MAX_LINE_BYTES:
        return False
    try:
        return isinstance(json.loads(nonblank[1]), dict)
    except (ValueError, RecursionError):
        return False


def import_path(
    *,
    engine: Engine,
    path: Path,
    kind: str | None,
    reviewer: Actor | str,
    progress: Callable[[int, int], None] | None = None,
    options: Any = None,
) -> ImportReport:
    """Import one file, detecting its kind when not given; a bad file is refused whole.

    Storing interactions triggers their auto-evaluation (seed 003 §1): every new, unreviewed one
    goes through the worker pool, `progress(done, total)` after each. `options` (a
    `lib.source_files.SourceOptions`) names the product and Phoenix's spans file for source kinds.
    """
    actor = authorize(engine, reviewer, Permission.IMPORT)
    try:
        # The load's collections walk its own objects, not the app's, from the file's first read
        # (another tool's file or a document is read whole before its rows): `_bulk_load` nests.
        # A deadlock's victim on PostgreSQL (the load's counter rows against a review's, an archive's or
        # a re-judge's) is run again whole: the file is read again and nothing of the attempt is left.
        with bulk.frozen_heap():
            report = run_retrying(
                engine,
                lambda: _import_file(engine=engine, path=path, kind=kind, actor=actor, options=options),
            )
    except ImportFailed as exc:
        raise type(exc)(f"{exc}; nothing was imported") from None
    if report.kind == "interactions":
        from lib import precedents

        report.evaluation = precedents.evaluate_new(engine, report.new_ids, progress=progress)
    return report


def _import_file(
    *, engine: Engine, path: Path, kind: str | None, actor: Actor, options: Any = None
) -> ImportReport:
    source = path.name
    reviewer = actor.identity
    if not path.is_file():
        raise ImportFailed(f"{path}: no such file")
    if kind is not None and kind not in KINDS:
        raise ImportFailed(f"unknown kind {kind!r}; choose one of {', '.join(KINDS)}")
    from lib.source_files import DEFAULT_PRODUCTS, SourceOptions, read_source

    options = options or SourceOptions()
    document = None
    if kind is None:
        kind, document = detect_kind(path, source, options)
    _check_options(kind, options, source)
    if kind in SOURCE_KINDS:
        read = read_source(kind, path, options, source, document)
        document = None  # its records are read: the parsed document is not held through the import
        with session_scope(engine) as session:
            score_stored_labels(session, read.evaluations, read.label_scores, via=read.via)
            fresh, extended, added, reviewed, not_taken = _extend_stored(
                session, read.evaluations, actor, read.via
            )
            reviewed += sum(v.human for ev in fresh for v in ev.verdicts)  # each becomes a reviewer score
            report = import_source_evaluations(
                session=session, evaluations=fresh, source=source, reviewer=actor, via=read.via
            )
        report.kind, report.unjudged, report.off_trace = kind, read.unjudged, read.off_trace
        report.text_scores, report.superseded, report.untraced = (
            read.text_scores,
            read.superseded,
            read.untraced,
        )
        report.skipped += extended
        report.judgments += added
        report.extended = added
        report.reviewer_scores, report.not_taken = reviewed, not_taken
        if kind != "phoenix" and not (options.product or "").strip():  # a Phoenix file never names one
            default = DEFAULT_PRODUCTS[kind]
            report.defaulted = sum(ev.product == default for ev in read.evaluations)
            report.default_product, report.product_advice = default, PRODUCT_ADVICE[read.via]
        return report
    if kind in ("evaluations", "notes", "interactions"):
        records = nonblank(jsonl_records(path, source))

        def prepare() -> _Prepared:
            # Validate under a read-only session: SQLite's write lock is held only for the inserts.
            with session_scope(engine, read_only=True) as session:
                if kind == "evaluations":
                    return _prepare_evaluations(
                        session=session, records=records, source=source, reviewer=reviewer
                    )
                if kind == "interactions":
                    return _prepare_interactions(records=records, source=source, reviewer=reviewer)
                return _prepare_notes(records=records, source=source, reviewer=reviewer)

        def write(prepared: _Prepared) -> ImportReport:
            with session_scope(engine) as session:
                if kind == "evaluations":
                    return _write_evaluations(session, prepared)
                if kind == "interactions":
                    return _write_interactions(session, prepared)
                return _write_notes(session, prepared)

        return _bulk_load(prepare, write)
    data = document if document is not None else read_document(path, source)
    with session_scope(engine) as session:
        if kind == "judgments":
            return import_judgments_cache(session=session, data=data, source=source, reviewer=actor)
        return import_metrics(session=session, data=data, source=source, reviewer=actor)
