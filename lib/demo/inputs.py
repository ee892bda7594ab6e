"""The demo's inputs and shared helpers: `data/demo/*.json`, the fixed anchor, seeded random streams."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cache
from typing import Any

from lib.config import DATA_DIR
from lib.metrics import DEFAULT_METRICS

DEMO_DIR = DATA_DIR / "demo"
DEMO_SEED = 20261116
DEMO_AUTHOR = "demo"
DEFAULT_SLUGS = tuple(m.slug for m in DEFAULT_METRICS)


@cache
def _read_input(name: str) -> Any:
    """One demo input file, parsed once per process (the inputs never change at run time)."""
    return json.loads((DEMO_DIR / name).read_text(encoding="utf-8"))


def _inputs(name: str) -> Any:
    # A deep copy, so no caller can mutate the cached inputs.
    return json.loads(json.dumps(_read_input(name)))


def demo_anchor() -> datetime:
    """The fixed moment the demo's history ends (all demo times lie before it)."""
    return datetime.fromisoformat(_read_input("products.json")["anchor"])


def _rng(seed: int, stream: str) -> random.Random:
    """An independent random stream per part, so changing one part never reshuffles another."""
    return random.Random(f"{seed}:{stream}")


def _short_model(name: str) -> str:
    return name.rsplit("/", 1)[-1]


def _choose(rng: random.Random, options: Sequence[Any]) -> Any:
    return options[rng.randrange(len(options))]


def _weighted(rng: random.Random, models: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    return rng.choices(list(models), weights=[m["weight"] for m in models])[0]
