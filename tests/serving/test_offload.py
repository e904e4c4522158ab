"""`offload.py`: the preprocessing pool and the chat template's render deadline."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import pytest

from workbench.errors import ValidationError
from workbench.serving.chat_template import ChatRenderer
from workbench.serving.offload import CpuPool, RenderTimeout, render_deadline
from workbench.serving.protocol.chat import ChatMessageParam

HEAVY = "{% for i in range(9000) %}{% for j in range(9000) %}{% endfor %}{% endfor %}x"


def test_a_heavy_template_is_stopped_at_its_deadline(tiny_llama):
    renderer = ChatRenderer(tiny_llama.tokenizer, trust_request_chat_template=True)
    renderer.render_timeout = 0.3
    start = time.perf_counter()
    with pytest.raises(ValidationError) as info:
        renderer.render([ChatMessageParam(role="user", content="Hi")], chat_template=HEAVY)
    assert time.perf_counter() - start < 3  # unbounded, the loop runs for many seconds
    assert info.value.parameter == "chat_template"


def test_an_ordinary_render_is_unaffected_and_tracing_is_restored(tiny_llama):
    renderer = ChatRenderer(tiny_llama.tokenizer)
    before = sys.gettrace()
    rendered = renderer.render([ChatMessageParam(role="user", content="Hi")])
    assert "Hi" in rendered.prompt and sys.gettrace() is before


def test_the_deadline_only_stops_template_code():
    with render_deadline(0.0):
        sum(range(100_000))  # plain Python in the same thread: not traced, not stopped
    env = __import__("jinja2").Environment()
    with pytest.raises(RenderTimeout), render_deadline(0.0):
        env.from_string("{% for i in range(100000) %}{% endfor %}").render()


async def test_the_pool_runs_work_off_the_loop_thread():
    pool = CpuPool(workers=1)
    try:
        name = await pool.run(lambda: threading.current_thread().name)
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        await pool.run(time.sleep, 0.3)  # blocking work: the loop keeps ticking
        ticker.cancel()
    finally:
        pool.close()
    assert name.startswith("workbench-preprocess") and ticks >= 10
