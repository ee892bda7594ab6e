"""How records are named and addressed on screen: evaluation titles and in-app links.

Every page that titles an evaluation or links to one goes through here, so an evaluation reads the
same everywhere (its question's first line, not "Evaluation snap_2026…") and every link honours
the same query parameters the target page reads (SPEC §4 deep links). Pure functions: no
streamlit, no database, so the CLI and the API could use them too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal
from urllib.parse import urlencode

from lib.models import NOTE_TYPES

TITLE_CHARS = 90
UNTITLED = "(no question text)"

# In-app URL paths (st.Page url_path in app.py). Links are relative ("evaluations?…", not
# "/evaluations?…") so they keep working when the app is served under a base path.
EVALUATIONS_PATH = "evaluations"
CORRECTIONS_PATH = "corrections"
NOTES_PATH = "notes"
COACH_PATH = "coach"
PRECEDENTS_PATH = "precedents"
ALIGNMENT_PATH = "alignment"

# Note types as every page and prompt shows them (seed 000's icons).
TYPE_ICONS: dict[str, str] = {
    "SUCCESS": "✅",
    "FAILURE": "❌",
    "PATTERN": "🔍",
    "STRATEGY": "💡",
    "TIP": "💭",
}
TYPE_LABELS: dict[str, str] = {kind: f"{TYPE_ICONS[kind]} {kind}" for kind in NOTE_TYPES}


def note_type_label(note_type: object) -> str:
    """A note type as every page shows it, icon and word ("💡 STRATEGY"): the icon alone says nothing
    to a newcomer, the word alone is slow to scan. Unknown types keep the generic note icon."""
    kind = str(note_type)
    return TYPE_LABELS.get(kind, f"📝 {kind}")


def evaluation_title(question: str | None, *, limit: int = TITLE_CHARS) -> str:
    """An evaluation's title: the question's first non-empty line, cut at a word near `limit` chars."""
    for line in str(question or "").splitlines():
        line = " ".join(line.split())  # tabs, non-breaking spaces and runs of blanks read as one space
        if line:
            break
    else:
        return UNTITLED
    return cut_at_word(line, limit)


def cut_at_word(text: str, limit: int) -> str:
    """`text` whole if it fits in `limit` characters, else cut at a word near `limit` with "…": a
    title, a logged message. Mid-word cuts read as typos (review14 F7: "or its label on")."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    space = cut.rfind(" ")
    if space > limit // 2:  # end on a whole word unless that would lose more than half the text
        cut = cut[:space]
    return cut.rstrip(" ,;:.-–—") + "…"


def one_line(text: str) -> str:
    """`text` on one line as written, but control characters (a newline, a terminal's escape
    sequences in a span name) shown escaped: a CLI cell, a log line nobody can forge a second line
    of. Quotes stay as they are, unlike repr's."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def page_url(path: str, params: Mapping[str, str] | None = None) -> str:
    """A relative in-app URL: `path` plus its query string (values URL-encoded, empty ones dropped)."""
    kept = {k: str(v) for k, v in (params or {}).items() if v not in (None, "")}
    return f"{path}?{urlencode(kept)}" if kept else path


def evaluation_url(snapshot_id: str) -> str:
    """The evaluation's detail view (`/evaluations?snapshot=<id>`)."""
    return page_url(EVALUATIONS_PATH, {"snapshot": snapshot_id})


def evaluations_list_url(params: Mapping[str, str] | None = None) -> str:
    """The Evaluations list filtered by `params` (names of `lib.inspector.to_params`)."""
    return page_url(EVALUATIONS_PATH, params)


def judgment_url(change_id: str) -> str:
    """One judgment's review form and audit trail on the Corrections page (`?change_id=`)."""
    return page_url(CORRECTIONS_PATH, {"change_id": change_id})


def coach_url(snapshot_id: str) -> str:
    """The coach chat on one evaluation (`/coach?snapshot=<id>`)."""
    return page_url(COACH_PATH, {"snapshot": snapshot_id})


def interaction_url(interaction_id: str) -> str:
    """One precedent interaction's trace on the Precedents page (`?interaction=<id>`)."""
    return page_url(PRECEDENTS_PATH, {"interaction": interaction_id})


# ---------------------------------------------------------------------------------------------
# Whose score (issue 25): one naming rule for every CSV, page and the API.
#
# An evaluation carries three verdicts on a metric: the evaluated user's score (stored with the
# evaluation, `user_scores` in the import format), the AI judge's score, and the reviewer's
# decision (a reviewer confirming or overruling the judgment in Overrule). A column or field is
# `<role>_<what>`: user_score, judge_score, judge_decision (a judgment's score or label),
# reviewer_decision, and the reasons user_reason, judge_reason, reviewer_reason. Pages say
# "User's score", "Judge's score", "Reviewer's decision". (The stored tables keep seed 004's
# column names: `decision` is the judge's, `user_decision` the reviewer's.)

Role = Literal["user", "judge", "reviewer"]
RoleWhat = Literal["score", "decision", "reason"]
ROLE_OWNERS: dict[str, str] = {"user": "User's", "judge": "Judge's", "reviewer": "Reviewer's"}
ROLE_HELP: dict[str, str] = {
    "user": "The evaluated user's score, stored with the evaluation",
    "judge": "The AI judge's score",
    "reviewer": "The reviewer's decision in Overrule: the judge's score confirmed or overruled; "
    "empty while unreviewed",
}
REVIEWED_BY = "reviewed_by"  # who made the reviewer's decision


def role_field(role: Role, what: RoleWhat) -> str:
    """The column / field name of a role's score, decision or reason: `reviewer_decision`."""
    return f"{role}_{what}"


def role_label(role: Role, what: RoleWhat) -> str:
    """What a page calls it: "User's score", "Judge's decision", "Reviewer's reason"."""
    return f"{ROLE_OWNERS[role]} {what}"


def metric_field(slug: str, field: str) -> str:
    """A wide CSV's column for one metric: `helpfulness user_score`, `helpfulness gap`."""
    return f"{slug} {field}"
