"""Command line for pipelines and operators: `python -m lib <command> ...` (SPEC §6).

Uses the same database as the app (`OVERRULE_DATABASE_URL` honoured). Errors go to stderr with a
non-zero exit status; results go to stdout.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import ArgumentError, OperationalError

from lib.auth import system_actor
from lib.config import ConfigError
from lib.display import one_line

if TYPE_CHECKING:
    from sqlmodel import Session

    from lib.auth import Actor
    from lib.queues import Assignment, QueueSpec

Handler = Callable[[argparse.Namespace], int]
_HANDLERS: dict[str, Handler] = {}


class CliError(Exception):
    """A user-facing CLI failure: printed to stderr, exit status 1."""


def handler(name: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        _HANDLERS[name] = fn
        return fn

    return register


def progress_bar(done: int, total: int, *, width: int = 30) -> str:
    """A text progress bar for the CLI's stderr."""
    filled = width if total == 0 else math.floor(width * done / total)
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


def print_progress(done: int, total: int) -> None:
    """Redraw the progress bar in place on stderr."""
    end = "\n" if done >= total else ""
    print(f"\r{progress_bar(done, total)}", end=end, file=sys.stderr, flush=True)


def _engine():
    from lib.db import init_db

    return init_db()


@handler("import")
def _cmd_import(args: argparse.Namespace) -> int:
    from lib.importer import ImportFailed, import_path
    from lib.source_files import SourceOptions

    try:
        report = import_path(
            engine=_engine(),
            path=Path(args.file),
            kind=args.kind,
            reviewer=system_actor(args.reviewer),
            progress=print_progress,
            options=SourceOptions(
                product=args.product,
                spans=Path(args.spans) if args.spans else None,
                label_scores=args.label_scores,
            ),
        )
    except ImportFailed as exc:
        raise CliError(str(exc)) from exc
    print(report.summary())
    return 0


@handler("export")
def _cmd_export(args: argparse.Namespace) -> int:
    from lib.export import ExportError, export_evaluations_csv, export_table

    try:
        if args.form is not None:
            if args.table != "evaluations" or args.format != "csv":
                raise CliError("--form applies to `export evaluations --format csv` only")
            rows = export_evaluations_csv(engine=_engine(), out=Path(args.out), form=args.form)
        else:
            rows = export_table(
                engine=_engine(), table=args.table, fmt=args.format, out=Path(args.out), actor=system_actor()
            )
    except ExportError as exc:
        raise CliError(str(exc)) from exc
    print(f"exported {rows} rows of {args.table} to {args.out}")
    return 0


@handler("demo")
def _cmd_demo(args: argparse.Namespace) -> int:
    engine = _engine()  # a wrong database URL fails before the demo builder is imported
    from lib.demo import load_demo

    counts = load_demo(engine=engine, force=args.force)
    if not counts:
        print("the database already holds data; demo not loaded (use --force to add it anyway)")
        return 0
    print("demo data loaded: " + ", ".join(f"{n} {what}" for what, n in counts.items()))
    return 0


@handler("notes")
def _cmd_notes(args: argparse.Namespace) -> int:
    """`notes` lists relevant notes; `notes add|search|clean` write, find and remove them."""
    import json

    from lib import notes
    from lib.db import session_scope

    action = args.notes_command or "list"
    # `notes --language en add ...` and `notes add --language en ...` mean the same.
    for dest in ("add_language", "search_language", "clean_language"):
        if getattr(args, dest, None) is None:
            setattr(args, dest, args.language)
    try:
        if action == "list" and args.language is None:
            raise CliError("notes: --language is required (use --language '' for notes of every language)")
        engine = _engine()
        with session_scope(engine, read_only=action in ("list", "search")) as session:
            if action == "add":
                note = notes.add_note(
                    session=session,
                    language=args.add_language or "",
                    note_type=args.type,
                    content=args.content,
                    phelps_code=args.code,
                    confidence=args.confidence,
                    session_id=args.session,
                    created_by=system_actor(args.by),
                )
                print(json.dumps(notes.note_record(note), ensure_ascii=False))
            elif action == "search":
                found = notes.search_notes(
                    session=session,
                    filters=notes.NoteFilter(
                        query=args.query,
                        note_type=args.type,
                        language=args.search_language,
                        session_id=args.session,
                    ),
                    limit=args.limit,
                )
                print(json.dumps([notes.note_record(n) for n in found], ensure_ascii=False, indent=2))
            elif action == "clean":
                older = notes.parse_age(args.older_than) if args.older_than is not None else None
                kwargs = {
                    "note_type": args.type,
                    "language": args.clean_language,
                    "older_than": older,
                    "all_notes": args.all,
                }
                if args.dry_run:
                    print(f"{notes.preview_remove(session=session, **kwargs)} notes would be removed")
                else:
                    removed = notes.remove_notes(session=session, removed_by=system_actor(), **kwargs)
                    print(f"removed {removed} notes")
            else:
                found = notes.relevant_notes(session=session, language=args.language, tags=args.tags)
                if args.format == "prompt":
                    print(notes.format_notes_for_prompt(found, current_session=args.session))
                else:
                    print(json.dumps([notes.note_record(n) for n in found], ensure_ascii=False, indent=2))
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    return 0


@handler("history")
def _cmd_history(args: argparse.Namespace) -> int:
    """`history` prints the seed-004 correction history a judge prompt for the product gets."""
    import json

    from lib import corrections
    from lib.config import get_settings
    from lib.db import session_scope

    settings = get_settings()
    max_entries = settings.history_max_entries if args.max_entries is None else args.max_entries
    ratio = settings.history_correction_ratio if args.ratio is None else args.ratio
    try:
        with session_scope(_engine(), read_only=True) as session:
            chosen = corrections.select_history(
                session, args.product, max_entries=max_entries, correction_ratio=ratio, metric=args.metric
            )
            if args.format == "prompt":
                print(corrections.format_history_for_prompt(chosen))
            else:
                records = [corrections.history_record(j) for j in chosen]
                print(json.dumps(records, ensure_ascii=False, indent=2))
    except ValueError as exc:
        raise CliError(f"history: {exc}") from exc
    return 0


@handler("judge")
def _cmd_judge(args: argparse.Namespace) -> int:
    """`judge FILE` runs Stage 1 + 2 on every not-yet-judged JSONL line; rerun it to resume.

    `judge --product P --sample N [--version NAME]` re-judges a sample of P's evaluations instead.
    """
    from lib import judge, judge_changes
    from lib.judge_versions import VersionError

    if args.concurrency is not None and not 1 <= args.concurrency <= 64:
        raise CliError("judge: --concurrency must be between 1 and 64")
    if args.file is None:
        if not args.product or args.sample is None:
            raise CliError("judge: give a JSONL FILE, or --product and --sample N to re-judge a sample")
        try:
            outcome = judge_changes.rejudge_sample(
                engine=_engine(),
                product=args.product,
                reviewer=system_actor(args.reviewer),
                version=args.version,
                size=args.sample,
                seed=args.seed,
                reviewed_only=not args.all_evaluations,
                progress=print_progress,
            )
        except (VersionError, ValueError) as exc:
            raise CliError(f"judge: {exc}; nothing was judged") from exc
        for snapshot_id, message in outcome.failed:
            print(f"{snapshot_id}: {message}", file=sys.stderr)
        print(outcome.summary())
        return 1 if outcome.failed else 0
    if args.product or args.sample is not None:
        raise CliError("judge: --product and --sample re-judge a sample; with a FILE leave them out")
    try:
        report = judge.judge_file(
            Path(args.file),
            engine=_engine(),
            reviewer=system_actor(args.reviewer),
            concurrency=args.concurrency,
            progress=print_progress,
            version=args.version,
        )
    except judge.BatchInputError as exc:
        raise CliError(f"judge: {exc}; nothing was judged") from exc
    for lineno, message in report.failed:
        print(f"{args.file} line {lineno}: {message}", file=sys.stderr)
    print(report.summary())
    if report.failed:
        print("rerun the same command to retry the failed lines; judged lines are skipped", file=sys.stderr)
        return 1
    return 0


@handler("versions")
def _cmd_versions(args: argparse.Namespace) -> int:
    """`versions list|show|agreement|compare|use`: judge versions and their agreement with reviewers."""
    import json

    from lib import judge_versions, version_agreement
    from lib.db import session_scope
    from lib.export import frame_to_csv_bytes

    engine = _engine()
    products = tuple(p.strip() for p in (args.product or "").split(",") if p.strip())
    try:
        with session_scope(engine, read_only=args.action != "use") as session:
            if args.action == "list":
                frame = judge_versions.versions_frame(session, products)
                if args.format == "csv":
                    sys.stdout.write(frame_to_csv_bytes(frame).decode("utf-8"))
                elif args.format == "json":
                    print(frame.to_json(orient="records", date_format="iso", indent=2))
                else:
                    shown = frame[
                        ["product", "name", "origin", "judge_model", "changes", "created_by", "current"]
                    ]
                    print(shown.to_string(index=False) if not frame.empty else "no judge versions yet")
                return 0
            if args.action in ("show", "use"):
                if len(products) != 1 or not args.name:
                    raise CliError(f"versions {args.action}: give --product P and the version's NAME")
                version = judge_versions.require_version(session, products[0], args.name)
                if args.action == "use":
                    judge_versions.set_current_options(
                        session=session, version=version, set_by=system_actor(args.reviewer)
                    )
                    print(f"{version.name!r} is now {products[0]}'s judge configuration (model and options)")
                    return 0
                record = judge_versions.version_record(
                    version, changes=judge_versions.changes_since_previous(session, version)
                )
                print(json.dumps(record, ensure_ascii=False, indent=2, default=str))
                return 0
            filters = version_agreement.VersionFilters(
                products=products, language=args.language, resamples=args.resamples, seed=args.seed
            )
            if args.action == "agreement":
                frame = version_agreement.agreement_by_version(session=session, filters=filters)
                if args.format == "csv":
                    sys.stdout.write(frame_to_csv_bytes(frame).decode("utf-8"))
                elif args.format == "json":
                    print(frame.to_json(orient="records", date_format="iso", indent=2))
                else:
                    table = version_agreement.display_frame(frame)
                    print(
                        table.to_string(index=False, na_rep="–")
                        if not frame.empty
                        else "no reviewed pairs yet"
                    )
                return 0
            if args.action == "compare":
                if len(products) != 1 or not args.name or not args.other:
                    raise CliError("versions compare: give --product P, version A's NAME and --other B")
                result = version_agreement.compare_by_names(
                    session=session,
                    product=products[0],
                    a=args.name,
                    b=args.other,
                    filters=filters,
                    same_items=args.same_items,
                )
                if args.format == "csv":
                    sys.stdout.write(frame_to_csv_bytes(result.frame).decode("utf-8"))
                    return 0
                for caution in result.cautions:
                    print(f"caution: {caution}", file=sys.stderr)
                table = version_agreement.comparison_display(result.frame)
                print(
                    table.to_string(index=False, na_rep="–")
                    if not table.empty
                    else "no metric with pairs on both"
                )
                return 0
    except (judge_versions.VersionError, PermissionError) as exc:
        raise CliError(f"versions {args.action}: {exc}") from exc
    raise CliError(f"versions: unknown action {args.action!r}")


@handler("second-opinion")
def _cmd_second_opinion(args: argparse.Namespace) -> int:
    """`second-opinion --product P` asks the evaluation model to validate judgments without one."""
    from lib import second_opinion
    from lib.config import get_settings

    if not get_settings().llm_configured:
        from lib.llm import NOT_CONFIGURED_MESSAGE

        raise CliError(NOT_CONFIGURED_MESSAGE)
    outcome = second_opinion.second_opinion_batch(
        engine=_engine(),
        product=args.product,
        reviewer=system_actor(args.reviewer),
        limit=args.limit,
        progress=print_progress,
    )
    for change_id, message in outcome.failed:
        print(f"{change_id}: {message}", file=sys.stderr)
    print(outcome.summary())
    return 1 if outcome.failed else 0


@handler("auto-eval")
def _cmd_auto_eval(args: argparse.Namespace) -> int:
    """Auto-evaluate pending interactions by precedent (seed 003 processEvaluationsForDuration)."""
    from lib import notes, precedents
    from lib.models import utcnow

    try:
        since = utcnow() - notes.parse_age(args.since) if args.since else None
    except ValueError as exc:
        raise CliError(f"auto-eval: --since: {exc}") from exc
    if args.limit is not None and args.limit < 1:
        raise CliError("auto-eval: --limit must be at least 1")
    if args.concurrency is not None and not 0 <= args.concurrency <= 64:
        raise CliError("auto-eval: --concurrency must be between 0 (serial) and 64")
    summary = precedents.auto_evaluate(
        _engine(),
        since=since,
        product=args.product,
        limit=args.limit,
        concurrency=args.concurrency,
        redo=args.redo,
        force_fallback=args.force_fallback,
        progress=print_progress,
    )
    print("\n".join(summary.lines()))
    return 0


@handler("evaluate")
def _cmd_evaluate(args: argparse.Namespace) -> int:
    """Score the notes that judge runs showed (seed 001 evaluator); failures are retried next time."""
    from lib.llm import LLMNotConfigured
    from lib.relevance import evaluate_pending

    if args.reset_retries:
        from lib.db import session_scope
        from lib.relevance import reset_retries

        try:
            with session_scope(_engine()) as session:
                reset_retries(session=session, audit_session_id=args.reset_retries, reviewer=system_actor())
        except ValueError as exc:
            raise CliError(f"evaluate: {exc}") from exc
        print(f"audit {args.reset_retries}: retries reset; the next `evaluate` run tries it again")
        return 0
    if args.limit < 1:
        raise CliError("evaluate: --limit must be at least 1")
    try:
        report = evaluate_pending(_engine(), limit=args.limit)
    except LLMNotConfigured as exc:
        raise CliError(str(exc)) from exc
    print(
        f"evaluated {report.total} audits: {report.completed} completed, "
        f"{report.failed} failed, {report.skipped} skipped"
    )
    for session_id, message in report.errors:
        print(f"error: audit {session_id}: {message} (will be retried)", file=sys.stderr)
    return 1 if report.failed else 0


def _edited_rubric(path: str | None) -> dict[str, str]:
    """The `rubric` arm's text: a JSON object {metric slug: rubric text}."""
    import json

    if path is None:
        return {}
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CliError(f"align: cannot read --rubric-file {path}: {exc}") from exc
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise CliError("align: --rubric-file must hold a JSON object of {metric slug: rubric text}")
    return data


@handler("align")
def _cmd_align(args: argparse.Namespace) -> int:
    """`align --product P --sample N --arms bare,full`: create (or continue) and run an experiment."""
    from datetime import date

    from lib import alignment
    from lib.db import session_scope

    engine = _engine()
    try:
        if args.cancel is not None:
            alignment.request_cancel(engine, args.cancel, by=system_actor(args.reviewer))
            print(f"experiment {args.cancel}: cancel requested")
            return 0
        if args.experiment is not None:
            experiment_id = args.experiment
        else:
            if not args.product:
                raise CliError("align: --product is required (or --experiment ID to continue one)")
            spec = alignment.ExperimentSpec(
                product=args.product,
                sample_size=args.sample,
                seed=args.seed,
                arms=alignment.parse_arms(args.arms),
                metrics=tuple(m.strip() for m in (args.metrics or "").split(",") if m.strip()),
                language=args.language,
                start=date.fromisoformat(args.since) if args.since else None,
                end=date.fromisoformat(args.until) if args.until else None,
                edited_rubric=_edited_rubric(args.rubric_file),
                created_by=system_actor(args.reviewer),
            )
            with session_scope(engine, read_only=True) as session:
                found = alignment.find_unfinished(session, spec)
            experiment_id = found if found is not None else alignment.create_experiment(engine, spec)
            verb = "continuing" if found is not None else "created"
            print(f"{verb} experiment {experiment_id}", file=sys.stderr)
        report = alignment.run_experiment(
            engine, experiment_id, concurrency=args.concurrency, progress=print_progress
        )
        with session_scope(engine, read_only=True) as session:
            result = alignment.measure(session, experiment_id)
    except (alignment.ExperimentError, ValueError) as exc:
        raise CliError(f"align: {exc}") from exc
    print(
        f"experiment {experiment_id}: {report.status}; {report.done} calls done, "
        f"{report.failed} failed, {report.pending} pending"
    )
    print(alignment.display_frame(result).to_string(index=False))
    if len(result.paired):
        print(result.paired.to_string(index=False))
    print(result.cost.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    if report.failed:
        print("rerun the same command to retry the failed calls; finished calls are kept", file=sys.stderr)
        return 1
    return 0


@handler("webhooks")
def _cmd_webhooks(args: argparse.Namespace) -> int:
    """`webhooks add|list|pause|resume|rotate|deliveries|replay|deliver|prune|key` (lib.webhooks)."""
    import contextlib
    import json

    from lib import webhooks
    from lib.db import session_scope

    action = args.webhook_action
    if action == "key":
        print(webhooks.new_key())
        return 0
    engine = _engine()
    try:
        if action == "deliver":
            try:
                with webhooks.http_client() as client:  # fails before a claim
                    total = 0 if args.loop else webhooks.deliver_due(engine, client=client)
            except webhooks.DeliveriesStopped as exc:
                raise CliError(str(exc)) from None
            if args.loop:
                # The app server's worker, in the foreground until Ctrl-C: a batch that raises (a
                # database hiccup) is logged and the next runs after a pause, as in the server.
                print("delivering due webhooks until interrupted (Ctrl-C)", flush=True)
                with contextlib.suppress(KeyboardInterrupt):
                    webhooks.DeliveryWorker(engine, interval=webhooks.POLL_SECONDS).run()
                return 0
            print(f"{total} delivery attempt(s)")
            return 0
        if action == "prune":
            if args.days is not None and args.days < 0:
                raise CliError("webhooks prune: --days must be 0 or more (0 keeps the whole log)")
            pruned = webhooks.prune_log(engine, force=True, days=args.days, dry_run=args.dry_run)
            assert pruned is not None  # forced: the throttle never skips it
            print(pruned.summary(dry_run=args.dry_run))
            return 0
        with session_scope(engine, read_only=action in ("list", "deliveries")) as session:
            actor = system_actor(args.by) if hasattr(args, "by") else system_actor()
            if action == "add":
                hook, secret = webhooks.register_webhook(
                    session=session, actor=actor, url=args.url, events=args.events.split(","),
                    description=args.description,
                )  # fmt: skip
                print(
                    f"webhook {hook.id} for {', '.join(hook.events)} -> {hook.url}; its signing secret, shown only now:"
                )
                print(secret)
            elif action == "list":
                for hook in webhooks.list_webhooks(session=session):
                    state = "active" if hook.active else "paused"
                    print(f"{hook.id}\t{state}\t{hook.url}\t{','.join(hook.events)}\t{hook.description}")
            elif action in ("pause", "resume"):
                hook = webhooks.set_active(
                    session=session, actor=actor, webhook_id=args.id, active=action == "resume"
                )
                print(f"webhook {hook.id} {'resumed' if hook.active else 'paused'}")
            elif action == "rotate":
                print(webhooks.rotate_secret(session=session, actor=actor, webhook_id=args.id))
            elif action == "deliveries":
                rows = webhooks.list_deliveries(
                    session=session, webhook_id=args.webhook, status=args.status, limit=args.limit
                )
                for row in rows:
                    print(json.dumps(webhooks.delivery_record(row), ensure_ascii=False))
            else:  # replay
                row = webhooks.replay_delivery(session=session, actor=actor, delivery_id=args.id)
                print(f"delivery {row.id} ({row.event}) is pending again")
    except (webhooks.WebhookError, LookupError) as exc:
        raise CliError(f"webhooks: {str(exc).strip(chr(39))}") from exc
    return 0


@handler("otlp")
def _cmd_otlp(args: argparse.Namespace) -> int:
    """`otlp waiting [--csv] [--limit N]`: what the OTLP receiver keeps waiting, why, what it
    forgot and what its answers refused lately (lib.otlp_waiting); each row a line saying what the
    sender should change."""
    from lib import otlp_waiting
    from lib.db import session_scope

    if args.limit is not None and args.limit < 0:
        raise CliError("otlp waiting: --limit must be 0 or more")
    engine = _engine()
    if args.csv:  # the whole list, cells a spreadsheet would run neutralised
        for chunk in otlp_waiting.csv_chunks(engine):
            sys.stdout.write(chunk.decode("utf-8"))
        return 0
    with session_scope(engine, read_only=True) as session:
        waiting = otlp_waiting.read(session, limit=args.limit)
        refused = otlp_waiting.refused(session, otlp_waiting.REFUSED_PRINTED)
    for line in otlp_waiting.summary_lines(waiting):
        print(line)
    for line in otlp_waiting.refused_lines(refused):  # what answers rejected or warned of lately
        print(line)
    if waiting.rows:  # the columns' names, as the CSV's header (docs/cli.md)
        print("\t".join(otlp_waiting.COLUMNS))
    for row in waiting.rows:
        print("\t".join(one_line(cell) for cell in row.cells()))
    if args.limit is not None and waiting.total > len(waiting.rows):
        print(f"(the oldest {len(waiting.rows):,} of {waiting.total:,}; --csv prints them all)")
    return 0


@handler("token")
def _cmd_token(args: argparse.Namespace) -> int:
    """`token create|list|revoke`: bearer tokens for the pipeline API (lib.tokens); create prints the secret once."""
    from lib import tokens
    from lib.db import session_scope

    try:
        with session_scope(_engine(), read_only=args.action == "list") as session:
            if args.action == "create":
                lifetime = tokens.parse_lifetime(args.expires_in) if args.expires_in else None
                token, secret = tokens.create_token(
                    session=session,
                    actor=system_actor(args.by),
                    name=args.name,
                    role=args.role,
                    expires_in=lifetime,
                )
                until = f", expires {token.expires_at:%Y-%m-%d %H:%M} UTC" if token.expires_at else ""
                print(f"token {token.name} ({token.role}{until}) created; its secret, shown only now:")
                print(secret)
            elif args.action == "revoke":
                token = tokens.revoke_token(session=session, actor=system_actor(args.by), name=args.name)
                print(f"token {token.name} revoked at {token.revoked_at:%Y-%m-%d %H:%M:%S} UTC")
            else:
                for token in tokens.list_tokens(session=session):
                    state = tokens.token_state(token)
                    if token.revoked_at:
                        state += f" {token.revoked_at:%Y-%m-%d %H:%M}"
                    elif token.expires_at:
                        state += f" (expires {token.expires_at:%Y-%m-%d %H:%M})"
                    used = (
                        f"last used {token.last_used_at:%Y-%m-%d %H:%M}"
                        if token.last_used_at
                        else "never used"
                    )
                    print(
                        f"{token.name}\t{token.role}\t{state}\tcreated {token.created_at:%Y-%m-%d %H:%M}"
                        f" by {token.created_by}\t{used}"
                    )
    except tokens.TokenError as exc:
        raise CliError(f"token: {exc}") from exc
    return 0


@handler("recount")
def _cmd_recount(args: argparse.Namespace) -> int:
    """`recount [NAME ...]`: rebuild the counters and other derived tables (lib.counters.REBUILDS) from the rows."""
    import lib.queues  # noqa: F401  (registers the team queues' rebuild)
    from lib import counters
    from lib.db import session_scope

    with session_scope(_engine()) as session:
        try:
            done = counters.recount(session=session, only=args.names or None)
        except ValueError as exc:
            raise CliError(f"recount: {exc}") from exc
    print(f"rebuilt {', '.join(done)}")
    return 0


def _queue_spec(args: argparse.Namespace) -> QueueSpec:
    """The CLI's `queue create` options as a lib.queues.QueueSpec (dates as YYYY-MM-DD)."""
    from datetime import date

    from lib.queues import QueueSpec

    def day(value: str | None, flag: str) -> date | None:
        if value is None:
            return None
        try:
            return date.fromisoformat(value)
        except ValueError:
            raise CliError(f"queue create: {flag} must be a date YYYY-MM-DD, got {value!r}") from None

    return QueueSpec(
        name=args.name,
        product=args.product,
        metrics=tuple(m for m in (args.metrics or "").split(",") if m.strip()),
        language=args.language,
        since=day(args.since, "--since"),
        until=day(args.until, "--until"),
        review_state=None if args.state == "any" else args.state,
        size=args.size,
        order=args.order,
        seed=args.seed,
        overlap=args.overlap,
        mode=args.mode,
        tolerance=args.tolerance,
        reviewers=tuple(r for r in (args.reviewers or "").split(",") if r.strip()),
        description=args.description or "",
    )


def _print_json(value: object) -> None:
    import json

    from fastapi.encoders import jsonable_encoder

    print(json.dumps(jsonable_encoder(value), ensure_ascii=False, indent=2))


def _print_item(session: Session, a: Assignment, actor: Actor, fmt: str) -> None:
    """The reserved item: blind-first before the reveal without any judge data, else with it."""
    from lib import queues

    if a.stage == "blind":
        item = queues.load_blind_item(session=session, queue_id=a.queue_id, item_id=a.item_id, reviewer=actor)
        record = queues.blind_item_record(item)
    else:
        team = queues.load_item(session=session, queue_id=a.queue_id, item_id=a.item_id, reviewer=actor)
        record = queues.team_item_record(team)
    record = {"assignment": queues.assignment_record(a), "item": record}
    if fmt == "json":
        _print_json(record)
        return
    asg, item = record["assignment"], record["item"]
    print(
        f"{asg['queue']}: item {asg['position']} of {asg['items']} (id {asg['item_id']}, {asg['item_key']}), "
        f"{asg['stage']} stage, reserved for {asg['reviewer']} until {asg['expires_at']:%Y-%m-%d %H:%M} UTC"
    )
    if item.get("question"):
        print(f"question: {item['question']}")
        print(f"answer: {item['answer']}")
    for m in item.get("metrics", []):  # blind: the scale only
        print(
            f"  judgment {m['judgment_id']}\t{m['title']}\tscale {m['scale']}\tyour blind label: {m['blind_decision'] or '-'}"
        )
    for j in item.get("judgments", []):
        print(
            f"  judgment {j['judgment_id']}\t{j['metric'] or j['change_id']}\tjudge {j['decision']}\t"
            f"your label: {j['label'] or '-'}\t{j['state']}"
        )


# The queue actions that write a reviewer's or a lead's decision: run by write_retrying, so a
# deadlock's victim on PostgreSQL is run again (and prints once, after its commit).
_QUEUE_WRITES = ("label", "skip", "undo", "adjudicate")


def _queue_write(session: Session, args: argparse.Namespace) -> str:
    """One of `_QUEUE_WRITES` in `session`; what to print once it committed."""
    from lib import queues

    queue = queues.get_queue(session=session, queue=args.queue)
    assert queue.id is not None
    action = args.queue_command
    if action == "label":
        outcome = queues.label(
            session=session, queue_id=queue.id, judgment_id=args.judgment, reviewer=system_actor(args.reviewer),
            decision=args.decision, reason=args.reason,
        )  # fmt: skip
        state = outcome.states.get(args.judgment, "?")
        extra = " (the judge's side is revealed now)" if outcome.stage == "blind" and outcome.revealed else ""
        return f"{outcome.stage} label saved for judgment {args.judgment}: {state}{extra}"
    if action == "skip":
        queues.skip_item(
            session=session, queue_id=queue.id, item_id=args.item, reviewer=system_actor(args.reviewer)
        )
        return f"item {args.item} skipped"
    if action == "undo" and args.adjudication:
        queues.undo_adjudication(
            session=session, queue_id=queue.id, judgment_id=args.judgment, actor=system_actor(args.reviewer)
        )
        return f"adjudication of judgment {args.judgment} undone: it awaits adjudication again"
    if action == "undo":
        queues.undo_label(
            session=session,
            queue_id=queue.id,
            judgment_id=args.judgment,
            reviewer=system_actor(args.reviewer),
        )
        return f"your label of judgment {args.judgment} is withdrawn"
    queues.adjudicate(
        session=session, queue_id=queue.id, judgment_id=args.judgment, actor=system_actor(args.by),
        decision=args.decision, reason=args.reason,
    )  # fmt: skip
    return f"judgment {args.judgment} adjudicated: {args.decision}"


@handler("queue")
def _cmd_queue(args: argparse.Namespace) -> int:
    """`queue ACTION`: team review queues (lib.queues) from the command line."""
    from lib import queues
    from lib.corrections import InvalidDecision, NothingToUndo
    from lib.db import session_scope, write_retrying

    action = args.queue_command
    reader = action in ("list", "show", "disputes", "agreement")
    try:
        if action in _QUEUE_WRITES:
            print(write_retrying(_engine(), lambda session: _queue_write(session, args)))
            return 0
        with session_scope(_engine(), read_only=reader) as session:
            if action == "create":
                queue = queues.create_queue(
                    session=session, actor=system_actor(args.by), spec=_queue_spec(args)
                )
                mode = queues.MODE_LABELS[queue.mode]
                print(
                    f"queue {queue.id} {queue.name!r} created: {queue.items:,} items, {queue.judgments:,} judgments; "
                    f"overlap {queue.overlap}, {mode}"
                )
                return 0
            if action == "list":
                found = queues.list_queues(session=session, reviewer=args.reviewer, include_closed=args.all)
                records = [
                    queues.queue_record(q, queues.queue_progress(session=session, queue_id=q.id or 0))
                    for q in found
                ]
                if args.format == "json":
                    _print_json(records)
                elif not records:
                    print("no review queues yet (create one with `python -m lib queue create`)")
                for r in records if args.format == "text" else []:
                    p = r["progress"]
                    print(
                        f"{r['id']}\t{r['name']}\t{r['status']}\t{r['mode']}\toverlap {r['overlap']}\t"
                        f"{p['items_done']}/{r['items']} items done\t{p['reserved']} reserved\t"
                        f"{p['awaiting_adjudication']} awaiting adjudication"
                    )
                return 0
            if action == "agreement":
                return _queue_agreement(session, args)
            queue = queues.get_queue(session=session, queue=args.queue)
            assert queue.id is not None
            if action == "show":
                progress = queues.queue_progress(session=session, queue_id=queue.id)
                people = queues.reviewer_progress(session=session, queue_id=queue.id)
                frame = queues.reviewer_progress_frame(people)
                if args.format == "json":
                    _print_json(
                        {
                            **queues.queue_record(queue, progress),
                            "reviewers_progress": frame.to_dict("records"),
                        }
                    )
                elif args.format == "csv":
                    print(frame.to_csv(index=False), end="")
                else:
                    print(
                        f"{queue.name} ({queue.status}, {queues.MODE_LABELS[queue.mode]}, overlap {queue.overlap}): "
                        f"{progress.items_done}/{progress.items} items done, {progress.reserved} reserved, "
                        f"{progress.remaining} remaining; judgments: {progress.resolved} resolved, "
                        f"{progress.disputed} awaiting adjudication, {progress.adjudicated} adjudicated"
                    )
                    if not frame.empty:
                        print(frame.to_string(index=False))
                return 0
            if action == "disputes":
                found = queues.disputes(session=session, queue_id=queue.id, limit=args.limit)
                rows = [queues.dispute_record(d) for d in found]
                if args.format == "json":
                    _print_json(rows)
                elif not rows:
                    print("nothing awaits adjudication")
                for r in rows if args.format == "text" else []:
                    labels = "; ".join(
                        f"{lv['reviewer']}: {lv['decision']}" + (f" ({lv['reason']})" if lv["reason"] else "")
                        for lv in r["labels"]
                    )
                    print(
                        f"judgment {r['judgment_id']}\t{r['metric'] or r['change_id']}\tjudge {r['judge_decision']}\t{labels}"
                    )
                return 0
            if action == "next":
                actor = system_actor(args.reviewer)
                assignment = queues.next_assignment(session=session, queue_id=queue.id, reviewer=actor)
                if assignment is None:
                    print(f"nothing left for {actor.identity} in {queue.name!r}")
                    return 0
                _print_item(session, assignment, actor, args.format)
                return 0
            if action == "assign":
                reviewers = [r for r in args.reviewers.split(",") if r.strip()]
                queue = queues.update_queue(
                    session=session, actor=system_actor(args.by), queue_id=queue.id, reviewers=reviewers
                )
                print(f"{queue.name!r} assigned to {', '.join(queue.reviewers) or 'every reviewer'}")
                return 0
            if action == "close":
                queues.close_queue(session=session, actor=system_actor(args.by), queue_id=queue.id)
                print(f"{queue.name!r} closed; its undecided judgments are back in the default queue")
                return 0
    except (
        queues.QueueError,
        queues.QueueNotFound,
        queues.ItemTaken,
        queues.NotRevealed,
        InvalidDecision,
        NothingToUndo,
    ) as exc:
        raise CliError(f"queue {action}: {str(exc).strip(chr(39))}") from exc
    except PermissionError as exc:
        raise CliError(f"queue {action}: {exc}") from exc
    raise CliError(f"queue: unknown action {action!r}")


def _queue_agreement(session: Session, args: argparse.Namespace) -> int:
    """`queue agreement [QUEUE]`: agreement between reviewers (lib.agreement) as text, JSON or CSV."""
    from lib import agreement, queues
    from lib.export import frame_to_csv_bytes

    try:
        tables = agreement.parse_tables(args.table)
        if args.format == "csv" and len(tables) != 1:
            raise agreement.AgreementError("--format csv prints one table: pick it with --table")
        queue_ids: tuple[int, ...] = ()
        if args.queue:
            found = queues.get_queue(session=session, queue=args.queue)
            queue_ids = (found.id or 0,)
        products = tuple(p.strip() for p in (args.product or "").split(",") if p.strip())
        filters = agreement.AgreementFilters(
            products=products, queue_ids=queue_ids, basis=args.basis, resamples=args.resamples, seed=args.seed
        )
        result = agreement.load_agreement(session=session, filters=filters)
    except agreement.AgreementError as exc:
        raise CliError(f"queue agreement: {exc}") from exc
    if args.format == "json":
        _print_json(agreement.agreement_record(result, tables))
        return 0
    if args.format == "csv":
        sys.stdout.write(frame_to_csv_bytes(getattr(result, tables[0])).decode("utf-8"))
        return 0
    if result.empty:
        print("no labels yet: agreement needs team-queue items labelled by two or more reviewers")
        return 0
    print(f"{result.labels:,} labels ({agreement.BASIS_LABELS[args.basis].lower()})")
    for name in tables:
        frame = agreement.display_table(result, name)
        print(f"\n== {name}")
        print(frame.to_string(index=False, na_rep="–") if not frame.empty else "(none)")
    return 0


class _Choices(Sequence[str]):
    """An argument's choices, read from the module that defines them only when argparse needs them
    (a value to check, help or an error to print): building the parser imports no command's module
    (lib.importer alone took about 0.4 CPU s off every `python -m lib` run)."""

    def __init__(self, load: Callable[[], Sequence[str]]) -> None:
        self._load = load
        self._values: tuple[str, ...] | None = None

    def _all(self) -> tuple[str, ...]:
        if self._values is None:
            self._values = tuple(self._load())
        return self._values

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        return self._all()[index]

    def __len__(self) -> int:
        return len(self._all())

    def __contains__(self, value: object) -> bool:
        return value in self._all()


def _import_kinds() -> Sequence[str]:
    from lib.importer import KINDS

    return KINDS


class _HelpFrom(argparse.Action):
    """A plain argument whose help is made only when help is shown (`help_from`), so the names it
    lists are imported then, not on every run (lib.export pulls in most of lib)."""

    def __init__(self, *args: Any, help_from: Callable[[], str], **kwargs: Any) -> None:
        self._help_from = help_from
        super().__init__(*args, **kwargs)

    @property  # type: ignore[override]
    def help(self) -> str:
        return self._help_from()

    @help.setter
    def help(self, _value: str | None) -> None:
        pass

    def __call__(
        self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None
    ) -> None:
        setattr(namespace, self.dest, values)


def _export_tables_help() -> str:
    from lib.export import EXPORTABLE_TABLES

    return "one of: " + ", ".join(sorted(EXPORTABLE_TABLES))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; other modules' commands are registered here so `--help` lists all."""
    parser = argparse.ArgumentParser(prog="python -m lib", description="Overrule command line.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "import",
        help="import evaluations, judgments, notes, metric sets, interactions, or promptfoo, Langfuse and "
        "Phoenix results",
    )
    p.add_argument("file", help="a JSONL or JSON file")
    kind = p.add_argument("--kind", default=None, help="what the file holds (detected when omitted)")
    kind.choices = _Choices(_import_kinds)  # set after: add_argument would read them at once
    p.add_argument("--reviewer", default="cli", help="recorded as the author of the import")
    p.add_argument(
        "--product",
        default=None,
        help="promptfoo, langfuse, phoenix: the product to file the evaluations under "
        "(default: promptfoo's description, which a results.jsonl lacks, or a Langfuse trace's name, "
        "else the tool's name)",
    )
    p.add_argument(
        "--spans", default=None, help="phoenix: the spans file (Parquet or CSV) the evaluations judged"
    )
    from lib.source_records import LABEL_SCORE_STEPS

    p.add_argument(
        "--label-scores",
        default=None,
        metavar="LABEL=SCORE,...",
        help="promptfoo, langfuse, phoenix: the score of a label sent without one, e.g. "
        f"frustrated=1,ok=0; {LABEL_SCORE_STEPS}",
    )

    p = sub.add_parser("export", help="export a table as CSV, Parquet or JSON")
    p.add_argument("table", action=_HelpFrom, help_from=_export_tables_help)
    p.add_argument("--format", choices=["csv", "parquet", "json"], default="csv")
    p.add_argument("--out", required=True, help="output file path")
    p.add_argument(
        "--form",
        choices=["wide", "long"],
        default=None,
        help="evaluations only: per metric the user's score, the judge's score, the gap and the "
        "reviewer's decision, with the answer; one row per evaluation (wide) or per judgment (long)",
    )

    p = sub.add_parser("demo", help="load the deterministic demo data set")
    p.add_argument("--force", action="store_true", help="load even when the database is not empty")

    p = sub.add_parser("notes", help="cross-session notes: list relevant ones, add, search, clean")
    p.add_argument("--language", default=None, help="the judge's language ('' = notes for every language)")
    p.add_argument("--tags", nargs="+", action="extend", default=[], metavar="T", help="context tags")
    p.add_argument("--format", choices=["json", "prompt"], default="json")
    p.add_argument("--session", default=None, help="your run's session id (its notes say CURRENT SESSION)")
    notes_sub = p.add_subparsers(dest="notes_command", metavar="ACTION")
    n = notes_sub.add_parser("add", help="add a note")
    n.add_argument("content", help="the note text")
    n.add_argument("--type", required=True, help="SUCCESS, FAILURE, PATTERN, STRATEGY or TIP")
    n.add_argument("--language", dest="add_language", default=None, help="'' (default) = every language")
    n.add_argument("--code", default=None, help="matched code (SUCCESS notes only)")
    n.add_argument("--confidence", type=float, default=None, help="0..1 (SUCCESS notes only)")
    n.add_argument("--session", default=None, help="session id (default: a new one for this run)")
    n.add_argument("--by", default="cli", help="recorded as the note's author")
    n = notes_sub.add_parser("search", help="search note text across all sessions")
    n.add_argument("query", nargs="?", default="", help="text to find (case-insensitive, literal)")
    n.add_argument("--type", default=None)
    n.add_argument("--language", dest="search_language", default=None)
    n.add_argument("--session", default=None)
    n.add_argument("--limit", type=int, default=100)
    n = notes_sub.add_parser("clean", help="remove notes by age, type and language")
    n.add_argument("--older-than", default=None, metavar="AGE", help="e.g. 30d, 12h, 90m, 2w")
    n.add_argument("--type", default=None)
    n.add_argument("--language", dest="clean_language", default=None, help="'' = the every-language notes")
    n.add_argument("--all", action="store_true", help="allow removing every note when no filter is given")
    n.add_argument("--dry-run", action="store_true", help="only count what would be removed")

    p = sub.add_parser("history", help="the correction history a judge prompt gets")
    p.add_argument("--product", required=True, help="only this product's judgments")
    p.add_argument("--metric", default=None, help="only this metric's judgments (default: every metric)")
    p.add_argument(
        "--max-entries",
        type=int,
        default=None,
        metavar="N",
        help="how many entries (default OVERRULE_HISTORY_MAX_ENTRIES, 20)",
    )
    p.add_argument(
        "--ratio",
        type=float,
        default=None,
        metavar="R",
        help="target share of corrections, 0..1 (default OVERRULE_HISTORY_CORRECTION_RATIO, 0.75)",
    )
    p.add_argument(
        "--format",
        choices=["json", "prompt"],
        default="json",
        help="json: the judgments in selection order; prompt: the block a judge prompt contains",
    )

    p = sub.add_parser(
        "judge", help="judge a JSONL file of questions and answers (scores, then mentor feedback), resumable"
    )
    p.add_argument(
        "file",
        nargs="?",
        default=None,
        help="JSONL, one evaluation per line (the import format without judge fields); "
        "leave it out to re-judge a sample (--product, --sample)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        metavar="N",
        help="requests in flight at once (default OVERRULE_JUDGE_CONCURRENCY, 4)",
    )
    p.add_argument("--reviewer", default="cli", help="recorded as the author of the snapshots")
    p.add_argument(
        "--version",
        default=None,
        metavar="NAME",
        help="judge with this judge version of the product (default: the product's current judge)",
    )
    p.add_argument("--product", default=None, help="re-judge a sample of this product's evaluations")
    p.add_argument("--sample", type=int, default=None, metavar="N", help="how many evaluations to re-judge")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed (same seed, same evaluations)")
    p.add_argument(
        "--all-evaluations",
        action="store_true",
        help="sample from every judged evaluation, not only those a reviewer decided",
    )

    p = sub.add_parser("versions", help="judge versions: list, show (with diff), agreement, compare, use")
    p.add_argument("action", choices=["list", "show", "agreement", "compare", "use"])
    p.add_argument("name", nargs="?", default=None, help="a version's name (show, use; version A of compare)")
    p.add_argument("--other", default=None, metavar="NAME", help="compare: version B (B − A is reported)")
    p.add_argument("--product", default=None, help="comma-separated products (show, use, compare: one)")
    p.add_argument("--language", default=None, help="agreement, compare: only this language")
    p.add_argument("--same-items", action="store_true", help="compare: only judgments both versions judged")
    p.add_argument("--format", choices=["text", "json", "csv"], default="text")
    p.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples for the intervals")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (same data + seed = same intervals)")
    p.add_argument("--reviewer", default="cli", help="use: recorded as who made the version current")

    p = sub.add_parser(
        "second-opinion", help="second opinions: a second LLM validates the judge's judgments of a product"
    )
    p.add_argument("--product", required=True, help="the product whose judgments to validate")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="at most N judgments (default: all)")
    p.add_argument("--reviewer", default="cli", help="recorded as who asked for the second opinions")

    p = sub.add_parser("evaluate", help="score the notes judge runs showed (tag relevance evaluator)")
    p.add_argument("--limit", type=int, default=5, help="process at most N pending audits (default 5)")
    p.add_argument(
        "--reset-retries",
        metavar="SESSION_ID",
        default=None,
        help="give a failed audit its retries back (after fixing the LLM server) instead of evaluating",
    )

    p = sub.add_parser(
        "auto-eval", help="auto-evaluate pending interactions by precedent (expert-reviewed answers)"
    )
    p.add_argument(
        "--since", default=None, metavar="AGE", help="only interactions newer than this, e.g. 7d, 12h"
    )
    p.add_argument("--product", default=None, help="only this product's interactions")
    p.add_argument(
        "--limit", type=int, default=None, metavar="N", help="at most N interactions, oldest first"
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        metavar="N",
        help="workers (default OVERRULE_EVAL_CONCURRENCY: CPUs − 1; 0 = serially in this process)",
    )
    p.add_argument(
        "--redo", action="store_true", help="delete the window's auto-evaluations (and AI feedback) first"
    )
    p.add_argument(
        "--force-fallback",
        action="store_true",
        help="skip sentence matching: only the high-score fallback with its LLM comparison decides",
    )

    p = sub.add_parser("align", help="judge-alignment experiment: re-judge reviewed judgments per prompt arm")
    p.add_argument("--product", default=None, help="the product whose reviewed judgments to sample")
    p.add_argument("--sample", type=int, default=200, metavar="N", help="reviewed judgments to sample (200)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (0)")
    p.add_argument("--arms", default="bare,full", help="comma-separated: bare, history, notes, full, rubric")
    p.add_argument("--metrics", default=None, help="comma-separated metric slugs (default: all)")
    p.add_argument("--language", default=None, help="only evaluations in this language")
    p.add_argument("--since", default=None, metavar="YYYY-MM-DD", help="evaluations created on or after")
    p.add_argument("--until", default=None, metavar="YYYY-MM-DD", help="evaluations created on or before")
    p.add_argument(
        "--rubric-file", default=None, metavar="PATH", help="JSON {metric slug: text} for the 'rubric' arm"
    )
    p.add_argument("--concurrency", type=int, default=1, metavar="N", help="calls in flight at once (1)")
    p.add_argument("--experiment", type=int, default=None, metavar="ID", help="continue this experiment")
    p.add_argument("--cancel", type=int, default=None, metavar="ID", help="ask a running experiment to stop")
    p.add_argument("--reviewer", default="cli", help="recorded as who started the experiment")
    p = sub.add_parser("token", help="bearer tokens for the pipeline API: create, list, revoke")
    token_sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    t = token_sub.add_parser("create", help="create a token and print its secret once")
    t.add_argument("--name", required=True, help="the token's name, recorded as the actor of its writes")
    t.add_argument("--role", required=True, choices=["viewer", "reviewer", "lead", "admin"])
    t.add_argument("--by", default=None, help="recorded as who created it (default: the system identity)")
    t.add_argument(
        "--expires-in",
        default=None,
        metavar="LIFETIME",
        help="the token stops working after this long: 30m, 12h, 90d, 2w, 1y (default: until revoked)",
    )
    token_sub.add_parser("list", help="list tokens (names, roles, state, expiry, last use; never secrets)")
    t = token_sub.add_parser("revoke", help="revoke a token by name")
    t.add_argument("--name", required=True)
    t.add_argument("--by", default=None, help="recorded as who revoked it")

    p = sub.add_parser(
        "webhooks",
        help="signed webhooks: add, list, pause, resume, rotate, deliveries, replay, deliver, prune",
    )
    hook_sub = p.add_subparsers(dest="webhook_action", required=True, metavar="ACTION")
    w = hook_sub.add_parser("add", help="register a URL and print its signing secret once (lead)")
    w.add_argument("url")
    w.add_argument(
        "--events",
        required=True,
        help="comma-separated: judgment.reviewed, judgment.overruled, judgment.undone, judgment.adjudicated",
    )
    w.add_argument("--description", default="")
    w.add_argument("--by", default=None, help="recorded as who registered it")
    hook_sub.add_parser("list", help="list webhooks (never their secrets)")
    for name, text in (
        ("pause", "stop new deliveries"),
        ("resume", "deliver again"),
        ("rotate", "new secret"),
    ):
        w = hook_sub.add_parser(name, help=f"{text} for a webhook")
        w.add_argument("id", type=int)
        w.add_argument("--by", default=None)
    w = hook_sub.add_parser("deliveries", help="the delivery log as JSON Lines, newest first")
    w.add_argument("--webhook", type=int, default=None)
    w.add_argument("--status", choices=["pending", "delivered", "failed"], default=None)
    w.add_argument("--limit", type=int, default=50)
    w = hook_sub.add_parser("replay", help="send a delivered or failed delivery again")
    w.add_argument("id", type=int)
    w.add_argument("--by", default=None)
    w = hook_sub.add_parser(
        "deliver", help="attempt due deliveries now (the app's server does this by itself)"
    )
    w.add_argument("--loop", action="store_true", help="keep delivering every second until stopped")
    w = hook_sub.add_parser(
        "prune",
        help="remove delivered deliveries older than OVERRULE_WEBHOOK_LOG_DAYS with their attempts now "
        "(the app's server does this hourly); failed and pending ones are kept",
    )
    w.add_argument(
        "--days", type=int, default=None, help="keep this many days instead of OVERRULE_WEBHOOK_LOG_DAYS"
    )
    w.add_argument("--dry-run", action="store_true", help="only count what would be removed")
    hook_sub.add_parser("key", help="print a new key for OVERRULE_WEBHOOK_KEY")

    p = sub.add_parser("otlp", help="the OTLP receiver: what waits for its other half, and why")
    otlp_sub = p.add_subparsers(dest="otlp_action", required=True, metavar="ACTION")
    o = otlp_sub.add_parser(
        "waiting",
        help="calls and verdicts waiting for their other half, why, what to change; what was forgotten",
    )
    o.add_argument("--csv", action="store_true", help="the whole list as CSV on stdout")
    o.add_argument("--limit", type=int, default=50, help="rows listed, oldest first (default 50)")
    p = sub.add_parser("recount", help="rebuild the counters the pages read (and every other derived table)")
    p.add_argument("names", nargs="*", metavar="NAME", help="only these (default: all registered rebuilds)")

    p = sub.add_parser("queue", help="team review queues: create, list, show, next, label, adjudicate, close")
    queue_sub = p.add_subparsers(dest="queue_command", required=True, metavar="ACTION")
    q = queue_sub.add_parser("create", help="create a queue over a filter (lead)")
    q.add_argument("--name", required=True)
    q.add_argument("--product", default=None)
    q.add_argument("--metrics", default=None, help="comma-separated metric slugs (default: every metric)")
    q.add_argument("--language", default=None)
    q.add_argument("--since", default=None, metavar="YYYY-MM-DD", help="judged on or after")
    q.add_argument("--until", default=None, metavar="YYYY-MM-DD", help="judged on or before")
    q.add_argument(
        "--state",
        choices=["unreviewed", "confirmed", "corrected", "reviewed", "any"],
        default="unreviewed",
        help="review state of the judgments (default: unreviewed)",
    )
    q.add_argument("--size", type=int, default=100, help="items (default 100)")
    q.add_argument("--order", choices=["oldest", "largest_gap", "random"], default="oldest")
    q.add_argument("--seed", type=int, default=0, help="seed of the random sample (0)")
    q.add_argument("--overlap", type=int, default=1, help="reviewers per item (1)")
    q.add_argument("--mode", choices=["open", "blind"], default="open", help="blind: blind-first review")
    q.add_argument("--tolerance", type=float, default=None, help="continuous scales: labels this close agree")
    q.add_argument(
        "--reviewers", default=None, help="comma-separated reviewers it is assigned to (default: any)"
    )
    q.add_argument("--description", default=None)
    q.add_argument("--by", default=None, help="recorded as the lead who created it")
    q = queue_sub.add_parser("list", help="queues with their progress (a reviewer's own first)")
    q.add_argument("--reviewer", default=None, help="put this reviewer's queues first")
    q.add_argument("--all", action="store_true", help="closed queues too")
    q.add_argument("--format", choices=["text", "json"], default="text")
    q = queue_sub.add_parser("show", help="one queue: settings, progress, per-reviewer progress")
    q.add_argument("queue", help="id or name")
    q.add_argument("--format", choices=["text", "json", "csv"], default="text")
    q = queue_sub.add_parser("next", help="reserve the next item for a reviewer and print it")
    q.add_argument("queue", help="id or name")
    q.add_argument("--reviewer", required=True)
    q.add_argument("--format", choices=["text", "json"], default="text")
    q = queue_sub.add_parser("label", help="label one judgment (blind label first in a blind-first queue)")
    q.add_argument("queue", help="id or name")
    q.add_argument("--reviewer", required=True)
    q.add_argument("--judgment", type=int, required=True, help="judgment id (from `queue next`)")
    q.add_argument("--decision", required=True, help="a score on the metric's scale or a label")
    q.add_argument("--reason", default=None, help="required when it differs from the judge (final labels)")
    q = queue_sub.add_parser("skip", help="pass an item over (it goes to other reviewers)")
    q.add_argument("queue", help="id or name")
    q.add_argument("--reviewer", required=True)
    q.add_argument("--item", type=int, required=True, help="item id")
    q = queue_sub.add_parser("undo", help="withdraw your label (or, with --adjudication, your adjudication)")
    q.add_argument("queue", help="id or name")
    q.add_argument("--reviewer", required=True)
    q.add_argument("--judgment", type=int, required=True)
    q.add_argument("--adjudication", action="store_true")
    q = queue_sub.add_parser("disputes", help="judgments awaiting adjudication, labels side by side")
    q.add_argument("queue", help="id or name")
    q.add_argument("--limit", type=int, default=100)
    q.add_argument("--format", choices=["text", "json"], default="text")
    q = queue_sub.add_parser("adjudicate", help="decide a disputed judgment (lead)")
    q.add_argument("queue", help="id or name")
    q.add_argument("--judgment", type=int, required=True)
    q.add_argument("--decision", required=True)
    q.add_argument("--reason", default=None, help="required when it overrules the judge")
    q.add_argument("--by", default=None, help="recorded as the lead who decided")
    q = queue_sub.add_parser("assign", help="assign a queue to reviewers (lead; '' = every reviewer)")
    q.add_argument("queue", help="id or name")
    q.add_argument("--reviewers", required=True, help="comma-separated")
    q.add_argument("--by", default=None)
    q = queue_sub.add_parser("close", help="close a queue: undecided judgments go back to the default queue")
    q.add_argument("queue", help="id or name")
    q.add_argument("--by", default=None)
    q = queue_sub.add_parser(
        "agreement", help="agreement between reviewers: alpha, kappa, pairs, calibration, anchoring"
    )
    q.add_argument("queue", nargs="?", default=None, help="id or name (default: every queue)")
    q.add_argument("--product", default=None, help="comma-separated products (default: all)")
    q.add_argument("--basis", choices=["final", "blind"], default="final", help="final or blind labels")
    q.add_argument(
        "--table",
        default="all",
        help="all, or comma-separated: metrics, queues, pairs, calibration, anchoring",
    )
    q.add_argument("--format", choices=["text", "json", "csv"], default="text", help="csv: one --table")
    q.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples for the intervals")
    q.add_argument("--seed", type=int, default=0, help="bootstrap seed (same labels + seed = same intervals)")

    # Each capability adds its subcommand parser above this line and its @handler function above.
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return the exit status."""
    args = build_parser().parse_args(argv)
    try:
        status = _HANDLERS[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's flush at exit
        return status
    except BrokenPipeError:
        # `python -m lib otlp waiting | head`: the reader stopped reading; it has what it wanted, so
        # no traceback (review14 F7). Stdout goes to /dev/null so the flush at exit cannot fail
        # again; the status is a shell's for a command a closed pipe ended (128 + SIGPIPE).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (CliError, ConfigError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (ArgumentError, OperationalError) as exc:
        # A wrong OVERRULE_DATABASE_URL or an unreachable server: say so without a traceback.
        detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        print(f"error: cannot use the database ({detail}); check OVERRULE_DATABASE_URL", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
