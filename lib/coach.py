"""Coach chat on an evaluation snapshot (seed 002 AD-4, AD-9, AD-10): metric-scoped, evidence-grounded.

Order of a send, as the seed fixes it: dedup on (snapshot_id, client_message_id, "user") first, then
the atomic turn claim, then the user row and an empty assistant row, then the streamed reply fills
the assistant row in place. The claim and the two inserts share one transaction, so a duplicate
that races past the dedup check fails on the unique constraint and its claim rolls back with it:
a retried message never costs a turn. The greeting never claims a turn and is idempotent; an empty
message asks for it, as the seed's `is_init` does.

The limit is per evaluation (AD-9), not per chat: once its turns are used, nothing on it calls the
LLM again. A new chat's greeting, or regenerating an unfinished greeting, is refused with
TurnLimitReached; stored replies are still returned, and a reply owed to a turn granted before the
limit (interrupted while streaming) is still finished.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, case, func, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from lib import llm
from lib.auth import Actor, Permission, authorize
from lib.config import get_settings
from lib.db import session_scope
from lib.display import TITLE_CHARS, evaluation_title
from lib.evidence import metric_entry
from lib.metrics import MetricSpec, metrics_for_product, score_of
from lib.models import ChatMessage, EvaluationSnapshot, new_prefixed_id, utcnow

log = logging.getLogger(__name__)

MAX_SELECTED_METRICS = 3
STRICT_EVIDENCE_RULE = (
    "You must ONLY reference evidence items provided in the context. Do NOT quote from the model answer "
    "directly. If no evidence exists for a topic, say so honestly."
)
TURN_LIMIT_MESSAGES = {
    "tr": "Bu değerlendirme üzerine yeterince konuştuk! Öğrendiklerini pekiştirmek için yeni bir soru "
    "çözmeye ne dersin?",
    "en": "We have talked enough about this evaluation! How about working on a new question to "
    "consolidate what you learned?",
}
NEW_EVALUATION_LABELS = {"tr": "Yeni bir değerlendirme başlat", "en": "Start a new evaluation"}
TURN_LIMIT_OUTCOME = "turn_limit_reached"  # seed 002 AD-9's error code (HTTP 429 in the seed)
# Written into the assistant row while its reply is streaming, flushed every this many characters.
_FLUSH_EVERY = 400


class CoachError(ValueError):
    """A coach action the user must correct (bad metrics, unknown or archived evaluation)."""


class TurnLimitReached(CoachError):
    """The snapshot has used all its user turns (seed 002 AD-9: HTTP 429 turn_limit_reached).

    Machine-readable: `outcome` is "turn_limit_reached", with `used`, `limit` and `language`; the
    message is the seed's guidance in the evaluation's language.
    """

    outcome = TURN_LIMIT_OUTCOME

    def __init__(self, *, used: int, limit: int, language: str) -> None:
        self.used, self.limit, self.language = used, limit, language
        super().__init__(turn_limit_message(language))


def _language(language: str) -> str:
    return language if language in TURN_LIMIT_MESSAGES else "en"


def turn_limit_message(language: str) -> str:
    """The seed's guidance text when the limit is reached, in the evaluation's language."""
    return TURN_LIMIT_MESSAGES[_language(language)]


def new_evaluation_label(language: str) -> str:
    """The guidance button's label, in the evaluation's language (tr/en, English otherwise)."""
    return NEW_EVALUATION_LABELS[_language(language)]


def claim_turn(session: Session, snapshot_id: str) -> bool:
    """Atomically take one user turn; False when the limit is reached (the caller commits).

    The turn that uses the last one marks the snapshot "completed" in the same statement: its chat
    is complete (read-only) from that moment, not from the next page load.
    """
    turns = EvaluationSnapshot.chat_turn_count
    result = session.execute(
        update(EvaluationSnapshot)
        .where(
            col(EvaluationSnapshot.id) == snapshot_id,
            col(EvaluationSnapshot.chat_turn_count) < col(EvaluationSnapshot.max_chat_turns),
        )
        .values(
            chat_turn_count=turns + 1,
            status=case(
                (turns + 1 >= col(EvaluationSnapshot.max_chat_turns), "completed"),
                else_=col(EvaluationSnapshot.status),
            ),
        )
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1


def greeting_message_id(snapshot_id: str, chat_id: str = "") -> str:
    """`init_{snapshot_id}` for the evaluation's first chat; later chats get their own suffix."""
    return f"init_{snapshot_id}" if not chat_id else f"init_{snapshot_id}:{chat_id}"


@dataclass(frozen=True)
class ChatSummary:
    """One chat of an evaluation, for the list of past chats."""

    chat_id: str
    selected_metrics: list[str]
    started_at: Any
    user_messages: int
    messages: int


def _live_snapshot(session: Session, snapshot_id: str) -> EvaluationSnapshot:
    snap = session.get(EvaluationSnapshot, snapshot_id)
    if snap is None or snap.deleted_at is not None:
        raise CoachError(f"evaluation {snapshot_id!r} does not exist or is archived")
    return snap


def _refuse_at_limit(session: Session, snapshot_id: str) -> None:
    """TurnLimitReached when the evaluation has used its turns: then no new LLM call may start on it."""
    snap = session.get(EvaluationSnapshot, snapshot_id, populate_existing=True)
    if snap is not None and snap.chat_turn_count >= snap.max_chat_turns:
        raise TurnLimitReached(used=snap.chat_turn_count, limit=snap.max_chat_turns, language=snap.language)


def validate_metrics(specs: Sequence[MetricSpec], selected: Sequence[str]) -> list[str]:
    """1–3 distinct metrics of the evaluation's rubric, in rubric order; CoachError otherwise."""
    chosen = list(dict.fromkeys(selected))
    if not 1 <= len(chosen) <= MAX_SELECTED_METRICS:
        raise CoachError(f"pick between 1 and {MAX_SELECTED_METRICS} metrics (got {len(chosen)})")
    known = [s.slug for s in specs]
    unknown = [m for m in chosen if m not in known]
    if unknown:
        raise CoachError(f"not metrics of this evaluation: {', '.join(unknown)}")
    return [slug for slug in known if slug in chosen]


def list_chats(*, session: Session, snapshot_id: str) -> list[ChatSummary]:
    """The evaluation's chats, oldest first, with their fixed metrics and message counts."""
    rows = session.exec(
        select(
            ChatMessage.chat_id,
            func.min(ChatMessage.created_at),
            func.count(),
            func.count().filter(col(ChatMessage.role) == "user"),
        )
        .where(ChatMessage.snapshot_id == snapshot_id)
        .group_by(ChatMessage.chat_id)
        .order_by(func.min(ChatMessage.created_at))
    ).all()
    return [
        ChatSummary(
            chat_id=cid,
            selected_metrics=chat_metrics(session=session, snapshot_id=snapshot_id, chat_id=cid),
            started_at=started,
            user_messages=users,
            messages=total,
        )
        for cid, started, total, users in rows
    ]


def chat_metrics(*, session: Session, snapshot_id: str, chat_id: str) -> list[str]:
    """The metrics fixed for a chat when it started (stored on its first message)."""
    first = session.exec(
        select(ChatMessage.selected_metrics)
        .where(ChatMessage.snapshot_id == snapshot_id, ChatMessage.chat_id == chat_id)
        .order_by(col(ChatMessage.created_at), col(ChatMessage.id))
        .limit(1)
    ).first()
    return list(first or [])


def chat_messages(*, session: Session, snapshot_id: str, chat_id: str = "") -> list[ChatMessage]:
    """A chat's messages in order (greeting first)."""
    return list(
        session.exec(
            select(ChatMessage)
            .where(ChatMessage.snapshot_id == snapshot_id, ChatMessage.chat_id == chat_id)
            .order_by(col(ChatMessage.created_at), col(ChatMessage.role).desc(), col(ChatMessage.id))
        ).all()
    )


def new_chat_id(*, session: Session, snapshot_id: str) -> str:
    """The id for another chat on this evaluation: "" for the first, then a short random id."""
    exists = session.exec(
        select(ChatMessage.id)
        .where(ChatMessage.snapshot_id == snapshot_id, ChatMessage.chat_id == "")
        .limit(1)
    ).first()
    return "" if exists is None else f"c{secrets.token_hex(4)}"


def metric_context(
    snapshot: EvaluationSnapshot, specs: Sequence[MetricSpec], selected: Sequence[str]
) -> dict:
    """Scores, reasons and evidence of the selected metrics only (seed "Chat Payload Schema")."""
    by_slug = {s.slug: s for s in specs}
    out: dict[str, Any] = {}
    for slug in selected:
        spec = by_slug[slug]
        user_entry = (snapshot.user_scores_json or {}).get(slug) or {}
        judge_entry = (snapshot.judge_scores_json or {}).get(slug) or {}
        user, judge = score_of(user_entry), score_of(judge_entry)
        ev = metric_entry(snapshot.evidence_json, slug)
        out[slug] = {
            "display_name": spec.display_name,
            "scale": spec.scale_label(),
            "user_score": user,
            "judge_score": judge,
            "metric_gap": None if user is None or judge is None else round(abs(user - judge), 2),
            "user_reason": (user_entry.get("reason") if isinstance(user_entry, dict) else None)
            or ev.get("user_reason"),
            "judge_reason": (judge_entry.get("reason") if isinstance(judge_entry, dict) else None)
            or ev.get("judge_reason"),
            "evidence": [
                {k: item.get(k) for k in ("quote", "why", "better", "verified", "highlight_available")}
                for item in ev["evidence"]
            ],
        }
    return out


def coach_payload(snapshot: EvaluationSnapshot, specs: Sequence[MetricSpec], selected: Sequence[str]) -> dict:
    """The seed's chat payload without history: snapshot context for the selected metrics."""
    return {
        "snapshot_id": snapshot.id,
        "question": snapshot.question,
        "model_answer": snapshot.model_answer,
        "model_name": snapshot.model_name,
        "selected_metrics": list(selected),
        "metrics": metric_context(snapshot, specs, selected),
    }


def system_prompt(snapshot: EvaluationSnapshot, specs: Sequence[MetricSpec], selected: Sequence[str]) -> str:
    """The coach's instructions: scope, strict evidence usage, refusal of other metrics, language."""
    names = {s.slug: s.display_name for s in specs}
    chosen = ", ".join(names[s] for s in selected)
    others = ", ".join(names[s.slug] for s in specs if s.slug not in selected) or "none"
    language = "Turkish" if snapshot.language == "tr" else "the user's language"
    payload = json.dumps(coach_payload(snapshot, specs, selected), ensure_ascii=False, indent=1)
    return (
        "You are a coach who helps a reviewer understand why their scores and an AI judge's scores for a "
        f"model answer differ. This chat is about these metrics only: {chosen}.\n"
        "For each metric: explain the gap, reference the evidence, and suggest 1–2 concrete improvements; "
        "you may invite the user to rewrite the answer and re-evaluate it.\n"
        f"STRICT EVIDENCE USAGE: {STRICT_EVIDENCE_RULE}\n"
        f"REFUSE other metrics: if the user asks about a metric that was not selected ({others}), politely "
        "decline and say that a new chat with that metric must be started.\n"
        f"Answer in {language}; technical terms may stay in English. Keep answers short and concrete.\n\n"
        f"EVALUATION CONTEXT (JSON):\n{payload}"
    )


def greeting_instruction(selected_names: Sequence[str]) -> str:
    return (
        "Open the conversation: briefly summarise the gaps between the user's and the judge's scores for "
        f"{', '.join(selected_names)}, pointing at the evidence items, and ask what the user wants to explore."
    )


def window(history: Sequence[ChatMessage], size: int) -> list[dict[str, str]]:
    """The last `size` complete messages as chat-completion messages (seed AD-4 token windowing)."""
    complete = [m for m in history if m.is_complete and m.content]
    tail = complete[-size:] if size > 0 else []
    return [{"role": m.role, "content": m.content} for m in tail]


def build_messages(
    snapshot: EvaluationSnapshot,
    specs: Sequence[MetricSpec],
    selected: Sequence[str],
    history: Sequence[ChatMessage],
    *,
    greeting: bool = False,
    window_size: int | None = None,
) -> list[dict[str, str]]:
    """Exactly what goes to the model: system prompt + the last N messages (+ the greeting request)."""
    size = get_settings().chat_window if window_size is None else window_size
    messages = [{"role": "system", "content": system_prompt(snapshot, specs, selected)}]
    if greeting:
        names = {s.slug: s.display_name for s in specs}
        messages.append({"role": "user", "content": greeting_instruction([names[s] for s in selected])})
        return messages
    return messages + window(history, size)


def estimate_tokens(text: str) -> int:
    """A rough token count for cost tracking (about four characters a token)."""
    return max(1, len(text) // 4) if text else 0


@dataclass
class PreparedReply:
    """A reply ready to show: already stored (`text`), or to be streamed by iterating `stream()`."""

    snapshot_id: str
    chat_id: str
    client_message_id: str
    assistant_id: str
    text: str | None = None
    streamer: Callable[[], Iterator[str]] | None = None
    # True when this message used the evaluation's last turn: its chat is read-only from now on.
    chat_complete: bool = False

    @property
    def needs_stream(self) -> bool:
        return self.text is None

    def stream(self) -> Iterator[str]:
        if self.text is not None:
            yield self.text
            return
        assert self.streamer is not None
        yield from self.streamer()


def _load_chat_context(session: Session, snapshot_id: str, chat_id: str):  # type: ignore[no-untyped-def]
    snap = _live_snapshot(session, snapshot_id)
    specs = metrics_for_product(session=session, product=snap.product)
    selected = chat_metrics(session=session, snapshot_id=snapshot_id, chat_id=chat_id)
    return snap, specs, selected


def _streamer(
    engine: Engine, assistant_id: str, snapshot_id: str, chat_id: str, greeting: bool
) -> Callable[[], Iterator[str]]:
    """A generator factory that asks the coach model and writes the reply into the assistant row."""

    def run() -> Iterator[str]:
        with session_scope(engine, read_only=True) as s:
            snap, specs, selected = _load_chat_context(s, snapshot_id, chat_id)
            history = chat_messages(session=s, snapshot_id=snapshot_id, chat_id=chat_id)
        messages = build_messages(snap, specs, selected, history, greeting=greeting)
        settings = get_settings()
        parts: list[str] = []
        flushed = 0
        for delta in llm.stream_chat(messages, model=settings.coach_model, purpose="coach"):
            parts.append(delta)
            yield delta
            text = "".join(parts)
            if len(text) - flushed >= _FLUSH_EVERY:
                _write_assistant(engine, assistant_id, text, complete=False)
                flushed = len(text)
        _write_assistant(engine, assistant_id, "".join(parts), complete=True)

    return run


def _write_assistant(engine: Engine, assistant_id: str, text: str, *, complete: bool) -> None:
    with session_scope(engine) as s:
        s.execute(
            update(ChatMessage)
            .where(col(ChatMessage.id) == assistant_id)
            .values(content=text, is_complete=complete, token_count=estimate_tokens(text))
        )


def _reset_in_place(session: Session, row: ChatMessage) -> None:
    """Seed AD-4 update-in-place: an unfinished reply is blanked and regenerated on the same row."""
    row.content = ""
    row.is_complete = False
    session.add(row)


def start_chat(
    engine: Engine,
    snapshot_id: str,
    selected_metrics: Sequence[str],
    *,
    reviewer: Actor | str | None = None,
    chat_id: str | None = None,
) -> PreparedReply:
    """Start (or reopen) a chat with fixed metrics; returns its greeting, stored or to be streamed.

    The greeting is idempotent: asking again returns the stored greeting and calls no LLM. It never
    counts against the turn limit, but a greeting still to be generated needs turns left on the
    evaluation (TurnLimitReached otherwise: "New chat" cannot reopen a finished evaluation).
    """
    reviewer = authorize(engine, reviewer, Permission.COACH).identity or None
    with session_scope(engine) as s:
        snap = _live_snapshot(s, snapshot_id)
        specs = metrics_for_product(session=s, product=snap.product)
        selected = validate_metrics(specs, selected_metrics)
        cid = new_chat_id(session=s, snapshot_id=snapshot_id) if chat_id is None else chat_id
        fixed = chat_metrics(session=s, snapshot_id=snapshot_id, chat_id=cid)
        if fixed and fixed != selected:
            raise CoachError(
                "the metrics of a chat cannot change once it has started; start a new chat for other metrics"
            )
        greeting_id = greeting_message_id(snapshot_id, cid)
        row = s.exec(
            select(ChatMessage).where(
                ChatMessage.snapshot_id == snapshot_id,
                ChatMessage.client_message_id == greeting_id,
                ChatMessage.role == "assistant",
            )
        ).first()
        if row is not None and row.is_complete:
            return PreparedReply(snapshot_id, cid, greeting_id, row.id, text=row.content)
        _refuse_at_limit(s, snapshot_id)
        if row is None:
            row = ChatMessage(
                id=new_prefixed_id("msg"),
                chat_id=cid,
                client_message_id=greeting_id,
                snapshot_id=snapshot_id,
                role="assistant",
                content="",
                is_complete=False,
                selected_metrics=selected,
                reviewer=reviewer,
            )
            s.add(row)
        else:
            _reset_in_place(s, row)
        assistant_id = row.id
    if not get_settings().llm_configured:
        raise llm.LLMNotConfigured()
    return PreparedReply(
        snapshot_id,
        cid,
        greeting_id,
        assistant_id,
        streamer=_streamer(engine, assistant_id, snapshot_id, cid, greeting=True),
    )


def send_message(
    engine: Engine,
    snapshot_id: str,
    content: str,
    client_message_id: str,
    *,
    chat_id: str = "",
    reviewer: Actor | str | None = None,
    selected_metrics: Sequence[str] | None = None,
) -> PreparedReply:
    """Send a user message in the seed's order; TurnLimitReached when the budget is used up.

    An empty (or blank) message is the seed's greeting request: the chat's greeting comes back,
    stored or to be streamed, as `start_chat` gives it; no turn is used and `client_message_id`
    is not needed (the greeting has its own). `selected_metrics` fixes the metrics of a chat that
    has none yet and is ignored once they are fixed (seed 002: sent with the first message only).
    """
    content = (content or "").strip()
    if not content:
        with session_scope(engine, read_only=True) as s:
            _live_snapshot(s, snapshot_id)
            fixed = chat_metrics(session=s, snapshot_id=snapshot_id, chat_id=chat_id)
        return start_chat(
            engine, snapshot_id, fixed or list(selected_metrics or ()), reviewer=reviewer, chat_id=chat_id
        )
    reviewer = authorize(engine, reviewer, Permission.COACH).identity or None
    if not client_message_id or client_message_id.startswith("init_"):
        raise CoachError("a client_message_id is required and must not start with 'init_'")
    with session_scope(engine) as s:
        _live_snapshot(s, snapshot_id)
        selected = chat_metrics(session=s, snapshot_id=snapshot_id, chat_id=chat_id)
        if not selected:
            raise CoachError("start the chat by picking its metrics first")
        prepared = _existing_turn(s, snapshot_id, chat_id, client_message_id)
    if prepared is not None:
        return _finish_existing(engine, prepared)
    if not get_settings().llm_configured:
        raise llm.LLMNotConfigured()
    assistant_id = new_prefixed_id("msg")
    try:
        with session_scope(engine) as s:
            if not claim_turn(s, snapshot_id):
                snap = s.get(EvaluationSnapshot, snapshot_id, populate_existing=True)
                assert snap is not None  # _live_snapshot found it above
                raise TurnLimitReached(
                    used=snap.chat_turn_count, limit=snap.max_chat_turns, language=snap.language
                )
            claimed = s.get(EvaluationSnapshot, snapshot_id, populate_existing=True)
            complete = claimed is not None and claimed.chat_turn_count >= claimed.max_chat_turns
            now = utcnow()
            s.add(
                ChatMessage(
                    id=new_prefixed_id("msg"),
                    chat_id=chat_id,
                    client_message_id=client_message_id,
                    snapshot_id=snapshot_id,
                    role="user",
                    content=content,
                    is_complete=True,
                    selected_metrics=selected,
                    token_count=estimate_tokens(content),
                    created_at=now,
                    reviewer=reviewer,
                )
            )
            s.add(
                ChatMessage(
                    id=assistant_id,
                    chat_id=chat_id,
                    client_message_id=client_message_id,
                    snapshot_id=snapshot_id,
                    role="assistant",
                    content="",
                    is_complete=False,
                    selected_metrics=selected,
                    created_at=now,
                    reviewer=reviewer,
                )
            )
    except IntegrityError:
        # A concurrent duplicate won the race; its turn stands and ours rolled back.
        with session_scope(engine) as s:
            prepared = _existing_turn(s, snapshot_id, chat_id, client_message_id)
        if prepared is None:  # pragma: no cover - the constraint fired, so the row exists
            raise
        return _finish_existing(engine, prepared)
    return PreparedReply(
        snapshot_id,
        chat_id,
        client_message_id,
        assistant_id,
        streamer=_streamer(engine, assistant_id, snapshot_id, chat_id, greeting=False),
        chat_complete=complete,
    )


def _existing_turn(
    session: Session, snapshot_id: str, chat_id: str, client_message_id: str
) -> PreparedReply | None:
    user = session.exec(
        select(ChatMessage).where(
            ChatMessage.snapshot_id == snapshot_id,
            ChatMessage.client_message_id == client_message_id,
            ChatMessage.role == "user",
        )
    ).first()
    if user is None:
        return None
    assistant = session.exec(
        select(ChatMessage).where(
            ChatMessage.snapshot_id == snapshot_id,
            ChatMessage.client_message_id == client_message_id,
            ChatMessage.role == "assistant",
        )
    ).first()
    if assistant is not None and assistant.is_complete:
        return PreparedReply(
            snapshot_id, user.chat_id, client_message_id, assistant.id, text=assistant.content
        )
    if assistant is None:
        assistant = ChatMessage(
            id=new_prefixed_id("msg"),
            chat_id=user.chat_id,
            client_message_id=client_message_id,
            snapshot_id=snapshot_id,
            role="assistant",
            content="",
            is_complete=False,
            selected_metrics=user.selected_metrics,
            created_at=user.created_at,
        )
        session.add(assistant)
    else:
        _reset_in_place(session, assistant)
    return PreparedReply(snapshot_id, user.chat_id, client_message_id, assistant.id)


def _finish_existing(engine: Engine, prepared: PreparedReply) -> PreparedReply:
    if prepared.text is not None:
        return prepared
    if prepared.client_message_id.startswith("init_"):
        # A greeting is never owed (it uses no turn): at the limit it is not generated again.
        with session_scope(engine, read_only=True) as s:
            _refuse_at_limit(s, prepared.snapshot_id)
    if not get_settings().llm_configured:
        raise llm.LLMNotConfigured()
    prepared.streamer = _streamer(
        engine,
        prepared.assistant_id,
        prepared.snapshot_id,
        prepared.chat_id,
        greeting=prepared.client_message_id.startswith("init_"),
    )
    return prepared


def unfinished_replies(*, session: Session, snapshot_id: str, chat_id: str = "") -> list[ChatMessage]:
    """Assistant rows left incomplete by an interrupted stream; the page regenerates them in place."""
    return list(
        session.exec(
            select(ChatMessage).where(
                ChatMessage.snapshot_id == snapshot_id,
                ChatMessage.chat_id == chat_id,
                ChatMessage.role == "assistant",
                col(ChatMessage.is_complete).is_(False),
            )
        ).all()
    )


def resume_reply(engine: Engine, snapshot_id: str, client_message_id: str) -> PreparedReply:
    """Regenerate an interrupted reply in place (same row, same id), never a duplicate."""
    with session_scope(engine) as s:
        _live_snapshot(s, snapshot_id)
        row = s.exec(
            select(ChatMessage).where(
                ChatMessage.snapshot_id == snapshot_id,
                ChatMessage.client_message_id == client_message_id,
                ChatMessage.role == "assistant",
            )
        ).first()
        if row is None:
            raise CoachError("no reply to resume")
        if row.is_complete:
            return PreparedReply(snapshot_id, row.chat_id, client_message_id, row.id, text=row.content)
        _reset_in_place(s, row)
        prepared = PreparedReply(snapshot_id, row.chat_id, client_message_id, row.id)
    return _finish_existing(engine, prepared)


def get_snapshot(*, session: Session, snapshot_id: str) -> EvaluationSnapshot | None:
    """A live (not archived) snapshot, or None."""
    snap = session.get(EvaluationSnapshot, snapshot_id)
    return None if snap is None or snap.deleted_at is not None else snap


def recent_snapshot_titles(*, session: Session, limit: int = 50) -> dict[str, str]:
    """The newest live evaluations as {id: title}, newest first: the picker reads questions, not ids."""
    rows = session.exec(
        select(EvaluationSnapshot.id, func.substr(EvaluationSnapshot.question, 1, TITLE_CHARS * 3))
        .where(col(EvaluationSnapshot.deleted_at).is_(None))
        .order_by(col(EvaluationSnapshot.created_at).desc())
        .limit(limit)
    ).all()
    return {sid: evaluation_title(question) for sid, question in rows}


def turns_left(*, session: Session, snapshot_id: str) -> tuple[int, int]:
    """(used, limit) user turns of the evaluation."""
    snap = _live_snapshot(session, snapshot_id)
    return snap.chat_turn_count, snap.max_chat_turns
