"""Writes data/sentences.jsonl: 320 short sentences about films, meals and trips, each labelled
positive or negative (and the adjective that says so), from fixed templates (seeded: the same file every run).

`python scripts/make_sentences.py` (notebook 24 reads the file: a linear probe per layer).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SUBJECTS = ["The film", "The meal", "The trip", "The concert", "The book", "The hotel",
            "The game", "The lecture"]
POSITIVE = ["wonderful", "delightful", "superb", "charming", "brilliant", "lovely", "excellent",
            "moving", "fantastic", "pleasant"]
NEGATIVE = ["awful", "dreadful", "boring", "terrible", "disappointing", "dull", "miserable",
            "tedious", "horrible", "unpleasant"]
TEMPLATES = ["{s} was {a}.", "{s} was truly {a}, from start to finish.",
             "Honestly, {s_lower} felt {a}.", "Everyone agreed that {s_lower} was {a}."]


def sentences(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for label, words in (("positive", POSITIVE), ("negative", NEGATIVE)):
        for s in SUBJECTS:
            for t in TEMPLATES:
                for a in rng.sample(words, 5):
                    rows.append({"text": t.format(s=s, s_lower=s.lower(), a=a), "label": label,
                                 "adjective": a})
    rng.shuffle(rows)
    return [{"id": f"s{i:03d}", **row} for i, row in enumerate(rows)]


if __name__ == "__main__":
    path = Path(__file__).resolve().parents[1] / "data" / "sentences.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in sentences()))
    print(f"wrote {path}")
