"""scripts/gpu_check.py (`make gpu-wheels`, `make gpu-check`) without a network or a GPU: the
carried wheels pinned to this venv's versions, pip's download and install commands, the
children's environment, the report's JSON shape and lines, and the table's model shape
(SmolLM2-135M's). The slow test takes the whole dry run on this CPU."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpu_check():
    """scripts/gpu_check.py as a module (registered while it runs: its dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_every_carried_wheel_is_pinned_to_this_venvs_version(gpu_check):
    pins = gpu_check.pins()
    assert pins == [f"{w.name}=={importlib.metadata.version(w.name)}" for w in gpu_check.WHEELS]
    names = {pin.split("==")[0] for pin in pins}
    assert {"transformers", "llguidance", "pydantic", "pydantic-core"} <= names
    assert not names & {"torch", "fastapi", "uvicorn", "openai"}  # there, or never imported


def test_pydantic_core_is_the_version_pydantic_pins(gpu_check):
    core = next(pin for pin in gpu_check.pins() if pin.startswith("pydantic-core=="))
    assert core in importlib.metadata.requires("pydantic")


def test_without_leaves_a_wheel_out_and_refuses_names_it_does_not_carry(gpu_check):
    pins = gpu_check.pins(version=lambda name: "1.0", without=("transformers",))
    assert "transformers==1.0" not in pins and "llguidance==1.0" in pins
    with pytest.raises(ValueError, match="fastapi"):
        gpu_check.pins(without=("fastapi",))


def test_the_download_is_binary_for_cpython_312_on_manylinux_without_dependencies(gpu_check):
    command = gpu_check.download_command("py", "llguidance==1.9.1", Path("/w"))
    assert command[:4] == ["py", "-m", "pip", "download"] and command[-1] == "llguidance==1.9.1"
    assert {"--no-deps", "--only-binary=:all:"} <= set(command)
    flags = dict(zip(command[4:-1:2], command[5:-1:2]))
    assert flags["--python-version"] == "3.12" and flags["--implementation"] == "cp"
    assert flags["-d"] == "/w"
    platforms = {value for flag, value in zip(command, command[1:]) if flag == "--platform"}
    # llguidance's wheel is manylinux_2_31, pydantic-core's manylinux_2_17 / 2014
    assert {"manylinux_2_31_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"} <= platforms
    assert "manylinux_2_40_x86_64" not in platforms  # newer than the GPU machine's glibc


def test_the_install_is_offline_into_the_target(gpu_check):
    wheels = [Path(".whl/a-1-py3-none-any.whl"), Path(".whl/b-2-py3-none-any.whl")]
    command = gpu_check.install_command("python3", wheels, Path("/tmp/site"))
    assert command[:4] == ["python3", "-m", "pip", "install"]
    assert {"--no-index", "--no-deps", "--upgrade"} <= set(command)
    assert command[command.index("--target") + 1] == "/tmp/site"
    assert command[-2:] == [".whl/a-1-py3-none-any.whl", ".whl/b-2-py3-none-any.whl"]


def test_fetching_keeps_one_wheel_of_each_at_the_pinned_version(gpu_check, monkeypatch, tmp_path):
    def fake_run(command, check):  # pip's file names: the name with underscores
        name, version = command[-1].split("==")
        (Path(command[command.index("-d") + 1]) /
         f"{name.replace('-', '_')}-{version}-py3-none-any.whl").touch()

    monkeypatch.setattr(gpu_check, "subprocess", types.SimpleNamespace(run=fake_run))
    (tmp_path / "transformers-4.0.0-py3-none-any.whl").touch()  # an older download
    (tmp_path / "fastapi-1.0-py3-none-any.whl").touch()  # no longer carried
    kept = gpu_check.fetch_wheels(tmp_path, without=("peft",))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in kept)
    assert sorted(gpu_check.wheel_name(p) for p in kept) == sorted(
        pin.split("==")[0] for pin in gpu_check.pins(without=("peft",)))
    transformers = importlib.metadata.version("transformers")
    assert f"transformers-{transformers}-py3-none-any.whl" in {p.name for p in kept}


def test_the_children_see_the_wheels_then_the_checkout(gpu_check):
    env = gpu_check.child_env(Path("/t"), False, {"PYTHONPATH": "/x", "HOME": "/h"})
    assert env["PYTHONPATH"].split(":") == ["/t", str(ROOT), "/x"]
    assert env["HOME"] == "/h" and env["HF_HUB_OFFLINE"] == "1"
    assert "WORKBENCH_GPU_TESTS_ON_CPU" not in env
    dry = gpu_check.child_env(None, True, {})
    assert dry["PYTHONPATH"] == str(ROOT) and dry["WORKBENCH_GPU_TESTS_ON_CPU"] == "1"


def test_the_check_runs_every_test_file_with_gpu_tests(gpu_check):
    mark = re.compile(r"^(@pytest\.mark\.gpu|pytestmark = .*pytest\.mark\.gpu)", re.MULTILINE)
    marked = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py")
                    if mark.search(path.read_text()))
    assert marked == sorted(gpu_check.TESTS)


def test_junit_counts(gpu_check, tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text("""<testsuites><testsuite name="pytest">
      <testcase classname="t.m" name="a"/>
      <testcase classname="t.m" name="b"><failure message="no"/></testcase>
      <testcase classname="t.m" name="c"><error message="no"/></testcase>
      <testcase classname="t.m" name="d"><skipped message="later"/></testcase>
      <testcase classname="t.m" name="e"/>
    </testsuite></testsuites>""")
    assert gpu_check.junit_counts(path) == {"passed": 2, "failed": 1, "errors": 1, "skipped": 1,
                                            "failures": ["t.m::b", "t.m::c"]}


def fake_children(cuda: bool):
    """`probe` and `tee` stand-ins: versions, a JUnit file with two passes, two figures."""
    def probe(python, env):
        return {"python": "3.12.3", "torch": "2.11.0+cu130", "transformers": "5.24.0",
                "cuda": cuda, "gpu": "NVIDIA H200" if cuda else None}

    def tee(command, env, log, timeout):
        if "pytest" in command:
            junit = next(arg for arg in command if arg.startswith("--junitxml="))
            Path(junit.split("=", 1)[1]).write_text(
                '<testsuite><testcase classname="m" name="a"/>'
                '<testcase classname="m" name="b"/></testsuite>')
        else:
            Path(command[command.index("--figures") + 1]).write_text(json.dumps(
                {"model": "m", "figures": {"single_stream_tok_s": 812.5,
                                           "single_stream_ratio": 3.1}}))
        return {"rc": 0, "timed_out": False, "seconds": 1.0}

    return probe, tee


def test_the_report_has_the_tests_the_table_and_one_line_per_figure(gpu_check, monkeypatch,
                                                                     tmp_path, capsys):
    probe, tee = fake_children(cuda=True)
    monkeypatch.setattr(gpu_check, "probe", probe)
    monkeypatch.setattr(gpu_check, "tee", tee)
    assert gpu_check.main(["run", "--no-wheels", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert set(report) == {"ok", "mode", "host_python", "wheels", "versions", "tests", "table",
                           "seconds"}
    assert report["ok"] is True and report["mode"] == "cuda" and report["wheels"] == []
    assert report["versions"]["gpu"] == "NVIDIA H200"
    assert (report["tests"]["passed"], report["tests"]["failed"], report["tests"]["rc"]) == (2, 0, 0)
    assert report["table"]["figures"] == {"single_stream_tok_s": 812.5, "single_stream_ratio": 3.1}
    lines = capsys.readouterr().out.splitlines()
    assert [line.split() for line in lines if line.startswith("single_stream")] == [
        ["single_stream_tok_s", "812.5"], ["single_stream_ratio", "3.1"]]


def test_without_a_gpu_the_report_says_so_and_the_check_fails(gpu_check, monkeypatch, tmp_path):
    probe, tee = fake_children(cuda=False)
    monkeypatch.setattr(gpu_check, "probe", probe)
    monkeypatch.setattr(gpu_check, "tee", tee)
    assert gpu_check.main(["run", "--no-wheels", "--out", str(tmp_path)]) == 1
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert report["ok"] is False and "sees no CUDA GPU" in report["error"]
    assert "tests" not in report


def test_the_table_model_has_smollm2_135ms_shapes(gpu_check, tmp_path):
    """SMOLLM2_135M on the shipped tokenizer builds, tensor for tensor, the shapes of the real
    model's converted safetensors."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.models.registry import DEFAULT_MODEL, resolve_model
    from workbench.models.tiny import TOKENIZERS, tiny_config

    config = tiny_config("llama", AutoTokenizer.from_pretrained(TOKENIZERS / "smollm2"),
                         **gpu_check.SMOLLM2_135M)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    path = resolve_model(DEFAULT_MODEL).path
    with safe_open(str(path / "model.safetensors"), "pt") as real:
        shapes = {name: list(real.get_slice(name).get_shape()) for name in real.keys()}
    assert {name: list(p.shape) for name, p in model.named_parameters()} == shapes
    real_config = json.loads((path / "config.json").read_text())
    for key in ("rms_norm_eps", "rope_parameters", "tie_word_embeddings", "bos_token_id",
                "eos_token_id", "max_position_embeddings"):
        assert getattr(config, key) == pytest.approx(real_config[key]), key


@pytest.mark.slow
def test_the_dry_run_takes_every_step_on_the_cpu(gpu_check, tmp_path):
    """`run --cpu-dry-run` on this venv: the GPU tests on the CPU, then the table."""
    assert gpu_check.main(["run", "--cpu-dry-run", "--no-wheels", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert report["mode"] == "cpu-dry-run" and report["tests"]["failed"] == 0
    # skipped: only the CUDA graph capture (tests/engine/gpu/test_step_graphs.py), which has no
    # CPU form
    assert report["tests"]["passed"] >= 10 and report["tests"]["skipped"] == 1
    figures = report["table"]["figures"]
    for key in ("single_stream_tok_s", "hf_single_stream_tok_s", "single_stream_ratio",
                "concurrent4_tok_s", "hf_concurrent4_tok_s", "beam4_time_ratio",
                "hf_static_single_stream_tok_s", "single_stream_static_ratio"):
        assert figures[key] > 0, key
