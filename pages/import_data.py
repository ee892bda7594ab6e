"""Import: upload evaluations, judgment caches, notes, metric sets or interactions — the page twin of
`python -m lib import`. Imported interactions are auto-evaluated by precedent, with a progress bar."""

from pathlib import Path

import streamlit as st

from lib import importer
from lib.auth import Permission
from lib.claims import FOLDER_CLAIM, TempFolder
from lib.safe_markdown import escape_markdown
from lib.source_files import SourceOptions
from lib.source_records import LABEL_SCORE_STEPS
from lib.ui import get_engine, require_reviewer

DETECT = "Detect automatically"
MAX_UPLOAD_MB = st.get_option("server.maxUploadSize")

st.title("Import")
st.caption(
    "Add data in bulk: the same import as `python -m lib import FILE`. A bad file is refused whole "
    "with the line and field at fault, and nothing is written; importing a file twice never "
    "duplicates rows."
)
st.markdown(
    "- **evaluations** (JSONL, one per line): `question`, `model_answer`, `product` and "
    "`user_scores` and/or `judge_scores` are required; scores are checked against the product's "
    "metric scales.\n"
    '- **judgments**: the judgment cache (JSON: `{"cache_version": "1.0", "judgments": {…}}`), as the '
    "Corrections page downloads it.\n"
    "- **notes** (JSONL): `timestamp, language, note_type, content, code, confidence, session_id` "
    "(`code` and `confidence` for SUCCESS notes only).\n"
    "- **metrics** (JSON list): `{product, slug, display_name, min, max, description}` — import a "
    "product's metric set before its evaluations.\n"
    "- **interactions** (JSONL): `id` (optional), `product`, `language`, `question`, `answer`, "
    "`citation_url`, `created_at` (optional) and an optional `expert` object "
    "(`sentence_scores: [{sentence, score}]`, `citation_score`, `citation_url`, `reviewer`) that makes "
    "the line an expert-reviewed precedent. New unreviewed interactions are then auto-evaluated "
    "against the precedents (see the Precedents page).\n"
    "- **promptfoo** (the JSON or JSONL `promptfoo eval -o` writes), **langfuse** (traces and scores, "
    "v2 or v3 with score configs, or v4 observations; JSON Lines or an API page) and **phoenix** (span annotations or "
    "evaluations as Parquet or CSV, with the spans file): other tools' judge results, one judgment "
    "per evaluation name. See docs/importing.md."
)
st.caption(
    'Every field is described in docs/data.md, "Data in and out". '
    f"Uploads are limited to {MAX_UPLOAD_MB} MB; import larger files with "
    "`python -m lib import FILE` on the server."
)

upload = st.file_uploader("File to import", type=["jsonl", "json", "parquet", "csv"], key="import_file")
kind = st.selectbox("What the file holds", [DETECT, *importer.KINDS], key="import_kind")
spans_upload = None
product = ""
label_scores = ""
if kind in importer.SOURCE_KINDS:
    product = st.text_input(
        "Product (empty: promptfoo's description, which a .jsonl lacks, or a Langfuse trace's name, "
        "else the tool's name)",
        key="import_product",
    )
    label_scores = st.text_input(
        "Scores of labels sent without a number (optional), e.g. frustrated=1,ok=0",
        key="import_label_scores",
        help=f"A label named here takes the score given; {LABEL_SCORE_STEPS}.",
    )
    if kind == "phoenix":
        spans_upload = st.file_uploader(
            "Phoenix spans file (the spans dataframe as Parquet or CSV)",
            type=["parquet", "csv"],
            key="import_spans",
        )
reviewer = require_reviewer("import data", Permission.IMPORT)
clicked = st.button("Import", key="import_run", type="primary", disabled=upload is None or not reviewer)
if clicked and upload is not None and reviewer:
    # import_path names the file in its messages, so the copy keeps the uploaded name.
    # Removed at the end; one a killed server left is swept an hour later (lib.claims).
    with TempFolder("upload") as folder:
        # Only the base name, never "." or ".." (nor the folder's claim): the browser's file name is untrusted.
        name = Path(upload.name).name
        path = folder / (name if name not in ("", ".", "..", FOLDER_CLAIM) else "upload.jsonl")
        path.write_bytes(upload.getvalue())
        spans_path = None
        if spans_upload is not None:
            spans_name = Path(spans_upload.name).name
            spans_path = (
                folder / "spans" / (spans_name if spans_name not in ("", ".", "..") else "spans.parquet")
            )
            spans_path.parent.mkdir()
            spans_path.write_bytes(spans_upload.getvalue())
        progress_slot = st.empty()

        def show_progress(done: int, total: int) -> None:
            progress_slot.progress(done / total if total else 1.0, text=f"Auto-evaluating {done}/{total}")

        try:
            with st.spinner("Validating and importing…"):
                report = importer.import_path(
                    engine=get_engine(),
                    path=path,
                    kind=None if kind == DETECT else kind,
                    reviewer=reviewer,
                    progress=show_progress,
                    options=SourceOptions(
                        product=product or None,
                        spans=spans_path,
                        label_scores=label_scores or None,
                        via="page",
                    ),
                )
        except importer.ImportFailed as exc:
            st.error(f"The file was refused and nothing was written: {escape_markdown(str(exc))}", icon="🚫")
            if kind == DETECT and "the field for scores of labels" in str(exc):
                # That field shows once a kind is chosen (review18 L2: the advice named a hidden field).
                st.info(
                    'Choose the file\'s kind under "What the file holds" to show the field for scores of '
                    "labels sent without a number (and the Product field).",
                    icon="ℹ️",
                )
        else:
            st.success(escape_markdown(report.summary()), icon="✅")
