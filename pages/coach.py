"""Coach: a metric-scoped, evidence-grounded chat about one evaluation (seed 002)."""

import uuid

import streamlit as st

from lib import coach, display
from lib.auth import Permission
from lib.llm import LLMError, LLMNotConfigured
from lib.safe_markdown import escape_markdown, safe_markdown
from lib.ui import (
    current_actor,
    denied_reason,
    flash,
    get_engine,
    llm_off_help,
    session_scope,
    show_flash,
)

FLASH_KEY = "coach_flash"

st.title("Coach")

snapshot_id = st.query_params.get("snapshot", "")
if not snapshot_id:
    with session_scope(read_only=True) as session:
        recent = coach.recent_snapshot_titles(session=session, limit=50)
    st.info("Open a chat from an evaluation's detail page, or pick a recent evaluation.")
    if recent:
        choice = st.selectbox(
            "Evaluation", list(recent), index=None, key="coach_pick", format_func=lambda sid: recent[sid]
        )
        if choice:
            st.query_params["snapshot"] = choice
            st.rerun()
    st.stop()

engine = get_engine()
with session_scope(read_only=True) as session:
    snapshot = coach.get_snapshot(session=session, snapshot_id=snapshot_id)
    if snapshot is None or snapshot.deleted_at is not None:
        st.error(f"Evaluation {escape_markdown(snapshot_id)} does not exist or is archived.")
        st.stop()
    specs = coach.metrics_for_product(session=session, product=snapshot.product)
    chats = coach.list_chats(session=session, snapshot_id=snapshot_id)
    used, limit = coach.turns_left(session=session, snapshot_id=snapshot_id)

plain_names = {s.slug: s.display_name for s in specs}
names = {slug: escape_markdown(name) for slug, name in plain_names.items()}  # for Markdown labels
st.subheader(escape_markdown(display.evaluation_title(snapshot.question)))
st.caption(
    f"Evaluation {escape_markdown(snapshot.id)} · {escape_markdown(snapshot.product)} · "
    f"{escape_markdown(snapshot.language)}"
)
with st.expander("Question and model answer"):
    st.text(snapshot.question)
    st.text(snapshot.model_answer)
st.markdown(f"[🔎 Back to the evaluation]({display.evaluation_url(snapshot.id)})")

no_llm = llm_off_help("The coach")
if no_llm:
    # Earlier chats stay readable; a new chat cannot start, so its form is not offered at all.
    st.warning(escape_markdown(no_llm), icon="🔌")
    if not chats:
        st.stop()


def _turn_limit_guidance() -> None:
    """Seed 002 AD-9: the guidance and the way on, once the evaluation's turns are used."""
    st.info(coach.turn_limit_message(snapshot.language))
    if st.button(coach.new_evaluation_label(snapshot.language), key="coach_new_eval", type="primary"):
        st.switch_page("pages/new_evaluation.py")


# The limit is per evaluation: once reached, no chat of any kind starts (its greeting calls the LLM).
at_limit = used >= limit
if at_limit and not chats:
    _turn_limit_guidance()
    st.stop()

NEW_CHAT = "➕ New chat"
labels = {
    c.chat_id: f"Chat {i + 1}: {', '.join(names.get(m, m) for m in c.selected_metrics)} "
    f"({c.user_messages} messages)"
    for i, c in enumerate(chats)
}
options = [*labels] if no_llm or at_limit else [*labels, NEW_CHAT]
# The active chat lives in session state; the radio's key follows it so a new chat becomes selected.
active = st.session_state.get("coach_active_chat")
default = active if active in options else (list(labels)[-1] if chats else NEW_CHAT)
chosen = st.radio(
    "Chats on this evaluation",
    options,
    index=options.index(default),
    format_func=lambda o: labels.get(o, o),
    horizontal=True,
    key=f"coach_chat_{len(options)}_{default}",
)
st.session_state["coach_active_chat"] = chosen
# Two boxes at the same place in every run: a reply streams into `conversation`, and the rerun after it
# draws the stored chat into the same box. The message then sits at the same index in both runs, so
# Streamlit updates it in place instead of showing the streamed copy, faded, beside the stored one.
heading = st.container()
conversation = st.container()


def _stream_safely(prepared: coach.PreparedReply) -> None:
    """Stream a reply, rendering the text so far through safe_markdown (the model's text is untrusted)."""
    placeholder = st.empty()
    text = ""
    for delta in prepared.stream():
        text += delta
        placeholder.markdown(safe_markdown(text))


def _show_reply(prepared: coach.PreparedReply) -> None:
    with st.chat_message("assistant"):
        if prepared.needs_stream:
            _stream_safely(prepared)
        else:
            st.markdown(safe_markdown(prepared.text or ""))


coach_denied = denied_reason(Permission.COACH) if current_actor() else None
if coach_denied:
    heading.caption(f"🔒 {escape_markdown(coach_denied)}")
if chosen == NEW_CHAT:
    with heading:
        st.subheader("Start a chat")
        st.caption("Pick 1–3 metrics. They are fixed for this chat; other metrics need a new chat.")
        picked = st.multiselect(
            "Metrics to discuss",
            [s.slug for s in specs],
            format_func=lambda s: plain_names[s],
            max_selections=coach.MAX_SELECTED_METRICS,
            key="coach_metrics",
        )
        start = st.button(
            "Start chat",
            key="coach_start",
            type="primary",
            disabled=bool(no_llm or coach_denied) or not picked,
        )
    if start:
        try:
            prepared = coach.start_chat(engine, snapshot_id, picked, reviewer=current_actor())
            with conversation:  # where the chat's first message stands after the rerun
                _show_reply(prepared)
        except (coach.CoachError, LLMNotConfigured) as exc:
            st.error(escape_markdown(str(exc)))
            st.stop()
        except LLMError as exc:
            st.error(
                f"The coach could not answer: {escape_markdown(str(exc))}. Open the chat again to retry."
            )
            st.stop()
        st.session_state["coach_active_chat"] = prepared.chat_id
        st.rerun()
    st.stop()

chat_id = str(chosen)
with session_scope(read_only=True) as session:
    history = coach.chat_messages(session=session, snapshot_id=snapshot_id, chat_id=chat_id)
    unfinished = coach.unfinished_replies(session=session, snapshot_id=snapshot_id, chat_id=chat_id)
heading.caption(
    "Metrics: " + ", ".join(names.get(m, m) for m in (history[0].selected_metrics if history else []))
)

with conversation:
    for message in history:
        if message.role == "assistant" and not message.is_complete:
            continue
        with st.chat_message(message.role):
            st.markdown(
                safe_markdown(message.content)
                if message.role == "assistant"
                else escape_markdown(message.content)
            )

    # A reply cut off by a rerun or a closed tab is regenerated in place (same row) on the next visit.
    if unfinished and not no_llm:
        for row in unfinished:
            try:
                _show_reply(coach.resume_reply(engine, snapshot_id, row.client_message_id))
            except coach.TurnLimitReached:
                continue  # an unfinished greeting is not generated once the turns are used
            except LLMError as exc:
                st.error(f"The coach could not finish an earlier reply: {escape_markdown(str(exc))}")
                break

show_flash(FLASH_KEY)
st.progress(min(used / limit, 1.0), text=f"{used} of {limit} messages used")
if at_limit:
    _turn_limit_guidance()
    st.chat_input("This chat is read-only now.", disabled=True, key="coach_input")
    st.stop()

prompt = st.chat_input("Ask the coach…", disabled=bool(no_llm or coach_denied), key="coach_input")
if prompt:
    prepared: coach.PreparedReply | None = None
    try:
        with conversation:  # after the stored messages: where the rerun will draw these two
            with st.chat_message("user"):
                st.markdown(escape_markdown(prompt))
            prepared = coach.send_message(
                engine, snapshot_id, prompt, str(uuid.uuid4()), chat_id=chat_id, reviewer=current_actor()
            )
            _show_reply(prepared)
    except coach.TurnLimitReached:
        st.rerun()  # another tab used the last turn: show the read-only chat at once
    except (coach.CoachError, LLMNotConfigured) as exc:
        st.error(escape_markdown(str(exc)))
    except LLMError as exc:
        message = f"The coach could not answer: {exc}. Your message is kept; open the chat again to retry."
        if prepared is not None and prepared.chat_complete:
            flash(FLASH_KEY, "error", message)  # the last turn is used: the chat turns read-only now
            st.rerun()
        st.error(escape_markdown(message))
    else:
        st.rerun()
