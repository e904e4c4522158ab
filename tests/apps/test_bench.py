"""workbench.apps.bench (lives here with the models it loads): both sides of each measurement count
the same tokens, and the command prints its figures. No timing is asserted."""

import json

import pytest

from workbench.apps import bench
from workbench.models import tiny_model


@pytest.fixture(scope="module")
def tiny_side():
    """Contenders on two separate tiny llamas (our engine may patch the model it runs)."""
    from workbench import LLM

    return bench.Contenders(bench.BenchConfig.quick(), theirs=tiny_model("llama", seed=0),
                            ours=LLM(model=tiny_model("llama", seed=0)))


def test_hf_generate_makes_exactly_the_tokens_asked_for(tiny_side):
    prompts = tiny_side.prompt_ids(3)
    assert len({len(ids) for ids in prompts}) > 1  # left padding is exercised
    assert bench.hf_generate(tiny_side.theirs, prompts, 5, sample=True, seed=1) == 15
    assert bench.hf_generate(tiny_side.theirs, prompts[:1], 5, sample=False) == 5


def test_ours_generate_makes_exactly_the_tokens_asked_for(tiny_side):
    prompts = tiny_side.prompt_ids(3)
    assert bench.ours_generate(tiny_side.ours, prompts, 5, sample=True, seed=1) == 15
    assert bench.ours_generate(tiny_side.ours, prompts[:1], 5, sample=False) == 5


def test_both_sides_agree_on_greedy_tokens(tiny_side):
    import torch

    prompt = tiny_side.prompt_ids(1)[0]
    ours = tiny_side.ours.generate([{"prompt_token_ids": prompt}],
                                   bench_params(max_tokens=6))[0].outputs[0].token_ids
    ids = torch.tensor([prompt])
    theirs = tiny_side.theirs.model.generate(ids, max_new_tokens=6, min_new_tokens=6,
                                             do_sample=False)[0, len(prompt):].tolist()
    assert list(ours) == theirs


def bench_params(**kwargs):
    from workbench import SamplingParams

    return SamplingParams(temperature=0, ignore_eos=True, **kwargs)


def test_a_benchmark_reports_ours_theirs_and_the_ratio(tiny_side):
    figures = bench.bench_single_stream(tiny_side, bench.BenchConfig(tokens=4, repeats=1))
    assert set(figures) == {"single_stream_tok_s", "hf_single_stream_tok_s", "single_stream_ratio"}
    assert all(value > 0 for value in figures.values())


def test_the_concurrent_figures_are_named_after_the_count(tiny_side):
    figures = bench.bench_concurrent16(tiny_side, bench.BenchConfig(tokens=2, repeats=1,
                                                                    concurrency=3))
    assert set(figures) == {"concurrent3_tok_s", "hf_concurrent3_tok_s", "concurrent3_ratio"}


def test_the_static_cache_figures(tiny_side):
    """transformers with its static cache, in turn with ours; on a CPU it compiles nothing
    (transformers compiles its decode step by itself on a GPU only), and says so."""
    figures = bench.bench_hf_static(tiny_side, bench.BenchConfig(tokens=4, repeats=1))
    assert set(figures) == {"hf_static_single_stream_tok_s", "single_stream_static_ratio",
                            "hf_static_first_call_s", "hf_static_compiled"}
    assert figures["hf_static_single_stream_tok_s"] > 0 and figures["single_stream_static_ratio"] > 0
    assert figures["hf_static_compiled"] is False


def test_a_static_cache_generate_makes_exactly_the_tokens_asked_for(tiny_side):
    prompts = tiny_side.prompt_ids(2)
    assert bench.hf_generate(tiny_side.theirs, prompts, 5, sample=False,
                             cache_implementation="static") == 10


def _fake(side, config):
    return {"fake_tok_s": 12.5, "fake_ratio": 1.25}


def test_run_takes_given_contenders_and_hands_out_each_benchmarks_figures(tiny_side):
    seen = []
    sides = lambda side, config: {"same_side": side is tiny_side}
    results = bench.run(bench.BenchConfig.quick(), [_fake, sides], side=tiny_side,
                        figures=seen.append)
    assert seen == [{"fake_tok_s": 12.5, "fake_ratio": 1.25}, {"same_side": True}]
    assert results["same_side"] is True and results["peak_rss_mb"] > 0


def test_json_mode_prints_one_json_object_on_the_last_line(monkeypatch, capsys):
    monkeypatch.setattr(bench, "BENCHMARKS", (_fake,))
    assert bench.main(["--json", "--quick"]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["fake_tok_s"] == 12.5 and figures["peak_rss_mb"] > 0


def test_table_mode_prints_one_row_per_figure(monkeypatch, capsys):
    monkeypatch.setattr(bench, "BENCHMARKS", (_fake,))
    assert bench.main(["--quick"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert [row.split()[0] for row in rows] == ["fake_tok_s", "fake_ratio", "peak_rss_mb"]


def test_the_machine_figures_say_what_was_measured(tiny_side, monkeypatch):
    threads = []
    monkeypatch.setattr(bench, "memory_read_bandwidth",
                        lambda count: threads.append(count) or bench.ReadBandwidth(10.0, 9.0, 11.5))
    figures = bench.bench_machine(tiny_side, bench.BenchConfig.quick(threads=3))
    assert threads == [3]  # the bench's threads, as the engine's steps use them
    runner = tiny_side.ours.llm_engine.runner
    assert figures["kernel"] == runner.kernel.kernel and figures["dtype"] == "float32"
    assert figures["cpu_flags"] == runner.kernel.cpu_flags
    assert (figures["memory_read_gb_s"], figures["memory_read_gb_s_q1"],
            figures["memory_read_gb_s_q3"]) == (10.0, 9.0, 11.5)
    step_bytes = bench.decode_step_bytes(tiny_side.theirs.model)  # as loaded, not fused
    assert figures["single_stream_limit_tok_s"] == round(10.0e9 / step_bytes, 2)  # the median's


def test_decode_step_bytes_counts_a_tied_table_once_and_an_untied_input_table_not_at_all():
    tied = tiny_model("llama").model  # tied embeddings
    params = sum(p.numel() for p in tied.parameters())
    assert bench.decode_step_bytes(tied) == params * 4
    untied = tiny_model("mistral").model
    embed = untied.get_input_embeddings().weight.numel()
    assert bench.decode_step_bytes(untied) == (sum(p.numel() for p in untied.parameters())
                                               - embed) * 4


def test_decode_step_bytes_with_gguf_blocks_counts_the_blocks_and_the_head_once():
    """dtype="gguf": a weight with blocks reads its blocks; the tied head's blocks are read
    whole once, the embedding (whose blocks come back under its name too) one row a token."""
    from workbench.models.gguf_blocks import QuantizedWeight

    model = tiny_model("llama").model
    names = [n for n, p in model.named_parameters(remove_duplicate=False) if p.dim() == 2]
    quantized = {n: QuantizedWeight.quantize(model.get_parameter(n).detach(), "Q8_0")
                 for n in names}
    quantized["lm_head.weight"] = quantized["model.embed_tokens.weight"]
    floats = sum(p.numel() * 4 for n, p in model.named_parameters() if p.dim() == 1)
    blocks = sum(w.nbytes for n, w in quantized.items() if n != "model.embed_tokens.weight")
    assert bench.decode_step_bytes(model, quantized) == floats + blocks


def test_memory_read_bandwidth_is_a_positive_rate_within_its_quartiles():
    read = bench.memory_read_bandwidth(1, megabytes=8, passes=3)
    assert 0.1 < read.q1 <= read.median <= read.q3


def test_memory_read_bandwidth_is_the_median_of_the_timed_passes(monkeypatch):
    import torch

    durations = iter([0.004, 0.001, 0.002, 0.008, 0.016])  # rates 2**20 / d: 1, 4, 2, 1/2, 1/4
    timed_on = []

    def fake_seconds(run):
        timed_on.append(torch.get_num_threads())
        run()
        return next(durations)

    monkeypatch.setattr(bench, "seconds", fake_seconds)
    before = torch.get_num_threads()
    threads = 1 if before != 1 else 2
    read = bench.memory_read_bandwidth(threads, megabytes=1, passes=5)
    assert timed_on == [threads] * 5  # five passes timed (not the untimed first), on `threads`
    assert torch.get_num_threads() == before  # and the caller's count is back
    assert read.median == pytest.approx(2**20 / 0.004 / 1e9)
    assert (read.q1, read.q3) == (pytest.approx(2**20 / 0.008 / 1e9),
                                  pytest.approx(2**20 / 0.002 / 1e9))


def test_memory_read_bandwidth_needs_two_passes():
    with pytest.raises(ValueError, match="passes"):
        bench.memory_read_bandwidth(1, megabytes=1, passes=1)


def test_the_share_of_the_limit_is_reported(monkeypatch, capsys):
    monkeypatch.setattr(bench, "BENCHMARKS", (
        lambda side, config: {"single_stream_limit_tok_s": 40.0},
        lambda side, config: {"single_stream_tok_s": 30.0}))
    assert bench.main(["--json", "--quick"]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["single_stream_of_limit"] == 0.75


@pytest.mark.slow
def test_the_invariant_inside_and_features_figures_are_measured():
    config = bench.BenchConfig.quick(tokens=4, concurrency=4)
    side = bench.Contenders(config)
    figures = bench.run(config, [bench.bench_inside, bench.bench_invariant,
                                 bench.bench_features], side=side)
    for key in ("inside_capture_ratio", "inside_steer_ratio", "logprobs5_ratio",
                "token_stats_ratio", "invariant_single_ratio", "invariant_concurrent_ratio",
                "invariant_prefill_ratio", "features_concurrent_ratio", "features_prefill_ratio",
                "neuronpedia_topk_speedup", "neuronpedia_steer_speedup"):
        assert figures[key] > 0, key
    assert figures["invariant_single_tok_s"] > 0
    assert figures["features_d_sae"] == bench.FEATURES_D_SAE
    assert side.ours.saes == {}  # the bench's SAE unloaded after


def test_the_engine_peak_rss_is_measured_in_a_child(tiny_llama, tiny_llama_dir, monkeypatch):
    """Our engine alone, loaded from its directory and generating in a spawned interpreter:
    the bench's own process never builds it (its LLM would raise here), and its memory is not
    in the figure."""
    import torch

    import workbench


    def here(*args, **kwargs):
        raise AssertionError("built in the bench's own process")

    monkeypatch.setattr(workbench, "LLM", here)
    side = bench.Contenders(bench.BenchConfig.quick(), theirs=tiny_llama, ours=object())
    config = bench.BenchConfig.quick(model=str(tiny_llama_dir), concurrency=2, tokens=3)
    held = torch.ones(2**28)  # 1 GiB resident here: never the child's (ru_maxrss would be)
    figures = bench.bench_engine_memory(side, config)
    assert set(figures) == {"engine_peak_rss_mb"} and 50 < figures["engine_peak_rss_mb"] < 1024
    assert bench.own_peak_rss_mb() > 1024 + figures["engine_peak_rss_mb"] / 4 and held.sum() > 0


def test_the_prefill_figures_compare_ours_with_transformers_forward(tiny_side):
    figures = bench.bench_prefill512(tiny_side, bench.BenchConfig(tokens=2, repeats=1))
    assert set(figures) == {"prefill512_tok_s", "hf_prefill512_tok_s", "prefill512_ratio"}
    assert all(value > 0 for value in figures.values())
    assert len(bench.long_prompt(tiny_side)) == 512


def test_the_load_figures_come_from_a_child_per_side(tiny_llama_dir):
    config = bench.BenchConfig.quick(model=str(tiny_llama_dir), tokens=3)
    side = bench.Contenders(config)
    figures = bench.bench_load(side, config)
    assert "theirs" not in side.__dict__ and "ours" not in side.__dict__  # never loaded here
    assert figures["load_s"] > 0 and figures["hf_load_s"] > 0 and figures["load_time_ratio"] > 0
    assert figures["first_token_s"] >= figures["load_s"] and figures["first_token_time_ratio"] > 0
    assert figures["fresh_single_stream_tok_s"] > 0 and figures["hf_fresh_single_stream_tok_s"] > 0
    from workbench.models.devices import resolve_dtype

    size = 2 if str(resolve_dtype("auto", "cpu")) == "torch.bfloat16" else 4  # what auto picks
    count = sum(p.numel() for p in tiny_model("llama").model.parameters())  # tied: once
    assert figures["weights_mb"] == round(count * size / 2**20, 1)
    assert {"resident_over_weights", "peak_load_over_weights", "hf_resident_over_weights"} <= \
        set(figures)


def test_only_runs_the_benchmarks_named_and_refuses_unknown_names(monkeypatch, capsys):
    monkeypatch.setattr(bench, "BENCHMARKS", (_fake, bench.bench_machine))
    assert bench.main(["--json", "--quick", "--only", "_fake"]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(figures) == {"fake_tok_s", "fake_ratio", "peak_rss_mb"}
    with pytest.raises(SystemExit):
        bench.main(["--only", "nope"])
    assert "no benchmark named nope" in capsys.readouterr().err


def test_a_benchmark_that_needs_both_copies_is_skipped_saying_why(tiny_side, monkeypatch):
    monkeypatch.setattr(bench, "BOTH_IN_PROCESS", frozenset({_fake}))
    monkeypatch.setattr(bench.Contenders, "both_do_not_fit", lambda self: "too big")
    results = bench.run(bench.BenchConfig.quick(), [_fake], side=tiny_side)
    assert results["skipped"] == {"_fake": "too big"} and "fake_tok_s" not in results


def test_a_shape_is_an_alias_of_a_random_model_in_the_cache():
    from workbench.models import ALIASES, shapes

    assert {shapes.alias(name) for name in shapes.SHAPES} <= set(ALIASES)
    config = shapes.config_of("llama-1b")
    names = dict(shapes.parameters_of(config))
    assert sum(torch_numel(s) for s in names.values()) == 1_073_809_408  # 1.07B: the table once (tied), 16 layers
    assert "lm_head.weight" not in names


def torch_numel(shape) -> int:
    import math

    return math.prod(shape)


def test_the_stream_share_pairs_each_stream_with_a_read_at_the_same_moment(tiny_side,
                                                                           monkeypatch):
    reads = iter([10.0, 20.0, 40.0])
    monkeypatch.setattr(bench, "memory_read_bandwidth",
                        lambda threads, passes: bench.ReadBandwidth(next(reads), 0.0, 0.0))
    monkeypatch.setattr(bench, "tokens_per_second", lambda run: run() and 100.0)
    figures = bench.bench_stream_share(tiny_side, bench.BenchConfig(tokens=2, repeats=1))
    step = bench.decode_step_bytes(tiny_side.theirs.model)
    shares = [100.0 / (r * 1e9 / step) for r in (10.0, 20.0, 40.0)]
    assert figures["stream_share_of_limit"] == round(shares[1], 3)  # the median pair's
    assert (figures["stream_share_of_limit_min"], figures["stream_share_of_limit_max"]) == (
        round(shares[2], 3), round(shares[0], 3))
    assert figures["stream_share_reads_gb_s"] == [10.0, 20.0, 40.0]


def test_transformers_side_of_the_load_is_left_out_where_its_copy_cannot_fit(tiny_llama_dir,
                                                                            monkeypatch):
    """An 8B in float32 on 24 GB: transformers' copy (29.5 GB) cannot load, while ours keeps
    the checkpoint's bfloat16; `bench_load` measures ours alone and says why."""
    import psutil

    config = bench.BenchConfig.quick(model=str(tiny_llama_dir), dtype="float32")
    assert bench._theirs_do_not_fit(config) is None
    real = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real._replace(available=1000))
    reason = bench._theirs_do_not_fit(config)
    assert reason is not None and "float32 copy" in reason and "0.0 GB available" in reason


def test_our_runs_compute_their_prompts_as_transformers_does(tiny_side, monkeypatch):
    """Each of our timed runs starts with the prefix cache reset (transformers' `generate`
    keeps no cache between calls): no run is credited with a prefill it skipped."""
    engine = tiny_side.ours.llm_engine
    resets = []
    real = engine.reset_prefix_cache
    monkeypatch.setattr(engine, "reset_prefix_cache", lambda: resets.append(1) or real())
    config = bench.BenchConfig.quick()
    bench.compare("single_stream", tiny_side, config, tiny_side.prompt_ids(1), sample=False)
    assert len(resets) == 1 + config.repeats  # the warm-up and every timed run
