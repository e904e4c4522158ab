"""Pooling: hidden states -> one vector per request, and what each task makes of it.

- Poolers over a packed row of several sequences (`pool_segments`): mean, CLS (first token),
  last token, max; an embedding model uses the one its sentence-transformers files name.
- `finish(params, hidden, logits, label_ids)`: the task's output from the pooled hidden state
  (and, on a generative model, the next-token logits of the last prompt token):
  embed = L2-normalized vector (`dimensions` cut first); encode = the vector as it is;
  classify = softmax over the logits of the label tokens (the reference's "classifier from
  token" technique: an LLM classifies by its next-token preference among label words);
  score = the probability of the last label ("yes" by default), or its log-odds raw.
- `judgement_prompt(query, document, tokenizer)`: the query/document relevance prompt a
  generative model scores (template below); `cosine` for bi-encoder scores.
- `pooling_request(...)`: tokenizes and checks a pooling prompt into an engine `Request`
  (inputs may use the whole context: up to max_model_len tokens).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workbench.engine.requests.outputs import PoolingOutput, PoolingRequestOutput
from workbench.engine.requests.request import Request
from workbench.errors import ValidationError
from workbench.pooling_params import PoolingParams
from workbench.sampling_params import SamplingParams

POOLING_MODES = ("mean", "cls", "last", "max")

# what the context-length refusal calls each task (the reference's operation names)
OPERATIONS = {"embed": "embedding generation", "encode": "embedding generation",
              "classify": "classification", "score": "score"}

JUDGEMENT_SYSTEM = ('Judge whether the Document meets the requirements based on the Query and '
                    'the Instruct provided. Note that the answer can only be "yes" or "no".')
JUDGEMENT_INSTRUCTION = "Given a search query, decide whether the document is relevant to it."


# -- poolers ---------------------------------------------------------------------------------
def pool_segments(hidden: torch.Tensor, lengths: list[int], mode: str) -> torch.Tensor:
    """hidden: [T, H], the packed tokens of len(lengths) sequences in order -> [B, H]
    (float32 for mean, hidden's dtype otherwise)."""
    device = hidden.device
    lens = torch.tensor(lengths, device=device)
    ends = lens.cumsum(0)  # [B]
    starts = ends - lens
    if mode == "cls":
        return hidden.index_select(0, starts)
    if mode == "last":
        return hidden.index_select(0, ends - 1)
    segment = torch.repeat_interleave(torch.arange(len(lengths), device=device), lens)  # [T]
    if mode == "mean":
        sums = hidden.new_zeros(len(lengths), hidden.shape[1], dtype=torch.float32)
        sums.index_add_(0, segment, hidden.float())
        return sums / lens.unsqueeze(1)  # float32: the mean of bf16 rows stays exact
    if mode == "max":
        out = hidden.new_full((len(lengths), hidden.shape[1]), float("-inf"))
        index = segment.unsqueeze(1).expand_as(hidden)
        return out.scatter_reduce(0, index, hidden, reduce="amax", include_self=True)
    raise ValueError(f"Unknown pooling {mode!r}; choose one of {POOLING_MODES}.")


def normalize(x: torch.Tensor) -> torch.Tensor:
    """L2 normalization over the last dimension (float32)."""
    return F.normalize(x.float(), p=2, dim=-1)


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of two vectors [D] (or rows [N, D]) -> [] (or [N])."""
    return F.cosine_similarity(a.float(), b.float(), dim=-1)


# -- label tokens ----------------------------------------------------------------------------
def label_token_ids(tokenizer, labels: tuple[str, ...]) -> list[int]:
    """One token id per label word; refuses labels that are not a single token."""
    if len(labels) < 2:
        raise ValidationError(f"classifier_labels needs at least two labels, got {list(labels)}.",
                              parameter="classifier_labels", value=list(labels))
    ids = []
    for label in labels:
        tokens = tokenizer(label, add_special_tokens=False)["input_ids"]
        if len(tokens) != 1:
            pieces = tokenizer.convert_ids_to_tokens(tokens)
            raise ValidationError(
                f"Classifier label {label!r} is {len(tokens)} tokens ({pieces}) for this "
                "tokenizer; each label must be exactly one token.",
                parameter="classifier_labels", value=label)
        ids.append(tokens[0])
    if len(set(ids)) != len(ids):
        raise ValidationError(f"classifier_labels {list(labels)} map to the same token.",
                              parameter="classifier_labels", value=list(labels))
    return ids


# -- the tasks -------------------------------------------------------------------------------
def finish(params: PoolingParams, hidden: torch.Tensor, logits: torch.Tensor | None,
           label_ids: list[int] | None) -> torch.Tensor:
    """The task's result [D] (float32, CPU) from a pooled hidden state [H] and, on a generative
    model, the next-token logits [V] of the last prompt token."""
    task = params.task
    if task in ("embed", "encode"):
        vec = hidden.float()
        if params.dimensions is not None:
            vec = vec[:params.dimensions]
        return (normalize(vec) if params.normalize else vec).cpu()
    if task == "score" and label_ids is None:  # a bi-encoder: the embedding; cosine comes later
        return (normalize(hidden) if params.use_activation else hidden.float()).cpu()
    if logits is None or label_ids is None:
        raise ValueError(f"Task {task!r} needs the label-token logits of a generative model.")
    chosen = logits.float()[label_ids]  # [K]
    if task == "classify":
        return (torch.softmax(chosen, -1) if params.use_activation else chosen).cpu()
    # score: P(last label) among the labels; raw: its log-odds (= l_yes - l_no for two labels)
    log_probs = torch.log_softmax(chosen, -1)
    if params.use_activation:
        return log_probs[-1:].exp().cpu()
    return (chosen[-1:] - torch.logsumexp(chosen[:-1], -1)).cpu()


def judgement_prompt(query: str, document: str, tokenizer=None,
                     instruction: str = JUDGEMENT_INSTRUCTION) -> str:
    """The relevance prompt a generative model scores: its next-token "yes" vs "no".

    With a tokenizer that has a chat template, a system message (`JUDGEMENT_SYSTEM`) and a user
    message "<Instruct>: {instruction}\\n<Query>: {query}\\n<Document>: {document}", rendered
    with the generation prompt (Qwen3-Reranker's layout); otherwise the same lines as plain
    text followed by "Answer (yes or no):".
    """
    user = f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": JUDGEMENT_SYSTEM},
                    {"role": "user", "content": user}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{JUDGEMENT_SYSTEM}\n{user}\nAnswer (yes or no):"


# -- requests --------------------------------------------------------------------------------
def pooling_request(inputs, request_id: str, prompt, params: PoolingParams, **request_kwargs
                    ) -> Request:
    """A checked pooling `Request` (`inputs`: the engine's `InputProcessor`; `params` verified).

    Its `SamplingParams` only tell the shared bookkeeping "one sequence, nothing sampled".
    """
    if isinstance(prompt, dict):
        if prompt.get("prompt_embeds") is not None:
            raise ValidationError("Pooling requests do not take prompt embeds.",
                                  parameter="prompt_embeds")
        if request_kwargs.get("cache_salt") is None and prompt.get("cache_salt") is not None:
            request_kwargs["cache_salt"] = prompt["cache_salt"]
    text, ids = inputs.tokenize(prompt)
    max_len = inputs.max_model_len
    keep = params.truncate_prompt_tokens
    if keep is not None:
        if keep > max_len:
            raise ValidationError(  # the reference's pooling wording
                "truncate_prompt_tokens value is greater than max_model_len. Please request a "
                "smaller truncation size.", parameter="truncate_prompt_tokens", value=keep)
        ids = ids[-(max_len if keep == -1 else keep):]
    if not ids:
        raise ValidationError("The prompt cannot be empty", parameter="prompt", value=ids)
    bad = next((t for t in ids if not isinstance(t, int) or not 0 <= t < inputs.vocab_size), None)
    if bad is not None:
        raise ValidationError(f"Token id {bad} is out of vocabulary", parameter="prompt", value=bad)
    if len(ids) > max_len:
        assert params.task is not None  # `verify` resolved it
        raise ValidationError(
            f"This model's maximum context length is {max_len} tokens. However, you requested "
            f"{len(ids)} tokens in the input for {OPERATIONS[params.task]}. Please reduce the "
            "length of the input.", parameter="input_tokens", value=len(ids))
    sp = SamplingParams(max_tokens=1, detokenize=False)
    return Request(request_id, text, ids, sp, pooling=params, **request_kwargs)


# -- scoring pairs ---------------------------------------------------------------------------
def score_pairs(text_1, text_2) -> list[tuple]:
    """(query, document) pairs of a score call: 1:1, 1:N or N:N, as the reference."""
    first = [text_1] if isinstance(text_1, (str, dict)) else list(text_1)
    second = [text_2] if isinstance(text_2, (str, dict)) else list(text_2)
    if not first:
        raise ValidationError("At least one text element must be given", parameter="text_1")
    if not second:
        raise ValidationError("At least one text_pair element must be given", parameter="text_2")
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise ValidationError("Input lengths must be either 1:1, 1:N or N:N", parameter="text_1",
                              value=(len(first), len(second)))
    return list(zip(first, second))


def bi_encoder_score(one, two):
    """The score of two embedding outputs (`PoolingRequestOutput`s): their cosine, as an output
    of its own (request id "a_b", both prompts' tokens, as the reference)."""
    reason = next((o.finish_reason for o in (one, two) if o.finish_reason != "stop"), "stop")
    data = (cosine(one.outputs.data, two.outputs.data).reshape(1) if reason == "stop"
            else torch.empty(0))
    return PoolingRequestOutput(f"{one.request_id}_{two.request_id}", PoolingOutput(data),
                                one.prompt_token_ids + two.prompt_token_ids,
                                one.num_cached_tokens + two.num_cached_tokens, True, reason)
