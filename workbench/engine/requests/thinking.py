"""`thinking_token_budget`: a reasoning that runs past its budget is ended by force.

Each sequence of a request with a budget gets a `ThinkingBudget`. It watches the output: the
reasoning opens at the first token (when the prompt opened it, or the model reasons without a
start tag, as DeepSeek-R1) or once the output ends with the start tag's ids; it closes when the
output ends with the end tag's ids. Once the reasoning has `budget` tokens and is still open,
`forced_token` names the next token of the end tag (continuing a partial tag the model may have
begun), and the sampler allows nothing else, until the tag is complete; the answer follows.
Logprobs stay those of the model's raw distribution, as with structured outputs.
"""

from __future__ import annotations


class ThinkingBudget:
    """Reasoning-token count and forced end tag of one sequence (see the module docstring)."""

    def __init__(self, budget: int, end_ids: list[int], start_ids: list[int] | None):
        self.budget = budget
        self.end_ids = list(end_ids)
        self.start_ids = list(start_ids) if start_ids else None
        self.open = self.start_ids is None
        self.closed = False
        self.count = 0  # reasoning tokens so far

    def observe(self, output_ids: list[int]) -> None:
        """Called after each token is appended to the output."""
        if self.closed:
            return
        if not self.open:
            if _ends_with(output_ids, self.start_ids):
                self.open = True
            return
        if _ends_with(output_ids, self.end_ids):
            self.closed = True
        else:
            self.count += 1

    def forced_token(self, output_ids: list[int]) -> int | None:
        """The only token the next step may take, or None when the budget does not bind."""
        if not self.open or self.closed or self.count < self.budget:
            return None
        done = next(k for k in range(len(self.end_ids) - 1, -1, -1)
                    if _ends_with(output_ids, self.end_ids[:k]))  # the tag begun so far
        return self.end_ids[done]


def _ends_with(ids: list[int], tail: list[int] | None) -> bool:
    return not tail or ids[-len(tail):] == tail
