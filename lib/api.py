"""The pipeline API (issue 13): `/api/v1`, served by the app's own server (see `serve.py`).

Thin on purpose: every endpoint authenticates a bearer token (lib.tokens), checks the token's role
against lib.auth's one permission table, and calls the lib function the CLI calls. The history and
notes blocks are the very text `python -m lib history|notes --format prompt` prints; evaluations go
through lib.importer (all or nothing, idempotent); reviews through corrections.record_review
(optimistic locking). Errors: no token 401, role too low 403, unknown 404, stale version 409 with
the other reviewer's decision, body too large 413, invalid record 422 naming line and field,
malformed JSON 400 with its position, an import another writer collided with 409 with Retry-After.
A refused request writes nothing.

Order of checks (issue 24): the token and its role are checked before a byte of the body is read
(no endpoint declares a FastAPI body parameter, which FastAPI would read and parse before any
dependency runs; tests/test_api.py checks every route); then the body is read through
`_capped_body`, which refuses it (413) as soon as it passes the route's limit, declared or counted,
so nothing past the limit is held or parsed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import (
    FileResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from fastapi_offline import FastAPIOffline
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool

from lib.auth import Actor, Permission, PermissionDenied, require
from lib.claims import TempFolder
from lib.json_files import BOM
from lib.records import ImportFailed

if TYPE_CHECKING:  # the closures' sessions; lib.db is imported where a request needs it
    from sqlmodel import Session

log = logging.getLogger(__name__)
API_PREFIX = "/api/v1"
MAX_AGREEMENT_RESAMPLES = 10_000  # bootstrap resamples one request may ask for (each costs CPU)
MIB = 1024 * 1024
_LINE = re.compile(r"(?:line|record) (\d+)")
# The file and place an importer's message starts with: "spans.csv line 3", "evaluations.parquet row 2".
_PLACE = re.compile(r"^(\S+\.\w+) (line|row) (\d+)")
_FIELD = re.compile(r"field '?([A-Za-z_][A-Za-z0-9_.]*)'?")


class ApiError(Exception):
    """An HTTP error with a JSON body: `detail` plus any extra keys (line, field, current, ...)."""

    def __init__(
        self, status: int, detail: str, *, headers: dict[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(detail)
        self.status, self.detail, self.extra, self.headers = status, detail, extra, headers or {}


@lru_cache(maxsize=1)
def _default_engine() -> Engine:
    from lib.db import init_db

    return init_db()


def token_actor(request: Request) -> Actor:
    """The bearer token's actor; 401 when the token is missing, unknown, revoked or expired. A live
    token's last use is noted (at most once a minute)."""
    from lib import tokens
    from lib.db import session_scope

    scheme, _, secret = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise ApiError(401, "an API token is required: send 'Authorization: Bearer <token>'")
    engine = request.app.state.get_engine()
    with session_scope(engine, read_only=True) as session:
        token = tokens.find_token(session=session, secret=secret.strip())
        refused = tokens.refusal(token)
    if token is None or refused is not None:
        request.state.token_name = token.name if token is not None else None  # for the audit row
        raise ApiError(401, refused or "unknown or revoked API token")
    tokens.record_use(engine=engine, token=token)
    return Actor(identity=token.name, role=token.role, kind="token")


async def audit_refusal(request: Request, status: int, reason: str, identity: str | None = None) -> None:
    """A refused request (401, 403) in the audit trail, rate-limited (lib.auth.record_refusal): who,
    what was asked, from where, and why. Never the token's secret."""
    from lib.auth import record_refusal

    who = identity or getattr(request.state, "token_name", None) or "anonymous"
    client = request.client.host if request.client else "unknown client"
    detail = f"{status} {request.method} {request.url.path} from {client}: {reason}"
    try:
        await run_in_threadpool(
            record_refusal, engine=request.app.state.get_engine(), identity=who, detail=detail
        )
    except Exception:  # the refusal stands even if the audit cannot be written
        log.warning("could not audit a refused API request", exc_info=True)


Token = Annotated[Actor, Depends(token_actor)]

# The OpenAPI description of a JSON-object body (read by hand, after authentication).
_JSON_BODY: dict[str, Any] = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}
}


# OTLP/HTTP bodies (lib.otlp): ExportTraceServiceRequest / ExportLogsServiceRequest.
_OTLP_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/x-protobuf": {"schema": {"type": "string", "format": "binary"}},
            "application/json": {"schema": {"type": "object"}},
        },
    }
}


# `POST /imports/phoenix`: Phoenix's two files as multipart/form-data parts (read by hand, after
# authentication, through `_capped_body`).
PHOENIX_PARTS = ("evaluations", "spans")
_PHOENIX_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": list(PHOENIX_PARTS),
                    "properties": {
                        "evaluations": {
                            "type": "string",
                            "format": "binary",
                            "description": "span evaluations: SpanEvaluations.save() Parquet, or its dataframe as CSV",
                        },
                        "spans": {
                            "type": "string",
                            "format": "binary",
                            "description": "the spans dataframe (get_spans_dataframe) as Parquet or CSV",
                        },
                    },
                }
            }
        },
    }
}


async def _capped_body(request: Request, limit: int, setting: str) -> AsyncIterator[bytes]:
    """The body chunk by chunk as it arrives; 413 once it is over `limit` bytes, declared or counted."""
    too_big = f"the body is over the {limit // MIB} MB limit ({setting})"
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, too_big)
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, too_big)
        yield chunk


async def _json_object(request: Request, limit: int) -> dict[str, Any]:
    """The body as one JSON object, read within `limit`: 400 when malformed, 422 when not an object."""
    raw = bytearray()
    async for chunk in _capped_body(request, limit, "OVERRULE_API_MAX_JSON_MB"):
        raw += chunk
    value = _parse_json(bytes(raw))
    if not isinstance(value, dict):
        raise ApiError(422, "send one JSON object as the body")
    return value


async def _multipart_files(
    request: Request, limit: int, folder: Path, names: tuple[str, ...]
) -> dict[str, Path]:
    """The named file parts of a multipart/form-data body, written to `folder` (each as
    `<name>.parquet` or `<name>.csv`, by its first bytes); the body is read through `_capped_body`
    (413 past `limit`); 415 when the body is not multipart, 422 when a part is missing or extra."""
    from starlette.formparsers import MultiPartException, MultiPartParser

    from lib.source_files import PARQUET_MAGIC

    wanted = " and ".join(f"'{n}'" for n in names)
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        raise ApiError(
            415, f"send multipart/form-data with the file parts {wanted} (curl -F {names[0]}=@FILE ...)"
        )
    parser = MultiPartParser(
        request.headers,
        _capped_body(request, limit, "OVERRULE_API_MAX_BODY_MB"),
        max_files=len(names),
        max_fields=0,
    )
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise ApiError(
            400, f"not a usable multipart/form-data body: {exc}; send the file parts {wanted}"
        ) from None
    try:
        extra = sorted(set(form.keys()) - set(names))
        if extra:
            raise ApiError(
                422, f"unknown part(s) {', '.join(map(repr, extra))}; send the file parts {wanted}"
            )
        paths: dict[str, Path] = {}
        for name in names:
            part = form.get(name)
            if part is None or isinstance(part, str):
                raise ApiError(
                    422, f"the file part {name!r} is missing; send the file parts {wanted}", field=name
                )
            await part.seek(0)
            head = await part.read(len(PARQUET_MAGIC))
            await part.seek(0)
            paths[name] = folder / f"{name}.{'parquet' if head == PARQUET_MAGIC else 'csv'}"
            with paths[name].open("wb") as fh:
                while chunk := await part.read(1024 * 1024):
                    await run_in_threadpool(fh.write, chunk)
        return paths
    finally:
        await form.close()


class _FolderFileResponse(FileResponse):
    """A file in a `TempFolder`, sent, then the folder removed however the sending ends: a
    background task would be skipped when `send` raises (a client gone, under an ASGI 2.4 server)."""

    def __init__(self, folder: TempFolder, path: Path, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.folder = folder

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.folder.remove()


def create_app(
    engine: Engine | None = None, *, max_body_mb: int | None = None, max_json_mb: int | None = None
) -> FastAPI:
    """The FastAPI sub-application; mount it at `/api/v1`. `engine` defaults to the app's database."""
    from lib.config import get_settings

    settings = get_settings()
    limit = (max_body_mb if max_body_mb is not None else settings.api_max_body_mb) * MIB
    json_limit = (max_json_mb if max_json_mb is not None else settings.api_max_json_mb) * MIB
    # The docs pages load Swagger UI / ReDoc and their favicon from the app (fastapi-offline ships
    # them), not from a CDN: an offline install shows them, and a reader's browser asks no one else.
    api = FastAPIOffline(
        title="Overrule pipeline API",
        version="1",
        description="Push evaluations, pull the correction history and notes a judge prompt gets, review.",
        docs_url="/docs",
        redoc_url="/redoc",
        openapi_url="/openapi.json",
    )

    def get_engine() -> Engine:
        return engine if engine is not None else _default_engine()

    api.state.get_engine = get_engine

    @api.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        headers = {**({"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}), **exc.headers}
        if exc.status in (401, 403):
            await audit_refusal(request, exc.status, exc.detail)
        return JSONResponse({"detail": exc.detail, **exc.extra}, status_code=exc.status, headers=headers)

    @api.exception_handler(PermissionDenied)
    async def _denied(request: Request, exc: PermissionDenied) -> JSONResponse:
        await audit_refusal(request, 403, str(exc), exc.actor.identity if exc.actor is not None else None)
        return JSONResponse({"detail": str(exc)}, status_code=403)

    def _run(fn: Callable[[], Any]) -> Any:
        """Call a lib function, turning its refusals into HTTP errors (ValueError: bad input, 422)."""
        from lib.corrections import ReviewConflict, judgment_state_json
        from lib.queues import ItemTaken, NotRevealed

        try:
            return fn()
        except ReviewConflict as exc:
            raise ApiError(
                409, exc.describe(), current=jsonable_encoder(judgment_state_json(exc.current))
            ) from None
        except (ItemTaken, NotRevealed) as exc:  # a queue item held by others; blind labels missing
            raise ApiError(409, str(exc)) from None
        except LookupError as exc:  # JudgmentNotFound, an unknown audit or note
            raise ApiError(404, str(exc).strip("'\"")) from None
        except PermissionDenied:
            raise
        except ValueError as exc:
            raise ApiError(422, str(exc)) from None

    def _write(work: Callable[[Session], Any]) -> Any:
        """`work(session)` as one write (`lib.db.write_retrying`: run again when PostgreSQL made it
        a deadlock's victim), its refusals turned into HTTP errors (`_run`)."""
        from lib.db import write_retrying

        return _run(lambda: write_retrying(get_engine(), work))

    async def otlp_export(request: Request, actor: Actor, signal: str) -> Response:
        """OTLP/HTTP (lib.otlp): the token's role first, then the media type, then the body, capped
        as it streams and once un-gzipped; errors as OTLP's Status in the request's encoding."""
        from lib import otlp
        from lib.config import get_settings
        from lib.importer import ImportConflict

        require(actor, Permission.IMPORT)
        kind, headers = otlp.JSON, {}
        try:
            kind = otlp.media_type(request.headers.get("content-type", ""))
            raw = bytearray()
            try:
                async for chunk in _capped_body(request, json_limit, "OVERRULE_API_MAX_JSON_MB"):
                    raw += chunk
            except ApiError as exc:
                raise otlp.OtlpError(exc.status, exc.detail) from None
            encoding = request.headers.get("content-encoding", "")
            settings = get_settings()
            # Off the event loop, as the decode is: the server's loop serves the pages too.
            body = await run_in_threadpool(otlp.read_body, bytes(raw), encoding, json_limit)
            outcome = await run_in_threadpool(
                lambda: otlp.receive(
                    engine=get_engine(), signal=signal, body=body, kind=kind, settings=settings, actor=actor
                )
            )
        except otlp.OtlpError as exc:
            status, message = exc.status, exc.message
        except ImportConflict as exc:  # another writer at the same moment: OTLP clients retry a 503
            status, message, headers = 503, str(exc), {"Retry-After": "1"}
        else:
            if outcome.says:
                # The SDK's exporters never read a partial success: the server's log is where an
                # operator sees what was not stored.
                log.warning(
                    "OTLP %s from %s: %d rejected: %s",
                    signal,
                    actor,
                    outcome.rejected,
                    otlp.logged_messages(outcome.messages),
                )
            return Response(otlp.response_body(signal, outcome, kind), media_type=kind)
        body = otlp.status_body(otlp.GRPC_CODE.get(status, 2), message, kind)
        return Response(body, status_code=status, media_type=kind, headers=headers)

    @api.post("/otlp/v1/traces", response_class=Response, openapi_extra=_OTLP_BODY)
    async def otlp_traces(actor: Token, request: Request) -> Response:
        """OTLP/HTTP traces (protobuf or JSON, gzip): GenAI spans with their `gen_ai.evaluation.result`
        events become evaluations with one judgment per evaluation name; the answer is OTLP's
        ExportTraceServiceResponse, its partial success naming each span that could not be mapped.
        Also served at `/v1/traces` on the app's root. Needs a role that may import (lead)."""
        return await otlp_export(request, actor, "traces")

    @api.post("/otlp/v1/logs", response_class=Response, openapi_extra=_OTLP_BODY)
    async def otlp_logs(actor: Token, request: Request) -> Response:
        """OTLP/HTTP logs: `gen_ai.evaluation.result` events sent as log records in the judged span's
        context (or naming its `gen_ai.response.id`); they join their span whichever arrives first.
        Also served at `/v1/logs` on the app's root."""
        return await otlp_export(request, actor, "logs")

    @api.post("/otlp/v1/metrics", response_class=Response, openapi_extra=_OTLP_BODY)
    async def otlp_metrics(actor: Token, request: Request) -> Response:
        """OTLP/HTTP metrics are not taken: 501 with a google.rpc.Status saying to set
        `OTEL_METRICS_EXPORTER=none` (an SDK exports metrics by default). The token is checked as
        on the other OTLP routes, so a wrong one is told so first. Also at `/v1/metrics`."""
        from lib import otlp

        require(actor, Permission.IMPORT)
        try:
            kind = otlp.media_type(request.headers.get("content-type", ""))
        except otlp.OtlpError:  # not OTLP's: the answer in JSON, still saying what to change
            kind = otlp.JSON
        body = otlp.status_body(otlp.GRPC_CODE[501], otlp.METRICS_REFUSED, kind)
        return Response(body, status_code=501, media_type=kind)

    @api.get("/otlp/waiting")
    def otlp_waiting(actor: Token, limit: Annotated[int, Query(ge=0, le=10_000)] = 100) -> dict[str, Any]:
        """What the OTLP receiver keeps waiting for its other half (lib.otlp_waiting): counts by why
        (rows of verdicts among the oldest `otlp_waiting.CLASSED`, the rest `unclassed`), the oldest
        `limit` rows with what the sender should change, what was forgotten. Lead. Why the bound:
        classing every row cost each call ~0.3 CPU s per 100k waiting verdicts, whatever `limit`."""
        from lib import otlp_waiting
        from lib.db import session_scope

        require(actor, Permission.SEE_OTLP_WAITING)
        with session_scope(get_engine(), read_only=True) as session:
            waiting = otlp_waiting.read(session, limit=limit, classed=otlp_waiting.CLASSED)
            return otlp_waiting.waiting_record(waiting)

    @api.get("/health")
    def health() -> dict[str, Any]:
        """Database reachable and migrated to the newest revision (no token needed: it shows no data)."""
        from alembic.runtime.migration import MigrationContext
        from alembic.script import ScriptDirectory

        from lib.db import alembic_config

        eng = get_engine()
        head = ScriptDirectory.from_config(alembic_config()).get_current_head()
        try:
            with eng.connect() as conn:
                current = MigrationContext.configure(conn).get_current_revision()
        except Exception as exc:  # any driver error means "not reachable"
            raise ApiError(503, f"database unreachable: {type(exc).__name__}") from None
        if current != head:
            raise ApiError(503, "database schema is not current", revision=current, head=head)
        return {"status": "ok", "database": eng.dialect.name, "revision": current}

    @api.get("/history", response_model=None)
    def history(
        actor: Token,
        product: str,
        metric: str | None = None,
        max_entries: int | None = None,
        ratio: float | None = None,
        format: Literal["json", "prompt"] = "json",
    ) -> Any:
        """The seed-004 history a judge prompt for `product` gets: what `python -m lib history` prints."""
        from lib import corrections
        from lib.config import get_settings
        from lib.db import session_scope

        require(actor, Permission.READ)
        settings = get_settings()
        entries = settings.history_max_entries if max_entries is None else max_entries
        share = settings.history_correction_ratio if ratio is None else ratio
        with session_scope(get_engine(), read_only=True) as session:
            chosen = _run(
                lambda: corrections.select_history(
                    session, product, max_entries=entries, correction_ratio=share, metric=metric
                )
            )
            if format == "prompt":  # byte for byte the CLI's stdout (print adds the newline)
                return PlainTextResponse(corrections.format_history_for_prompt(chosen) + "\n")
            return [corrections.history_record(j) for j in chosen]

    @api.get("/notes", response_model=None)
    def get_notes(
        actor: Token,
        language: str,
        tags: Annotated[list[str], Query()] = [],  # noqa: B006 - FastAPI copies defaults
        session_id: str | None = Query(None, alias="session"),
        format: Literal["json", "prompt"] = "json",
    ) -> Any:
        """Notes relevant to a judge of `language` (and tags): what `python -m lib notes` prints."""
        from lib import notes
        from lib.db import session_scope

        require(actor, Permission.READ)
        with session_scope(get_engine(), read_only=True) as session:
            found = _run(lambda: notes.relevant_notes(session=session, language=language, tags=tags))
            if format == "prompt":
                return PlainTextResponse(
                    notes.format_notes_for_prompt(found, current_session=session_id) + "\n"
                )
            return [notes.note_record(n) for n in found]

    @api.post("/notes", status_code=201, openapi_extra=_JSON_BODY)
    async def post_note(actor: Token, request: Request) -> dict[str, Any]:
        """Add one note (`content`, `type`, optional `language`, `code`, `confidence`, `session`)."""
        from lib import notes
        from lib.db import session_scope

        require(actor, Permission.NOTE)
        body = await _json_object(request, json_limit)

        def add() -> dict[str, Any]:
            with session_scope(get_engine()) as session:
                note = notes.add_note(
                    session=session,
                    language=_opt_str(body, "language") or "",
                    note_type=_req_str(body, "type"),
                    content=_req_str(body, "content"),
                    phelps_code=_opt_str(body, "code"),
                    confidence=body.get("confidence"),
                    session_id=_opt_str(body, "session"),
                    created_by=actor,
                )
                return notes.note_record(note)

        return await run_in_threadpool(_run, add)

    async def receive_and_import(
        request: Request,
        actor: Actor,
        kind: str,
        *,
        judge: bool = False,
        concurrency: int | None = None,
        options: Any = None,
    ) -> dict[str, Any]:
        """Stream the body to a private file (413 past the limit), then run the importer on it, or,
        with `judge`, the judge's batch (`python -m lib judge FILE`) on it."""
        require(actor, Permission.IMPORT)
        if judge:
            _check_can_judge(actor)
        with await run_in_threadpool(TempFolder, "api") as folder:
            path = folder / ("request.jsonl" if options is None else f"{kind}.json")
            with path.open("wb") as fh:  # streamed to disk: the importer reads it line by line
                async for chunk in _capped_body(request, limit, "OVERRULE_API_MAX_BODY_MB"):
                    await run_in_threadpool(fh.write, chunk)
            if judge:
                return await run_in_threadpool(_judge_body, get_engine(), path, actor, concurrency)
            if kind == "promptfoo" and await run_in_threadpool(_promptfoo_lines, path):
                path = path.rename(path.with_suffix(".jsonl"))  # the summary's and refusals' name
            report = await run_in_threadpool(_import_body, get_engine(), path, actor, kind, options)
        return _report_answer(report)

    @api.post("/evaluations")
    async def post_evaluations(
        actor: Token,
        request: Request,
        judge: bool = False,
        concurrency: Annotated[int | None, Query(ge=1, le=64)] = None,
    ) -> dict[str, Any]:
        """Import evaluations (JSON Lines, or one JSON array) all or nothing; re-posting adds nothing.

        With `?judge=true` the lines are questions and answers without judge fields (the format of
        `python -m lib judge FILE`): the built-in judge runs Stage 1 + 2 on each line not yet judged
        and the answer reports judged / skipped / failed lines; re-posting resumes (judged lines are
        skipped). Needs a role that may judge (lead) and a configured LLM (503 otherwise).
        """
        return await receive_and_import(request, actor, "evaluations", judge=judge, concurrency=concurrency)

    @api.post("/imports/phoenix", openapi_extra=_PHOENIX_BODY)
    async def post_phoenix_import(
        actor: Token, request: Request, product: str | None = None, label_scores: str | None = None
    ) -> dict[str, Any]:
        """Import Phoenix span evaluations with their spans, all or nothing, as `python -m lib import
        EVALS --kind phoenix --spans SPANS`: multipart/form-data with two file parts, `evaluations`
        and `spans` (each Parquet or CSV; together within OVERRULE_API_MAX_BODY_MB). `?product=`
        files them under a product, `?label_scores=frustrated=1,ok=0` scores labels sent without a
        number. A broken file is refused whole (422 naming file, line or row, and field)."""
        from lib.source_files import SourceOptions

        require(actor, Permission.IMPORT)
        with await run_in_threadpool(TempFolder, "api") as folder:
            paths = await _multipart_files(request, limit, folder, PHOENIX_PARTS)
            options = SourceOptions(
                product=product, spans=paths["spans"], label_scores=label_scores, via="api"
            )
            report = await run_in_threadpool(
                _import_body, get_engine(), paths["evaluations"], actor, "phoenix", options
            )
        return _report_answer(report)

    @api.post("/imports/{kind}")
    async def post_source_import(
        actor: Token, request: Request, kind: str, product: str | None = None, label_scores: str | None = None
    ) -> dict[str, Any]:
        """Import another tool's results file as evaluations, all or nothing, as `python -m lib import
        FILE --kind promptfoo|langfuse`: promptfoo's `-o results.json` (or .jsonl), Langfuse traces and
        scores. `?product=` files them under a product, `?label_scores=` as on `/imports/phoenix`.
        Phoenix (two files) has `/imports/phoenix`."""
        from lib.source_files import SourceOptions

        if kind not in ("promptfoo", "langfuse"):
            raise ApiError(404, f"no importer for {kind!r} here: promptfoo, langfuse or phoenix")
        options = SourceOptions(product=product, label_scores=label_scores, via="api")
        return await receive_and_import(request, actor, kind, options=options)

    @api.get("/webhooks")
    def list_webhooks(actor: Token) -> list[dict[str, Any]]:
        """Registered webhooks (never their secrets); lead."""
        from lib import webhooks
        from lib.db import session_scope

        require(actor, Permission.MANAGE_WEBHOOKS)
        with session_scope(get_engine(), read_only=True) as session:
            return [webhooks.webhook_record(w) for w in webhooks.list_webhooks(session=session)]

    @api.post("/webhooks", status_code=201, openapi_extra=_JSON_BODY)
    async def post_webhook(actor: Token, request: Request) -> dict[str, Any]:
        """Register `{url, events: [...], description}`; the answer holds the signing `secret`, once."""
        from lib import webhooks
        from lib.db import session_scope

        require(actor, Permission.MANAGE_WEBHOOKS)
        body = await _json_object(request, json_limit)
        events = body.get("events")
        if not isinstance(events, list):
            raise ApiError(422, "events must be a list of event names", field="events")

        def add() -> dict[str, Any]:
            with session_scope(get_engine()) as session:
                hook, secret = webhooks.register_webhook(
                    session=session, actor=actor, url=_req_str(body, "url"), events=events,
                    description=_opt_str(body, "description") or "",
                )  # fmt: skip
                return {**webhooks.webhook_record(hook), "secret": secret}

        return await run_in_threadpool(_run, add)

    @api.get("/webhooks/{webhook_id}/deliveries")
    def webhook_deliveries(
        actor: Token,
        webhook_id: int,
        status: Literal["pending", "delivered", "failed"] | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> list[dict[str, Any]]:
        """A webhook's delivery log, newest first: event, status, attempts, last response code, body."""
        from lib import webhooks
        from lib.db import session_scope

        require(actor, Permission.MANAGE_WEBHOOKS)
        with session_scope(get_engine(), read_only=True) as session:
            rows = webhooks.list_deliveries(
                session=session, webhook_id=webhook_id, status=status, limit=limit
            )
            return [webhooks.delivery_record(d) for d in rows]

    @api.post("/webhooks/deliveries/{delivery_id}/replay")
    def replay_webhook_delivery(actor: Token, delivery_id: int) -> dict[str, Any]:
        """Send a delivered or failed delivery again (the same body and event id)."""
        from lib import webhooks
        from lib.db import session_scope

        require(actor, Permission.MANAGE_WEBHOOKS)

        def replay() -> dict[str, Any]:
            with session_scope(get_engine()) as session:
                return webhooks.delivery_record(
                    webhooks.replay_delivery(session=session, actor=actor, delivery_id=delivery_id)
                )

        return _run(replay)

    @api.post("/interactions")
    async def post_interactions(actor: Token, request: Request) -> dict[str, Any]:
        """Import seed-003 interactions (JSON Lines) all or nothing, as `python -m lib import --kind
        interactions`: new unreviewed ones are auto-evaluated by precedent before the answer."""
        return await receive_and_import(request, actor, "interactions")

    @api.get("/judgments/{change_id}")
    def get_judgment(actor: Token, change_id: str) -> JSONResponse:
        """One judgment's reviewable state; its `version` (also the ETag) goes into PATCH's If-Match."""
        from lib import corrections
        from lib.db import session_scope

        require(actor, Permission.READ)
        with session_scope(get_engine(), read_only=True) as session:
            judgment = corrections.get_judgment(session=session, change_id=change_id)
            if judgment is None:
                raise ApiError(404, f"no judgment with change_id {change_id!r}")
            state = corrections.JudgmentState.of(judgment, None)
        return JSONResponse(
            jsonable_encoder(corrections.judgment_state_json(state)), headers={"ETag": f'"{state.version}"'}
        )

    @api.patch("/judgments/{change_id}", openapi_extra=_JSON_BODY)
    async def review_judgment(
        actor: Token,
        change_id: str,
        request: Request,
        if_match: Annotated[str | None, Header()] = None,
    ) -> JSONResponse:
        """`{"action": "confirm"}` or `{"action": "overrule", "decision": ..., "reason": ...}` as of the
        version in If-Match; 409 with the other reviewer's decision if it moved."""
        from lib import corrections

        require(actor, Permission.REVIEW)
        if if_match is None:
            raise ApiError(428, "send If-Match with the judgment's version (GET it first)")
        try:
            expected = int(if_match.strip().removeprefix("W/").strip('"'))
        except ValueError:
            raise ApiError(400, f"If-Match must be a judgment version, got {if_match!r}") from None
        body = await _json_object(request, json_limit)
        action = _req_str(body, "action")  # "confirm" or "overrule": record_review checks it

        def review(session: Session) -> corrections.JudgmentState:
            judgment = corrections.get_judgment(session=session, change_id=change_id)
            if judgment is None or judgment.id is None:
                raise corrections.JudgmentNotFound(f"no judgment with change_id {change_id!r}")
            done = corrections.record_review(
                session=session,
                judgment_id=judgment.id,
                expected_version=expected,
                action=action,
                user_decision=body.get("decision"),
                reviewer=actor,
                reason=_opt_str(body, "reason"),
            )
            return corrections.JudgmentState.of(done, actor.identity)

        # Off the event loop (the pages share it): the write may wait on a row lock, and a
        # deadlock's victim sleeps before it runs again.
        state = await run_in_threadpool(_write, review)
        return JSONResponse(
            jsonable_encoder(corrections.judgment_state_json(state)), headers={"ETag": f'"{state.version}"'}
        )

    # --- Team review queues (lib.queues): the functions the review page and `python -m lib queue` call.

    @api.get("/queues")
    def list_review_queues(actor: Token, all: bool = False) -> list[dict[str, Any]]:
        """Review queues with their progress, the token's own (assigned to it) first."""
        from lib import queues
        from lib.db import session_scope

        require(actor, Permission.READ)
        with session_scope(get_engine(), read_only=True) as session:
            found = queues.list_queues(session=session, reviewer=actor.identity, include_closed=all)
            return jsonable_encoder(
                [
                    queues.queue_record(q, queues.queue_progress(session=session, queue_id=q.id or 0))
                    for q in found
                ]
            )

    @api.post("/queues", status_code=201, openapi_extra=_JSON_BODY)
    async def create_review_queue(actor: Token, request: Request) -> dict[str, Any]:
        """Create a queue (lead): `name` and optionally `product`, `metrics`, `language`, `since`,
        `until` (YYYY-MM-DD), `review_state`, `size`, `order`, `seed`, `overlap`, `mode`, `tolerance`,
        `reviewers`, `description`."""
        from lib import queues
        from lib.db import session_scope

        require(actor, Permission.MANAGE_QUEUES)
        body = await _json_object(request, json_limit)
        spec = _queue_spec(body)

        def create() -> dict[str, Any]:
            with session_scope(get_engine()) as session:
                queue = queues.create_queue(session=session, actor=actor, spec=spec)
                return jsonable_encoder(
                    queues.queue_record(queue, queues.queue_progress(session=session, queue_id=queue.id or 0))
                )

        return await run_in_threadpool(_run, create)

    @api.get("/queues/{queue}")
    def get_review_queue(actor: Token, queue: str) -> dict[str, Any]:
        """One queue (id or name): settings, progress and per-reviewer progress."""
        from lib import queues
        from lib.db import session_scope

        require(actor, Permission.READ)

        def read() -> dict[str, Any]:
            with session_scope(get_engine(), read_only=True) as session:
                found = queues.get_queue(session=session, queue=queue)
                progress = queues.queue_progress(session=session, queue_id=found.id or 0)
                people = queues.reviewer_progress(session=session, queue_id=found.id or 0)
                return jsonable_encoder(
                    {
                        **queues.queue_record(found, progress),
                        "reviewers_progress": queues.reviewer_progress_frame(people).to_dict("records"),
                    }
                )

        return _run(read)

    def _agreement(
        queue: str | None, product: list[str] | None, basis: str, table: str, resamples: int, seed: int
    ) -> dict[str, Any]:
        from lib import agreement, queues
        from lib.db import session_scope

        if not 0 <= resamples <= MAX_AGREEMENT_RESAMPLES:
            raise ApiError(422, f"'resamples' must be 0 to {MAX_AGREEMENT_RESAMPLES:,}", field="resamples")

        def read() -> dict[str, Any]:
            tables = agreement.parse_tables(table)
            with session_scope(get_engine(), read_only=True) as session:
                queue_ids = () if queue is None else (queues.get_queue(session=session, queue=queue).id or 0,)
                filters = agreement.AgreementFilters(
                    products=tuple(product or ()),
                    queue_ids=queue_ids,
                    basis=basis,
                    resamples=resamples,
                    seed=seed,
                )
                result = agreement.load_agreement(session=session, filters=filters)
            return jsonable_encoder(agreement.agreement_record(result, tables))

        return _run(read)

    @api.get("/queues/{queue}/agreement")
    def queue_agreement(
        actor: Token,
        queue: str,
        product: Annotated[list[str] | None, Query()] = None,
        basis: str = "final",
        table: str = "all",
        resamples: int = 1000,
        seed: int = 0,
    ) -> dict[str, Any]:
        """Agreement between the queue's reviewers (lib.agreement): `metrics`, `queues`, `pairs`,
        `calibration`, `anchoring` (pick with `table=`), each a list of rows with 95 % intervals;
        `basis=blind` reads blind-first labels given before the judge was shown."""
        require(actor, Permission.READ)
        return _agreement(queue, product, basis, table, resamples, seed)

    @api.get("/agreement")
    def all_agreement(
        actor: Token,
        product: Annotated[list[str] | None, Query()] = None,
        basis: str = "final",
        table: str = "all",
        resamples: int = 1000,
        seed: int = 0,
    ) -> dict[str, Any]:
        """Agreement between reviewers over every queue (per queue in `queues`); as the queue's own."""
        require(actor, Permission.READ)
        return _agreement(None, product, basis, table, resamples, seed)

    @api.patch("/queues/{queue}", openapi_extra=_JSON_BODY)
    async def change_review_queue(
        actor: Token,
        queue: str,
        request: Request,
    ) -> dict[str, Any]:
        """Assign (`reviewers`), rename (`name`), describe (`description`) or close (`status: "closed"`)
        a queue (lead)."""
        from lib import queues
        from lib.db import session_scope

        require(actor, Permission.MANAGE_QUEUES)
        body = await _json_object(request, json_limit)
        reviewers = body.get("reviewers")
        if reviewers is not None and not (
            isinstance(reviewers, list) and all(isinstance(r, str) for r in reviewers)
        ):
            raise ApiError(422, "'reviewers' must be a list of names", field="reviewers")
        status = body.get("status")
        if status not in (None, "closed"):
            raise ApiError(422, "'status' can only be set to 'closed'", field="status")

        def change() -> dict[str, Any]:
            with session_scope(get_engine()) as session:
                found = queues.get_queue(session=session, queue=queue)
                found = queues.update_queue(
                    session=session, actor=actor, queue_id=found.id or 0, reviewers=reviewers,
                    name=_opt_str(body, "name"), description=_opt_str(body, "description"),
                )  # fmt: skip
                if status == "closed":
                    found = queues.close_queue(session=session, actor=actor, queue_id=found.id or 0)
                return jsonable_encoder(queues.queue_record(found))

        return await run_in_threadpool(_run, change)

    @api.post("/queues/{queue}/next")
    def next_queue_item(actor: Token, queue: str) -> dict[str, Any]:
        """Reserve the token's next item (or the one it holds) and return it: in a blind-first queue
        before its blind labels, without the judge's score, reason or evidence. 204-like `null`
        item when nothing is left."""
        from lib import queues
        from lib.db import session_scope

        require(actor, Permission.REVIEW)

        def take() -> dict[str, Any]:
            with session_scope(get_engine()) as session:
                found = queues.get_queue(session=session, queue=queue)
                assignment = queues.next_assignment(session=session, queue_id=found.id or 0, reviewer=actor)
                if assignment is None:
                    return {"assignment": None, "item": None}
                return _queue_item(session, assignment, actor)

        return _run(take)

    @api.get("/queues/{queue}/items/{item_id}")
    def get_queue_item(actor: Token, queue: str, item_id: int) -> dict[str, Any]:
        """Open one item (a link): reserved for the token when it has room; 409 when it has its reviewers."""
        from lib import queues
        from lib.db import session_scope

        require(actor, Permission.REVIEW)

        def open_item() -> dict[str, Any]:
            with session_scope(get_engine()) as session:
                found = queues.get_queue(session=session, queue=queue)
                assignment = queues.open_assignment(
                    session=session, queue_id=found.id or 0, item_id=item_id, reviewer=actor
                )
                return _queue_item(session, assignment, actor)

        return _run(open_item)

    @api.post("/queues/{queue}/items/{item_id}/labels", openapi_extra=_JSON_BODY)
    async def post_labels(
        actor: Token,
        queue: str,
        item_id: int,
        request: Request,
    ) -> dict[str, Any]:
        """Labels of the item's judgments: `{"labels": [{"judgment_id": 1, "decision": 4, "reason": "..."}]}`
        (blind labels first in a blind-first queue; all or nothing)."""
        from lib import queues

        require(actor, Permission.REVIEW)
        body = await _json_object(request, json_limit)
        labels = _label_inputs(body)

        def save(session: Session) -> dict[str, Any]:
            found = queues.get_queue(session=session, queue=queue)
            outcome = queues.label_item(
                session=session, queue_id=found.id or 0, item_id=item_id, reviewer=actor, labels=labels
            )
            return {
                "stage": outcome.stage, "revealed": outcome.revealed, "item_done": outcome.item_done,
                "states": {str(k): v for k, v in outcome.states.items()},
            }  # fmt: skip

        return await run_in_threadpool(_write, save)

    @api.post("/queues/{queue}/items/{item_id}/skip")
    def skip_queue_item(actor: Token, queue: str, item_id: int) -> dict[str, Any]:
        """Pass an item over: it goes to other reviewers."""
        from lib import queues

        require(actor, Permission.REVIEW)

        def skip(session: Session) -> dict[str, Any]:
            found = queues.get_queue(session=session, queue=queue)
            queues.skip_item(session=session, queue_id=found.id or 0, item_id=item_id, reviewer=actor)
            return {"skipped": item_id}

        return _write(skip)

    @api.get("/queues/{queue}/disputes")
    def get_disputes(
        actor: Token,
        queue: str,
        state: str = "disputed",
        offset: int = 0,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
    ) -> list[dict[str, Any]]:
        """Judgments awaiting adjudication (or `state=resolved|adjudicated|released`), labels side by side.
        Not `open` ones: their judge side would reach reviewers of a blind-first queue before they label."""
        from lib import queues
        from lib.db import session_scope

        require(actor, Permission.READ)
        if state not in ("disputed", "resolved", "adjudicated", "released"):
            raise ApiError(422, "state must be disputed, resolved, adjudicated or released", field="state")

        def read() -> list[dict[str, Any]]:
            with session_scope(get_engine(), read_only=True) as session:
                found = queues.get_queue(session=session, queue=queue)
                found_disputes = queues.disputes(
                    session=session, queue_id=found.id or 0, state=state, offset=offset, limit=limit
                )
                return jsonable_encoder([queues.dispute_record(d) for d in found_disputes])

        return _run(read)

    @api.post("/queues/{queue}/judgments/{judgment_id}/adjudicate", openapi_extra=_JSON_BODY)
    async def post_adjudication(
        actor: Token,
        queue: str,
        judgment_id: int,
        request: Request,
    ) -> dict[str, Any]:
        """A lead decides a disputed judgment: `{"decision": ..., "reason": ...}` (a reason when it overrules the judge)."""
        from lib import queues

        require(actor, Permission.ADJUDICATE)
        body = await _json_object(request, json_limit)
        if "decision" not in body:
            raise ApiError(422, "the body needs 'decision'", field="decision")

        def decide(session: Session) -> dict[str, Any]:
            found = queues.get_queue(session=session, queue=queue)
            qj = queues.adjudicate(
                session=session, queue_id=found.id or 0, judgment_id=judgment_id, actor=actor,
                decision=body["decision"], reason=_opt_str(body, "reason"),
            )  # fmt: skip
            return {"judgment_id": judgment_id, "state": qj.state, "decision": qj.decision}

        return await run_in_threadpool(_write, decide)

    @api.post("/relevance/audits", openapi_extra=_JSON_BODY)
    async def post_audit(actor: Token, request: Request) -> dict[str, Any]:
        """Which notes a remote judge run showed, under which tags (`session_id`, `shown_note_ids`,
        `tags`, optional `product`, `snapshot_id`, `transcript`); idempotent per session id."""
        from lib import relevance
        from lib.db import session_scope

        require(actor, Permission.JUDGE)
        body = await _json_object(request, json_limit)
        shown = body.get("shown_note_ids")
        tags = body.get("tags", [])
        if not isinstance(shown, list) or not all(isinstance(i, int) for i in shown):
            raise ApiError(422, "'shown_note_ids' must be a list of note ids", field="shown_note_ids")
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise ApiError(422, "'tags' must be a list of strings", field="tags")
        transcript = body.get("transcript")
        if transcript is not None and not (
            isinstance(transcript, list) and all(isinstance(m, dict) for m in transcript)
        ):
            raise ApiError(422, "'transcript' must be a list of {role, content} messages", field="transcript")

        def record() -> dict[str, Any]:
            with session_scope(get_engine()) as session:
                audit = relevance.record_audit(
                    session=session,
                    session_id=_req_str(body, "session_id"),
                    shown_note_ids=shown,
                    env_tags=tags,
                    product=_opt_str(body, "product"),
                    snapshot_id=_opt_str(body, "snapshot_id"),
                    transcript=transcript,
                    recorded_by=actor.identity,
                )
                if audit is None:
                    return {"recorded": False, "detail": "none of the shown notes exists"}
                return {
                    "recorded": True,
                    "session_id": audit.session_id,
                    "shown_note_ids": audit.shown_lesson_ids,
                    "tags": audit.env_tags,
                }

        return await run_in_threadpool(_run, record)

    @api.post("/relevance/scores", openapi_extra=_JSON_BODY)
    async def post_scores(actor: Token, request: Request) -> dict[str, Any]:
        """A remote evaluator's scores for an audit (`session_id`, `scores`: {note_id: -1..1} or the
        seed's list); applied once per audit, as the built-in evaluator applies them."""
        from sqlmodel import col, select

        from lib import relevance
        from lib.db import session_scope
        from lib.models import SessionAudit

        require(actor, Permission.JUDGE)
        body = await _json_object(request, json_limit)
        session_id = _req_str(body, "session_id")

        def apply() -> dict[str, Any]:
            with session_scope(get_engine()) as session:
                audit = session.exec(
                    select(SessionAudit).where(col(SessionAudit.session_id) == session_id)
                ).first()
                if audit is None:
                    raise LookupError(f"no audit for session {session_id!r}")
                scores = relevance.parse_evaluator_reply(body, audit.shown_lesson_ids or [])
                applied = relevance.apply_evaluation(
                    session=session, audit_session_id=session_id, scores=scores, reviewer=actor.identity
                )
                return {"applied": applied, "scores": {str(k): v for k, v in scores.items()}}

        return await run_in_threadpool(_run, apply)

    @api.get("/exports/{table}", response_model=None)
    def export(
        actor: Token,
        table: str,
        format: Literal["csv", "parquet", "jsonl"] = "csv",
        form: Literal["wide", "long"] | None = None,
    ) -> FileResponse | StreamingResponse:
        """A table streamed as CSV (formula-safe), Parquet or JSON Lines, through lib.export.

        `form` (evaluations, CSV): the Evaluations page's CSV of every live evaluation with, per
        metric, the user's score, the judge's score, the gap and the reviewer's decision, and the
        answer; one row per evaluation (wide) or per judgment (long), written while it is sent.
        """
        from lib.export import (
            EXPORT_PERMISSIONS,
            EXPORTABLE_TABLES,
            ExportError,
            evaluations_csv_chunks,
            export_table,
        )
        from lib.inspector import EvaluationFilters

        require(actor, Permission.EXPORT)
        if form is not None:
            if table != "evaluations" or format != "csv":
                raise ApiError(422, "form applies to /exports/evaluations?format=csv only")
            return StreamingResponse(
                evaluations_csv_chunks(engine=get_engine(), filters=EvaluationFilters(), form=form),
                media_type="text/csv",
                headers={"Content-Disposition": f'attachment; filename="evaluations_{form}.csv"'},
            )
        if table not in EXPORTABLE_TABLES:
            raise ApiError(
                404, f"unknown table {table!r}; exportable: {', '.join(sorted(EXPORTABLE_TABLES))}"
            )
        require(actor, EXPORT_PERMISSIONS[table])
        folder = TempFolder("export")
        out = folder.path / f"{table}.{format}"
        try:
            try:
                export_table(
                    engine=get_engine(),
                    table=table,
                    fmt="json" if format == "jsonl" else format,
                    out=out,
                    actor=actor,
                )
            except ExportError as exc:
                raise ApiError(422, str(exc)) from None
        except BaseException:  # any error, not only a refused export: no folder is left behind
            folder.remove()
            raise
        media = {"csv": "text/csv", "parquet": "application/vnd.apache.parquet", "jsonl": "application/jsonl"}
        return _FolderFileResponse(folder, out, media_type=media[format], filename=out.name)

    return api


def _queue_spec(body: dict[str, Any]) -> Any:
    """A queue's creation body as a lib.queues.QueueSpec; 422 naming the field that is wrong."""
    from datetime import date

    from lib.queues import QueueSpec

    def number(key: str, default: Any, kind: type) -> Any:
        value = body.get(key, default)
        if (
            value is None
            or (isinstance(value, kind) and not isinstance(value, bool))
            or (kind is float and isinstance(value, int) and not isinstance(value, bool))
        ):
            return value
        raise ApiError(422, f"'{key}' must be a {'whole number' if kind is int else 'number'}", field=key)

    def day(key: str) -> date | None:
        value = _opt_str(body, key)
        if value is None:
            return None
        try:
            return date.fromisoformat(value)
        except ValueError:
            raise ApiError(422, f"'{key}' must be a date YYYY-MM-DD", field=key) from None

    def names(key: str) -> tuple[str, ...]:
        value = body.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ApiError(422, f"'{key}' must be a list of strings", field=key)
        return tuple(value)

    state = body.get("review_state", "unreviewed")
    if state is not None and not isinstance(state, str):
        raise ApiError(422, "'review_state' must be a string or null", field="review_state")
    return QueueSpec(
        name=_req_str(body, "name"), product=_opt_str(body, "product"), metrics=names("metrics"),
        language=_opt_str(body, "language"), since=day("since"), until=day("until"),
        review_state=None if state == "any" else state, size=number("size", 100, int),
        order=_opt_str(body, "order") or "oldest", seed=number("seed", 0, int), overlap=number("overlap", 1, int),
        mode=_opt_str(body, "mode") or "open", tolerance=number("tolerance", None, float),
        reviewers=names("reviewers"), description=_opt_str(body, "description") or "",
    )  # fmt: skip


def _label_inputs(body: dict[str, Any]) -> list[Any]:
    """`{"labels": [{"judgment_id", "decision", "reason"?}, ...]}` as lib.queues.LabelInput rows."""
    from lib.queues import LabelInput

    given = body.get("labels")
    if not isinstance(given, list) or not given:
        raise ApiError(
            422, "the body needs 'labels': a list of {judgment_id, decision, reason}", field="labels"
        )
    out = []
    for n, entry in enumerate(given):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("judgment_id"), int)
            or "decision" not in entry
        ):
            raise ApiError(
                422, f"labels[{n}] needs 'judgment_id' (a number) and 'decision'", field=f"labels.{n}"
            )
        reason = entry.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise ApiError(422, f"labels[{n}].reason must be a string", field=f"labels.{n}.reason")
        out.append(LabelInput(judgment_id=entry["judgment_id"], decision=entry["decision"], reason=reason))
    return out


def _queue_item(session: Any, assignment: Any, actor: Actor) -> dict[str, Any]:
    """The reserved item as JSON: blind-first before the reveal without any judge data, else with it."""
    from lib import queues

    if assignment.stage == "blind":
        item = queues.blind_item_record(
            queues.load_blind_item(
                session=session, queue_id=assignment.queue_id, item_id=assignment.item_id, reviewer=actor
            )
        )
    else:
        item = queues.team_item_record(
            queues.load_item(
                session=session, queue_id=assignment.queue_id, item_id=assignment.item_id, reviewer=actor
            )
        )
    return jsonable_encoder({"assignment": queues.assignment_record(assignment), "item": item})


def _req_str(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str):
        raise ApiError(422, f"the body needs '{key}' as a string", field=key)
    return value


def _opt_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise ApiError(422, f"'{key}' must be a string", field=key)
    return value


def _check_can_judge(actor: Actor) -> None:
    """Refuse a judge run before the body is read: wrong role 403, no LLM configured 503."""
    from lib import llm
    from lib.config import get_settings

    require(actor, Permission.JUDGE)
    if not get_settings().llm_configured:
        raise ApiError(503, llm.NOT_CONFIGURED_MESSAGE)


def _judge_body(engine: Engine, path: Path, actor: Actor, concurrency: int | None) -> dict[str, Any]:
    """lib.judge.judge_file on the spooled body (a JSON array is first written out as JSON Lines)."""
    from lib import judge

    if _is_json_array(path):
        records = _json_array(path)
        if not isinstance(records, list):
            raise ApiError(422, "send one JSON array of evaluations, or JSON Lines")
        lines = path.with_name("request-lines.jsonl")
        with lines.open("w", encoding="utf-8") as out:
            for item in records:
                out.write(json.dumps(item, ensure_ascii=False) + "\n")
        path = lines
    try:
        report = judge.judge_file(path, engine=engine, reviewer=actor, concurrency=concurrency)
    except judge.BatchInputError as exc:
        message = str(exc).replace(path.name, "request")
        line = _LINE.search(message)
        raise ApiError(
            422, f"{message}; nothing was judged", line=int(line.group(1)) if line else None
        ) from None
    return {
        "summary": report.summary(),
        "total": report.total,
        "judged": report.judged,
        "skipped": report.skipped,
        "failed": [{"line": lineno, "detail": message} for lineno, message in report.failed],
        "snapshot_ids": report.snapshot_ids,
    }


def _is_json_array(path: Path) -> bool:
    """Whether the spooled body is one JSON array (after a BOM and whitespace) rather than JSON Lines."""
    with path.open("rb") as fh:
        return fh.read(64).removeprefix(BOM).lstrip().startswith(b"[")


def _json_array(path: Path) -> Any:
    """The spooled body as one JSON document; 400 with the position when it is malformed."""
    return _parse_json(path.read_bytes())


def _parse_json(raw: bytes) -> Any:
    """One JSON document (after a BOM); 400 with the position when it is malformed."""
    try:
        return json.loads(raw.removeprefix(BOM))
    except json.JSONDecodeError as exc:
        raise ApiError(
            400,
            f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno} (char {exc.pos})",
            line=exc.lineno,
            column=exc.colno,
            position=exc.pos,
        ) from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ApiError(400, f"malformed JSON: {str(exc).split(';')[0]}") from None


def _promptfoo_lines(path: Path) -> bool:
    """Whether a promptfoo body is `-o results.jsonl` (its first line a result), not results.json:
    the import is then named `promptfoo.jsonl` (review18 M4: a JSON Lines body was `promptfoo.json`)."""
    from lib.source_files import file_head, source_shape

    line = file_head(path).removeprefix(BOM).split(b"\n", 1)[0]
    try:
        return source_shape(json.loads(line)) == "promptfoo-lines"
    except ValueError:  # a pretty-printed document's "{", or a line longer than the head
        return False


def _report_answer(report: Any) -> dict[str, Any]:
    """An import's answer: its summary line and its counts (ImportReport's numbers and texts).
    `expert_reviews` only for interactions, whose reviews they are: a source file's reviewer scores
    are `reviewer_scores`, and a 0 there read as "no reviewer scores came" (review18 M3)."""
    counts = {k: v for k, v in dataclasses.asdict(report).items() if isinstance(v, (int, str))}
    if report.kind != "interactions":
        counts.pop("expert_reviews", None)
    return {"summary": report.summary(), **counts}


def _import_body(engine: Engine, path: Path, actor: Actor, kind: str, options: Any = None) -> Any:
    """The importer on the spooled body: an evaluations JSON array through import_evaluations,
    JSON Lines and other tools' files (`options` given) through import_path (the CLI's import)."""
    from lib.db import write_retrying
    from lib.importer import ImportConflict, import_evaluations, import_path

    is_array = options is None and _is_json_array(path)
    try:
        if options is not None:
            return import_path(engine=engine, path=path, kind=kind, reviewer=actor, options=options)
        if is_array and kind != "evaluations":
            raise ApiError(422, f"send {kind} as JSON Lines (one object per line)", line=1)
        if is_array:
            # Parsed again by a deadlock's victim (write_retrying): the importer's records are its own.
            return write_retrying(
                engine,
                lambda session: import_evaluations(
                    session=session, records=_json_array(path), source="request", reviewer=actor
                ),
            )
        return import_path(engine=engine, path=path, kind=kind, reviewer=actor)
    except ImportConflict as exc:  # nothing wrong with the data: the same post a moment later works
        raise ApiError(409, str(exc), headers={"Retry-After": "1"}) from None
    except ImportFailed as exc:
        message = str(exc)
        line = _LINE.search(message)
        field = _FIELD.search(message)
        extra: dict[str, Any] = {"line": int(line.group(1)) if line else None}
        if place := _PLACE.match(message):
            extra["file"] = place.group(1)
            if place.group(2) == "row":
                extra["row"] = int(place.group(3))
        if field:
            extra["field"] = field.group(1)
        if "invalid JSON" in message or "not valid UTF-8" in message:
            raise ApiError(400, message, **extra) from None
        raise ApiError(422, message, **extra) from None


def otlp_root_routes(api: Any) -> list[Any]:
    """`/v1/traces` and `/v1/logs` on the app's root, OTLP's conventional paths (an exporter given
    only the server's address posts there), served by `api`'s `/otlp/v1/...` routes; `/v1/metrics`
    too, to say it is not taken."""
    from starlette.routing import Route

    signals = ("traces", "logs", "metrics")
    return [Route(f"/v1/{signal}", _OtlpAlias(api), methods=["POST"]) for signal in signals]


class _OtlpAlias:
    """An ASGI app (a class, so Starlette's Route passes the raw scope) handing `/v1/<signal>` to the
    API app as `/api/v1/otlp/v1/<signal>`: one route, one set of checks."""

    def __init__(self, api: Any) -> None:
        self.api = api

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = f"{API_PREFIX}/otlp{scope['path']}"
        scope = {**scope, "path": path, "raw_path": path.encode(), "root_path": API_PREFIX}
        await self.api(scope, receive, send)
