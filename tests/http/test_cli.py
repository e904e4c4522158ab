"""`workbench serve` / `workbench bench` argument handling (no server is started)."""

from __future__ import annotations

import pytest

from workbench.apps import cli


def run_serve(monkeypatch, *argv):
    captured = {}

    def fake_run_server(engine_config, server_config, host, port):
        captured.update(engine=engine_config, server=server_config, host=host, port=port)

    monkeypatch.setattr("workbench.http.server.run_server", fake_run_server)
    assert cli.main(["serve", *argv]) == 0
    return captured


def test_defaults_serve_the_default_model(monkeypatch):
    got = run_serve(monkeypatch)
    assert got["engine"].model == "smollm2-135m-instruct"
    assert got["server"].served_model_names == ("smollm2-135m-instruct",)
    assert (got["host"], got["port"]) == ("127.0.0.1", 8000)


def test_flags_reach_the_configs(monkeypatch, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    got = run_serve(monkeypatch, "--served-model-name", "a", "b", "--max-model-len", "256",
                    "--dtype", "float32", "--seed", "3", "--api-key", "k", "--max-logprobs", "5",
                    "--chat-template", str(template), "--trust-request-chat-template",
                    "--return-tokens-as-token-ids", "--enable-log-requests",
                    "--max-num-seqs", "8", "--port", "9000")
    engine, server = got["engine"], got["server"]
    assert (engine.max_model_len, engine.dtype, engine.seed, engine.max_logprobs,
            engine.max_num_seqs, engine.served_model_name) == (256, "float32", 3, 5, 8, "a")
    assert server.served_model_names == ("a", "b") and server.api_keys == ("k",)
    assert server.chat_template.startswith("{% for m")
    assert server.trust_request_chat_template and server.return_tokens_as_token_ids
    assert server.enable_log_requests and got["port"] == 9000


def test_tool_and_reasoning_parser_flags_reach_the_server_config(monkeypatch):
    got = run_serve(monkeypatch, "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                    "--reasoning-parser", "deepseek_r1")
    server = got["server"]
    assert (server.enable_auto_tool_choice, server.tool_call_parser, server.reasoning_parser) \
        == (True, "hermes", "deepseek_r1")


def test_a_model_directory_is_served_under_its_name(monkeypatch, tmp_path):
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"model_type": "llama"}')
    got = run_serve(monkeypatch, "--model", str(model_dir))
    assert got["server"].served_model_names == ("my-model",)


@pytest.mark.parametrize("flags, message", [
    (["--tool-call-parser", "nope"], "invalid tool call parser: nope (chose from { granite,"),
    (["--enable-auto-tool-choice"], "--enable-auto-tool-choice requires --tool-call-parser"),
    (["--reasoning-parser", "nope"], "invalid reasoning parser: nope (chose from { deepseek_r1"),
    (["--lora-modules", "a=b"], "--lora-modules need(s) --enable-lora"),
    (["--enable-lora", "--lora-modules", "nonsense"], "Invalid --lora-modules entry 'nonsense'"),
    (["--enable-lora", "--lora-resolver-dir", "/no/such/dir"], "not a directory"),
    (["--chat-template", "missing.jinja"], "looks like a file path, but it failed to be opened"),
])
def test_unbuilt_features_and_bad_flags_stop_at_start_up(monkeypatch, capsys, flags, message):
    monkeypatch.setattr("workbench.http.server.run_server", lambda *a, **k: pytest.fail("ran"))
    with pytest.raises(SystemExit) as info:
        cli.main(["serve", *flags])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_inline_chat_template_is_checked():
    assert cli.read_chat_template("{{ messages }}") == "{{ messages }}"
    with pytest.raises(ValueError, match="not valid jinja"):
        cli.read_chat_template("{% for %}")


def test_bench_delegates_its_arguments(monkeypatch):
    seen = {}
    monkeypatch.setattr("workbench.apps.bench.main", lambda argv: seen.setdefault("argv", argv) and 0)
    assert cli.main(["bench", "--json", "--quick"]) == 0
    assert seen["argv"] == ["--json", "--quick"]


def test_a_model_the_engine_refuses_stops_the_server_at_start_up(tmp_path, capsys):
    """A family the engine cannot run exactly: exit 2 with the refusal, no traceback."""
    from transformers import AutoConfig

    AutoConfig.for_model("gpt_neo").save_pretrained(tmp_path)
    with pytest.raises(SystemExit) as info:
        cli.main(["serve", "--model", str(tmp_path)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "cannot run model_type 'gpt_neo' exactly" in err and "Supported model types" in err


def test_inside_flags_reach_the_engine_config(monkeypatch, tmp_path):
    a, b = tmp_path / "a.pt", tmp_path / "b.npy"
    a.write_bytes(b"x")
    b.write_bytes(b"x")
    got = run_serve(monkeypatch, "--max-capture-mb", "12.5", "--steering-vectors", f"a={a}",
                    "--steering-vectors", f"b={b}")
    engine = got["engine"]
    assert engine.max_capture_mb == 12.5
    assert engine.steering_vectors == (("a", str(a)), ("b", str(b)))
    spaced = run_serve(monkeypatch, "--steering-vectors", f"a={a}", f"b={b}")["engine"]
    assert spaced.steering_vectors == engine.steering_vectors
    assert run_serve(monkeypatch)["engine"].max_capture_mb == 256.0


def test_batch_invariant_flag(monkeypatch):
    assert run_serve(monkeypatch, "--batch-invariant")["engine"].batch_invariant is True
    assert run_serve(monkeypatch)["engine"].batch_invariant is False
    assert run_serve(monkeypatch, "--kernel", "amx")["engine"].kernel == "amx"


def test_dtype_gguf_flag(monkeypatch):
    """`--dtype gguf`: the engine keeps the GGUF file's blocks (tests/engine/test_gguf_engine.py)."""
    assert run_serve(monkeypatch, "--dtype", "gguf")["engine"].dtype == "gguf"


@pytest.mark.parametrize("flags, message", [
    (["--steering-vectors", "up=/no/such/vector.pt"], "no such file '/no/such/vector.pt'"),
    (["--steering-vectors", "up"], "expected NAME=PATH"),
    (["--steering-vectors", "up=HERE", "up=HERE"], "'up' given twice"),
    (["--max-capture-mb", "0"], "max_capture_mb must be positive"),
])
def test_bad_inside_flags_stop_at_start_up(monkeypatch, capsys, tmp_path, flags, message):
    here = tmp_path / "v.pt"
    here.write_bytes(b"x")
    flags = [f.replace("HERE", str(here)) for f in flags]
    monkeypatch.setattr("workbench.http.server.run_server", lambda *a, **k: pytest.fail("ran"))
    with pytest.raises(SystemExit) as info:
        cli.main(["serve", *flags])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_steering_vector_of_another_size_stops_the_server_at_load(tmp_path, capsys,
                                                                     tiny_llama, tiny_llama_dir):
    """The size is the model's: checked when the engine loads it, exit 2 naming the file."""
    import torch

    model_dir = tiny_llama_dir
    wrong = tmp_path / "wrong.pt"
    torch.save(torch.ones(tiny_llama.config.hidden_size + 1), wrong)
    with pytest.raises(SystemExit) as info:
        cli.main(["serve", "--model", str(model_dir), "--dtype", "float32", "--device", "cpu",
                  "--max-model-len", "64", "--steering-vectors", f"up={wrong}"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "steering_vectors[up]" in err and str(wrong) in err and "64 finite numbers" in err
