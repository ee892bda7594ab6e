"""Overrule's library: the work behind the pages, the CLI, the demo builder and the importer.

Calling convention: services take the database session as a keyword-only argument
(`f(*, session: Session, ...)`); the caller opens and closes it. The exceptions are the SPEC §5
functions whose positional form is public (tests and pipelines call them as the spec writes them),
which keep `session` first and positional:

- `lib.corrections.select_history(session, product, max_entries=20, correction_ratio=0.75, metric=None)`
- `lib.relevance.tag_relevance_with_evidence(session, note_id, tags)`; also `relevance_for_notes(session,
  note_ids, tags)`, which `lib.notes.relevant_notes` calls positionally as its `RelevanceHook`
- `lib.notes.add_note(session, language, note_type, content, phelps_code=None, confidence=None)`,
  `relevant_notes(session, language, limit=20)`, `search_notes(session, query, note_type, language)`,
  `remove_notes(session, note_type, language, older_than)`
- `lib.metrics.metrics_for_product(session, product)`, `products_with_rubrics(session)`,
  `upsert_metric_definitions(session, definitions)` ("the metric set of a product")
- `lib.coach.claim_turn(session, snapshot_id)`
- `lib.precedents.evaluate_interaction(session, interaction_id)` (seed 003's evaluateInteraction)

Each of these also accepts `session=` by keyword. Functions without a session (`verify_evidence`,
`ema_update`, `relevance_decision`, `format_notes_for_prompt`, `parse_evaluation_response`, ...)
take their arguments as SPEC §5 writes them.
"""
