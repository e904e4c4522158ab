"""`workbench serve` LoRA flags reach the engine and server configs (no server is started)."""

from __future__ import annotations

import json

import pytest

from workbench.apps import cli
from workbench.serving.lora import LoRAModulePath, parse_lora_module


def serve_configs(monkeypatch, *argv):
    captured = {}
    monkeypatch.setattr("workbench.http.server.run_server",
                        lambda engine, server, host, port: captured.update(e=engine, s=server))
    assert cli.main(["serve", *argv]) == 0
    return captured["e"], captured["s"]


def test_lora_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1")
    entry = json.dumps({"name": "b", "path": "/p/b", "base_model_name": "smollm2-135m-instruct"})
    engine, server = serve_configs(
        monkeypatch, "--enable-lora", "--lora-modules", "a=/p/a", entry, "--max-loras", "3",
        "--max-lora-rank", "8", "--max-cpu-loras", "4", "--default-mm-loras", '{"text": "/p/t"}',
        "--lora-resolver-dir", str(tmp_path))
    assert (engine.enable_lora, engine.max_loras, engine.max_lora_rank, engine.max_cpu_loras) == \
        (True, 3, 8, 4)
    assert server.lora_modules == (LoRAModulePath("a", "/p/a"),
                                   LoRAModulePath("b", "/p/b", "smollm2-135m-instruct"))
    assert server.default_mm_loras == {"text": "/p/t"}
    assert server.lora_resolver_dirs == (str(tmp_path),)
    engine, _ = serve_configs(monkeypatch, "--enable-lora")
    assert (engine.max_loras, engine.max_lora_rank, engine.max_cpu_loras) == (1, 16, None)


def test_resolver_dir_needs_runtime_updating(monkeypatch, capsys, tmp_path):
    for name in ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "WORKBENCH_ALLOW_RUNTIME_LORA_UPDATING"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit):
        cli.main(["serve", "--enable-lora", "--lora-resolver-dir", str(tmp_path)])
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1" in capsys.readouterr().err


@pytest.mark.parametrize("value, message", [
    ("=x", "Invalid --lora-modules entry"),
    ('{"name": "a"}', "needs both 'name' and 'path'"),
    ('{"name": "a", "path": "p", "is_3d_lora_weight": true}', "is_3d_lora_weight"),
    ('{"name": "a", "path": "p", "rank": 3}', "Unknown keys"),
    ("{broken", "Invalid JSON format for --lora-modules"),
])
def test_bad_lora_module_entries(value, message):
    with pytest.raises(ValueError, match=message):
        parse_lora_module(value)
