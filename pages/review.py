"""Review queue: one item at a time, the answer beside compact metric rows, every row reachable from
the keyboard — in the default queue (everything pending, one reviewer per item) or in a team queue a
lead created (several reviewers per item, optionally blind-first).

The queue and the item are in the URL (`/review?queue=…&item=…`), so a link to an item works and a
reload stays on it; the item a reviewer holds, their skipped items, their filters and what they
typed but did not send live in the database, so a new tab or another device continues there too.
"""

import streamlit as st

from lib import preferences, queues, reservations, review_queue
from lib.auth import Permission, PermissionDenied
from lib.models import ReviewQueueItem
from lib.review_queue import ORDERS, QueueFilter
from lib.safe_markdown import escape_markdown
from lib.ui import current_actor, current_reviewer, denied_reason, session_scope, show_flash
from lib.ui.review import KEY_MAP, Target, fit_to_screen, item_view, metric_rows, own_labels, queue_toolbar
from lib.ui.tables import link_to
from lib.ui.team_review import (
    DEFAULT_LABEL,
    blind_item,
    blind_keys_help,
    blind_rows,
    lease_status,
    queue_choices,
    queue_label,
)

ANY = "Any"
KEY = "review"
FLASH = "review_flash"
CHOICE = "review_queue_choice"
SHOWN = "review_shown"  # (queue id or None, item) drawn last: later runs follow the queue, not the URL
FILTERS = ("product", "metric", "language", "order")
PREFERENCE = "review"  # lib.preferences name of the queue choice and the filters

st.session_state.setdefault("review_skipped", [])
fit_to_screen()
reviewer = current_reviewer()
# A reviewer's item is reserved for them and their skips live in the database; someone who may only
# read reserves nothing.
reserver = reviewer if reviewer and not denied_reason(Permission.REVIEW) else None

with session_scope(read_only=True) as session:
    options = review_queue.queue_options(session=session)
    offered = queue_choices(queues.list_queues(session=session, reviewer=reviewer), reviewer)
    saved = (
        preferences.load_preference(session=session, reviewer=reviewer, name=PREFERENCE) if reviewer else {}
    )
team = {q.id: q for q in offered}
DEFAULT_QUEUE = 0  # the chooser's value for the default queue (a selectbox value None means "nothing chosen")
choices: list[int] = [*team, DEFAULT_QUEUE]
allowed = {
    "product": [ANY, *options["products"]],
    "metric": [ANY, *options["metrics"]],
    "language": [ANY, *options["languages"]],
    "order": list(ORDERS),
}


def _from_url(wanted: str) -> int | str:
    """The queue a link names (id or name) among those offered, or a message why not."""
    for queue in offered:
        if wanted.strip() in (str(queue.id), queue.name):
            return queue.id
    return f"There is no active queue {wanted!r} for you; here is {'your first queue' if team else 'the default queue'}."


url_notice = None
if CHOICE not in st.session_state:  # a session's first run: the link, else where the reviewer was
    wanted = st.query_params.get("queue")
    found = _from_url(wanted) if wanted else saved.get("queue", choices[0])
    if isinstance(found, str):
        url_notice, found = found, choices[0]
    st.session_state[CHOICE] = found if found in choices else choices[0]
elif st.session_state[CHOICE] not in choices:  # the queue closed (or was taken off) meanwhile
    url_notice = "That queue is no longer open to you; here is the next one."
    st.session_state[CHOICE] = choices[0]
for name in FILTERS:  # a first run, or a run after one that did not draw the filters (a team queue)
    if st.session_state.get(f"review_{name}") not in allowed[name]:
        value = saved.get(name)
        st.session_state[f"review_{name}"] = value if value in allowed[name] else allowed[name][0]


def _remember() -> None:
    """Keep the queue choice and the filters in the database: a reload or another device starts here."""
    if not reviewer:
        return
    with session_scope() as session:
        value = preferences.load_preference(session=session, reviewer=reviewer, name=PREFERENCE)
        value["queue"] = st.session_state.get(CHOICE)
        for name in FILTERS:
            if st.session_state.get(f"review_{name}") in allowed[name]:
                value[name] = st.session_state[f"review_{name}"]
        preferences.save_preference(session=session, reviewer=reviewer, name=PREFERENCE, value=value)


def _queue_changed() -> None:
    _remember()
    for name in (SHOWN, "review_current", "review_pending", "review_selected", "review_target"):
        st.session_state.pop(name, None)
    st.query_params.pop("item", None)


def _filters_changed() -> None:
    _remember()
    st.session_state.pop(SHOWN, None)
    st.query_params.pop("item", None)


head, chooser, filter_box = st.columns([2.2, 5, 1.6], vertical_alignment="bottom")
head.markdown("### Review queue")
if len(choices) > 1:
    chooser.selectbox(
        "Queue",
        choices,
        format_func=lambda q: DEFAULT_LABEL if q == DEFAULT_QUEUE else queue_label(team[q], reviewer),
        key=CHOICE,
        on_change=_queue_changed,
        help="Your queues first, then queues open to everyone, then everything pending. A lead creates "
        "team queues on the Team queues page.",
    )
choice = st.session_state[CHOICE]
if choice == DEFAULT_QUEUE:
    with filter_box.popover("Filters and order", icon=":material/filter_list:", width="stretch"):
        for name, label in (("product", "Product"), ("metric", "Metric"), ("language", "Language")):
            st.selectbox(label, allowed[name], key=f"review_{name}", on_change=_filters_changed)
        st.radio("Order", allowed["order"], format_func=ORDERS.__getitem__, key="review_order",
                 on_change=_filters_changed)  # fmt: skip
else:
    queue = team[choice]
    with filter_box.popover("About this queue", icon=":material/groups:", width="stretch"):
        st.markdown(f"**{escape_markdown(queue.name)}**")
        if queue.description:
            st.markdown(escape_markdown(queue.description))
        st.caption(escape_markdown(queue_label(queue, reviewer)))
        if queue.mode == "blind":
            st.caption(
                "Blind-first: you score each metric from the answer alone; the judge's score, reason and "
                "highlights are shown after your scores are saved, and you keep or change your score."
            )
        if queue.overlap > 1:
            st.caption(
                f"{queue.overlap} reviewers label each item independently: agreeing labels decide it, "
                "differing ones go to a lead."
            )
if url_notice:
    st.info(escape_markdown(url_notice), icon="🔗")

if not reviewer:
    st.warning("Enter your name in the sidebar to review: every decision records who made it.", icon="👤")
elif denied := denied_reason(Permission.REVIEW):
    st.info(f"🔒 {escape_markdown(denied)} You can still read the queue.")


def flash_slot() -> None:
    """The outcome of the last action, in a slot that is there with or without a message: the
    elements after it keep their places, so a rerun never draws the rows into the toolbar's old
    place (with the old rows still in it until the run ends: a page 300 px taller for a moment)."""
    with st.empty():
        show_flash(FLASH)


def _requested() -> str | None:
    """The item the URL names when a session first looks at this queue (a link, a reload); after
    that the page follows the queue (the URL follows the page)."""
    shown = st.session_state.get(SHOWN)
    return st.query_params.get("item") if shown is None or shown[0] != choice else None


def _show_in_url(queue_id: int | None, item: object | None) -> None:
    """`/review?queue=…&item=…` for what is on screen, so the address is a link to it."""
    want = {"queue": str(queue_id)} if queue_id is not None else {}
    if item is not None:
        want["item"] = str(item)
    if dict(st.query_params) != want:
        st.query_params.from_dict(want)


def _skip_default(key: str) -> None:
    if reserver:
        with session_scope() as session:
            review_queue.skip_item(session=session, reviewer=reserver, key=key)
    else:
        st.session_state["review_skipped"] = [*st.session_state["review_skipped"], key]
    for name in ("review_current", "review_pending", SHOWN):
        st.session_state.pop(name, None)
    st.query_params.pop("item", None)


def _unskip_default() -> None:
    if reserver:
        with session_scope() as session:
            review_queue.bring_back_skipped(session=session, reviewer=reserver)
    st.session_state["review_skipped"] = []


@st.fragment
def default_queue(filters: QueueFilter) -> None:
    """The default queue's progress and current item; reviewing, skipping or undoing reruns only this."""
    current = _requested() or st.session_state.get("review_current")
    with session_scope(read_only=reserver is None) as session:
        progress = review_queue.queue_progress(session=session, filters=filters)
        try:
            item, notice = review_queue.current_item(
                session=session,
                reviewer=reserver,
                filters=filters,
                current=current,
                skipped=st.session_state["review_skipped"],
            )
        except ValueError:  # a link with a key that names no item
            item, notice = (
                review_queue.current_item(
                    session=session,
                    reviewer=reserver,
                    filters=filters,
                    skipped=st.session_state["review_skipped"],
                )[0],
                "That link names no item of this queue; here is the next one.",
            )
        skipped = (
            review_queue.skipped_items(session=session, reviewer=reserver)
            if reserver
            else st.session_state["review_skipped"]
        )
        workspace = review_queue.load_workspace(session=session, item=item) if item else None
        draft = (
            review_queue.draft_of(session=session, reviewer=reserver, key=item.key)
            if item and reserver
            else {}
        )
    if notice:
        st.info(escape_markdown(notice), icon="👥")

    if item is None or workspace is None:
        _show_in_url(None, None)
        st.session_state[SHOWN] = (DEFAULT_QUEUE, None)
        st.progress(progress.fraction, text=progress.label)
        flash_slot()
        st.session_state.pop("review_current", None)
        if skipped:
            st.info(f"Only skipped items are left ({len(skipped)}).")
            st.button("Bring skipped items back", key="review_unskip", on_click=_unskip_default)
        else:
            st.success("Nothing left to review with these filters.", icon="🎉")
        queue_toolbar(key=KEY, flash_key=FLASH)
        return
    if st.session_state.get("review_current") != item.key:
        st.session_state["review_selected"] = 0  # a new item starts at its largest gap
    st.session_state["review_current"] = item.key
    st.session_state[SHOWN] = (DEFAULT_QUEUE, item.key)
    _show_in_url(None, item.key)

    left, right = st.columns([4.4, 5.6], gap="medium")
    with left:
        item_view(workspace, key=KEY)
    with right:
        st.progress(progress.fraction, text=progress.label)
        flash_slot()
        if reserver:
            lease_status(queue_id=None, item_key=item.key, reviewer=reserver, key=KEY)
        metric_rows(workspace, key=KEY, flash_key=FLASH, target=Target(item_key=item.key), draft=draft)
        if skipped:
            st.caption(f"You skipped {len(skipped)} item(s); they come back when nothing else is left.")
        queue_toolbar(key=KEY, flash_key=FLASH, on_skip=lambda: _skip_default(item.key))


def _skip_team(queue_id: int, item_id: int) -> None:
    try:
        with session_scope() as session:
            queues.skip_item(session=session, queue_id=queue_id, item_id=item_id, reviewer=current_actor())
    except (queues.QueueError, queues.QueueNotFound, PermissionDenied) as exc:
        st.session_state[FLASH] = ("error", f"Not skipped: {exc}")
        return
    for name in ("review_pending", SHOWN, "review_target"):
        st.session_state.pop(name, None)
    st.query_params.pop("item", None)


def _unskip_team(queue_id: int) -> None:
    with session_scope() as session:
        queues.bring_back_skipped(session=session, queue_id=queue_id, reviewer=reserver or "")


def _next_item() -> None:
    st.session_state.pop(SHOWN, None)
    st.session_state.pop("review_target", None)
    st.query_params.pop("item", None)


@st.fragment
def team_queue(queue_id: int) -> None:
    """A team queue: the reviewer's reserved item (blind stage, or the judge's side and their
    labels), the queue's progress, their skipped items."""
    if reserver is None:
        st.info(
            "Only reviewers take items of a team queue. Its progress, its labels and what awaits a lead "
            "are on the Team queues page.",
            icon="👥",
        )
        link_to(
            "pages/queues.py", "Open the Team queues page", url_path="queues", query={"queue": str(queue_id)}
        )
        return
    requested = _requested()
    notice = None
    shown = st.session_state.get(SHOWN)
    try:
        with session_scope() as session:
            assignment = None
            if requested:
                try:
                    assignment = queues.open_assignment(
                        session=session, queue_id=queue_id, item_id=int(requested), reviewer=current_actor()
                    )
                except queues.ItemTaken as exc:
                    notice = f"{exc}."
                except (queues.QueueNotFound, ValueError):
                    notice = "That link names no item of this queue; here is your next item."
            if assignment is None:
                assignment = queues.next_assignment(
                    session=session, queue_id=queue_id, reviewer=current_actor()
                )
            if (
                shown is not None
                and shown[0] == queue_id
                and shown[1] is not None
                and (assignment is None or assignment.item_id != shown[1])
            ):
                lost = session.get(ReviewQueueItem, shown[1])
                row = (
                    reservations.find(session, queue_id=queue_id, item_key=lost.item_key, reviewer=reserver)
                    if lost
                    else None
                )
                if row is not None and row.status == reservations.EXPIRED:
                    notice = (
                        f"Your reservation of item {lost.position if lost else ''} ran out and another reviewer "
                        "took it; what you typed is kept with it. Here is your next item."
                    )
            progress = queues.queue_progress(session=session, queue_id=queue_id)
            skipped = queues.skipped_items(session=session, queue_id=queue_id, reviewer=reserver)
            blind = team_item = workspace = None
            if assignment is not None and assignment.stage == "blind":
                blind = queues.load_blind_item(
                    session=session, queue_id=queue_id, item_id=assignment.item_id, reviewer=current_actor()
                )
            elif assignment is not None:
                team_item = queues.load_item(
                    session=session, queue_id=queue_id, item_id=assignment.item_id, reviewer=current_actor()
                )
                workspace = review_queue.load_workspace(session=session, item=team_item.item)
    except PermissionDenied as exc:
        st.warning(escape_markdown(str(exc)), icon="🔒")
        return
    except (queues.QueueError, queues.QueueNotFound) as exc:
        st.info(escape_markdown(str(exc)), icon="👥")
        return
    if notice:
        st.info(escape_markdown(notice), icon="👥")
    label = (
        f"{progress.items_done:,} of {progress.items:,} items done by the team · "
        f"{progress.disputed:,} awaiting a lead"
    )
    if assignment is None:
        _show_in_url(queue_id, None)
        st.session_state[SHOWN] = (queue_id, None)
        st.progress(progress.fraction, text=label)
        flash_slot()
        if skipped:
            st.info(f"Only items you skipped are left for you ({len(skipped)}).")
            st.button(
                "Bring skipped items back", key="review_unskip", on_click=_unskip_team, args=(queue_id,)
            )
        else:
            st.success(
                "Nothing left for you in this queue: every item has the reviewers it needs, or you labelled it.",
                icon="🎉",
            )
        return
    st.session_state[SHOWN] = (queue_id, assignment.item_id)
    _show_in_url(queue_id, assignment.item_id)
    left, right = st.columns([4.4, 5.6], gap="medium")
    with left:
        if blind is not None:
            blind_item(blind, key=KEY)
        elif workspace is not None:
            item_view(workspace, key=KEY)
    with right:
        st.progress(progress.fraction, text=f"Item {assignment.position:,} of {assignment.items:,} · {label}")
        flash_slot()
        lease_status(queue_id=queue_id, item_key=assignment.item_key, reviewer=reserver, key=KEY)
        if blind is not None:
            blind_rows(blind, key=KEY, flash_key=FLASH, draft=assignment.draft)
        elif workspace is not None and team_item is not None:
            if assignment.stage == "done":
                st.caption(
                    "Every metric of this item has your label. You can change a label while the judgment "
                    "still waits for other reviewers."
                )
                st.button("Take my next item", key="review_take_next", on_click=_next_item, type="primary")
            target = Target(
                item_key=assignment.item_key,
                queue_id=queue_id,
                item_id=assignment.item_id,
                blind_first=assignment.blind,
            )
            metric_rows(
                workspace, key=KEY, flash_key=FLASH, target=target,
                own=own_labels(team_item.labels, team_item.states), draft=assignment.draft,
            )  # fmt: skip
        if skipped:
            st.caption(
                f"You skipped {len(skipped)} item(s) of this queue; they come back when nothing else is left."
            )
        queue_toolbar(
            key=KEY,
            flash_key=FLASH,
            on_skip=(lambda: _skip_team(queue_id, assignment.item_id))
            if assignment.stage != "done"
            else None,
            undo=False,
            walk=True,
            keys=blind_keys_help() if blind is not None else KEY_MAP,
        )


if choice == DEFAULT_QUEUE:
    filters = QueueFilter(
        product=None if st.session_state["review_product"] == ANY else st.session_state["review_product"],
        metric=None if st.session_state["review_metric"] == ANY else st.session_state["review_metric"],
        language=None if st.session_state["review_language"] == ANY else st.session_state["review_language"],
        order=st.session_state["review_order"],
    )
    default_queue(filters)
else:
    team_queue(choice)
