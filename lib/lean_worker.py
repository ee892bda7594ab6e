"""How worker processes start (`lib.isolated.WorkerPool`): without re-running the app's main script,
and for a lean worker (`lib.wide_scan.EXPORT_WORKERS`) without numpy and pandas.

Standard library only, on purpose: a new worker imports this module first (its process class and
its initializer live here), before anything brings in Arrow, so the refusal of numpy and pandas is
in place when Arrow asks for them.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from multiprocessing import popen_spawn_posix, reduction, spawn, util
from multiprocessing.context import BaseContext, SpawnContext, SpawnProcess, set_spawning_popen
from typing import Any

# What a lean worker never imports: Arrow imports numpy with itself and pandas (~30 MiB of private
# memory) the first time it converts Python values, only to ask whether they are pandas objects.
REFUSED = frozenset({"pandas", "numpy"})


class _Refused:
    """A finder that refuses `REFUSED`, ahead of the others."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> None:
        if name.partition(".")[0] in REFUSED:
            raise ModuleNotFoundError(f"{name} is not imported in a lean worker", name=name)


def init_lean_worker(app_pid: int) -> None:
    """`lib.isolated.init_worker` for a lean worker, after refusing `REFUSED`: Arrow and DuckDB then
    go on without them, as where they are not installed (~35 MiB less per worker). A process that
    has imported one already (not a fresh worker) is left as it is."""
    if not REFUSED & set(sys.modules):
        sys.meta_path.insert(0, _Refused)  # type: ignore[arg-type]
    from lib.isolated import init_worker  # imports Arrow: after the refusal

    _use_jemalloc()
    init_worker(app_pid, child_of_app=True)  # spawned by the app itself


def _use_jemalloc() -> None:
    """Arrow's jemalloc pool for this worker's Arrow allocations (the CSV kernels' buffers) instead
    of its default mimalloc, where the build has it: a wide export's peak is ~9 MiB lower (issue 27:
    101 -> 92 MiB private at 100k) at the same CPU; mimalloc keeps freed pages for reuse."""
    import pyarrow as pa

    with contextlib.suppress(NotImplementedError):  # a pyarrow built without jemalloc: its default
        pa.set_memory_pool(pa.jemalloc_memory_pool())


def preparation_data(name: str) -> dict[str, Any]:
    """multiprocessing's preparation data for a new worker without the main-module keys.

    multiprocessing re-imports `__main__` in a new worker; under Streamlit `__main__` is the page
    script being run, which would run again in the worker (and ask for a worker itself). The call's
    function is always imported by module name, so the main script is never needed."""
    prep_data = spawn.get_preparation_data(name)
    for key in ("init_main_from_name", "init_main_from_path"):
        prep_data.pop(key, None)
    return prep_data


def dump_launch(popen: Any, process_obj: Any) -> io.BytesIO:
    """What a new worker reads first: its preparation data (`preparation_data`) and the process."""
    buf = io.BytesIO()
    set_spawning_popen(popen)
    try:
        reduction.dump(preparation_data(process_obj._name), buf)
        reduction.dump(process_obj, buf)
    finally:
        set_spawning_popen(None)
    return buf


class _SpawnPopen(popen_spawn_posix.Popen):
    """Python's spawn start, with `preparation_data` (the main script is never re-run)."""

    def _launch(self, process_obj: Any) -> None:
        from multiprocessing import resource_tracker

        tracker_fd = resource_tracker.getfd()
        self._fds.append(tracker_fd)
        buf = dump_launch(self, process_obj)
        parent_r = child_w = child_r = parent_w = None
        try:
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            cmd = spawn.get_command_line(tracker_fd=tracker_fd, pipe_handle=child_r)
            self._fds.extend([child_r, child_w])
            self.pid = util.spawnv_passfds(spawn.get_executable(), cmd, self._fds)
            self.sentinel = parent_r
            with open(parent_w, "wb", closefd=False) as f:
                f.write(buf.getbuffer())
        finally:
            self.finalizer = util.Finalize(
                self, util.close_fds, [fd for fd in (parent_r, parent_w) if fd is not None]
            )
            for fd in (child_r, child_w):
                if fd is not None:
                    os.close(fd)


class _SpawnProcess(SpawnProcess):
    _Popen = staticmethod(_SpawnPopen)  # type: ignore[assignment]


class _SpawnContext(SpawnContext):
    Process = _SpawnProcess  # type: ignore[assignment]


def spawn_context() -> BaseContext:
    """Workers started as fresh interpreters that import only what their calls need."""
    return _SpawnContext()
