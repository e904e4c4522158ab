"""`make gpu-wheels` here, `make gpu-check` on a GPU machine that reaches no package registry.

The GPU machine has Python 3.12, a CUDA torch, transformers, numpy, pytest and the like, and lacks
a few packages the engine's GPU tests need. `wheels` (here, with the venv's python) downloads
exactly those (`WHEELS`), pinned to the venv's versions, for CPython 3.12 on manylinux x86-64,
into `.whl/` (ignored by git; carried along with the working tree). `run` (there, with the
machine's own python3, no venv) installs them into a target folder, puts it and the checkout on
`PYTHONPATH`, runs the GPU tests (`tests/engine/gpu/test_engine_gpu.py`) and then the throughput
table (`table`, in a child process): each figure on a line of its own, everything in
`$OUT/gpu-check.json` (`./gpu-check.json` where OUT is unset), the logs beside it.

The table's model is SmolLM2-135M's shape (`SMOLLM2_135M`: 30 layers, width 576, its
vocabulary and tokenizer) with random weights in bfloat16: the real weights cannot travel (the
GGUF alone is 94 MiB, over the 64 MiB a GPU run may carry), and speed depends on the shapes
only. `run --cpu-dry-run` takes every step on the CPU instead (the GPU tests on the CPU through
`WORKBENCH_GPU_TESTS_ON_CPU=1`, the table on a tiny llama, a few tokens), which proves on a
machine without a GPU that the install and the imports hold.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WHEEL_DIR = ROOT / ".whl"
TARGET = Path(tempfile.gettempdir()) / "workbench-gpu-site"
TESTS = ["tests/engine/gpu/test_engine_gpu.py", "tests/engine/gpu/test_step_graphs.py"]
PYTHON_VERSION = "3.12"  # the GPU machine's python3
GLIBC_MINORS = range(17, 40)  # manylinux_2_17 .. 2_39 (its glibc is 2.39): pip matches N exactly


@dataclass(frozen=True)
class Wheel:
    """A distribution the GPU machine lacks, or has at another version, and why it is needed."""

    name: str
    why: str


WHEELS = (
    Wheel("transformers", "the venv's version (that machine has 5.17): the engine runs "
                          "transformers' own modules and the tests compare with its generate"),
    Wheel("peft", "the LoRA test's reference, at the version that goes with that transformers"),
    Wheel("llguidance", "structured outputs (a binary abi3 wheel)"),
    Wheel("pydantic", "the serving layer's models, which `workbench.llm` imports"),
    Wheel("pydantic-core", "pydantic's compiled core (binary, CPython 3.12), the version it pins"),
    Wheel("annotated-types", "pydantic's"),
    Wheel("typing-inspection", "pydantic's"),
    Wheel("typing-extensions", "pydantic's, at least the venv's version"),
    Wheel("pytest-asyncio", "pyproject.toml's asyncio_mode, which --strict-config requires"),
)
# Not carried, as the GPU tests and the table never import them: fastapi, starlette, uvicorn
# (the HTTP layer), openai, jsonschema, gguf (no GGUF travels).

# SmolLM2-135M-Instruct's config (what `workbench.models` converts its GGUF into)
SMOLLM2_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                    max_position_embeddings=8192, rms_norm_eps=1e-5, initializer_range=0.02,
                    rope_parameters={"rope_theta": 100000.0, "rope_type": "default"},
                    tie_word_embeddings=True)


def pins(wheels=WHEELS, version: Callable[[str], str] = importlib.metadata.version,
         without: tuple[str, ...] = ()) -> list[str]:
    """`NAME==VERSION` for each wheel but those `without`, at the version installed here."""
    unknown = set(without) - {w.name for w in wheels}
    if unknown:
        raise ValueError(f"--without names no carried wheel: {sorted(unknown)}; "
                         f"they are {[w.name for w in wheels]}")
    return [f"{w.name}=={version(w.name)}" for w in wheels if w.name not in without]


def download_command(python: str, pin: str, dest: Path) -> list[str]:
    """pip's download of one pinned wheel for CPython 3.12 on manylinux x86-64, no dependency."""
    platforms = [f"manylinux_2_{n}_x86_64" for n in GLIBC_MINORS] + ["manylinux2014_x86_64"]
    return [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--python-version", PYTHON_VERSION, "--implementation", "cp",
            *(arg for p in platforms for arg in ("--platform", p)), "-d", str(dest), pin]


def install_command(python: str, wheels: list[Path], target: Path) -> list[str]:
    """pip's offline install of the carried wheels into `target` (no index, no dependency)."""
    return [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
            "--no-cache-dir", "--upgrade", "--target", str(target), *map(str, wheels)]


def wheel_name(path: Path) -> str:
    """The distribution a wheel file holds, normalized (`pytest_asyncio-1.5.0-...` -> pytest-asyncio)."""
    return path.name.split("-")[0].lower().replace("_", "-")


def fetch_wheels(dest: Path, without: tuple[str, ...] = ()) -> list[Path]:
    """Download the pinned wheels into `dest` and delete any other wheel there (one version of
    each: two would stop the install)."""
    dest.mkdir(exist_ok=True)
    wanted = pins(without=without)
    for pin in wanted:
        subprocess.run(download_command(sys.executable, pin, dest), check=True)
    versions = dict(pin.split("==") for pin in wanted)
    kept = []
    for path in sorted(dest.glob("*.whl")):
        if versions.get(wheel_name(path)) == path.name.split("-")[1]:
            kept.append(path)
        else:
            path.unlink()
    missing = set(versions) - {wheel_name(p) for p in kept}
    if missing:
        raise RuntimeError(f"pip left no wheel for {sorted(missing)} in {dest}")
    return kept


# -- the GPU side --------------------------------------------------------------------------

def child_env(target: Path | None, cpu_dry_run: bool, base: dict[str, str]) -> dict[str, str]:
    """The children's environment: the wheels' target and the checkout first on PYTHONPATH,
    offline, unbuffered; on the dry run, the GPU tests told to run on the CPU."""
    paths = [str(target)] if target else []
    paths += [str(ROOT)] + ([base["PYTHONPATH"]] if base.get("PYTHONPATH") else [])
    env = {**base, "PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if cpu_dry_run:
        env["WORKBENCH_GPU_TESTS_ON_CPU"] = "1"
    return env


def pytest_command(python: str, junit: Path) -> list[str]:
    return [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
            f"--junitxml={junit}", *TESTS]


def junit_counts(path: Path) -> dict[str, Any]:
    """passed / failed / errors / skipped and the failing tests' ids, from pytest's JUnit XML."""
    cases = ElementTree.parse(path).getroot().iter("testcase")
    counts: dict[str, Any] = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []}
    for case in cases:
        outcome = next((child.tag for child in case if child.tag in
                        ("failure", "error", "skipped")), "passed")
        key = {"failure": "failed", "error": "errors"}.get(outcome, outcome)
        counts[key] += 1
        if key in ("failed", "errors"):
            counts["failures"].append(f"{case.get('classname')}::{case.get('name')}")
    return counts


def tee(command: list[str], env: dict[str, str], log: Path, timeout: float) -> dict[str, Any]:
    """Run `command`, its output both printed and written to `log`; killed (its whole process
    group) after `timeout` seconds. Returns rc, timed_out and seconds."""
    start = time.monotonic()
    with open(log, "w") as sink:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        assert proc.stdout is not None

        def copy() -> None:
            for line in proc.stdout:
                sys.stdout.write(line)
                sink.write(line)

        reader = threading.Thread(target=copy, daemon=True)
        reader.start()
        try:
            rc, timed_out = proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc, timed_out = proc.wait(), True
        reader.join(timeout=10)
    return {"rc": rc, "timed_out": timed_out, "seconds": round(time.monotonic() - start, 1)}


PROBE = """import json, sys, torch, transformers
cuda = torch.cuda.is_available()
print(json.dumps({"python": sys.version.split()[0], "torch": torch.__version__,
                  "transformers": transformers.__version__, "cuda": cuda,
                  "gpu": torch.cuda.get_device_name(0) if cuda else None}))"""


def probe(python: str, env: dict[str, str]) -> dict[str, Any]:
    """What the children will import: versions, and whether torch sees a GPU."""
    done = subprocess.run([python, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the children cannot import torch and transformers:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> int:
    """Install the carried wheels, run the GPU tests, then the table; write the report."""
    out = Path(args.out or os.environ.get("OUT") or ".")
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    report: dict[str, Any] = {"ok": False, "mode": "cpu-dry-run" if args.cpu_dry_run else "cuda",
                              "host_python": platform.python_version()}
    wheels = [] if args.no_wheels else sorted(Path(args.wheels).glob("*.whl"))
    report["wheels"] = [w.name for w in wheels]
    try:
        if wheels and sys.version_info[:2] != (3, 12):
            raise RuntimeError(f"the carried wheels are for CPython {PYTHON_VERSION}, this is "
                               f"{platform.python_version()}: --no-wheels runs on its own packages")
        if wheels:
            subprocess.run(install_command(sys.executable, wheels, args.target), check=True)
        env = child_env(args.target if wheels else None, args.cpu_dry_run, dict(os.environ))
        report["versions"] = probe(sys.executable, env)
        if not args.cpu_dry_run and not report["versions"]["cuda"]:
            raise RuntimeError(f"torch {report['versions']['torch']} sees no CUDA GPU "
                               "(--cpu-dry-run takes the same steps on the CPU)")
        with tempfile.TemporaryDirectory() as scratch:
            junit, figures = Path(scratch) / "junit.xml", Path(scratch) / "figures.json"
            tests = tee(pytest_command(sys.executable, junit), env, out / "gpu-check-tests.log",
                        args.tests_timeout)
            report["tests"] = {**tests, **(junit_counts(junit) if junit.is_file() else {})}
            table = [sys.executable, __file__, "table", "--figures", str(figures)]
            table += ["--cpu-dry-run"] if args.cpu_dry_run else []
            report["table"] = tee(table, env, out / "gpu-check-table.log", args.table_timeout)
            report["table"].update(json.loads(figures.read_text()) if figures.is_file() else {})
        report["ok"] = all(report[step]["rc"] == 0 for step in ("tests", "table")) and \
            report["tests"].get("passed", 0) > 0
    except (RuntimeError, subprocess.CalledProcessError) as error:
        report["error"] = str(error)
    report["seconds"] = round(time.monotonic() - start, 1)
    path = out / "gpu-check.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\ngpu-check summary ({report['mode']}):\n{summary(report)}\n"
          f"gpu-check: {'ok' if report['ok'] else 'FAILED'}, report in {path}", flush=True)
    return 0 if report["ok"] else 1


def summary(report: dict[str, Any]) -> str:
    """The report's headline lines: tests, then one per figure of the table."""
    lines = []
    if "error" in report:
        lines.append(f"gpu-check error: {report['error']}")
    tests = report.get("tests", {})
    if tests:
        lines.append(f"tests: {tests.get('passed', 0)} passed, {tests.get('failed', 0)} failed, "
                     f"{tests.get('errors', 0)} errors, {tests.get('skipped', 0)} skipped in "
                     f"{tests['seconds']} s" + (" (timed out)" if tests["timed_out"] else ""))
    for key, value in report.get("table", {}).get("figures", {}).items():
        lines.append(f"{key:<34} {value}")
    return "\n".join(lines)


# -- the table (a child of `run`, with the wheels on its path) -----------------------------

def table(args: argparse.Namespace) -> int:
    """Our engine against transformers on SmolLM2-135M's shape (bfloat16, 64 tokens): single
    stream and transformers' eager generate, 64 concurrent requests, beam width 4, transformers
    with its static cache compiled. Each benchmark's figures are written to `--figures` as
    soon as measured, so a run cut short keeps what it had."""
    import torch

    from workbench import LLM
    from workbench.apps import bench
    from workbench.models import tiny_model

    device = "cpu" if args.cpu_dry_run else "cuda"
    shape = {} if args.cpu_dry_run else SMOLLM2_135M
    config = bench.BenchConfig(dtype="bfloat16", kernel="auto",
                               threads=1 if args.cpu_dry_run else min(8, os.cpu_count() or 1),
                               **(dict(tokens=4, repeats=1, concurrency=4) if args.cpu_dry_run
                                  else dict(tokens=64, repeats=3, concurrency=64)))
    build = lambda: tiny_model("llama", seed=0, dtype=config.dtype, device=device, **shape)
    side = bench.Contenders(config, theirs=build(), ours=LLM(build(), seed=config.seed))
    result = {"model": ("tiny llama" if args.cpu_dry_run else "SmolLM2-135M's shape") +
              f", random weights, {side.theirs.num_parameters / 1e6:.1f}M parameters",
              "dtype": config.dtype, "tokens": config.tokens, "concurrency": config.concurrency,
              "repeats": config.repeats, "figures": {}}

    def figures(found: dict[str, Any]) -> None:
        result["figures"].update(found)
        args.figures.write_text(json.dumps(result))
        for key, value in found.items():
            print(f"{key:<34} {value}", flush=True)

    figures({})
    print(f"table: {result['model']} on {device} (torch {torch.__version__})", flush=True)
    bench.run(config, [bench.bench_machine, bench.bench_single_stream, bench.bench_concurrent16,
                       bench.bench_beam4, bench.bench_hf_static],
              log=lambda line: print(line, flush=True), side=side, figures=figures)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steps = parser.add_subparsers(dest="step", required=True)
    wheels = steps.add_parser("wheels", help="download the carried wheels (here)")
    wheels.add_argument("--dest", type=Path, default=WHEEL_DIR)
    wheels.add_argument("--without", action="append", default=[],
                        help="leave a wheel out (the GPU machine's own serves), e.g. transformers")
    check = steps.add_parser("run", help="install them, run the GPU tests and the table (there)")
    check.add_argument("--cpu-dry-run", action="store_true", help="every step on the CPU")
    check.add_argument("--wheels", type=Path, default=WHEEL_DIR, help="default .whl/")
    check.add_argument("--no-wheels", action="store_true",
                       help="install nothing: this python's own packages (a venv with a GPU)")
    check.add_argument("--target", type=Path, default=TARGET, help=f"default {TARGET}")
    check.add_argument("--out", help="the report's folder (default: $OUT, else .)")
    check.add_argument("--tests-timeout", type=float, default=180)
    check.add_argument("--table-timeout", type=float, default=300)
    figures = steps.add_parser("table", help="the throughput table alone (run's child)")
    figures.add_argument("--figures", type=Path, required=True, help="a JSON file to write")
    figures.add_argument("--cpu-dry-run", action="store_true")
    args = parser.parse_args(argv)
    if args.step == "wheels":
        kept = fetch_wheels(args.dest, tuple(args.without))
        size = sum(p.stat().st_size for p in kept) / 2**20
        print("\n".join(p.name for p in kept) + f"\n{len(kept)} wheels, {size:.1f} MiB in {args.dest}")
        return 0
    return run(args) if args.step == "run" else table(args)


if __name__ == "__main__":
    sys.exit(main())
