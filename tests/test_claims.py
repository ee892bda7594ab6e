"""lib.claims: temporary folders of API requests and streamed exports are removed whatever happens in
the process, and what a killed process left in the temp dir is swept, never a live process's folder
(review3 E2). The partial files beside an export, the rule's other user, are tested in test_export."""

from __future__ import annotations

import asyncio
import fcntl
import gc
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lib import claims
from lib.claims import FOLDER_CLAIM, TempFolder, sweep_temp_folders

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private temp dir for tempfile (and so for TempFolder and its sweep)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    yield tmp_path


def _folder(root: Path, name: str, *, claim: bool = True, age: float = 7200) -> Path:
    """A request's folder as a process left it (with a file in it, and its claim unless `claim` is
    False: an older version's), `age` s old."""
    folder = root / name
    folder.mkdir()
    made = [folder / "request.jsonl", *([folder / FOLDER_CLAIM] if claim else [])]
    for path in made:
        path.write_bytes(b"{}\n" if path.suffix == ".jsonl" else b"")
    then = time.time() - age
    for path in [*made, folder]:
        os.utime(path, (then, then))
    return folder


def _ours(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_making_a_folder_sweeps_dead_ones_and_keeps_fresh_live_and_foreign_ones(temp_dir: Path) -> None:
    """Before, a server killed mid-request left `overrule-export-*`/`overrule-api-*` for ever: no later
    request looks into another request's folder."""
    dead = [
        _folder(temp_dir, "overrule-export-dead0001"),
        _folder(temp_dir, "overrule-api-dead_002"),
        _folder(temp_dir, "overrule-api-oldver03", claim=False),  # an older version's: no claim
        _folder(temp_dir, "overrule_upload_k3_9xq2a", claim=False),  # an older Import page's (tempfile)
    ]
    kept = [
        _folder(temp_dir, "overrule-api-fresh001", age=60),  # maybe between mkdtemp and its claim
        _folder(temp_dir, "overrule_upload_fresh001", claim=False, age=60),  # maybe an older server's, live
        _folder(temp_dir, "overrule-export-backup"),  # not a name mkdtemp gave: a user's folder
        _folder(temp_dir, "overrule_upload_backup"),
        _folder(temp_dir, "overrule-other-abcdefgh"),  # no kind of ours
    ]
    (temp_dir / "overrule-api-afile001").write_bytes(b"a file, not a folder")
    live = _folder(temp_dir, "overrule-export-live0001")  # two hours old, but its request still runs
    holder = os.open(live / FOLDER_CLAIM, os.O_WRONLY)
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        with TempFolder("api") as folder:
            assert folder.parent == temp_dir and folder.name.startswith("overrule-api-")
            assert (folder / FOLDER_CLAIM).exists()
            assert _ours(temp_dir) == sorted(
                [folder.name, "overrule-api-afile001", live.name, *(p.name for p in kept)]
            )
    finally:
        os.close(holder)
    assert not any(p.exists() for p in dead)
    assert _ours(temp_dir) == sorted(["overrule-api-afile001", live.name, *(p.name for p in kept)])
    assert sweep_temp_folders() == 1  # the live one's request ended (its lock let go): now it goes
    assert not live.exists()


def test_making_folders_sweeps_the_temp_dir_at_most_once_a_minute(
    temp_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every folder made swept the whole temp dir (~50 ms CPU a request at 100,000 entries): now a
    process sweeps one temp dir at most once per SWEEP_INTERVAL_SECONDS, and a dead folder still goes
    at the first folder made after that."""
    clock = [1000.0]
    monkeypatch.setattr(claims, "monotonic", lambda: clock[0])
    first = _folder(temp_dir, "overrule-api-dead0001")
    with TempFolder("api"):
        pass
    assert not first.exists()
    second = _folder(temp_dir, "overrule-api-dead0002")
    clock[0] += claims.SWEEP_INTERVAL_SECONDS - 1
    with TempFolder("export"), TempFolder("upload"):  # not due: nothing read
        pass
    assert second.exists()
    clock[0] += 1
    with TempFolder("cache"):
        pass
    assert _ours(temp_dir) == []


def test_a_folder_is_removed_when_its_owner_is_dropped_or_remove_is_called_twice(temp_dir: Path) -> None:
    """A response whose sending failed, an abandoned generator: the folder goes with the object."""
    folder = TempFolder("export")
    path = folder.path
    (path / "x.csv").write_bytes(b"a")
    del folder
    gc.collect()
    assert not path.exists()
    again = TempFolder("cache")
    again.remove()
    again.remove()
    assert not again.path.exists()
    with pytest.raises(ValueError, match="unknown temporary folder kind"):
        TempFolder("uploads")


def test_a_killed_processs_folder_is_kept_while_it_runs_and_swept_once_it_is_dead(temp_dir: Path) -> None:
    """A real second process: the claim's lock, not the folder's age, tells a live request from a dead one."""
    child = subprocess.Popen(
        [sys.executable, "-c", f"""
import os, signal, sys, tempfile
tempfile.tempdir = {str(temp_dir)!r}
from lib.claims import TempFolder
folder = TempFolder("api")
(folder.path / "request.jsonl").write_bytes(b"half a body")
print(folder.path.name, flush=True)
sys.stdin.readline()
os.kill(os.getpid(), signal.SIGKILL)  # no cleanup: as under the OOM killer
"""],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        folder = temp_dir / child.stdout.readline().strip()
        assert folder.name.startswith("overrule-api-") and folder.is_dir()
        for path in [*folder.iterdir(), folder]:
            os.utime(path, (time.time() - 7200,) * 2)
        assert sweep_temp_folders() == 0
        assert folder.is_dir(), "a live request's folder is never swept"
    finally:
        assert child.stdin is not None
        child.stdin.write("\n")
        child.stdin.close()
        assert child.wait(timeout=60) == -signal.SIGKILL
    assert folder.is_dir()
    with TempFolder("export"):  # the next request that makes a folder sweeps the dead one
        pass
    assert _ours(temp_dir) == []


def test_another_users_private_folder_is_left_quietly(
    temp_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """In a /tmp shared with another user running Overrule, their 0700 folders cannot be looked
    into: theirs to sweep, with no warning on every request (the tests run as root, who may look
    anywhere, so the refusal is what the kernel answers another user)."""
    foreign = _folder(temp_dir, "overrule-api-foreign1")
    real_stat = Path.stat

    def stat(self: Path, *args: object, **kwargs: object) -> os.stat_result:
        if self.parent == foreign:
            raise PermissionError(13, "Permission denied", str(self))
        return real_stat(self, *args, **kwargs)

    monkeypatch.setattr(Path, "stat", stat)
    with caplog.at_level("WARNING"):
        assert sweep_temp_folders() == 0
    assert foreign.exists() and not caplog.records


def test_a_sweep_that_cannot_read_the_temp_dir_fails_nothing(tmp_path: Path) -> None:
    assert sweep_temp_folders(tmp_path / "missing") == 0


def test_the_folder_response_removes_its_folder_when_sending_fails(temp_dir: Path) -> None:
    """A background task is skipped when `send` raises (a client gone under an ASGI 2.4 server)."""
    from lib.api import _FolderFileResponse

    folder = TempFolder("export")
    out = folder.path / "x.csv"
    out.write_bytes(b"a,b\n")
    response = _FolderFileResponse(folder, out, media_type="text/csv", filename=out.name)

    async def receive() -> dict[str, object]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, object]) -> None:
        raise OSError("the client is gone")

    scope = {"type": "http", "method": "GET", "headers": [], "path": "/", "query_string": b""}
    with pytest.raises(OSError, match="the client is gone"):
        asyncio.run(response(scope, receive, send))
    assert not folder.path.exists()
