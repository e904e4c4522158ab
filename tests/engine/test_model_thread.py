"""All model work runs on one thread, whoever asks (engine/model_thread.py): one OpenMP team."""

import asyncio
import threading
import time

import pytest
import torch

from tests.engine.helpers import make_llm
from workbench.engine.async_engine import AsyncLLMEngine
from workbench.engine.engine import EngineLock
from workbench.engine.model_thread import (
    jobs_waiting,
    model_thread,
    on_model_thread,
    while_serving,
)
from workbench.sampling_params import SamplingParams


def test_a_call_runs_there_and_returns_or_raises_what_the_function_does():
    assert on_model_thread(threading.current_thread) is model_thread()
    assert on_model_thread(lambda a, b=0: a + b, 2, b=3) == 5
    with pytest.raises(ZeroDivisionError):
        on_model_thread(lambda: 1 / 0)
    assert on_model_thread(threading.current_thread) is model_thread()  # still serving


def test_a_call_from_the_model_thread_itself_runs_at_once():
    assert on_model_thread(on_model_thread, threading.current_thread) is model_thread()


def test_the_model_thread_can_wait_on_work_that_needs_it():
    """Model work waiting on another thread that itself asks the model thread (the bench
    driving its own server) finishes instead of deadlocking; failures come back."""
    def waits() -> object:
        def helper() -> object:
            return on_model_thread(threading.current_thread)  # needs the model thread
        return while_serving(helper)

    assert on_model_thread(waits) is model_thread()
    with pytest.raises(ZeroDivisionError):
        on_model_thread(while_serving, lambda: on_model_thread(lambda: 1 / 0))
    assert while_serving(lambda: 7) == 7  # elsewhere: just a call
    assert on_model_thread(threading.current_thread) is model_thread()  # still serving


def test_the_callers_torch_thread_count_applies():
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            assert on_model_thread(torch.get_num_threads) == threads
    finally:
        torch.set_num_threads(before)


def test_denormals_are_flushed_on_every_thread_of_the_team():
    """A parallel product whose every result is denormal gives zeros in each thread's share
    (the model thread's workers inherit its FTZ/DAZ mode); this thread is left as it was."""
    tiny = torch.full((1 << 20,), 1e-30)  # 2**20 elements: split across the team

    def denormal_results() -> int:
        return int((tiny * 1e-10).count_nonzero())

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert on_model_thread(denormal_results) == 0
    finally:
        torch.set_num_threads(before)
    assert denormal_results() == tiny.numel()  # the caller's own mode is untouched


def test_llm_and_a_served_engine_step_on_the_model_thread(tiny_llama):
    """A notebook's `LLM` in the main thread and `serve_in_kernel`'s loop thread share one
    engine; each step ran on the model thread."""
    llm = make_llm(tiny_llama, max_model_len=256, block_size=4)
    engine = llm.llm_engine
    stepped_on: set[threading.Thread] = set()
    step = engine._step

    def recording_step():
        stepped_on.add(threading.current_thread())
        return step()

    engine._step = recording_step
    params = SamplingParams(max_tokens=4, temperature=0)
    llm.generate(["Once upon a time"], params)

    async def served() -> str:
        front = AsyncLLMEngine.from_llm(llm)
        try:
            async for out in front.generate("Once upon a time", params, "served-0"):
                last = out
            return last.outputs[0].text
        finally:
            front.shutdown()

    assert asyncio.run(served())
    assert stepped_on == {model_thread()}


def test_both_fronts_load_on_the_model_thread(monkeypatch, tiny_llama):
    import workbench.engine.async_engine as async_engine
    import workbench.llm as llm_module

    loaded_on = []

    class Recorder:
        def __init__(self, config, loaded):
            loaded_on.append(threading.current_thread())
            if loaded is None:
                raise RuntimeError("the model could not be loaded")

    monkeypatch.setattr(async_engine, "LLMEngine", Recorder)
    monkeypatch.setattr(llm_module, "LLMEngine", Recorder)
    monkeypatch.setattr(AsyncLLMEngine, "__init__", lambda self, engine: None)
    AsyncLLMEngine.from_config(None, tiny_llama)
    llm_module.LLM(tiny_llama)
    assert loaded_on == [model_thread(), model_thread()]
    with pytest.raises(RuntimeError, match="could not be loaded"):  # reaches the caller
        AsyncLLMEngine.from_config(None)


def test_a_run_of_steps_stays_on_the_model_thread_without_handing_back(tiny_llama):
    """`LLMEngine.steps`: one job on the model thread steps until the work is done; `more()`
    is asked after each step (there, too)."""
    engine = make_llm(tiny_llama).llm_engine
    finals, asked_on = [], set()
    engine.add_request("long", "Once upon a time", SamplingParams(max_tokens=12, temperature=0,
                                                                  ignore_eos=True),
                       on_output=lambda out: out.finished and finals.append(out))

    def more() -> bool:
        asked_on.add(threading.current_thread())
        return True

    engine.steps(more)  # returns once nothing is left: the request finished
    assert len(finals) == 1 and len(finals[0].outputs[0].token_ids) == 12
    assert asked_on == {model_thread()} and not engine.has_unfinished_requests()


def test_a_run_of_steps_hands_over_to_a_job_waiting_for_the_model_thread(tiny_llama):
    """Another thread's model work (a second engine, the bench's other side) waits one step,
    not the whole run."""
    engine = make_llm(tiny_llama).llm_engine
    engine.add_request("long", "Once upon a time", SamplingParams(max_tokens=40, temperature=0,
                                                                  ignore_eos=True))
    steps, ran_after = [], []
    other = threading.Thread(target=lambda: on_model_thread(lambda: ran_after.append(len(steps))))

    def more() -> bool:
        steps.append(1)
        if len(steps) == 3:  # another thread asks for the model thread now
            other.start()
            while not jobs_waiting():
                time.sleep(0.001)
        return True

    engine.steps(more)
    other.join()
    assert len(steps) == 3 and engine.has_unfinished_requests()  # the run gave way at once
    engine.steps(lambda: True)  # the rest, as the loop that called it would go on
    assert ran_after == [3] and not engine.has_unfinished_requests()


def test_the_engine_lock_counts_the_threads_waiting_for_it():
    """A run of steps returns when `lock.waiting`: an add or abort waits one step at most."""
    lock = EngineLock()
    acquired = threading.Event()

    def waiter() -> None:
        with lock:
            acquired.set()

    with lock:
        with lock:  # re-entrant, and the holder never counts as waiting
            assert lock.waiting == 0
        thread = threading.Thread(target=waiter)
        thread.start()
        deadline = time.monotonic() + 10
        while lock.waiting != 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert lock.waiting == 1 and not acquired.is_set()
    thread.join()
    assert acquired.is_set() and lock.waiting == 0
