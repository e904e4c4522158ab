"""The kernel choice (engine/kernels/projections.py): one table of probed capabilities, refusals at start-up,
and the float32 fast path's exactness against transformers on SmolLM2."""

from __future__ import annotations

import pytest
import torch

from tests.engine.helpers import ids_of, make_llm
from workbench import LLM, SamplingParams
from workbench.engine.kernels import c_library, c_products, projections
from workbench.errors import ValidationError
from workbench.models import load_model
from workbench.models.cpu import CpuFeatures, cpu_features

MACHINES = {  # the CPU kinds users have, as the probe sees them
    "avx2": "avx2 fma f16c",
    "avx512": "avx2 fma f16c avx512f avx512bw avx512vl avx512dq",
    "avx512-bf16": "avx2 fma f16c avx512f avx512bw avx512vl avx512dq avx512_bf16",
    "amx": "avx2 fma f16c avx512f avx512bw avx512vl avx512dq avx512_bf16 amx_tile amx_bf16",
    "no-avx2": "sse4_2 avx",
}
EXPECTED = {  # machine -> (float32 kernel, bfloat16 kernel) that "auto" picks
    "avx2": ("avx2", "torch"), "avx512": ("avx2", "onednn"),
    "avx512-bf16": ("avx2", "avx512bf16"), "amx": ("avx2", "amx"),
    "no-avx2": ("torch", "torch"),
}


def simulated(machine: str) -> CpuFeatures:
    return CpuFeatures(frozenset(MACHINES[machine].split()), "test")


@pytest.fixture
def every_build(monkeypatch):
    """The run-time parts (a C compiler, torch's oneDNN) present, so that the choice
    depends on the simulated flags alone."""
    monkeypatch.setattr(c_products, "available", lambda: True)
    monkeypatch.setattr(c_products, "available_bf16", lambda: True)
    monkeypatch.setattr(c_products, "available_amx", lambda: True)
    monkeypatch.setattr(projections, "onednn_prepack_works", lambda: True)
    monkeypatch.delenv("WORKBENCH_KERNEL", raising=False)


@pytest.mark.parametrize("machine", MACHINES)
def test_auto_picks_by_capability(machine, every_build):
    features = simulated(machine)
    got = tuple(projections.choose(dtype, "cpu", features=features).kernel
                for dtype in (torch.float32, torch.bfloat16))
    assert got == EXPECTED[machine]
    assert projections.choose(torch.float16, "cpu", features=features).kernel == "torch"


def test_auto_falls_back_when_the_build_lacks_a_part(every_build, monkeypatch):
    monkeypatch.setattr(c_products, "available", lambda: False)  # no C compiler
    assert projections.choose(torch.float32, features=simulated("avx2")).kernel == "torch"
    # a compiler without AMX (or an OS that does not grant it), then without AVX-512 BF16
    monkeypatch.setattr(c_products, "available_amx", lambda: False)
    assert projections.choose(torch.bfloat16, features=simulated("amx")).kernel == "avx512bf16"
    monkeypatch.setattr(c_products, "available_bf16", lambda: False)
    assert projections.choose(torch.bfloat16, features=simulated("amx")).kernel == "onednn"
    assert projections.choose(torch.bfloat16, features=simulated("avx512-bf16")).kernel == "onednn"


@pytest.mark.parametrize("kernel, dtype, words", [
    ("onednn", torch.bfloat16, "AVX-512 BW/VL/DQ or AVX-NE-CONVERT"),
    ("avx512bf16", torch.bfloat16, "AVX-512 BW/VL/DQ or AVX-NE-CONVERT"),
    ("amx", torch.bfloat16, "AVX-512 BW/VL/DQ or AVX-NE-CONVERT"),
    ("avx2", torch.bfloat16, "float32"),
    ("onednn", torch.float32, "bfloat16"),
])
def test_a_kernel_the_machine_cannot_run_is_refused_naming_the_flag(kernel, dtype, words,
                                                                     every_build):
    with pytest.raises(ValidationError) as error:
        projections.choose(dtype, "cpu", kernel, features=simulated("avx2"))
    assert error.value.parameter == "kernel"
    assert "--kernel" in str(error.value) and words in str(error.value)
    assert "this one has: avx2 fma f16c" in str(error.value) or "dtype" in str(error.value)


def test_bf16_is_emulated_only_without_native_bf16():
    assert projections.emulated(torch.bfloat16, "cpu", simulated("avx512"))
    assert not projections.emulated(torch.bfloat16, "cpu", simulated("avx512-bf16"))
    assert not projections.emulated(torch.float32, "cpu", simulated("avx2"))
    assert not projections.emulated(torch.bfloat16, "cuda", simulated("avx2"))


def test_amx_needs_the_isa_a_compiler_and_the_os(every_build, monkeypatch):
    with pytest.raises(ValidationError, match="AMX BF16 \\(this one has"):
        projections.choose(torch.bfloat16, "cpu", "amx", features=simulated("avx512-bf16"))
    monkeypatch.setattr(c_products, "available_amx", lambda: False)
    with pytest.raises(ValidationError, match="targets AMX .* grants processes AMX"):
        projections.choose(torch.bfloat16, "cpu", "amx", features=simulated("amx"))


def test_avx512bf16_needs_the_isa_and_a_compiler_that_targets_it(every_build, monkeypatch):
    with pytest.raises(ValidationError, match="AVX-512 BF16 \\(this one has"):
        projections.choose(torch.bfloat16, "cpu", "avx512bf16", features=simulated("avx512"))
    monkeypatch.setattr(c_products, "available_bf16", lambda: False)
    with pytest.raises(ValidationError, match="C compiler that targets AVX-512 BF16"):
        projections.choose(torch.bfloat16, "cpu", "avx512bf16", features=simulated("amx"))


@pytest.mark.parametrize("probe, machine", [("available_bf16", "avx512"),
                                            ("available_amx", "avx512-bf16")])
def test_the_bf16_c_kernels_are_never_called_without_their_isa(monkeypatch, probe, machine):
    """`available_bf16` and `available_amx` probe the flags before they load the library, ask
    the OS or run a product (which would fault)."""

    check = getattr(c_products, probe)
    monkeypatch.setattr(c_products, "cpu_features", lambda: simulated(machine))
    monkeypatch.setattr(c_library, "library", lambda: pytest.fail("the library was loaded"))
    check.cache_clear()
    try:
        assert not check()
    finally:
        check.cache_clear()


def test_unknown_kernel_names_and_cuda(every_build):
    with pytest.raises(ValidationError, match="kernel must be 'auto' or one of"):
        projections.choose(torch.float32, "cpu", "fast")
    assert projections.choose(torch.bfloat16, "cuda").kernel == "torch"
    with pytest.raises(ValidationError, match="runs on the CPU only"):
        projections.choose(torch.bfloat16, "cuda", "onednn")


def test_the_environment_forces_a_kernel_for_its_dtype(every_build, monkeypatch):
    monkeypatch.setenv("WORKBENCH_KERNEL", "torch")
    assert projections.choose(torch.float32, features=simulated("avx2")).kernel == "torch"
    assert projections.choose(torch.float32, "cpu", "avx2", features=simulated("avx2")).kernel == "avx2"
    monkeypatch.setenv("WORKBENCH_KERNEL", "onednn")  # a bf16 kernel: float32 models keep auto
    assert projections.choose(torch.float32, features=simulated("amx")).kernel == "avx2"
    assert projections.choose(torch.bfloat16, features=simulated("amx")).kernel == "onednn"
    with pytest.raises(ValidationError, match="cannot run here"):
        projections.choose(torch.bfloat16, features=simulated("avx2"))


def test_portable_runs_cover_every_other_runnable_kernel(monkeypatch, every_build):
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).parents[3] / "scripts" / "test_portable.py"
    spec = importlib.util.spec_from_file_location("test_portable", path)
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "test_portable", script)  # its dataclass looks itself up
    spec.loader.exec_module(script)
    monkeypatch.setattr(script, "cpu_features", lambda: simulated("amx"))
    monkeypatch.setattr(projections, "cpu_features", lambda: simulated("amx"))
    monkeypatch.setattr(script.shutil, "which", lambda name: "/usr/bin/" + name)
    runs = script.runs()
    assert [run.title for run in runs] == [
        "kernel avx512bf16", "kernel onednn", "kernel torch",
        "torch, oneDNN and MKL limited to AVX2", "an AVX2-only CPU (qemu-user)"]
    emulated = runs[-1].command()
    assert emulated[:3] == ["/usr/bin/qemu-x86_64", "-cpu", script.QEMU_CPU]
    assert "avx512" not in script.QEMU_CPU and runs[-1].env["WORKBENCH_CPU_FLAGS"] == "avx2 fma f16c"
    monkeypatch.setattr(script.shutil, "which", lambda name: None)
    assert runs[-2].title == script.runs()[-1].title  # no emulator: that run is left out
    monkeypatch.setattr(script, "cpu_features", lambda: simulated("avx2"))
    assert [run.title for run in script.runs()] == ["kernel torch"]


def test_the_engine_refuses_at_start_up(tiny_llama):
    unrunnable = next((k for k in projections.KERNELS
                       if projections.missing(k, torch.float32, cpu_features())), None)
    if unrunnable is None:
        pytest.skip("this machine runs every kernel in float32")
    with pytest.raises(ValidationError) as error:
        LLM(tiny_llama, kernel=unrunnable, max_model_len=64, num_kv_blocks=8)
    assert error.value.parameter == "kernel"


def test_the_runner_says_which_kernel(tiny_llama, caplog):
    import copy
    import dataclasses

    loaded = dataclasses.replace(tiny_llama, model=copy.deepcopy(tiny_llama.model))
    with caplog.at_level("INFO", logger="workbench.engine.step.runner"):
        llm = make_llm(loaded)
    choice = llm.llm_engine.runner.kernel
    assert choice.kernel == projections.choose(torch.float32).kernel and choice.dtype == torch.float32
    assert f"kernel {choice.kernel}, ops {choice.ops} (float32 on cpu" in caplog.text


def hf_steps(loaded, prompt: str, tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    """transformers' own greedy generation (its KV cache, SDPA): tokens up to the first EOS and
    the float32 log-softmax of each step's logits."""
    ids = ids_of(loaded, prompt)
    with torch.inference_mode():
        out = loaded.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                    dtype=torch.long), do_sample=False, max_new_tokens=tokens,
                                    output_logits=True, return_dict_in_generate=True,
                                    pad_token_id=loaded.tokenizer.pad_token_id)
    return out.sequences[0, len(ids):].tolist(), [torch.log_softmax(l[0], -1) for l in out.logits]


@pytest.mark.slow
def test_smollm2_float32_fast_path_matches_transformers():
    """SmolLM2 in float32 on the kernel `auto` picks here (fused projections, the lean decoder
    loop, few-row products): greedy tokens identical to transformers' `generate`, alone and as a
    batch of four, and each chosen token's logprob within 2e-5 of transformers' step logits.
    (1e-5 is below float32's noise here: the engine on plain `F.linear` differs from
    `generate` by up to 1.6e-5 on these prompts, depending on the batch.)"""
    ours = make_llm(load_model("smollm2-135m-instruct", dtype="float32", device="cpu"),
                    max_model_len=512, num_kv_blocks=96)
    assert ours.llm_engine.runner.kernel.kernel == projections.choose(torch.float32).kernel
    theirs = load_model("smollm2-135m-instruct", dtype="float32", device="cpu")  # unpatched
    prompts = ["The capital of France is", "def fibonacci(n):",
               "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n",
               "Once upon a time, in a small village at the edge of a great forest,"]
    params = SamplingParams(max_tokens=24, temperature=0, logprobs=0)
    batch = ours.generate(prompts, params)
    alone = [ours.generate(prompt, params)[0] for prompt in prompts]
    for i, prompt in enumerate(prompts):
        tokens, logprobs = hf_steps(theirs, prompt, 24)
        for out in (batch[i].outputs[0], alone[i].outputs[0]):
            assert list(out.token_ids) == tokens
            for step, token in enumerate(tokens):
                assert abs(out.logprobs[step][token].logprob - logprobs[step][token].item()) < 2e-5
