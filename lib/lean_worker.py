"""How worker processes start (`lib.isolated.WorkerPool`): without re-running the app's main script,
and for a lean worker (`lib.wide_scan.EXPORT_WORKERS`) without numpy and pandas.

A lean worker is a fresh interpreter started by `LeanExecutor` with `subprocess` and spoken to
over two pipes (a call, then its answer, pickled), not by `multiprocessing`: its spawn start needs
multiprocessing's resource tracker, a third interpreter beside the app and the worker (~7 MiB of
the export's summed PSS, issue 27) that only cleans up named semaphores, which these pipes do not
use.

Standard library only, on purpose: a new worker imports this module first (its loop and its
initializer live here), before anything brings in Arrow, so the refusal of numpy and pandas is in
place when Arrow asks for them.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import reduction, spawn
from multiprocessing.context import set_spawning_popen
from typing import IO, Any

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


# A message on a lean worker's pipes: its length, then the pickle. Framed, so that a call that
# cannot be unpickled (a module that fails to import) is answered as that call's error.
_FRAME = struct.Struct("!Q")
# What a lean worker runs first (standard library only): the app's sys.path from the first message,
# then this module's `serve`, which reads the initializer and then the calls.
_BOOT = (
    "import os, pickle, sys; "
    "calls, answers = os.fdopen(int(sys.argv[1]), 'rb'), os.fdopen(int(sys.argv[2]), 'wb'); "
    "sys.path[:] = pickle.loads(calls.read(int.from_bytes(calls.read(8), 'big'))); "
    "from lib.lean_worker import serve; serve(calls, answers)"
)


def _send(stream: IO[bytes], data: bytes) -> None:
    stream.write(_FRAME.pack(len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> bytes:
    """The next message; EOFError when the other end is gone (closed, or its process died)."""
    header = stream.read(_FRAME.size)
    if len(header) < _FRAME.size:
        raise EOFError("the pipe was closed")
    (size,) = _FRAME.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the pipe was closed")
    return data


class RemoteTraceback(Exception):
    """The traceback of a call's error in the worker, as its `__cause__` (as concurrent.futures does)."""

    def __str__(self) -> str:
        return str(self.args[0])


def _answer(call: bytes) -> bytes:
    """Run one pickled call; its pickled answer: (True, result) or (False, error, traceback text)."""
    try:
        func, args, kwargs = pickle.loads(call)  # noqa: S301 - from the app that started this process
        return pickle.dumps((True, func(*args, **kwargs)), pickle.HIGHEST_PROTOCOL)
    except BaseException as exc:  # the call's error is the caller's to raise
        trace = "".join(traceback.format_exception(exc))
        try:
            return pickle.dumps((False, exc, trace), pickle.HIGHEST_PROTOCOL)
        except Exception:  # an error that cannot be pickled: its text
            return pickle.dumps((False, RuntimeError(repr(exc)), trace), pickle.HIGHEST_PROTOCOL)


def serve(calls: IO[bytes], answers: IO[bytes]) -> None:
    """A lean worker's life: run its initializer, then each call in turn until the app closes its end
    of the pipe (the executor is shut down, or the app is gone)."""
    initializer, initargs = pickle.loads(_receive(calls))  # noqa: S301 - from the app, as above
    initializer(*initargs)
    while True:
        try:
            call = _receive(calls)
        except EOFError:
            return
        _send(answers, _answer(call))


class _Worker:
    """One lean worker process and the app's ends of its pipes."""

    def __init__(self, launch: bytes) -> None:
        call_r, call_w = os.pipe()
        answer_r, answer_w = os.pipe()
        try:
            command = [sys.executable, *subprocess._args_from_interpreter_flags(), "-c", _BOOT]  # type: ignore[attr-defined]
            self.process = subprocess.Popen(
                [*command, str(call_r), str(answer_w)], pass_fds=(call_r, answer_w), stdin=subprocess.DEVNULL
            )
        except BaseException:
            for fd in (call_r, call_w, answer_r, answer_w):
                os.close(fd)
            raise
        os.close(call_r)
        os.close(answer_w)
        self.calls = os.fdopen(call_w, "wb")
        self.answers = os.fdopen(answer_r, "rb")
        try:
            _send(self.calls, pickle.dumps(sys.path, pickle.HIGHEST_PROTOCOL))
            _send(self.calls, launch)
        except BaseException:  # it died at once (the caller sees a dead worker), or anything else: reap it
            self.close()
            raise

    def close(self) -> None:
        """Let the worker go (its pipe closed: it leaves its loop) and reap it."""
        for stream in (self.calls, self.answers):
            with contextlib.suppress(OSError):
                stream.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _settle(future: Future[Any], answer: bytes) -> None:
    """Settle a call's future with its worker's pickled answer (`_answer`): the result, or the
    call's error with the worker's traceback as its cause. An answer that does not unpickle here (an
    error class whose `__init__` wants more than its `args`, a class the app cannot import) fails
    the call with a RuntimeError that says so: it is never left pending. The worker is fine (the
    frame was read whole), so it takes the next call; ProcessPoolExecutor breaks on this instead."""
    try:
        ok, *rest = pickle.loads(answer)  # noqa: S301 - our own child's
    except BaseException as exc:  # whatever unpickling raised (it runs the classes' own code)
        unread = RuntimeError(f"the answer of a lean worker could not be unpickled in the app: {exc!r}")
        unread.__cause__ = exc
        future.set_exception(unread)
        return
    if ok:
        future.set_result(rest[0])
        return
    error, trace = rest
    error.__cause__ = RemoteTraceback(trace)
    future.set_exception(error)


# An item of `LeanExecutor`'s queue: the call's future and the pickled call; None stops a thread.
_Item = tuple[Future[Any], bytes] | None


class LeanExecutor:
    """The executor `lib.isolated.WorkerPool` uses for lean workers (`lib.wide_scan.EXPORT_WORKERS`):
    up to `max_workers` fresh interpreters, each started with `subprocess` on its first call and
    reused, spoken to over two pipes, one call at a time, by a thread of this process.

    It behaves as a `ProcessPoolExecutor` where `WorkerPool` relies on it: a worker is started only
    when none is idle; a queued call can be cancelled; a worker that dies (killed, crashed) fails
    its call with BrokenProcessPool and breaks the executor (every other worker is stopped, queued
    calls fail, `submit` raises), so the pool starts a new one; an answer the app cannot unpickle
    fails its call with a RuntimeError, and the worker goes on (`_settle`); `shutdown` cancels the queued calls,
    and `_processes` are the processes `WorkerPool.stop` kills. Without multiprocessing, no resource
    tracker is started (see the module's docstring)."""

    def __init__(self, max_workers: int, initializer: Callable[..., None], initargs: tuple[Any, ...]) -> None:
        self._max_workers = max_workers
        self._launch = pickle.dumps((initializer, initargs), pickle.HIGHEST_PROTOCOL)
        self._items: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # released by a thread waiting for a call
        self._lock = threading.Lock()
        self._threads = 0
        self._workers: set[_Worker] = set()
        self._broken: str | None = None
        self._shut_down = False

    @property
    def _processes(self) -> dict[int, subprocess.Popen[bytes]]:
        """The live worker processes by pid (as ProcessPoolExecutor's attribute of that name)."""
        with self._lock:
            return {worker.process.pid: worker.process for worker in self._workers}

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Queue `fn(*args, **kwargs)` for a worker; raises BrokenProcessPool once a worker died."""
        call = pickle.dumps((fn, args, kwargs), pickle.HIGHEST_PROTOCOL)  # fails here, not in a worker
        with self._lock:
            if self._broken is not None:
                raise BrokenProcessPool(self._broken)
            if self._shut_down:
                raise RuntimeError("cannot schedule new calls after shutdown")
            future: Future[Any] = Future()
            self._items.put((future, call))
            if not self._idle.acquire(blocking=False) and self._threads < self._max_workers:
                self._threads += 1
                threading.Thread(target=self._run, name="overrule-lean-worker", daemon=True).start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking calls; cancel the queued ones if `cancel_futures`; idle workers leave. A running
        call goes on (`WorkerPool.stop` kills its process). `wait` waits for nothing here."""
        with self._lock:
            self._shut_down = True
            threads = self._threads
        if cancel_futures:
            self._fail_queued(None)
        for _ in range(threads):
            self._items.put(None)

    def _fail_queued(self, error: str | None) -> None:
        """Cancel every queued call (`error` None), or fail it with BrokenProcessPool(error)."""
        while True:
            try:
                item = self._items.get_nowait()
            except queue.Empty:
                return
            if item is None:
                self._items.put(None)  # a thread's stop, not a call: kept for the thread
                return
            future = item[0]
            if error is None:
                future.cancel()
            elif future.set_running_or_notify_cancel():
                future.set_exception(BrokenProcessPool(error))

    def _break(self, error: str) -> None:
        """A worker died: as ProcessPoolExecutor, the executor is broken and its other workers stop.
        Every thread is told to leave, as `shutdown` does: an idle one waits for a call that will
        never come, and only it reaps its killed worker (`_run`'s `finally`); `WorkerPool` drops a
        broken executor without a `shutdown`, so nothing else would (a zombie, a thread and two
        pipes for each worker death while another worker was idle)."""
        with self._lock:
            if self._broken is None:  # the first death's error, not the EOF it caused in the others
                self._broken = error
            workers = list(self._workers)
            threads = self._threads
        self._fail_queued(error)
        for worker in workers:
            with contextlib.suppress(OSError):
                worker.process.kill()
        for _ in range(threads):
            self._items.put(None)

    def _run(self) -> None:
        """A thread's loop: take a call, hand it to this thread's worker (started on its first call),
        settle the call's future with the answer."""
        worker: _Worker | None = None
        try:
            while True:
                item = self._items.get()
                if item is None:
                    return
                future, call = item
                if not future.set_running_or_notify_cancel():
                    self._idle.release()
                    continue
                try:
                    if worker is None:
                        worker = _Worker(self._launch)
                        with self._lock:
                            self._workers.add(worker)
                    _send(worker.calls, call)
                    answer = _receive(worker.answers)
                except BaseException as exc:  # the call's future is settled whatever went wrong
                    # OSError, EOFError: the worker died, or was killed by WorkerPool.stop. Anything
                    # else leaves the worker and its pipes in a state nobody knows: broken the same.
                    died = "died" if isinstance(exc, (OSError, EOFError)) else "failed"
                    error = f"a lean worker process {died}: {exc!r}"
                    broken = BrokenProcessPool(error)
                    broken.__cause__ = exc
                    future.set_exception(broken)
                    self._break(error)
                    return
                # Idle before the caller hears back: a call it submits next finds this worker free
                # rather than starting a second one (an idle worker is ~30 MiB).
                self._idle.release()
                _settle(future, answer)
        finally:
            if worker is not None:
                with self._lock:
                    self._workers.discard(worker)
                worker.close()
