"""The model thread: one thread runs all of a process's model work (loading, engine steps).

torch's CPU build runs its parallel operators on OpenMP (libgomp), and every thread that runs
one keeps a team of worker threads for the rest of its life. Once the live teams' threads
outnumber the cores, libgomp stops spin-waiting between parallel regions, and every small
product of a decode step waits on a futex instead: on 2 cores a step ran at ~0.6x. A notebook's
`LLM` (driven from the kernel's main thread), the step loop of `serve_in_kernel` and the
bench's transformers side would each own a team; handing their model work to this one thread
keeps a single team live, whichever thread asks.

The thread flushes denormal floats to zero (FTZ/DAZ, `torch.set_flush_denormal`) before its
team exists, and the team's threads inherit it: a softmax over a vocabulary whose logits span
more than ~87 makes denormal terms, each a slow microcode assist (sampling 16 rows of SmolLM2's
49,152 logits: 1.7 ms with them, 0.3 ms flushed). Nothing a model computes is that small.

`on_model_thread(fn, *args)` runs `fn` there, with the caller's torch thread count (so
`torch.set_num_threads` in a notebook or a test still sets how many threads a step uses), and
returns (or raises) what it does; called from the model thread itself it runs at once.
`while_serving(fn)` lets the model thread wait on work that needs it. The
thread is a daemon: a process may exit while it idles. Never call it while holding a lock the
model work takes (the engine's `lock`).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import torch

T = TypeVar("T")

_Job = tuple[Callable[..., Any], tuple, dict, int, Future]

_jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()  # None: a wake-up
_thread: threading.Thread | None = None
_start_lock = threading.Lock()


def on_model_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)`, run on the model thread (see the module docstring)."""
    thread = _thread or _start()
    if threading.current_thread() is thread:
        return fn(*args, **kwargs)
    future: Future = Future()
    _jobs.put((fn, args, kwargs, torch.get_num_threads(), future))
    return future.result()


def jobs_waiting() -> bool:
    """Whether a job waits for the model thread (a run of steps hands it over then)."""
    return not _jobs.empty()


def model_thread() -> threading.Thread:
    """The thread itself (started on first use)."""
    return _thread or _start()


def _start() -> threading.Thread:
    global _thread
    with _start_lock:
        if _thread is None:
            _thread = threading.Thread(target=_serve, name="workbench-model", daemon=True)
            _thread.start()
    return _thread


def while_serving(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on a thread of its own while the model thread, the caller, goes on running
    jobs (an engine's steps) until it returns: for model work that waits on requests the model
    thread must step (the bench driving its own in-process server). Elsewhere: `fn(*args)`."""
    if threading.current_thread() is not _thread:
        return fn(*args)
    done: Future = Future()

    def target() -> None:
        try:
            done.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - raised again below
            done.set_exception(exc)
        _jobs.put(None)

    threading.Thread(target=target, name="workbench-while-serving", daemon=True).start()
    while not done.done():
        _run(_jobs.get())
    return done.result()


def _serve() -> None:
    torch.set_flush_denormal(True)  # this thread's; its OpenMP team, created later, inherits it
    while True:
        _run(_jobs.get())


def _run(job: _Job | None) -> None:
    if job is None:
        return
    fn, args, kwargs, threads, future = job
    try:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        future.set_result(fn(*args, **kwargs))
    except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
        future.set_exception(exc)
