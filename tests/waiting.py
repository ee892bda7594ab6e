"""Waiting for work that another thread or process does (a background run, a server starting, a row
lock taken): poll its state until it holds, never sleep a fixed time and hope.

The bound only turns a hang into a failure with a message; it is no measure of speed, so it is
generous: a 2-core machine shared with other jobs can be many times slower than a quiet one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

WAIT_SECONDS = 180.0


def wait_until(condition: Callable[[], object], what: str, *, timeout: float = WAIT_SECONDS) -> None:
    """Return as soon as `condition()` is truthy; fail saying `what` was awaited after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting after {timeout:.0f} s for {what}")
        time.sleep(0.05)  # the polling interval, not a wait for anything
