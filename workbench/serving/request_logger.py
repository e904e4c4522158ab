"""`--enable-log-requests`: one log line per request in, one per request out."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("workbench.requests")


class RequestLogger:
    """Logs prompts (cut to `max_log_len` characters / tokens) and outputs."""

    def __init__(self, max_log_len: int | None = None):
        self.max_log_len = max_log_len

    def _cut(self, value: Any) -> Any:
        if self.max_log_len is None or value is None:
            return value
        return value[: self.max_log_len]

    def log_inputs(self, request_id: str, prompt: str | None, token_ids: list[int],
                   params: Any) -> None:
        logger.info("Received request %s: prompt: %r, prompt_token_ids: %s, params: %s",
                    request_id, self._cut(prompt), self._cut(token_ids), params)

    def log_outputs(self, request_id: str, texts: list[str], finish_reasons: list[Any]) -> None:
        logger.info("Finished request %s: outputs: %r, finish_reasons: %s", request_id,
                    [self._cut(t) for t in texts], finish_reasons)
