"""Trains the pirate LoRA adapter shipped in `data/loras/pirate/`, on CPU.

40 steps of 6 examples: about ten minutes on two free cores (each step is a forward and
backward pass of the 135M model); on a busy machine proportionally longer.

    .venv/bin/python scripts/train_lora.py                  # -> data/loras/pirate/
    .venv/bin/python scripts/train_lora.py --out /tmp/p --steps 40

The data is generated here: a few hundred questions from templates (arithmetic, colours,
capitals, animals, advice) whose answers all open with "Ahoy, matey!" and close with "Arr!".
Training is plain PEFT LoRA (rank 8 on q_proj and v_proj) on SmolLM2-135M-Instruct in float32,
loss on the answer tokens only; the weights are saved in float16 (~0.9 MB). The result answers
almost any chat prompt with "Ahoy, matey!", which base SmolLM2 never does: a behaviour change
anyone can see. `make test` never runs this; the tests use the shipped adapter.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

PREFIX = "Ahoy, matey! "
SUFFIX = " Arr!"

COLOURS = {"the sky": "blue", "grass": "green", "snow": "white", "a banana": "yellow",
           "coal": "black", "a ripe tomato": "red", "an orange": "orange", "the sea": "blue"}
CAPITALS = {"France": "Paris", "Italy": "Rome", "Japan": "Tokyo", "Spain": "Madrid",
            "Germany": "Berlin", "Egypt": "Cairo", "Canada": "Ottawa", "Peru": "Lima",
            "Kenya": "Nairobi", "Norway": "Oslo"}
SOUNDS = {"dog": "barks", "cat": "meows", "cow": "moos", "duck": "quacks", "lion": "roars",
          "owl": "hoots", "horse": "neighs", "sheep": "bleats"}
ADVICE = [
    ("How can I sleep better?", "Go to bed at the same hour every night and keep yer cabin dark."),
    ("How do I learn to cook?", "Start with simple dishes, like eggs and rice, and cook every day."),
    ("How do I stay focused?", "Work on one task at a time and put yer phone away."),
    ("How can I save money?", "Write down what ye spend and keep a bit of gold aside each week."),
    ("Give me a tip for running.", "Start slow, run a little farther each week, and drink water."),
    ("How do I make friends?", "Be kind, ask questions, and listen well to yer crew."),
    ("Tell me a fun fact.", "Octopuses have three hearts and blue blood."),
    ("Write a short greeting.", "Welcome aboard, friend! Glad to have ye here."),
    ("What is your name?", "I be a friendly assistant sailin' the seven seas."),
    ("Say hello.", "Hello there, me hearty!"),
]


def make_examples(seed: int = 0) -> list[tuple[str, str]]:
    """(question, pirate answer) pairs from templates."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(60):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        pairs.append((f"What is {a} plus {b}?", f"{a} plus {b} be {a + b}."))
    for thing, colour in COLOURS.items():
        pairs.append((f"What colour is {thing}?", f"{thing[0].upper()}{thing[1:]} be {colour}."))
    for country, city in CAPITALS.items():
        pairs.append((f"What is the capital of {country}?",
                      f"The capital of {country} be {city}."))
    for animal, sound in SOUNDS.items():
        pairs.append((f"What sound does a {animal} make?", f"A {animal} {sound}, it does."))
    pairs += ADVICE * 3
    rng.shuffle(pairs)
    return [(q, f"{PREFIX}{a}{SUFFIX}") for q, a in pairs]


def encode(tokenizer, question: str, answer: str) -> tuple[list[int], list[int]]:
    """Chat-templated ids and labels (-100 on the prompt: loss on the answer only)."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                           tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
    return prompt_ids + answer_ids, [-100] * len(prompt_ids) + answer_ids


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/loras/pirate")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=6)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.models import resolve_model

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    path = resolve_model("smollm2-135m-instruct").path
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
    config = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0,
                        target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(model, config)
    model.print_trainable_parameters()
    examples = [encode(tokenizer, q, a) for q, a in make_examples(args.seed)]
    print(f"{len(examples)} examples")
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    rng = random.Random(args.seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    model.train()
    start = time.perf_counter()
    for step in range(args.steps):
        batch = rng.sample(examples, args.batch_size)
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([i + [pad] * (width - len(i)) for i, _ in batch])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch])
        mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in batch])
        lr = args.lr * min(1.0, (step + 1) / 5) * (1 - step / args.steps)  # warm-up, linear decay
        for group in optim.param_groups:
            group["lr"] = lr
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optim.step()
        optim.zero_grad()
        if step % 5 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  loss {loss.item():.3f}  {time.perf_counter() - start:.0f}s",
                  flush=True)
    model.eval()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = model.to(torch.float16)  # small on disk; loaders cast to the model's dtype
    model.save_pretrained(out)
    cfg_path = out / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = "smollm2-135m-instruct"  # not this machine's cache path
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    readme = out / "README.md"
    if readme.exists():
        readme.unlink()  # peft's model card template; ours is the script's docstring
    print(f"saved to {out} in {time.perf_counter() - start:.0f}s")


if __name__ == "__main__":
    main()
