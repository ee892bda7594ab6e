"""Calls the lean worker tests (tests/test_duck.py) run in a lean worker: standard library only, since
a lean worker refuses numpy and pandas and a test module imports them (through SQLAlchemy, pandas)."""

from __future__ import annotations

import os
import time


class NotRebuilt(Exception):
    """An error that pickles in the worker but does not unpickle in the app: unpickling calls the
    class with its `args` alone, one argument where `__init__` wants two (TypeError)."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(what)
        self.why = why


def fail_not_rebuilt() -> None:
    """Raise an error the app cannot rebuild from its pickle."""
    raise NotRebuilt("lost", "its __init__ wants two arguments")


class NotRebuiltResult:
    """A result that pickles but does not unpickle (its state is refused on the way back)."""

    def __setstate__(self, state: object) -> None:
        raise ValueError("this result cannot be rebuilt")


def not_rebuilt_result() -> NotRebuiltResult:
    """Return a result the app cannot rebuild from its pickle."""
    result = NotRebuiltResult()
    result.x = 1  # type: ignore[attr-defined]  # a state to set: __setstate__ runs only then
    return result


def wait_for(path: str, timeout: float = 120.0) -> None:
    """Run until `path` exists (the test creates it): a busy call that ends when the test says, not
    after a time a loaded machine may overrun. TimeoutError after `timeout` s, so a failed test
    never leaves a worker waiting."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)  # the polling interval, not a wait for anything
