"""CPU work of a request off the event loop: a bounded thread pool, and a render deadline.

Tokenizing a multi-megabyte prompt or rendering a heavy chat template takes seconds of CPU;
on the event loop that would stall every other request and `/health`. `CpuPool.run` runs such
work in a small thread pool (as vLLM's async tokenizer does), one per server, so at most
`workers` requests preprocess at once and the loop stays free (the fast tokenizer releases the
GIL; Python code yields it every few milliseconds). `render_deadline` bounds a template's
render time: template code (jinja compiles it to Python) is traced line by line in the
rendering thread only, and past the deadline the render raises `RenderTimeout`.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")
_TEMPLATE_FILE = "<template>"  # the file name jinja gives compiled templates


class RenderTimeout(Exception):
    """A chat template ran past its render deadline."""


class CpuPool:
    """A server's thread pool for tokenization and template rendering (threads start lazily).

    >>> import asyncio
    >>> pool = CpuPool(workers=1)
    >>> asyncio.run(pool.run(sum, [1, 2, 3]))
    6
    >>> pool.close()
    """

    def __init__(self, workers: int = 2):
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}.")
        self.workers = workers
        self._executor = ThreadPoolExecutor(max_workers=workers,
                                            thread_name_prefix="workbench-preprocess")

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` in the pool; the caller's loop goes on meanwhile."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Drops queued work; running work ends on its own (templates within their deadline)."""
        self._executor.shutdown(wait=False, cancel_futures=True)


@contextmanager
def render_deadline(seconds: float | None) -> Iterator[None]:
    """Raises `RenderTimeout` inside template code still running `seconds` from now (this
    thread only; other code is not traced)."""
    if seconds is None:
        yield
        return
    deadline = time.monotonic() + seconds
    lines = 0

    def in_template(frame: Any, event: str, arg: Any) -> Any:
        nonlocal lines
        if event == "line":
            lines += 1
            if lines % 512 == 0 and time.monotonic() > deadline:
                raise RenderTimeout(f"the chat template did not render within {seconds:g} s")
        return in_template

    def on_call(frame: Any, event: str, arg: Any) -> Any:
        return in_template if frame.f_code.co_filename == _TEMPLATE_FILE else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        yield
    finally:
        sys.settrace(previous)
