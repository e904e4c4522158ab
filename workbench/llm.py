"""`LLM`: the offline, synchronous API with vLLM's names (`generate`, `chat`, `beam_search`,
and the pooling calls `embed`, `classify`, `score`, `encode`), and ours: `score_text` /
`score_chat`, the logprob, rank and entropy of every token of a given text.

>>> from workbench import LLM, SamplingParams                        # doctest: +SKIP
>>> llm = LLM(model="smollm2-135m-instruct", dtype="float32")        # doctest: +SKIP
>>> llm.generate(["Once upon a time"], SamplingParams(max_tokens=8))[0].outputs[0].text  # doctest: +SKIP

Prompts are submitted together and the engine steps until all are done, so a list of prompts
is one continuously batched run. Outputs come back in the order of the prompts. When the engine
fails a request inside a step (the model's forward, the sampler, ...), the call raises
`EngineStepError` once all are done, naming each failed request and its cause; its `outputs`
are all of the call's, the failed ones with finish_reason "error" and `error` set.
"""

from __future__ import annotations

import itertools
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from tqdm.auto import tqdm

from workbench.config import EngineConfig
from workbench.engine.engine import LLMEngine
from workbench.engine.model_thread import on_model_thread
from workbench.engine.requests.beam_search import BeamSearchOutput
from workbench.engine.requests.outputs import (
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringRequestOutput,
)
from workbench.engine.step.pooling import bi_encoder_score, judgement_prompt, score_pairs
from workbench.errors import EngineStepError, ValidationError
from workbench.inspect import branch_tree as bt
from workbench.inspect.activations import with_views
from workbench.inspect.logprob_table import LogprobTable
from workbench.inspect.model_compare import ModelComparison
from workbench.inspect.output_views import llm_html, llm_repr
from workbench.inspect.scoring import ScoredSpan
from workbench.pooling_params import PoolingParams
from workbench.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams
from workbench.serving import compare as cmp
from workbench.serving.chat_template import ChatRenderer
from workbench.serving.protocol.chat import ChatMessageParam
from workbench.verbs.beams import BeamPlan
from workbench.verbs.branch import (
    Answer,
    BranchPlan,
    Continue,
    Probe,
    check_params,
    continuation_params,
    probe_params,
)
from workbench.verbs.compare import ComparePlan, offline_variant
from workbench.verbs.scores import ScorePlan, text_spans, turn_spans

_CONFIG_FIELDS = set(EngineConfig.__dataclass_fields__)
_REMEMBERED_PARAMS = 4096  # the sampling params of this many latest requests, for `branch`


class ModelTakenOverWarning(UserWarning):
    """`LLM(model=loaded)` took the loaded model over (see `LLM`)."""


class LLM:
    """An engine on one model, driven synchronously (see the module docstring).

    `model`: an alias, a directory, a .gguf file, or a model already loaded (`load_model`'s
    `LoadedModel`), which the engine then takes over, and says so (`ModelTakenOverWarning`):
    its projections become the kernels' own weights, each kept once in the layout its kernel
    reads (no second copy), so the object belongs to the engine from then on: it can no longer
    be saved or run as transformers' model. Save it or `copy.deepcopy` it first to keep
    yours."""

    def __init__(self, model: Any = "smollm2-135m-instruct", **kwargs: Any):
        unknown = set(kwargs) - _CONFIG_FIELDS
        if unknown:
            raise TypeError(f"LLM() got unexpected keyword arguments: {sorted(unknown)}; "
                            f"known: {sorted(_CONFIG_FIELDS)}")
        loaded = None
        if not isinstance(model, str):  # an already loaded model (workbench.models.LoadedModel)
            loaded, model = model, getattr(model, "served_name", "model")
            warnings.warn(f"LLM takes the loaded model {model!r} over: its projections become "
                          "the engine's kernels' weights (one copy each, in their layouts), so "
                          "the object belongs to the engine now and can no longer be saved or "
                          "run as transformers' model. Pass a copy (copy.deepcopy) to keep "
                          "yours.", ModelTakenOverWarning, stacklevel=2)
        self.config = EngineConfig(model=model, **kwargs)
        self.llm_engine = on_model_thread(LLMEngine, self.config, loaded)
        self._ids = itertools.count()
        self._params: OrderedDict[str, SamplingParams] = OrderedDict()  # request id -> params

    def load_sae(self, name: str, path: str) -> Any:
        """Loads the sparse autoencoder in the folder `path` (SAELens's format) as `name`: its
        features can then be read (`SamplingParams(features=...)`) and steered
        (`interventions=[{"feature": {"sae": name, "index": i}, "scale": s}]`). Refused,
        naming what is wrong, where it does not fit this model. Returns the
        `SparseAutoencoder`."""
        return on_model_thread(self.llm_engine.load_sae, name, path)

    def unload_sae(self, name: str) -> None:
        on_model_thread(self.llm_engine.unload_sae, name)

    @property
    def saes(self) -> dict[str, Any]:
        """The loaded SAEs by name."""
        shape = self.llm_engine.inputs.model_shape
        return dict(shape.saes) if shape is not None else {}

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def __repr__(self) -> str:
        return llm_repr(self)

    def _repr_html_(self) -> str:
        return llm_html(self)

    def generate(self, prompts: Any, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False, priority: list[int] | None = None,
                 lora_request: Any = None) -> list[RequestOutput]:
        """Generates for one prompt or a list (text, token ids, or {"prompt_token_ids": [...]}).

        `lora_request`: one `LoRARequest` for all prompts, or a list with one per prompt (None:
        the base model); needs `LLM(..., enable_lora=True)`.
        """
        prompts = _as_list(prompts)
        loras = _per_prompt(lora_request, len(prompts))
        params = sampling_params or SamplingParams()
        params = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"Got {len(params)} sampling params for {len(prompts)} prompts.")
        engine = self.llm_engine

        def adder(prompt, p: SamplingParams, prio: int, lora: Any):
            p = p.clone()
            p.output_kind = RequestOutputKind.FINAL_ONLY

            def add(rid: str, collect: Callable) -> Any:
                self._remember(rid, p)
                return engine.add_request(rid, prompt, p, priority=prio, lora_request=lora,
                                          on_output=collect)

            return add

        prios = priority or [0] * len(prompts)
        return self._drive([adder(*a) for a in zip(prompts, params, prios, loras)], "llm",
                           use_tqdm)

    def _remember(self, request_id: str, params: SamplingParams) -> None:
        self._params[request_id] = params
        while len(self._params) > _REMEMBERED_PARAMS:
            self._params.popitem(last=False)

    def branch(self, output: RequestOutput, position: int,
               tokens: int | Sequence[int] | None = None, top: int | None = None,
               params: SamplingParams | None = None, *, index: int = 0,
               use_tqdm: bool = False) -> bt.BranchTree:
        """What if generated token `position` of `output` had been another: the prompt and the
        tokens generated before `position`, then each forced token, then a continuation.

        `tokens`: the ids to force (one or a list); or `top=n`: the n best alternatives at that
        position from the output's own logprobs (where it has none, the model is asked for
        them first; refused where the position has fewer than n). The continuation uses the
        original request's sampling params (`params` to change them; what counts generated
        tokens, `max_tokens` and the penalties, counts from the token after the forced one;
        structured outputs are refused: their grammar would start afresh there), with at
        least `logprobs=0` so every branch has its tokens' logprobs; a forced token's own logprob is the output's where it returned
        it, else asked of the model at that position (`logprob_token_ids`). All branches run
        as one batch, their prompts' prefix served from the prefix cache (the original's
        blocks: `num_cached_tokens` of each branch). `index`: which completion of an `n > 1`
        output. Branches run with the original's LoRA adapter, if it had one. Returns a `BranchTree`
        whose branches carry their `RequestOutput`s (`tree.branches[i].output`).
        """
        tok = self.get_tokenizer()
        plan = BranchPlan.of(output, tok, position, index)
        base = check_params(params if params is not None
                            else self._params.get(output.request_id), output.request_id)
        plan = plan.forcing(tokens, top, self.llm_engine.vocab_size)
        lora_request = output.lora_request
        probe = plan.probe
        if probe is not None:  # no logprobs in the output: ask the model for the best
            cap = self.config.max_logprobs
            if cap != -1 and probe.logprobs > cap:
                raise ValidationError(f"top={top} asks the model for the {probe.logprobs} best "
                                      f"tokens at position {plan.position}, over this engine's "
                                      f"max_logprobs={cap}.", parameter="top", value=top)
            plan = plan.probed(self._answers([probe], None, lora_request, use_tqdm)[0])
        cont = continuation_params(base)
        answers = self._answers(plan.requests, cont, lora_request, use_tqdm)
        return plan.assemble(answers, cont.skip_special_tokens)

    def _answers(self, requests: list[Continue | Probe], cont: SamplingParams | None,
                 lora_request: Any, use_tqdm: bool) -> list[Answer]:
        """A branch plan's requests as one batch: each `Continue` with `cont`, each `Probe` one
        greedy token; their `Answer`s in order."""
        engine = self.llm_engine

        def adder(ask: Continue | Probe):
            p = probe_params(ask) if isinstance(ask, Probe) else cont
            assert p is not None, "a continuation needs its params"

            def add(rid: str, collect: Callable) -> Any:
                self._remember(rid, p)
                return engine.add_request(rid, {"prompt_token_ids": ask.prompt_token_ids}, p,
                                          lora_request=lora_request, on_output=collect)

            return add

        outs = self._drive([adder(a) for a in requests], "branch", use_tqdm)
        text = bt.token_texts(self.get_tokenizer())
        return [Answer(bt.path_of_output(o.outputs[0], text), o.num_cached_tokens, o)
                for o in outs]

    def beam_search(self, prompts: Any, params: BeamSearchParams, lora_request: Any = None,
                    use_tqdm: bool = False) -> list[BeamSearchOutput]:
        """Beam search over one prompt or a list, all batched in the same engine steps.

        Each result's `sequences` are best first (`tokens` = prompt + generated ids, `text` the
        generated text without EOS); `.tree` is the `BeamTree` of every candidate.
        `lora_request`: one for all prompts or a list with one per prompt.
        """
        plan = BeamPlan(_as_list(prompts), params)
        loras = _per_prompt(lora_request, len(plan.prompts))
        engine = self.llm_engine

        def adder(prompt, lora):
            return lambda rid, collect: engine.add_beam_request(rid, prompt, params,
                                                                lora_request=lora,
                                                                on_output=collect)

        outputs = self._drive([adder(*a) for a in zip(plan.prompts, loras)], "beam", use_tqdm,
                              steps=plan.steps)
        return plan.assemble(outputs)

    # -- pooling (engine/step/pooling.py) --------------------------------------------------------
    def encode(self, prompts: Any, pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
               truncate_prompt_tokens: int | None = None, use_tqdm: bool = False,
               pooling_task: str | None = None, priority: list[int] | None = None
               ) -> list[PoolingRequestOutput]:
        """Pools one prompt or a list, batched in the same engine steps; `pooling_task` (or the
        params' `task`, else the model's default) says what: embed, classify, score, encode."""
        prompts = _as_list(prompts)
        params = pooling_params or PoolingParams()
        params = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"Got {len(params)} pooling params for {len(prompts)} prompts.")
        params = [replace(p, task=pooling_task or p.task,
                          truncate_prompt_tokens=truncate_prompt_tokens or p.truncate_prompt_tokens)
                  for p in params]
        engine = self.llm_engine
        texts = [i for i, p in enumerate(prompts) if isinstance(p, str)]
        if texts:  # one batched call of the fast tokenizer, as add_pooling_request would
            ids = self.get_tokenizer()([prompts[i] for i in texts])["input_ids"]
            prompts = list(prompts)
            for i, token_ids in zip(texts, ids):
                prompts[i] = {"prompt": prompts[i], "prompt_token_ids": token_ids}

        def adder(prompt, p: PoolingParams, prio: int):
            return lambda rid, collect: engine.add_pooling_request(rid, prompt, p, priority=prio,
                                                                   on_output=collect)

        prios = priority or [0] * len(prompts)
        outs = self._drive([adder(*a) for a in zip(prompts, params, prios)], "pool", use_tqdm)
        failed = [o.request_id for o in outs if o.finish_reason != "stop"]
        if failed:
            raise RuntimeError(f"Pooling failed for requests {failed} (see the engine log).")
        return outs

    def embed(self, prompts: Any, pooling_params: PoolingParams | None = None,
              truncate_prompt_tokens: int | None = None, use_tqdm: bool = False
              ) -> list[EmbeddingRequestOutput]:
        """Embeddings of one prompt or a list (`.outputs.embedding`)."""
        outs = self.encode(prompts, pooling_params, truncate_prompt_tokens, use_tqdm, "embed")
        return [EmbeddingRequestOutput.from_base(o) for o in outs]

    def classify(self, prompts: Any, pooling_params: PoolingParams | None = None,
                 truncate_prompt_tokens: int | None = None, use_tqdm: bool = False
                 ) -> list[ClassificationRequestOutput]:
        """Label probabilities (`.outputs.probs`, in `llm_engine.classifier_labels` order) of one
        prompt or a list: the next-token preference of a generative model among its labels."""
        outs = self.encode(prompts, pooling_params, truncate_prompt_tokens, use_tqdm, "classify")
        return [ClassificationRequestOutput.from_base(o) for o in outs]

    def score(self, text_1: Any, text_2: Any, pooling_params: PoolingParams | None = None,
              truncate_prompt_tokens: int | None = None, use_tqdm: bool = False
              ) -> list[ScoringRequestOutput]:
        """Scores of (text_1, text_2) pairs, 1:1, 1:N or N:N (`.outputs.score`): the cosine of
        their embeddings on an embedding model; on a generative model the probability of the
        last label ("yes") for `judgement_prompt(query, document)`."""
        pairs = score_pairs(text_1, text_2)
        if self.llm_engine.is_pooling_model:
            unique = {repr(t): t for pair in pairs for t in pair}  # each text embedded once
            outs = self.encode(list(unique.values()), pooling_params, truncate_prompt_tokens,
                               use_tqdm, "score")
            by_key = dict(zip(unique, outs))
            return [ScoringRequestOutput.from_base(bi_encoder_score(by_key[repr(q)], by_key[repr(d)]))
                    for q, d in pairs]
        if not all(isinstance(t, str) for pair in pairs for t in pair):
            raise ValidationError("A generative model scores texts: they fill its judgement "
                                  "prompt (workbench.engine.step.pooling.judgement_prompt).",
                                  parameter="text_1")
        tok = self.get_tokenizer()
        prompts = [judgement_prompt(q, d, tok) for q, d in pairs]
        outs = self.encode(prompts, pooling_params, truncate_prompt_tokens, use_tqdm, "score")
        return [ScoringRequestOutput.from_base(o) for o in outs]

    # -- scoring given text (`workbench/inspect/scoring.py`) ---------------------------------
    def score_text(self, prompts: str | list[str], texts: str | list[str], logprobs: int = 0,
                   use_tqdm: bool = False, lora_request: Any = None) -> list[LogprobTable]:
        """Each text's tokens scored after its prompt (one prompt for all texts, or one per
        text), all batched in the same engine steps: a `LogprobTable` per text, its rows the
        text's tokens (logprob, rank, entropy of the whole distribution, margin; `logprobs`
        top alternatives each; `total_logprob`: the text's log-probability)."""
        tok = self.get_tokenizer()
        spans = text_spans(prompts, texts, lambda text, special: tok(
            text, add_special_tokens=special)["input_ids"])
        return self._score(ScorePlan(spans, logprobs), use_tqdm, lora_request)

    def score_chat(self, conversations: list[dict] | list[list[dict]], logprobs: int = 0,
                   use_tqdm: bool = False, chat_template: str | None = None,
                   chat_template_kwargs: dict | None = None, tools: list[dict] | None = None,
                   lora_request: Any = None) -> list[LogprobTable]:
        """The last message (the assistant's) of one conversation or each of a list scored
        given the messages before it, through the chat template: only the turn's tokens (its
        content and the template's end of turn), batched as `score_text`."""
        tok = self.get_tokenizer()
        renderer = ChatRenderer(tok, trust_request_chat_template=True)  # the caller's own template

        def ids(messages: list[dict], add_generation_prompt: bool) -> list[int]:
            rendered = renderer.render(
                [ChatMessageParam.model_validate(m) for m in messages],
                add_generation_prompt=add_generation_prompt, chat_template=chat_template,
                chat_template_kwargs=chat_template_kwargs, tools=tools)
            return tok(rendered.prompt, add_special_tokens=False)["input_ids"]

        spans = turn_spans(conversations, ids)
        return self._score(ScorePlan(spans, logprobs), use_tqdm, lora_request)

    def compare(self, prompt: str, text: str, variants: Sequence[Any],
                reference: int = 0, use_tqdm: bool = False) -> ModelComparison:
        """`text` after `prompt` teacher-forced through each variant in one batch, compared
        per token with the `reference` variant (`workbench/serving/compare.py`): each
        variant's logprob of the forced token, its difference to the reference's, and
        KL(reference || variant) over the whole vocabulary, exactly. A variant is None (the
        base model), a `LoRARequest`, or a dict with `lora_request`, `interventions` and
        `name` (its column; default the model's or adapter's name). Returns a
        `ModelComparison` (table, frame, plot, summary)."""
        ids, start = cmp.scored_ids(self.get_tokenizer(), prompt, text)
        return self._compare(ids, start, variants, reference, use_tqdm)

    def compare_chat(self, messages: list[dict], variants: Sequence[Any], reference: int = 0,
                     chat_template_kwargs: dict | None = None, use_tqdm: bool = False
                     ) -> ModelComparison:
        """`compare` on a conversation's last message (the assistant's), after the messages
        before it through the chat template: only the turn's tokens, as `score_chat`'s."""
        renderer = ChatRenderer(self.get_tokenizer(), trust_request_chat_template=True)
        ids, start = cmp.turn_ids(renderer, self.get_tokenizer(),
                                  [ChatMessageParam.model_validate(m) for m in messages],
                                  chat_template_kwargs)
        return self._compare(ids, start, variants, reference, use_tqdm)

    def _compare(self, ids: list[int], start: int, variants: Sequence[Any], reference: int,
                 use_tqdm: bool) -> ModelComparison:
        engine = self.llm_engine
        base = engine.served_model_name
        plan = ComparePlan.of([offline_variant(v, base) for v in variants],
                              ScoredSpan(ids, start), reference, base)

        def adder(p: SamplingParams, lora: Any):
            return lambda rid, collect: engine.add_request(
                rid, {"prompt_token_ids": ids}, p, lora_request=lora, on_output=collect)

        outs = self._drive([adder(p, v.lora_request) for p, v in
                            zip(plan.params(engine.vocab_size), plan.variants)],
                           "compare", use_tqdm)  # all queued before the first step
        return plan.assemble(outs, engine.outputs.texts)

    def _score(self, plan: ScorePlan, use_tqdm: bool, lora_request: Any) -> list[LogprobTable]:
        outs = self.generate(plan.prompts, plan.params, use_tqdm=use_tqdm,
                             lora_request=lora_request)
        return plan.assemble(outs, tokenizer=self.get_tokenizer())

    def _drive(self, adders: list[Callable[[str, Callable], Any]], kind: str,
               use_tqdm: bool, steps: int | None = None) -> list:
        """Submits one request per `adder(request_id, on_output)`, steps the engine until each
        has its final output, and returns those in order; on any error all are aborted. Raises
        `EngineStepError` (with every output) when the engine failed any of them.
        The progress bar counts finished requests, or with `steps` (beam searches, which
        report only at the end) engine steps of each unfinished request, up to `steps`."""
        engine = self.llm_engine
        ids: list[str] = []
        finals: dict[str, Any] = {}
        bar = _progress(steps or len(adders), use_tqdm,
                        "Beam search steps" if steps else "Processed prompts")

        def collect(out) -> None:
            if getattr(out, "finished", True):  # a beam search reports once, at the end
                finals[out.request_id] = out
                if not steps:
                    bar.update(1)

        try:
            for add in adders:
                rid = f"{kind}-{next(self._ids)}"
                add(rid, collect)
                ids.append(rid)
            live = len(ids)

            def more() -> bool:  # after each step, on the model thread
                nonlocal live
                if steps:
                    bar.update(min(live, steps - bar.n))
                live = len(ids) - len(finals)
                return live > 0

            while len(finals) < len(ids):
                engine.steps(more)  # another thread (serve_in_kernel) may be stepping too: fine
            if steps:
                bar.update(steps - bar.n)  # searches that ended early (EOS) fill the rest
        except BaseException:
            engine.abort_request(ids)
            engine.step()
            raise
        finally:
            bar.close()
        outputs = [with_views(finals[rid]) for rid in ids]  # activations' data as views
        errors = {rid: out.error for rid, out in zip(ids, outputs) if out.error is not None}
        if errors:
            raise EngineStepError(errors, outputs)
        return outputs

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | None = None, use_tqdm: bool = False,
             chat_template: str | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, chat_template_kwargs: dict | None = None,
             tools: list[dict] | None = None, lora_request: Any = None) -> list[RequestOutput]:
        """Applies the chat template to one conversation or a list of them, then generates
        (`lora_request` as in `generate`: one for all conversations or one per conversation).

        Rendering is the server's (`workbench.serving.chat_template`), so offline and HTTP
        prompts are the same tokens.
        """
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        if continue_final_message and add_generation_prompt:
            raise ValueError("Cannot set both `continue_final_message` and "
                             "`add_generation_prompt` to True.")
        tok = self.get_tokenizer()
        renderer = ChatRenderer(tok, trust_request_chat_template=True)  # the caller's own template
        prompts = []
        for conv in conversations:
            rendered = renderer.render(
                [ChatMessageParam.model_validate(m) for m in conv], add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, chat_template=chat_template,
                chat_template_kwargs=chat_template_kwargs, tools=tools)
            ids = tok(rendered.prompt, add_special_tokens=False)["input_ids"]
            prompts.append({"prompt": rendered.prompt, "prompt_token_ids": ids})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm,
                             lora_request=lora_request)


def _per_prompt(lora_request: Any, num_prompts: int) -> list:
    """One adapter (or None) for every prompt, or a list with one per prompt, as vLLM's."""
    if isinstance(lora_request, (list, tuple)):
        if len(lora_request) != num_prompts:
            raise ValueError("Lora request list should be the same length as the prompts")
        return list(lora_request)
    return [lora_request] * num_prompts


def _as_list(prompts: Any) -> list:
    """One prompt (text, token ids, or a dict) or a list of them -> a list."""
    if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
        return [prompts]
    return list(prompts)


class _NoBar:
    n = 0

    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, use_tqdm: Any, desc: str = "Processed prompts"):
    """No bar, tqdm's (a widget in a notebook, a line on a terminal), or, as vLLM's `use_tqdm`
    also takes, what a callable makes with tqdm's keyword arguments."""
    if callable(use_tqdm):
        return use_tqdm(total=total, desc=desc)
    if not use_tqdm:
        return _NoBar()
    return tqdm(total=total, desc=desc)
