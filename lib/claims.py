"""Claims: the one rule that tells a dead process's leftovers from a live process's files.

What a process writes aside (an export's hidden `.NAME.<hex>.partial`, an API request's folder in
the temp dir) is left behind for ever when the process is killed before its cleanup runs (SIGKILL,
the OOM killer, a lost machine). So the writer first creates an empty claim file and keeps it
locked (`flock`, which the kernel releases however the process ends) until its files are gone, and
a sweep removes leftovers only when they and their claim are older than STALE_SECONDS **and** the
sweep can take the claim's lock. A live writer holds the lock however slowly it works, in another
thread or process; the age covers the instant between a claim's creation and its lock, and file
systems whose locks other hosts do not see.

Users: `lib.export._written_aside` (the partial beside an exported file) and `TempFolder` (the
`overrule-KIND-*` folders of API requests, streamed exports and the Import page's uploads).
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import re
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Iterable
from contextlib import suppress
from pathlib import Path
from time import monotonic
from types import TracebackType

log = logging.getLogger(__name__)

# How old a dead writer's leftovers must be before a sweep removes them.
STALE_SECONDS = 3600
# How often at most a process's `TempFolder`s sweep one temp dir: a sweep reads every entry of it
# (~50 ms CPU at 100,000 entries, which every request that made a folder paid), and a dead writer's
# leftovers wait STALE_SECONDS anyway, so they now go at most a minute later than they could.
SWEEP_INTERVAL_SECONDS = 60.0

# The temporary folders TempFolder makes: `overrule-KIND-` and mkdtemp's eight random characters.
# Only names of this shape are swept: a user's own `overrule-export-backup` folder is never touched.
# Also the Import page's folders of versions before TempFolder, `overrule_upload_` and mkdtemp's
# eight: they have no claim, so like the older versions' `overrule-KIND-` folders they go on age alone.
TEMP_KINDS = ("export", "api", "cache", "upload")
_TEMP_NAME = re.compile(rf"(?:overrule-(?:{'|'.join(TEMP_KINDS)})-|overrule_upload_)[a-z0-9_]{{8}}")
FOLDER_CLAIM = ".overrule.lock"


def hold(claim: Path) -> int:
    """Create `claim` (FileExistsError if it exists) and lock it; returns its descriptor, to close
    only once the claimed files are gone (remove them, the claim last, while still holding it)."""
    fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    # A file system whose flock fails: the writer goes on unlocked. A sweep cannot lock a claim
    # there either, so it never removes a leftover that has one (docs/data.md says so).
    with suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def sweep(claim: Path, remove: Callable[[], None], *, aged: Iterable[Path], stale_before: float) -> bool:
    """Call `remove` (which removes the leftovers, the claim among them) if every path of `aged`
    that exists was last changed before `stale_before` and no live writer holds `claim`; True if
    it did. No claim at all: an older version's leftover, removed on age alone. The claim is opened
    for writing: on NFS an exclusive lock (flock becomes a POSIX lock) needs it."""
    for path in aged:
        try:
            if path.stat().st_mtime > stale_before:
                return False  # written lately: maybe a live writer's
        except FileNotFoundError:
            pass
        except PermissionError:
            return False  # inside another user's private folder: theirs to sweep
    try:
        fd = os.open(claim, os.O_WRONLY)
    except FileNotFoundError:
        remove()
        return True
    except OSError:
        return False  # someone else's claim (another user's): theirs to sweep
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # held: a live writer (or a file system that cannot tell)
        remove()
        return True
    finally:
        os.close(fd)


class TempFolder:
    """A private folder `overrule-KIND-*` in the temp dir, claimed (`FOLDER_CLAIM` inside it) while
    this process uses it.

    Removed by `remove()` or at the end of a `with` block, and at the latest when the object is
    collected or the interpreter exits (a response whose sending failed, an abandoned generator).
    Making one first sweeps the folders that killed processes left (`sweep_temp_folders`, at most
    once per SWEEP_INTERVAL_SECONDS: `sweep_temp_folders_when_due`): the temp dir is shared, so no
    later request would ever look into a dead request's folder."""

    def __init__(self, kind: str) -> None:
        if kind not in TEMP_KINDS:
            raise ValueError(f"unknown temporary folder kind {kind!r}: {', '.join(TEMP_KINDS)}")
        sweep_temp_folders_when_due()
        self.path = Path(tempfile.mkdtemp(prefix=f"overrule-{kind}-"))
        try:
            fd = hold(self.path / FOLDER_CLAIM)
        except BaseException:
            shutil.rmtree(self.path, ignore_errors=True)
            raise
        self._remove = weakref.finalize(self, _remove_folder, self.path, fd)

    def remove(self) -> None:
        """Remove the folder and let its claim go; only the first call does anything."""
        self._remove()

    def __enter__(self) -> Path:
        return self.path

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()


def _remove_folder(path: Path, fd: int) -> None:
    """The claim goes with the folder while still locked, so no sweep takes a live folder's."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    finally:
        os.close(fd)


def sweep_temp_folders(root: Path | None = None) -> int:
    """Remove the `TempFolder`s that dead processes left in the temp dir (`root`); returns how many.
    Best effort: a sweep that fails leaves the folders and never fails the caller."""
    root = Path(tempfile.gettempdir()) if root is None else root
    stale_before = time.time() - STALE_SECONDS
    try:
        with os.scandir(root) as entries:
            names = [
                e.name for e in entries if _TEMP_NAME.fullmatch(e.name) and e.is_dir(follow_symlinks=False)
            ]
    except OSError:
        return 0
    removed = 0
    for name in names:
        folder = root / name
        remove = functools.partial(shutil.rmtree, folder, ignore_errors=True)
        try:
            removed += sweep(
                folder / FOLDER_CLAIM, remove, aged=(folder, folder / FOLDER_CLAIM), stale_before=stale_before
            )
        except OSError:
            log.warning("could not remove the leftover folder %s", folder, exc_info=True)
    return removed


_last_sweeps: dict[Path, float] = {}  # temp dir -> monotonic time of this process's last due sweep


def sweep_temp_folders_when_due(root: Path | None = None) -> int:
    """`sweep_temp_folders` if this process has not begun one of `root` in the last
    SWEEP_INTERVAL_SECONDS (else 0): what a request pays for the sweep is then one dictionary look-up,
    whatever the temp dir holds. No lock (nothing for a forked child to inherit held): two threads
    may both find a sweep due at the same instant, and sweeps beside each other are safe, as ever."""
    root = Path(tempfile.gettempdir()) if root is None else root
    now = monotonic()
    last = _last_sweeps.get(root)
    if last is not None and now - last < SWEEP_INTERVAL_SECONDS:
        return 0
    _last_sweeps[root] = now
    return sweep_temp_folders(root)
