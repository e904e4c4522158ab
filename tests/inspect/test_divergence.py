"""`DivergenceReport` and `Workbench.replay`: the comparison on constructed runs (identical, a
logprob-only difference, a token divergence that is a near-tie and one that is not), the
refusals, the views; then a replay on the tiny llama in the kernel and over HTTP, its batch
scenario seen sharing the engine's steps with the other requests by the real scheduler."""

from __future__ import annotations

import json

import pytest

from workbench.errors import ValidationError
from workbench.inspect import DivergenceReport
from workbench.inspect.divergence import RunTokens, Scenario, compare
from workbench.verbs.replay import other_bodies, replay_body

PROMPT = ("The quick brown fox jumps over the lazy dog, and then it runs far away into the "
          "deep green forest where")
MAX = 10


def run(ids, logprobs, margins=None, top=None) -> RunTokens:
    return RunTokens(tuple(ids), tuple(f"t{i}" for i in ids), tuple(logprobs),
                     tuple(top or ()), tuple(margins or [1.0] * len(ids)))


# -- the comparison ---------------------------------------------------------------------------
def test_the_same_bits_are_identical():
    a = run([1, 2, 3], [-0.5, -0.25, -1.0], top=[(("t1", -0.5), ("x", -2.0))] * 3)
    d = compare(a, run([1, 2, 3], [-0.5, -0.25, -1.0], top=[(("t1", -0.5), ("x", -2.0))] * 3))
    assert d.identical and d.verdict == "identical"
    assert (d.token_diverges_at, d.logprob_diverges_at, d.max_delta) == (None, None, 0.0)
    assert d.deltas == (0.0, 0.0, 0.0)


def test_logprobs_that_move_without_changing_a_token():
    a = run([1, 2, 3], [-0.5, -0.25, -1.0])
    d = compare(a, run([1, 2, 3], [-0.5, -0.25 + 2e-6, -1.0 - 5e-6]))
    assert not d.identical and d.verdict == "logprobs differ"
    assert (d.token_diverges_at, d.logprob_diverges_at) == (None, 1)
    assert d.max_delta == pytest.approx(5e-6)
    assert d.near_tie is None and d.margin is None


def test_an_alternative_that_moves_is_a_logprob_difference_too():
    a = run([1, 2], [-0.5, -0.25], top=[(("t1", -0.5), ("x", -2.0)), (("t2", -0.25),)])
    b = run([1, 2], [-0.5, -0.25], top=[(("t1", -0.5), ("x", -2.5)), (("t2", -0.25),)])
    d = compare(a, b)
    assert (d.logprob_diverges_at, d.max_delta) == (0, 0.5)


def test_a_token_divergence_at_a_near_tie():
    ref = run([1, 2, 3, 4], [-0.1, -0.2, -0.69, -0.3], margins=[3.0, 2.0, 0.004, 1.0])
    other = run([1, 2, 9, 4], [-0.1, -0.2 + 1e-6, -0.70, -0.3])
    d = compare(ref, other, "batch")
    assert (d.token_diverges_at, d.logprob_diverges_at) == (2, 1)
    assert d.deltas == pytest.approx((0.0, 1e-6))  # only the positions before it
    assert d.margin == 0.004 and d.near_tie and d.verdict == "tokens differ (near-tie)"
    assert (d.reference_token, d.token) == ("t3", "t9")


def test_a_margin_within_twice_the_noise_is_a_near_tie():
    ref = run([1, 2, 3], [-0.1, -0.2, -0.3], margins=[1.0, 1.0, 0.05])
    d = compare(ref, run([1, 2, 7], [-0.1, -0.23, -0.3]))  # noise 0.03 before: 2 x 0.03 > 0.05
    assert d.margin == 0.05 > d.tie and d.near_tie


def test_a_token_divergence_that_is_no_near_tie():
    ref = run([1, 2, 3], [-0.1, -0.2, -0.3], margins=[1.0, 1.0, 1.5])
    d = compare(ref, run([1, 2, 7], [-0.1, -0.2 - 1e-6, -0.3]))
    assert d.token_diverges_at == 2 and d.near_tie is False and d.verdict == "tokens differ"


def test_a_run_that_stops_earlier_diverges_where_it_stops():
    d = compare(run([1, 2, 3], [-0.1, -0.2, -0.3]), run([1, 2], [-0.1, -0.2]))
    assert (d.token_diverges_at, d.logprob_diverges_at, d.deltas) == (2, 2, (0.0, 0.0))


def test_the_margin_comes_from_token_stats_else_from_the_returned_top_two():
    top = [{"A": -0.1, "B": -2.6}, {"c": -0.4, "d": -0.5}]
    body = {"choices": [{"index": 0, "text": "Ac", "token_ids": [5, 6], "logprobs": {
        "tokens": ["A", "c"], "token_logprobs": [-0.1, -0.4], "top_logprobs": top}}]}
    tokens = RunTokens.of(body)
    assert tokens.token_ids == (5, 6) and tokens.tokens == ("A", "c")
    assert tokens.margins == pytest.approx((2.5, 0.1))
    stats = [{"entropy": 1.0, "rank": 1, "margin": 2.4375, "top_k_mass": 0.9}] * 2
    body["choices"][0]["logprobs"]["token_stats"] = stats
    assert RunTokens.of(body).margins == (2.4375, 2.4375)  # the engine's exact one


def test_a_chat_body_is_read_too():
    content = [{"token": "Hi", "logprob": -0.2, "top_logprobs": [
        {"token": "Hi", "logprob": -0.2}, {"token": "Yo", "logprob": -1.7}]}]
    body = {"object": "chat.completion", "choices": [{"index": 0, "message": {
        "role": "assistant", "content": "Hi"}, "token_ids": [42],
        "logprobs": {"content": content}}]}
    tokens = RunTokens.of(body)
    assert tokens.token_ids == (42,) and tokens.margins == pytest.approx((1.5,))


# -- what a replay sends, and what it refuses -------------------------------------------------
def test_the_comparison_forces_top_two_logprobs_ids_and_token_stats_where_ours():
    endpoint, body = replay_body({"prompt": "Hi", "temperature": 0, "logprobs": 1,
                                  "stream": True}, ours=True)
    assert endpoint == "completions" and "stream" not in body
    assert (body["logprobs"], body["return_token_ids"], body["token_stats"]) == (2, True, True)
    endpoint, body = replay_body({"messages": [{"role": "user", "content": "Hi"}], "seed": 1,
                                  "temperature": 0.7, "top_logprobs": 5, "token_stats": True},
                                 ours=False)
    assert endpoint == "chat" and "token_stats" not in body  # another server would drop it
    assert (body["logprobs"], body["top_logprobs"]) == (True, 5)


@pytest.mark.parametrize("fields", [{"temperature": 0.8}, {}])
def test_unseeded_sampling_is_refused_naming_temperature_and_seed(fields):
    with pytest.raises(ValidationError, match="temperature.*seed") as info:
        replay_body({"prompt": "Hi", **fields}, ours=True)
    assert info.value.parameter == "temperature"


def test_more_than_one_choice_is_refused():
    with pytest.raises(ValidationError, match="`n` must be 1"):
        replay_body({"prompt": "Hi", "temperature": 0, "n": 2}, ours=True)


def test_the_other_requests_differ_in_prompt_and_length_and_outlast_the_reference():
    bodies = other_bodies("completions", {"prompt": "Hi", "max_tokens": 8}, 10)
    assert len({b["prompt"] for b in bodies}) == 10 and len({len(b["prompt"]) for b in bodies}) > 5
    assert all(b["max_tokens"] > 2 * 8 and b["ignore_eos"] and b["temperature"] == 0
               for b in bodies)
    chat = other_bodies("chat", {"messages": []}, ["one", "two"])
    assert [b["messages"][0]["content"] for b in chat] == ["one", "two"]
    with pytest.raises(ValidationError, match="others must be at least 1"):
        other_bodies("completions", {}, 0)


# -- the views --------------------------------------------------------------------------------
def _report() -> DivergenceReport:
    ref = Scenario("alone", run([1, 2, 3], [-0.1, -0.2, -0.3], margins=[1.0, 0.004, 1.0]),
                   "abc", 0, 0, 1)
    batch = Scenario("batch", run([1, 5, 6], [-0.1 + 1e-7, -0.21, -0.3]), "aef", 0, 3, 8, 7)
    return DivergenceReport(ref, [batch, Scenario("warm", ref.tokens, "abc", 16, 0, 1)],
                            where="in-kernel engine")


def test_the_report_reads_as_a_repr_a_frame_and_data():
    report = _report()
    assert not report.identical and report["warm"].identical
    assert repr(report) == ("DivergenceReport(3 tokens vs alone; batch: tokens differ (near-tie) "
                            "at 1, warm: identical)")
    df = report.to_frame()
    assert list(df["scenario"]) == ["alone", "batch", "warm"]
    assert list(df["token_diverges_at"].astype(object).fillna(-1)) == [-1, 1, -1]
    assert list(df["num_shared_steps"]) == [0, 3, 0]
    assert list(report.deltas_frame()["scenario"]) == ["batch", "warm", "warm", "warm"]
    json.dumps(report.to_dict())
    with pytest.raises(KeyError, match="no scenario 'cold'"):
        report["cold"]


def test_the_html_is_deterministic_and_themed():
    html = _report()._repr_html_()
    assert html == _report()._repr_html_() and 'id="wb-divergence-' in html
    assert "tokens differ (near-tie)" in html and "3 (up to 8 requests)" in html
    assert "body[data-jp-theme-light='false']" in html  # the dark theme's rules


def test_the_plot_is_log_scaled_with_the_token_divergence_marked():
    import matplotlib

    matplotlib.use("Agg")
    ax = _report().plot()
    assert ax.get_yscale() == "log"
    assert len(ax.lines) == 4  # two scenarios' |Δ|, batch's divergence, the bit-equal floor


# -- end to end -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llm(tiny_llama):
    from workbench import LLM

    return LLM(tiny_llama, max_model_len=128, block_size=16, num_kv_blocks=64, seed=0)


@pytest.fixture
def steps(llm):
    """Every step the real scheduler makes: per request it ran, (prompt, cache salt)."""
    scheduler = llm.llm_engine.scheduler
    real, seen = scheduler.schedule, []

    def spy():
        out = real()
        if out.scheduled:
            requests = {id(s.seq.request): s.seq.request for s in out.scheduled}
            seen.append([(tuple(r.prompt_token_ids), r.cache_salt) for r in requests.values()])
        return out

    scheduler.schedule = spy
    yield seen
    del scheduler.schedule


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_replay_runs_alone_batched_and_warm(request, llm, steps, where):
    wb = request.getfixturevalue(where)
    result = wb.completions(PROMPT, max_tokens=MAX, temperature=0, return_token_ids=True)
    steps.clear()
    report = wb.replay(result, others=5)
    assert [s.name for s in (report.reference, *report.scenarios)] == ["alone", "batch", "warm"]
    assert report.request["token_stats"] and report.request["logprobs"] == 2  # ours: exact
    ref = report.reference.tokens
    assert list(ref.token_ids) == result.response["choices"][0]["token_ids"]
    assert len(ref) == MAX and all(m is not None for m in ref.margins)
    prompt = tuple(result.response["choices"][0]["prompt_token_ids"])
    salts = {salt for step in steps for p, salt in step if p == prompt}
    assert len(salts) == 2  # the reference and the warm run share one; the batch has its own
    batched = next(s for s in salts if s.endswith("-batch"))
    solo = [step for step in steps if any(p == prompt and s != batched for p, s in step)]
    assert len(solo) == 2 * MAX and all(len(step) == 1 for step in solo)  # nothing beside them
    shared = [step for step in steps if (prompt, batched) in step and len(step) > 1]
    assert shared and max(len(step) for step in shared) == 6  # with all 5 others at once
    batch, warm = report.scenarios
    assert batch.others == 5 and warm.others == 0
    if where == "local":  # the engine's own counts reach the report in the kernel
        assert (batch.num_shared_steps, batch.max_step_requests) == (len(shared), 6)
        assert report.reference.num_shared_steps == warm.num_shared_steps == 0
        assert report.reference.num_cached_tokens == 0 and warm.num_cached_tokens == 16
        assert batch.num_cached_tokens == 0  # a cache of its own: only batching differs
    assert report["warm"].token_diverges_at is None or report["warm"].near_tie is not None


def test_local_and_remote_replays_agree_on_the_reference(local, remote):
    body = {"prompt": PROMPT, "max_tokens": MAX, "temperature": 0}
    a, b = local.replay(**body, others=2), remote.replay(**body, others=2)
    assert a.reference.tokens.token_ids == b.reference.tokens.token_ids
    assert a.reference.tokens.logprobs == b.reference.tokens.logprobs


def test_a_chat_result_replays_with_its_seed(local):
    result = local.chat([{"role": "user", "content": "Say something."}], max_tokens=6,
                        temperature=0.9, seed=7)
    report = local.replay(result, others=2)
    assert report.request["top_logprobs"] == 2 and report.request["seed"] == 7
    assert len(report.reference.tokens) == len(report.scenarios[0].tokens) == 6


def test_an_unseeded_sampled_result_is_refused(local):
    result = local.completions(PROMPT, max_tokens=2, temperature=1.0)
    with pytest.raises(ValidationError, match="temperature"):
        local.replay(result)


def test_the_batch_sends_the_others_before_the_reference(local, monkeypatch):
    backend, sent = local._backend, []
    real = backend.generate_many

    def recording(endpoint, bodies):
        sent.append(bodies)
        return real(endpoint, bodies)

    monkeypatch.setattr(backend, "generate_many", recording)
    report = local.replay(prompt=PROMPT, max_tokens=4, temperature=0, others=3)
    (bodies,) = sent
    assert [b.get("prompt") == PROMPT for b in bodies] == [False, False, False, True]
    assert bodies[-1]["cache_salt"].endswith("-batch")  # arriving last, into a running batch
    batch = report.scenarios[0]
    assert (batch.name, batch.others, len(batch.tokens)) == ("batch", 3, 4)  # the last one's
