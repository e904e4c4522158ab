"""Runs one scheduled step through the model: packed tokens in, logits of the rows needed out.

The runner owns the KV cache tensors (one flat `[num_blocks * block_size, Hkv, D]` pair per
layer) and runs transformers' own base model (embeddings, positions, decoder layers, final
norm: where the family keeps them is `workbench/models/architectures.py`) on a single ragged
row of every scheduled token, then the LM head and what the family's causal LM does after it;
attention goes through `workbench.engine.step.attention.paged_attention`, the forward's context.
Logits are computed only for the rows that need them: each sequence's last computed token, and
prompt positions when prompt logprobs are asked. In every dtype the Q/K/V and gate/up
projections are fused and every projection runs on the kernel chosen once for this machine
(`engine/kernels/projections.py`, `engine/step/fusion.py`). A probe step at start-up (`probe`) records what each
layer's attention asks for (scaling, sliding window, soft-capping) and checks the lean loop
(`engine/step/decoder.py`): where it gives the base model's hidden states bit for bit (Llama,
Mistral, Qwen2), the layers run through it instead.

With `batch_invariant=True` a row's computation depends on its own tokens only: every
projection computes so that a row's bits never depend on the other rows
(`fusion.make_batch_invariant`: the "avx2" and "avx512bf16" kernels' invariant C products, every
row in one call; the other kernels in fixed tiles), every query token is attended alone
against its own context in one fixed order (`attention.QueryContexts`,
`c_attention.paged_attention`), decode steps go through the one C call with as many rows as
the invariant products take (any count on "avx2" and "avx512bf16"; the loop's bits), and the ops
between (norms, activations, rotary) are per row already. A request's tokens and logprobs
are then the same bits whatever shares its step, however its prompt is chunked, with or
without prefix-cache hits (`tests/engine/kernels/test_batch_invariant.py`); what cannot be made so is
refused at start-up (`check_batch_invariant`).
"""

from __future__ import annotations

import logging
import math
import mmap
from dataclasses import dataclass, field

import torch

from workbench.engine.kernels import c_products, projections
from workbench.engine.requests.scheduler import ScheduledSequence, SchedulerOutput
from workbench.engine.step import attention, attention_modules, inspection
from workbench.engine.step.attention import AttentionContext, PrefillChunk, QueryContexts
from workbench.engine.step.decoder import DecoderStack, rms_norm
from workbench.engine.step.fusion import fuse_projections, invariant_c_rows, make_batch_invariant
from workbench.engine.step.inspection import InspectedRows, StepInspector
from workbench.errors import ValidationError
from workbench.models.architectures import (
    apply_logits,
    architecture_of,
    head_size,
    kv_heads,
    module_at,
    refuse,
    sites_of,
    stray_layout_keys,
)
from workbench.models.loader import compute_dtype

logger = logging.getLogger(__name__)


PROBE_TOKENS = 5


@torch.inference_mode()
def probe(runner: ModelRunner, stack: DecoderStack | None, kv_shape: tuple[int, int]):
    """One prefill of a few seeded tokens through the base model: what each layer's attention
    asks for (`attention.LayerAttention` by layer), and whether `stack` (its C ops off) gives
    the same final hidden states bit for bit (so a family takes the lean loop by what its layers
    compute, not by its name)."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, runner.config.vocab_size, (1, PROBE_TOKENS), generator=generator)
    embeds = runner.embed(ids.to(runner.device))
    pos = torch.arange(PROBE_TOKENS, device=runner.device).unsqueeze(0)
    ctx = runner._probe_context(PROBE_TOKENS, kv_shape)
    try:
        reference = runner.forward(embeds, pos, ctx, lean=False)
    except Exception as error:  # transformers' own forward fails too: say which keys may
        stray = stray_layout_keys(runner.config)
        if not stray:
            raise
        raise refuse(runner.config, f"its forward fails ({error}) with config keys its "
                                    f"family's attention does not read: {', '.join(stray)}; "
                                    "remove them from config.json") from error
    assert ctx.probe is not None
    if len(ctx.probe) != len(runner.layers):  # it would compute without the cache
        raise refuse(runner.config, f"{len(runner.layers) - len(ctx.probe)} of its layers do not "
                                    "call transformers' attention interface")
    if stack is None:
        return dict(ctx.probe), False
    c_ops, stack.c_ops = stack.c_ops, False
    stack.windows = [ctx.probe[i].sliding_window for i in range(len(runner.layers))]
    stack.refresh()
    try:
        rope = runner.base.rotary_emb(embeds, position_ids=pos)
        lean = stack(embeds[0], rope[0][0], rope[1][0], runner._probe_context(
            PROBE_TOKENS, kv_shape))
        same = torch.equal(rms_norm(runner.base.norm, lean), reference[0])
    except Exception as error:  # a layer the loop cannot run: transformers' layers do
        logger.info("the lean decoder loop does not run this model (%s)", error)
        same = False
    finally:
        stack.c_ops = c_ops
        stack.refresh()  # its C layers again, with the windows the probe found
    if not same:
        logger.info("the lean decoder loop differs from %s's layers: they run as they are",
                    runner.arch.family)
    return dict(ctx.probe), same


def check_batch_invariant(model, kernel: projections.KernelChoice, layers) -> None:
    """Refuses (`ValidationError` naming batch_invariant) a model or machine that the
    batch-invariant engine cannot make bit-identical across batches: its attention is the C
    function's (`c_attention.paged_attention`: a CPU with AVX2 and a C compiler, head sizes it takes),
    and a mixture of experts' expert products run batched by expert."""
    config = model.config
    heads, (kv, head_dim) = config.num_attention_heads, kv_shape(config)
    why = None
    if kernel.device != "cpu":
        why = (f"it runs on the CPU (on {kernel.device}, vLLM's VLLM_BATCH_INVARIANT=1 is the "
               "GPU's)")
    elif not c_products.available():
        why = ("its attention is the C library's (a CPU with AVX2 and FMA and a C compiler; the "
               "log says what is missing)")
    elif head_dim % 8 or head_dim > 256 or heads % kv or heads // kv > 16:
        why = (f"its C attention takes head sizes that are multiples of 8 up to 256 and up to "
               f"16 query heads per KV head (this model: {heads} heads of {head_dim}, {kv} KV "
               "heads)")
    elif any("experts" in name.rsplit(".", 1)[-1] for name, _ in layers.named_modules()):
        why = ("its experts' products run batched by expert (how many rows each gets depends "
               "on the batch)")
    if why is not None:
        model_type = getattr(config, "model_type", None)
        raise ValidationError(f"batch_invariant=True (--batch-invariant) cannot hold for "
                              f"model_type {model_type!r}: {why}.",
                              parameter="batch_invariant", value=True)


@dataclass
class LogitRows:
    """Which logits rows belong to which scheduled sequence."""

    logits: torch.Tensor  # [R, V] float32
    last_row: dict[str, int]  # seq_id -> row of the logits of its last computed token
    prompt_rows: dict[str, tuple[int, int, int]]  # seq_id -> (first row, count, first position)
    hidden: torch.Tensor | None = None  # [R, H] final hidden states of the same rows (pooling)
    # seq_ids whose prompt this step completed and whose forward stops early: they end, no row
    stopped: list[str] = field(default_factory=list)


def kv_shape(config) -> tuple[int, int]:
    """(KV heads, head size) of a decoder's keys and values, from its config as its family's
    attention reads it (what sizes the cache's memory; the runner's probe step checks it
    against what the layers compute, and lays the cache out from that)."""
    return kv_heads(config), head_size(config)


def check_layout(config, layer_attention: dict[int, attention.LayerAttention]) -> tuple[int, int]:
    """The (KV heads, head size) every layer's keys have in the probe step, the cache's
    layout; refuses (naming the config key) a config whose KV layout or sliding window
    disagrees with what the layers compute, which the cache could not serve as transformers'
    `generate` does."""
    shapes = {a.kv_shape for a in layer_attention.values()}
    expected = kv_shape(config)
    if len(shapes) != 1 or shapes != {expected}:
        computed = ", ".join(f"{h} of size {d}" for h, d in sorted(shapes))
        keys = [f"{key}={config.__dict__[key]!r}" for key in (
            "num_key_value_heads", "num_kv_heads", "head_dim") if key in config.__dict__]
        raise refuse(config, f"its layers' keys have {computed} KV heads where its config "
                             f"({', '.join(keys) or 'num_attention_heads, hidden_size'}) says "
                             f"{expected[0]} of size {expected[1]}")
    window = getattr(config, "sliding_window", None)
    if window is not None:  # transformers' KV cache keeps each layer's as its config says
        types = getattr(config, "layer_types", None) or ["sliding_attention"] * len(
            layer_attention)
        cached = [window if kind == "sliding_attention" else None for kind in types]
        computed_windows = [layer_attention[i].sliding_window for i in range(len(cached))]
        if cached != computed_windows:
            raise refuse(config, f"its config's sliding_window={window!r} windows the layers' "
                                 f"KV cache in transformers' generate (by layer: {cached}) "
                                 f"where their attention applies {computed_windows} (a forward "
                                 "and a generate would disagree); remove the key from "
                                 "config.json if the family does not use it")
    layout = next(iter(shapes))
    return layout[0], layout[1]


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * math.prod(kv_shape(config)) * itemsize


def allocate_kv_caches(shape: tuple[int, ...], num_layers: int, dtype: torch.dtype,
                       device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, (K, V) zeros of `shape`. On CPU one anonymous memory map holds them all: the
    OS maps in a zeroed page when it is first written, so the cache takes resident memory as it
    fills (torch.zeros would write every page of it at start: 1 GB by default)."""
    if device.type != "cpu":
        return [(torch.zeros(shape, dtype=dtype, device=device),
                 torch.zeros(shape, dtype=dtype, device=device)) for _ in range(num_layers)]
    itemsize = torch.empty((), dtype=dtype).element_size()
    buffer = mmap.mmap(-1, 2 * num_layers * math.prod(shape) * itemsize)
    caches = torch.frombuffer(buffer, dtype=dtype).view(num_layers, 2, *shape)  # keeps buffer
    return [(caches[i, 0], caches[i, 1]) for i in range(num_layers)]


class ModelRunner:
    """Executes `SchedulerOutput`s on a causal LM from transformers; see the module docstring."""

    _lora = None

    @property
    def lora(self):
        """A `lora_manager.LoRAManager` when the engine serves adapters, else None."""
        return self._lora

    @lora.setter
    def lora(self, manager) -> None:
        self._lora = manager
        if self.stack is not None:  # its wrappers replaced the projections the loop calls
            self.stack.refresh()

    def __init__(self, model, num_blocks: int, block_size: int, kernel: str = "auto",
                 batch_invariant: bool = False, quantized: dict | None = None,
                 gguf_activations: str = "float32"):
        self.arch = architecture_of(model.config)  # refuses a family it cannot run exactly
        attention.register()
        model.set_attn_implementation(attention.ATTENTION_NAME)
        weight = next(model.parameters())
        dtype = compute_dtype(model)
        # `quantized`: GGUF blocks by parameter name (`dtype="gguf"`), multiplied by "gguf"
        # ("gguf_q8": `gguf_activations="q8"`, llama.cpp's int8 activations)
        self.kernel = projections.choose(dtype, weight.device.type, kernel,
                                     blocks=bool(quantized), activations=gguf_activations)
        logger.info("projections: %s", self.kernel.describe())
        if projections.emulated(dtype, weight.device.type):
            logger.warning("%s is emulated on this CPU (no AVX-512 BF16 or AMX): float32 "
                           "(dtype='auto') runs faster here", dtype)
        k_quants = sorted({w.kind for w in (quantized or {}).values() if w.kind.endswith("_K")})
        if self.kernel.kernel == "gguf" and k_quants:
            logger.info("the %s blocks meet float32 activations (exact to the dequantized "
                        "model); llama.cpp's arithmetic, gguf_activations='q8' "
                        "(--gguf-activations q8), runs K-quants about twice as fast",
                        "/".join(k_quants))
        self.layers = module_at(model, self.arch.layers)
        fuse_projections(model, self.kernel.kernel, self.layers, quantized)
        self.batch_invariant = batch_invariant
        if batch_invariant:
            check_batch_invariant(model, self.kernel, self.layers)
            # the projections without blocks on the float32 kernel, the blocks' own in tiles
            make_batch_invariant(model, projections.choose(dtype).kernel if quantized
                                 else self.kernel.kernel)
        if self.arch.attention is not None:  # attention computed in its module: our forward
            attention_modules.install(self.arch.attention, self.layers, model.config,
                                      module_at(model, self.arch.base))
        self.model = model
        self.base = module_at(model, self.arch.base)
        self.sites, self.missing_sites = sites_of(self.arch, model.config)
        self.embed = module_at(model, self.arch.embed)
        self.config = model.config
        self.block_size = block_size
        self.device = next(model.parameters()).device
        self.dtype = dtype
        cfg = self.config
        self._arange_block = torch.arange(block_size, device=self.device)
        # what each layer's attention asks for (scaling, window, softcap), and whether the
        # lean loop computes what the base model does, bit for bit: one probe step tells
        self.stack = None
        stack = DecoderStack(model, self.layers, c_ops=self.kernel.ops == "c",
                             one_call_rows=invariant_c_rows(model) if batch_invariant
                             else None) \
            if DecoderStack.supports(model, self.layers) else None
        self.layer_attention, stack_matches = probe(self, stack, kv_shape(cfg))
        # the cache laid out as the layers compute their keys (the config agrees, or refused)
        shape = (num_blocks * block_size, *check_layout(cfg, self.layer_attention))
        self.kv_caches = allocate_kv_caches(shape, cfg.num_hidden_layers, self.dtype, self.device)
        if stack is not None and stack_matches:
            self.stack = stack
        windows = [a.sliding_window for a in self.layer_attention.values()]
        # positions further back than every layer's window are never read again
        self.window: int | None = None
        if windows and all(w is not None for w in windows):
            self.window = max(w for w in windows if w is not None)

    # -- inputs -----------------------------------------------------------------------------
    def _slots(self, block_table: list[int], start: int, stop: int) -> torch.Tensor:
        """Cache slots of positions [start, stop) of a sequence."""
        bs = self.block_size
        first, last = start // bs, (stop - 1) // bs + 1
        # a released block (out of every layer's window) reads as block 0: masked, never used
        bt = torch.tensor(block_table[first:last], device=self.device).clamp_(min=0)
        slots = (bt.unsqueeze(1) * bs + self._arange_block).flatten()  # [(last - first) * bs]
        offset = start - first * bs
        return slots[offset:offset + stop - start]

    def _decode_span(self, decodes: list[ScheduledSequence]) -> tuple[int, int] | None:
        """(first slot, length) of a lone decode whose context lies in consecutive blocks."""
        if len(decodes) != 1:
            return None
        seq = decodes[0].seq
        length = seq.num_computed_tokens + 1
        table = seq.block_table[:-(-length // self.block_size)]
        if table[0] < 0 or table != list(range(table[0], table[0] + len(table))):
            return None
        return table[0] * self.block_size, length

    def _decode_context(self, decodes: list[ScheduledSequence]):
        """Padded slot table [B, Lmax], mask [B, Lmax] (None if no padding) and context lengths
        [B] of the decodes."""
        bs = self.block_size
        lengths = [s.seq.num_computed_tokens + 1 for s in decodes]
        max_blocks = -(-max(lengths) // bs)
        table = torch.zeros((len(decodes), max_blocks), dtype=torch.long)
        for i, s in enumerate(decodes):
            bt = s.seq.block_table[:max_blocks]
            table[i, :len(bt)] = torch.tensor(bt).clamp_(min=0)  # released: as `_slots`
        table = table.to(self.device)
        slots = (table.unsqueeze(2) * bs + self._arange_block).view(len(decodes), -1)
        lmax = max(lengths)
        slots = slots[:, :lmax]
        lens = torch.tensor(lengths, device=self.device)
        if min(lengths) == lmax:  # nothing padded (always so for a single sequence)
            return slots, None, lens, lmax
        mask = torch.arange(lmax, device=self.device).unsqueeze(0) < lens.unsqueeze(1)
        return slots, mask, lens, lmax

    def _prepare(self, scheduled: list[ScheduledSequence]):
        decodes = [s for s in scheduled if s.num_tokens == 1]
        prefills = [s for s in scheduled if s.num_tokens > 1]
        ordered = decodes + prefills
        ids, positions, slot_parts, chunks = [], [], [], []
        contexts: list[torch.Tensor] = []  # the batch-invariant attention's: each context
        start = 0
        for s in ordered:
            seq, c, n = s.seq, s.seq.num_computed_tokens, s.num_tokens
            ids.extend(seq.token_ids[c:c + n])
            positions.append(torch.arange(c, c + n))
            if self.batch_invariant:
                contexts.append(self._slots(seq.block_table, 0, c + n))
            if n > 1:
                ctx_slots = contexts[-1] if self.batch_invariant else \
                    self._slots(seq.block_table, 0, c + n)
                slot_parts.append(ctx_slots[c:])
                mask = None
                if c > 0:  # query i sits at position c + i and sees keys 0 .. c + i
                    q_pos = torch.arange(c, c + n, device=self.device).unsqueeze(1)
                    mask = torch.arange(c + n, device=self.device).unsqueeze(0) <= q_pos
                chunks.append(PrefillChunk(start, n, ctx_slots, mask))
            else:
                slot_parts.append(self._slots(seq.block_table, c, c + 1))
            start += n
        decode_slots = decode_mask = decode_lengths = None
        max_decode = 0
        if decodes:
            decode_slots, decode_mask, decode_lengths, max_decode = self._decode_context(decodes)
        ctx = AttentionContext(
            slot_mapping=torch.cat(slot_parts),
            num_decode=len(decodes),
            decode_slots=decode_slots,
            decode_mask=decode_mask,
            prefills=chunks,
            kv_caches=self.kv_caches,
            decode_span=self._decode_span(decodes),
            decode_lengths=decode_lengths,
            max_decode_length=max_decode,
            c_attention=self.kernel.ops == "c",
        )
        input_ids = torch.tensor(ids, device=self.device)
        pos = torch.cat(positions).to(self.device)
        if self.batch_invariant:
            ctx.queries = self._query_contexts(ordered, contexts, pos)
        return ordered, input_ids, pos, ctx

    def _query_contexts(self, ordered: list[ScheduledSequence], contexts: list[torch.Tensor],
                        pos: torch.Tensor) -> QueryContexts:
        """Where each packed token's context lies (the batch-invariant attention's): its
        sequence's run of slots, as long as its position + 1."""
        sizes = torch.tensor([len(c) for c in contexts])
        first = torch.cumsum(sizes, 0) - sizes  # where each sequence's slots start
        counts = torch.tensor([s.num_tokens for s in ordered])
        lengths = pos + 1
        return QueryContexts(torch.cat(contexts), first.repeat_interleave(counts), lengths,
                             int(sizes.max()))

    # -- execution --------------------------------------------------------------------------
    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        bs = self.block_size
        for src, dst in copies:
            for k, v in self.kv_caches:
                k[dst * bs:(dst + 1) * bs] = k[src * bs:(src + 1) * bs]
                v[dst * bs:(dst + 1) * bs] = v[src * bs:(src + 1) * bs]

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> LogitRows:
        self.copy_blocks(out.block_copies)
        ordered, input_ids, pos, ctx = self._prepare(out.scheduled)
        ctx.inspector = self._inspector(ordered)
        stop = self._stop_at_layer(ordered)
        embeds = self.embed(input_ids.unsqueeze(0))  # [1, T, H]
        self._splice_prompt_embeds(embeds, ordered)
        if self.lora is not None:  # which rows use which adapter, for the LoRA layers
            self.lora.begin_step(ordered)
        try:
            if ctx.inspector is None:
                hidden = self.forward(embeds, pos.unsqueeze(0), ctx)
            else:
                hidden = self._inspected_forward(embeds, pos.unsqueeze(0), ctx, ctx.inspector,
                                                 stop)
        finally:
            if self.lora is not None:
                self.lora.end_step()
        rows, last_row, prompt_rows, stopped = self._select_rows(ordered)
        if stop is not None:  # every request of the step ends early: no row has logits
            return LogitRows(hidden.new_empty(0, 0, dtype=torch.float32), {}, {}, None, stopped)
        hidden = hidden[0, rows]  # [R, H]
        if self.stack is not None:  # the lean loop leaves the final norm to the rows needed
            hidden = rms_norm(self.base.norm, hidden)
        return LogitRows(self.logits(hidden), last_row, prompt_rows, hidden, stopped)

    @staticmethod
    def _stop_at_layer(ordered: list[ScheduledSequence]) -> int | None:
        """The layer the step's forward can end before: where every request of the step stops
        early (`SamplingParams.stop_at_layer`), the deepest of theirs; else None (all layers:
        those requests' rows take no logits all the same)."""
        stops = [s.seq.request.stop_at_layer for s in ordered]
        return None if None in stops else max(stops)  # type: ignore[type-var]

    def _inspector(self, ordered: list[ScheduledSequence]) -> StepInspector | None:
        """The step's `StepInspector` when a scheduled request records or intervenes."""
        rows, start = [], 0
        for s in ordered:
            seq, c, n = s.seq, s.seq.num_computed_tokens, s.num_tokens
            inside = seq.request.inside
            if inside is not None:
                rows.append(InspectedRows(seq.request.recording, inside, start, n, c,
                                          seq.num_prompt_tokens,
                                          self._slots(seq.block_table, 0, c + n)))
            start += n
        if not rows:
            return None
        return StepInspector(rows, self.config.num_attention_heads, kv_shape(self.config)[1])

    def _inspected_forward(self, embeds: torch.Tensor, pos: torch.Tensor,
                           ctx: AttentionContext, inspector: StepInspector,
                           stop: int | None = None) -> torch.Tensor:
        """`forward` with the step's records and interventions: the lean loop calls them
        itself (never the one-call C step), transformers' layers through
        hooks; then the final norm's rows and the logit lens. With `stop`, the residual
        stream before layer `stop`, no later layer computed."""
        if self.stack is not None:
            rope = self.base.rotary_emb(embeds, position_ids=pos)
            hidden = self.stack(embeds[0], rope[0][0], rope[1][0], ctx, stop).unsqueeze(0)
            if inspector.wants("normalized", None):
                inspector.visit("normalized", None, rms_norm(self.base.norm, hidden[0]))
        else:
            with inspection.hooks(inspector, self.layers, self.base, self.sites):
                hidden = self.forward(embeds, pos, ctx, lean=False) if stop is None \
                    else self._forward_until(stop, embeds, pos, ctx)
        inspector.lens(self.unembed)
        inspector.features()
        return hidden

    def unembed(self, resid: torch.Tensor) -> torch.Tensor:
        """The residual stream after some layer [n, H] -> float32 logits [n, V], as after the
        last: the final norm, the LM head and the family's logits transform (the logit lens)."""
        normed = module_at(self.base, self.sites.final_norm)(resid)
        project_out = getattr(self.base, "project_out", None)  # OPT's, where it has one
        if project_out is not None:
            normed = project_out(normed)
        return self.logits(normed)

    def forward(self, embeds: torch.Tensor, pos: torch.Tensor, ctx: AttentionContext,
                lean: bool = True) -> torch.Tensor:
        """embeds [1, T, H] at positions pos [1, T] -> the last layer's hidden states [1, T, H]
        (after the final norm, except through the lean loop, which leaves it to the caller)."""
        if lean and self.stack is not None:
            rope = self.base.rotary_emb(embeds, position_ids=pos)
            return self.stack(embeds[0], rope[0][0], rope[1][0], ctx).unsqueeze(0)
        with attention.forward_context(ctx):
            return self.base(inputs_embeds=embeds, position_ids=pos,
                             use_cache=False).last_hidden_state

    def _forward_until(self, stop: int, embeds: torch.Tensor, pos: torch.Tensor,
                       ctx: AttentionContext) -> torch.Tensor:
        """transformers' forward ended by layer `stop - 1`'s output (after the step's own hooks
        on it, registered before): its hidden states [1, T, H]."""
        class Stopped(Exception):
            pass

        def end(module, args, output) -> None:
            raise Stopped(output[0] if isinstance(output, tuple) else output)

        handle = self.layers[stop - 1].register_forward_hook(end)
        try:
            self.forward(embeds, pos, ctx, lean=False)
        except Stopped as done:
            return done.args[0]
        finally:
            handle.remove()
        raise AssertionError(f"layer {stop - 1} was never reached")

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final hidden states [R, H] -> float32 logits [R, V], as the family's causal LM
        computes them (the LM head, then its soft-capping or scaling)."""
        return apply_logits(self.arch, self.config, self.model.lm_head(hidden)).float()

    def _probe_context(self, tokens: int, kv_shape: tuple[int, int]) -> AttentionContext:
        """A prefill of `tokens` positions over scratch KV caches (the probe step's)."""
        caches = [(torch.zeros(tokens, *kv_shape, dtype=self.dtype, device=self.device),
                   torch.zeros(tokens, *kv_shape, dtype=self.dtype, device=self.device))
                  for _ in self.layers]
        slots = torch.arange(tokens, device=self.device)
        return AttentionContext(slot_mapping=slots, num_decode=0, decode_slots=None,
                                decode_mask=None, prefills=[PrefillChunk(0, tokens, slots, None)],
                                kv_caches=caches, probe={})

    @staticmethod
    def _splice_prompt_embeds(hidden: torch.Tensor, ordered: list[ScheduledSequence]) -> None:
        """Prompt positions of a request given as embeddings take its rows, not the table's."""
        start = 0
        for s in ordered:
            seq, c, n = s.seq, s.seq.num_computed_tokens, s.num_tokens
            embeds = seq.request.prompt_embeds  # [P, H] on the CPU
            if embeds is not None and c < seq.num_prompt_tokens:
                stop = min(c + n, seq.num_prompt_tokens)
                hidden[0, start:start + stop - c] = embeds[c:stop].to(hidden.device, hidden.dtype)
            start += n

    @staticmethod
    def _select_rows(ordered: list[ScheduledSequence]):
        rows: list[int] = []
        last_row: dict[str, int] = {}
        prompt_rows: dict[str, tuple[int, int, int]] = {}
        stopped: list[str] = []  # requests that end early with their prompt: no row
        start = 0
        for s in ordered:
            seq, c, n = s.seq, s.seq.num_computed_tokens, s.num_tokens
            wants_prompt = (seq.request.params.prompt_logprobs is not None
                            and seq.index == 0 and c < seq.num_prompt_tokens - 1)
            if wants_prompt:  # positions c .. predict prompt tokens c + 1 ..
                count = min(c + n, seq.num_prompt_tokens - 1) - c
                prompt_rows[seq.seq_id] = (len(rows), count, c)
                rows.extend(range(start, start + count))
            if s.completes_tokens and seq.request.stop_at_layer is not None:
                stopped.append(seq.seq_id)
            elif s.completes_tokens:
                last_row[seq.seq_id] = len(rows)
                rows.append(start + n - 1)
            start += n
        return rows, last_row, prompt_rows, stopped
