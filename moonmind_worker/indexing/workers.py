"""Chunking and embedding for `indexing.indexer.index_repository` on the machine's other cores.

Why processes: the indexer's CPU work is Python (tree-sitter glue, BM25 counting, payloads)
and engine calls that hold the GIL (Qdrant Edge's update and optimize), so threads take turns
instead of running side by side. Worker processes chunk files and turn batches of chunks into
points (embedding, BM25 vectors, payloads); the indexing process reads, decides, and writes.

Only the offline static model runs here: it is CPU work in this machine's cores. A hosted
embedder spends its time waiting on the network and keeps the in-process path (`Pool` then runs
every job at once, in this process), as does a run too small to pay for starting processes.
Workers die with the process that started them (SIGKILL included: PR_SET_PDEATHSIG), ignore
Ctrl-C (the indexing process decides what an interrupt means), and hold no store.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import weakref
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

from ..heap import BULK_GC_THRESHOLDS, give_back_heap, keep_large_blocks_out_of_the_heap

#: Changed-file text handed to one chunking job (characters), or this many files, whichever comes first.
GROUP_CHARS = 256_000
GROUP_FILES = 48
#: In auto mode, processes start once this much changed text (characters) was seen: a run smaller
#: than this finishes in about the time two workers take to start (imports, the model).
START_CHARS = 1_500_000
#: How often a wait for a job's result looks at whether a worker of its pool died (see `_unstick`).
DEATH_CHECK_S = 1.0


#: Pools of this process whose worker processes are running (see `Pool._stop`: the last to stop ends the resource tracker).
_running = 0
_running_lock = threading.Lock()


def done(value: Any) -> Future:
    """A job that ran already (the in-process path)."""
    f: Future = Future()
    f.set_result(value)
    return f


def worker_count(setting: int | None) -> int:
    """Worker processes for a run: the setting, or one per CPU when there are several (0: in-process)."""
    if setting is not None:
        return setting
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(cpus, 8) if cpus > 1 else 0


class Pool:
    """Chunking and point-building jobs, in worker processes or (see module doc) in this process.

    Jobs return futures; the caller keeps them in order and bounds how many are in flight
    (`files_in_flight` and `chars_in_flight`, `batches_in_flight`), so memory stays flat however
    large the repository and its files.
    """

    def __init__(self, embedder: Any, settings: Any) -> None:
        from ..embedding.static import StaticEmbedder

        self._embedder = embedder
        setting = settings.index_workers
        self._workers = worker_count(setting) if isinstance(embedder, StaticEmbedder) else 0
        self._start_at = 0 if setting else START_CHARS  # an explicit count starts at the first job
        self._seen = 0
        self._executor: ProcessPoolExecutor | None = None
        # pool jobs: what to run here if a worker dies, and the pool they went to
        self._jobs: dict[Future, tuple[Callable[..., Any], tuple, ProcessPoolExecutor]] = {}
        self._redone: weakref.WeakKeyDictionary[Future, Any] = weakref.WeakKeyDictionary()  # ... and what it gave
        self.group_chars, self.group_files = GROUP_CHARS, GROUP_FILES
        self.files_in_flight = max(self._workers, 1) * 2 * GROUP_FILES
        # and their text: a count of files alone lets a tree of large pages hold far too much of them
        self.chars_in_flight = max(self._workers, 1) * 4 * GROUP_CHARS
        self.batches_in_flight = max(self._workers, 1) + 1
        self.lost_a_worker = False  # a worker died and the run went on in this process (see `_give_up`)

    @property
    def parallel(self) -> bool:
        return self._executor is not None

    def _submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        if self._executor is None and self._workers and self._seen >= self._start_at:
            self._start()
        if self._executor is not None:
            try:
                with _may_start_processes():  # a submit may start a worker
                    job = self._executor.submit(fn, None, *args)
            except BrokenProcessPool:
                self._give_up()
            else:
                self._jobs[job] = (fn, args, self._executor)
                return job
        return done(fn(self._embedder, *args))

    def result(self, job: Future) -> Any:
        """A job's result; one a dead worker took with it is computed here instead (see `_give_up`).

        Asked once per file of a chunking job: a result computed here is kept for the job's other
        files (until the caller lets go of the job).
        """
        if job in self._redone:
            return self._redone[job]
        call = self._jobs.pop(job, None)
        try:
            while True:
                try:
                    return job.result(timeout=DEATH_CHECK_S)
                except FuturesTimeout:
                    if call is not None and _lost_a_worker(call[2]):
                        _unstick(call[2])
                        raise BrokenProcessPool("a worker died and its pool did not say so") from None
        except BrokenProcessPool:
            if call is not None and call[2] is self._executor:
                self._give_up()
            fn, args, _ = call  # type: ignore[misc]
            value = self._redone[job] = fn(self._embedder, *args)
            return value

    def rest(self) -> None:
        """Workers finish the jobs they were given (their results are kept) and exit; the next job starts them again.

        Why: while the store builds a segment in this process (`Store.room`), there is nothing for
        them to do, and their memory would sit beside the build's, the run's largest.
        """
        self._stop(cancel=False)

    def _give_up(self) -> None:
        """A worker died (killed, out of memory, or a script that re-runs itself in every new process
        because its entry point lacks `if __name__ == "__main__":`): the run goes on in this process."""
        executor, self._executor, self._workers = self._executor, None, 0
        self.lost_a_worker = True
        if executor is not None:  # not counted off `_running`: a broken pool's semaphores keep their tracker
            executor.shutdown(wait=False, cancel_futures=True)

    def _start(self) -> None:
        import multiprocessing

        global _running
        with _running_lock:
            _running += 1
        model = self._embedder
        self._executor = ProcessPoolExecutor(
            max_workers=self._workers,
            mp_context=multiprocessing.get_context("spawn"),  # never fork a process that holds the engine's threads
            initializer=_init,
            initargs=(str(model.model_dir), model.name, os.getpid()),
        )

    def expect(self, chars: int) -> None:
        """Text the run will chunk at least (files the store does not hold yet, by size on disk).

        Why: a run known to be that large starts its workers with its first job, so this process
        never loads the model, numpy and the tokenizer to chunk and embed the first `START_CHARS`
        itself (memory held the whole run long, and CPU on the cores the workers need).
        """
        if self._workers and chars >= self._start_at:
            self._start_at = 0

    def chunk(self, group: list[tuple[str, str]], chunk_chars: int, overlap_lines: int, redact: bool) -> Future:
        """Chunks of each (path, text), in order; `redact`: secrets replaced first (text.chunking.chunk_text)."""
        self._seen += sum(len(text) for _, text in group)
        return self._submit(_chunk_group, group, chunk_chars, overlap_lines, redact)

    def points(self, docs: list, *, repo: str, tenant: str) -> Future:
        """`payloads.build_points` of one batch (embedded as one batch, wherever it runs).

        The batch's payload template is validated here, where the contracts are loaded: a worker
        builds the points from it without them (`points.build`).
        """
        from .payloads import payload_template

        if not any(chunks for _, _, chunks in docs):
            return done([])
        template = payload_template(docs, repo=repo, tenant=tenant, model_version=self._embedder.name)
        return self._submit(_points, docs, template)

    def close(self) -> None:
        """Workers exit once their current job is done; jobs not started are dropped (an error or interrupt)."""
        self._stop(cancel=True)

    def _stop(self, cancel: bool) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            # not killed: a worker stopped mid-job leaves the pool's semaphores to the resource
            # tracker, which then warns on stderr under the "interrupted" line; a job is short, so waiting for it is cheap
            executor.shutdown(wait=True, cancel_futures=cancel)
            del executor  # its queues, and with them the semaphores the tracker watches
            global _running
            with _running_lock:
                _running -= 1
                if not _running:  # another run's pool in this process (a threaded host) still needs it
                    _stop_resource_tracker()


@contextmanager
def _may_start_processes() -> Iterator[None]:
    """Let a daemonic process, a Celery prefork pool's, start the workers.

    Why: multiprocessing refuses children to a daemonic process (AssertionError), because such a
    process is ended without waiting for its children, which would outlive it. Ours die with the
    process that started them, however it ends (`_die_with_parent`), so the refusal guards nothing
    here, and it failed every index task large enough to start workers on a plain
    `celery -A moonmind_worker.celery worker` (whose pool processes are daemonic).
    """
    import multiprocessing
    from multiprocessing.process import AuthenticationString  # type: ignore[attr-defined]

    config = getattr(multiprocessing.current_process(), "_config", {})  # private: the process's flags and key
    saved = {k: config[k] for k in ("daemon", "authkey") if k in config}
    if saved.get("daemon"):
        config["daemon"] = False
    if "authkey" in saved and not isinstance(saved["authkey"], AuthenticationString):
        # billiard's (Celery's) process object holds its key as its own type, which the standard
        # library's spawn cannot pickle to hand to the new process: the same bytes, as its type
        config["authkey"] = AuthenticationString(bytes(saved["authkey"]))
    try:
        yield
    finally:
        config.update(saved)


def _processes(executor: ProcessPoolExecutor) -> list:
    return list((getattr(executor, "_processes", None) or {}).values())  # private: the pool's worker processes


def _lost_a_worker(executor: ProcessPoolExecutor) -> bool:
    return any(not p.is_alive() for p in _processes(executor))


def _unstick(executor: ProcessPoolExecutor) -> None:
    """End a pool whose worker died while sending a result (CPython's pool then waits for good).

    Why: the pool's reader thread, half way through the dead worker's message, blocks reading
    the rest, so the pool never sees the death (no BrokenProcessPool) and its jobs never end; an
    index run then hung for good (a worker killed mid-run, about 1 run in 30). Its other workers
    are stopped, and this process's copy of the result pipe's write end is closed: with no
    writer left the read ends, and the pool's thread exits as for any broken pool.
    """
    for p in _processes(executor):
        p.kill()
    queue = getattr(executor, "_result_queue", None)  # private: the pipe its workers send results on
    writer = getattr(queue, "_writer", None)
    if writer is not None:
        writer.close()


def _stop_resource_tracker() -> None:
    """End the process multiprocessing started to clean up after the pool's semaphores (and its RSS).

    Why: it outlives the pool, through the run's last write and its optimize (the run's peak);
    with the pool gone it watches nothing (a later pool starts it again). Its stop is private API
    (Python 3.11.7+, 3.12+): where it is missing, the tracker just stays.
    """
    from multiprocessing import resource_tracker

    stop = getattr(resource_tracker._resource_tracker, "_stop", None)
    if stop is not None:
        stop()


# --- in the worker processes ------------------------------------------------

_model: Any = None


def _init(model_dir: str, name: str, parent: int) -> None:
    # Read by OpenBLAS when numpy loads (not yet: this module does not import it). One thread: the
    # workers already fill every core, and a product split over threads that each wait for the
    # others while those wait for a core spent ~9% of a Django run's CPU in OpenBLAS's sync loops
    # (BENCHMARKS.md). The command that started us chose one too (cli.main.one_thread_blas), so a
    # file's vector has the same bits here as there; a count the caller set is kept, and then
    # idle threads sleep soon instead of spinning ~2**28 cycles after every product.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "1")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent)
    _first_for_the_oom_killer()
    # Why one tokenizer thread: the workers already fill every core, so its thread pool only competes
    # with them, and each pool thread keeps its own malloc arena (memory); the ids are the same.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    keep_large_blocks_out_of_the_heap()
    gc.set_threshold(*BULK_GC_THRESHOLDS)  # a worker does bulk work only (heap.collect_rarely says why)
    from ..embedding.static import StaticEmbedder

    global _model
    _model = StaticEmbedder(Path(model_dir), name)


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel kills this process when its parent dies, however it dies."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)


def _first_for_the_oom_killer() -> None:
    """Linux: when memory runs out, the kernel kills this process before the indexing process.

    Why: a worker is the one process of a run whose loss costs only time (its jobs are done in the
    indexing process, `Pool.result`), while the kernel otherwise picks the largest, the indexing
    process, and the run dies. So a run in a container too small for its workers finishes, slower,
    instead of being killed, and a Celery worker beside it is not the kernel's choice either.
    Raising one's own score needs no privilege. Figures: BENCHMARKS.md ("the memory a run needs").
    """
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def _chunk_group(embedder: Any, group: list[tuple[str, str]], chunk_chars: int, overlap_lines: int, redact: bool) -> list:
    from ..text.chunking import chunk_text

    try:
        return [chunk_text(text, rel, chunk_chars, overlap_lines, redact=redact) for rel, text in group]
    finally:
        if embedder is None:
            give_back_heap()


def _points(embedder: Any, docs: list, template: dict) -> list:
    from .points import build

    try:
        return build(embedder if embedder is not None else _model, docs, template)
    finally:
        if embedder is None:
            give_back_heap()
