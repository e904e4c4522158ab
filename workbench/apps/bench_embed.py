"""The embedding benchmark of `workbench bench`: our encode path against batched transformers.

The corpus is a fixed, seeded mix of sentences from 3 to about 60 words (`corpus(n)`), the
lengths a retrieval workload embeds. Transformers' side is what a user writes by hand:
`AutoModel` on padded batches of 32 in corpus order, then the model's own pooling (mean with the
attention mask for MiniLM) and L2 normalization, in the same dtype (larger padded batches only
pad more). Ours is `LLM.embed` on the whole corpus at once, the engine set for a batch job as
vLLM's offline defaults are (steps of up to 256 sequences / 8192 tokens: with 64 sequences per
step it was 1.3-1.5x instead of 2.2x on the loaded 2-core machine, as small steps mean more,
smaller ops). Each side is warmed up, then timed in turns; best of `repeats`.
"""

from __future__ import annotations

import random
import time
from functools import cached_property

from workbench.models.registry import DEFAULT_EMBED_MODEL

HF_BATCH = 32
SUBJECTS = ("The committee", "A small dog", "My neighbour", "The new library", "Researchers",
            "The old bridge over the river", "Our team", "A stranger on the train", "The city",
            "Most of the students in the evening class", "The weather service", "She", "Nobody")
VERBS = ("announced", "found", "painted", "described", "rejected", "explained", "visited",
         "measured", "forgot", "celebrated", "questioned", "built", "translated")
OBJECTS = ("a plan for the summer", "the results", "an unusual pattern in the data", "the garden",
           "a letter from an old friend", "the budget", "three new species of beetle",
           "the history of the valley", "a faster way home", "the noise", "the final chapter")
CLAUSES = ("after a long and difficult meeting", "because the deadline had moved again",
           "although nobody expected it", "while the rain kept falling on the roofs of the town",
           "before anyone could stop them", "with the help of a few volunteers from the school",
           "despite the cost", "as the sun went down behind the hills", "on Tuesday",
           "in a way that surprised even the people who had known them for years",
           "so that the children could finally see the stars from the playground")


def corpus(count: int, seed: int = 0) -> list[str]:
    """`count` sentences of mixed length, the same for the same seed."""
    rng = random.Random(seed)
    sentences = []
    for _ in range(count):
        parts = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)]
        for _ in range(rng.choice((0, 0, 1, 1, 2, 3, 4))):
            parts.append(rng.choice(CLAUSES))
        sentences.append(" ".join(parts) + ".")
    return sentences


class EmbedContenders:
    """Our `LLM` on the embedding model and a separate transformers copy, loaded on first use."""

    def __init__(self, model: str = DEFAULT_EMBED_MODEL, dtype: str = "auto"):
        self.model, self.dtype = model, dtype

    @cached_property
    def theirs(self):
        from workbench.models import load_model  # deferred: the loader imports torch

        return load_model(self.model, dtype=self.dtype)

    @cached_property
    def ours(self):
        from workbench.llm import LLM  # deferred: it imports torch

        return LLM(model=self.model, dtype=self.dtype, max_num_seqs=256,
                   max_num_batched_tokens=8192)


def hf_embed(lm, texts: list[str], batch_size: int = HF_BATCH):
    """transformers: padded batches, mean pooling over the attention mask, L2 norm -> [N, H]."""
    import torch  # deferred: torch is heavy; the module loads without it
    import torch.nn.functional as F

    out = []
    with torch.inference_mode():
        for i in range(0, len(texts), batch_size):
            enc = lm.tokenizer(texts[i:i + batch_size], padding=True, truncation=True,
                               max_length=lm.max_model_len, return_tensors="pt").to(lm.device)
            hidden = lm.model(**enc).last_hidden_state  # [B, L, H]
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [B, L, 1]
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out.append(F.normalize(pooled.float(), dim=-1))
    return torch.cat(out)


def ours_embed(llm, texts: list[str]):
    import torch  # deferred: torch is heavy; the module loads without it

    return torch.tensor([o.outputs.embedding for o in llm.embed(texts)])


def bench_embed(side: EmbedContenders, texts: list[str], repeats: int) -> dict[str, float]:
    """`embed_per_s`, `hf_embed_per_s` (sentences per second) and `embed_ratio`."""
    import torch.nn.functional as F  # deferred: torch is heavy; the module loads without it

    if side.theirs.pooling != "mean" or not side.theirs.normalize:
        raise ValueError("The embedding benchmark compares mean pooling + normalization.")
    ours, theirs = ours_embed(side.ours, texts[:64]), hf_embed(side.theirs, texts[:64])  # warm-up
    agreement = F.cosine_similarity(ours, theirs, dim=-1).min().item()
    ours_rate = theirs_rate = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        ours_embed(side.ours, texts)
        ours_rate = max(ours_rate, len(texts) / (time.perf_counter() - start))
        start = time.perf_counter()
        hf_embed(side.theirs, texts)
        theirs_rate = max(theirs_rate, len(texts) / (time.perf_counter() - start))
    return {"embed_per_s": round(ours_rate, 1), "hf_embed_per_s": round(theirs_rate, 1),
            "embed_ratio": round(ours_rate / theirs_rate, 3),
            "embed_min_cosine": round(agreement, 5)}
