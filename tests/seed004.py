"""The seed-004 selection exactly as the seed writes it, over in-memory judgments.

The oracle that `lib.corrections.select_history` is checked against (tests/test_corrections.py) and
timed against (bench/bench_history.py). Deliberately not refactored: it is the seed's own code.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(slots=True)
class CachedJudgment:
    """What the seed's cache holds per judgment (the fields its selection reads)."""

    change_id: str
    product: str
    was_corrected: bool
    timestamp: datetime
    metric: str | None = None


def seed_get_history_for_prompt(
    judgments: dict[str, CachedJudgment], product: str, max_entries: int = 20, correction_ratio: float = 0.75
) -> list[CachedJudgment]:
    """Seed 004 "Detailed Algorithm", verbatim (self.judgments → judgments)."""
    product_judgments = [j for j in judgments.values() if j.product == product]
    corrected = [j for j in product_judgments if j.was_corrected]
    correct = [j for j in product_judgments if not j.was_corrected]
    corrected.sort(key=lambda j: j.timestamp, reverse=True)
    correct.sort(key=lambda j: j.timestamp, reverse=True)
    target_corrections = int(max_entries * correction_ratio)
    target_correct = max_entries - target_corrections
    actual_corrections = min(len(corrected), target_corrections)
    actual_correct = min(len(correct), target_correct)
    remaining_slots = max_entries - actual_corrections - actual_correct
    if remaining_slots > 0:
        if actual_corrections < target_corrections:
            extra_correct = min(remaining_slots, len(correct) - actual_correct)
            actual_correct += extra_correct
        else:
            extra_corrections = min(remaining_slots, len(corrected) - actual_corrections)
            actual_corrections += extra_corrections
    selected_corrections = corrected[:actual_corrections]
    selected_correct = correct[:actual_correct]
    result: list[CachedJudgment] = []
    corr_iter = iter(selected_corrections)
    correct_iter = iter(selected_correct)
    while len(result) < max_entries:
        try:  # noqa: SIM105
            result.append(next(corr_iter))
        except StopIteration:
            pass
        if len(result) < max_entries:
            try:  # noqa: SIM105
                result.append(next(correct_iter))
            except StopIteration:
                pass
        if len(result) == actual_corrections + actual_correct:
            break
    return result
