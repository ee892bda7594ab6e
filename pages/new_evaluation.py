"""New evaluation: score an answer yourself, let the judge run Stage 1 and 2, and compare."""

from urllib.parse import quote

import streamlit as st

from lib import evaluation_form, judge
from lib.auth import Permission
from lib.metrics import metrics_for_product
from lib.safe_markdown import escape_markdown
from lib.ui import (
    current_actor,
    denied_reason,
    get_engine,
    llm_off_help,
    llm_unavailable_message,
    require_reviewer,
    session_scope,
)

RESULT_KEY = "new_result"


def _link(snapshot_id: str) -> str:
    """The shareable deep link to an evaluation's detail (SPEC §4)."""
    return f"/evaluations?snapshot={quote(snapshot_id, safe='')}"


def _show_result() -> None:
    """The outcome of the last run, kept across reruns until the next one."""
    result = st.session_state.get(RESULT_KEY)
    if not result:
        return
    kind, message, snapshot_id = result
    if kind == "saved":
        st.success(f"Saved as evaluation {escape_markdown(snapshot_id)}.", icon="✅")
        st.markdown(f"[Open the evaluation →]({_link(snapshot_id)})")
    elif kind == "duplicate":
        st.warning(escape_markdown(message), icon="♻️")
        st.markdown(f"[Open the existing evaluation →]({_link(snapshot_id)})")
    else:
        st.error(escape_markdown(message), icon="⚠️")


st.title("New evaluation")
st.caption(
    "Give a question, the model's answer and your own scores. The judge scores the answer blind, "
    "quoting its evidence (the judge's scores), then compares its scores with yours (mentor "
    "feedback). The evaluation is saved only when both steps succeed."
)

unavailable = llm_unavailable_message()
if unavailable:
    st.warning(unavailable, icon="🔌")

with session_scope(read_only=True) as session:
    products = evaluation_form.known_products(session=session)
    languages = evaluation_form.known_languages(session=session)

left, right = st.columns(2)
product = left.selectbox(
    "Product",
    products,
    index=0 if products else None,
    key="new_product",
    accept_new_options=True,
    placeholder="Pick a product or type a new one",
    help="The product's rubric decides the metrics and their scales; a new product uses the default set.",
)
language = right.selectbox(
    "Language", languages, index=languages.index("en"), key="new_language", accept_new_options=True
)
if not product or not product.strip():
    st.info("Pick a product, or type a new product name, to see its metrics.")
    st.stop()

with session_scope(read_only=True) as session:
    metrics = metrics_for_product(session=session, product=product.strip())
names = {m.slug: m.display_name for m in metrics}

with st.form("new_form"):
    question = st.text_area("Question", key="new_question", height=100)
    answer = st.text_area("Model answer", key="new_answer", height=220)
    cols = st.columns(2)
    model_name = cols[0].text_input("Model name", key="new_model_name", placeholder="e.g. mistral-nemo")
    category = cols[1].text_input("Category", key="new_category", placeholder="optional")
    cols = st.columns(2)
    primary = cols[0].selectbox(
        "Primary metric", list(names), format_func=names.get, key=f"new_primary_{product}"
    )
    bonus = cols[1].multiselect(
        "Bonus metrics", list(names), format_func=names.get, key=f"new_bonus_{product}"
    )

    st.subheader("Your scores")
    st.caption("Leave a metric empty to skip it. Each metric is scored on its own scale.")
    scores: dict[str, float | None] = {}
    reasons: dict[str, str] = {}
    for spec in metrics:
        low, high, step = evaluation_form.score_bounds(spec)
        score_col, reason_col = st.columns([1, 3])
        # Widget labels and tooltips render Markdown: a metric's name and rubric are data (issue 24).
        scores[spec.slug] = score_col.number_input(
            escape_markdown(f"{spec.display_name} ({spec.scale_label()})"),
            min_value=low,
            max_value=high,
            step=step,
            value=None,
            key=f"new_score_{product}_{spec.slug}",
            help=escape_markdown(spec.description) if spec.description else None,
        )
        reasons[spec.slug] = reason_col.text_input(
            escape_markdown(f"Why {spec.display_name}?"),
            key=f"new_reason_{product}_{spec.slug}",
            placeholder="your reason",
        )
    judge_denied = denied_reason(Permission.JUDGE) if current_actor() else None
    if judge_denied:
        st.caption(f"🔒 {escape_markdown(judge_denied)}")
    submitted = st.form_submit_button(
        "Run the judge",
        key="new_submit",
        type="primary",
        icon="⚖️",
        disabled=unavailable is not None or judge_denied is not None,
        help=llm_off_help("The judge") or judge_denied,
    )

if submitted:
    st.session_state.pop(RESULT_KEY, None)
    user_scores = evaluation_form.user_scores_from_form(metrics, scores, reasons)
    reviewer = require_reviewer("run the judge", Permission.JUDGE)
    if reviewer and not any(s["score"] is not None for s in user_scores.values()):
        st.error("Give at least one score: the judge compares its scores with yours.")
    elif reviewer:
        evaluation = judge.EvaluationInput(
            question=question,
            model_answer=answer,
            product=product.strip(),
            language=(language or "en").strip(),
            model_name=model_name.strip() or None,
            category=category.strip() or None,
            primary_metric=primary,
            bonus_metrics=tuple(bonus),
            user_scores=user_scores,
        )
        with st.status("Judging…", expanded=True) as status:
            try:
                snapshot_id = judge.judge_evaluation(
                    engine=get_engine(), evaluation=evaluation, reviewer=reviewer, progress=status.write
                )
            except judge.AlreadyJudged as exc:
                status.update(label="Already judged", state="error")
                st.session_state[RESULT_KEY] = ("duplicate", str(exc), exc.snapshot_id)
            except judge.JudgeFailed as exc:
                status.update(label="Judging failed", state="error")
                st.session_state[RESULT_KEY] = ("failed", str(exc), None)
            else:
                status.update(label="Judged and saved", state="complete", expanded=False)
                st.session_state[RESULT_KEY] = ("saved", "", snapshot_id)

_show_result()
