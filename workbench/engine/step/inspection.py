"""One step's view inside the model: records and interventions at TransformerLens's hook points,
on the rows of the requests that asked, and only those.

The runner builds a `StepInspector` for a step in which some scheduled request has a capture, a
logit lens or interventions (`Request.inside`, resolved); other steps run exactly as before. Each
hook point hands it the step's packed rows (`visit(site, layer, rows)`: `[T, W]`, or `[T, Hq, D]`
for `z`): it applies the interventions of the requests whose rows they are, in place and in
order, then copies the rows asked for into each request's `Recording` (so a capture sees what
the model went on with). Attention probabilities come from `attention.attend` (`pattern`),
recomputed for the asked query rows the way transformers' eager attention computes them.

Where the hook points are: transformers' layers get forward hooks on the modules the family's
`Sites` name, for the step (`hooks`); the lean decoder loop (`engine/step/decoder.py`) calls `visit`
between its operations itself. Rows of other requests are never written, so their results are
bit-identical to a step without inspection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from workbench.engine.kernels import c_products
from workbench.engine.requests.recording import FeatureCell, LensCell, Recording
from workbench.inside.resolve import Inside, ResolvedIntervention
from workbench.inside.sites import site_name, split_name
from workbench.models.architectures import Sites, module_at


@dataclass
class InspectedRows:
    """One scheduled sequence of an inspecting request: where its rows are this step."""

    recording: Recording | None  # None: it only intervenes
    inside: Inside
    start: int  # its first row in the packed step
    count: int  # its rows this step
    first: int  # the position of its first row
    num_prompt: int
    slots: torch.Tensor  # [first + count] cache slots of its whole context (patterns)

    def rows_of(self, selects: Callable[[int, int], bool]) -> list[int]:
        """Offsets (within its rows) of the positions `selects(position, num_prompt)`."""
        return [i for i in range(self.count) if selects(self.first + i, self.num_prompt)]


class StepInspector:
    """Records and interventions for one step (see the module docstring)."""

    def __init__(self, rows: list[InspectedRows], num_heads: int, head_dim: int):
        self.rows = rows
        self.num_heads, self.head_dim = num_heads, head_dim
        self.sites: set[tuple[str, int | None]] = set()  # every (site, layer) with work
        self.lens_layers: set[int] = set()
        self.pattern_layers: set[int] = set()
        self._lens_rows: dict[tuple[int, int], torch.Tensor] = {}  # (row index, layer) -> rows
        self._feature_rows: dict[int, torch.Tensor] = {}  # row index -> its rows at its SAE
        self._feature_out: dict[int, torch.Tensor] = {}  # ... at its transcoder's output hook
        # (row index, SAE load) -> a transcoder's input rows this step, for what it writes later
        self._inputs: dict[tuple[int, str], torch.Tensor] = {}
        for seq in rows:
            inside = seq.inside
            for i in inside.interventions:
                self.sites.add((i.site, i.layer))
                if i.sae is not None and i.sae.transcoder:
                    self.sites.add((i.sae.site, i.sae.layer))
            if inside.capture is not None:
                for name in inside.capture.recorded:
                    site, layer = split_name(name)
                    if site == "pattern":
                        assert layer is not None
                        self.pattern_layers.add(layer)
                    else:
                        self.sites.add((site, layer))
            if inside.logit_lens is not None:
                self.lens_layers.update(inside.logit_lens.layers)
                self.sites.update(("resid_post", layer) for layer in inside.logit_lens.layers)
            if inside.features is not None:
                self.sites.add((inside.features.site, inside.features.layer))
                self.sites.add(inside.features.sae.writes)

    def wants(self, site: str, layer: int | None) -> bool:
        return (site, layer) in self.sites

    def visit(self, site: str, layer: int | None, rows: torch.Tensor) -> list[int]:
        """Intervenes on, then records, the packed rows [T, ...] of a hook point; returns the
        rows it changed (of the packed step)."""
        if (site, layer) not in self.sites:
            return []
        changed: list[int] = []
        name = site_name(site, layer)
        for index, seq in enumerate(self.rows):
            mine = rows[seq.start:seq.start + seq.count]  # a view: written in place
            for intervention in seq.inside.interventions:
                if intervention.site == site and intervention.layer == layer:
                    x_in = None if intervention.sae is None or not intervention.sae.transcoder \
                        else self._inputs[(index, intervention.sae.key)]
                    changed.extend(seq.start + i for i in _apply(intervention, mine, seq, x_in))
            for intervention in seq.inside.interventions:  # a transcoder reads here, writes later
                sae = intervention.sae
                if sae is not None and sae.transcoder and (sae.site, sae.layer) == (site, layer):
                    self._inputs[(index, sae.key)] = mine.to(torch.float32, copy=True)
            if seq.recording is None:
                continue
            capture, lens = seq.inside.capture, seq.inside.logit_lens
            if capture is not None and name in capture.recorded:
                self._record(seq, name, mine, capture.positions.selects)
            if lens is not None and site == "resid_post" and layer in lens.layers:
                at = seq.rows_of(lens.positions.selects)
                if at:
                    self._lens_rows[(index, layer)] = mine[at].clone()
            features = seq.inside.features
            if features is not None and (site, layer) == (features.site, features.layer):
                at = seq.rows_of(features.positions.selects)
                if at:
                    self._feature_rows[index] = mine[at].to(torch.float32, copy=True)
            if features is not None and features.sae.transcoder and \
                    (site, layer) == features.sae.writes:
                at = seq.rows_of(features.positions.selects)
                if at:
                    self._feature_out[index] = mine[at].to(torch.float32, copy=True)
        return changed

    # -- SAE features -----------------------------------------------------------------------
    def features(self) -> None:
        """Encodes the recorded rows of every request that reads an SAE, one encoder product
        per SAE for all its requests' rows of the step, and records each position's top-k
        features, its named features' activations, its L0 and its reconstruction error norm."""
        by_sae: dict[int, list[int]] = {}
        for index in self._feature_rows:
            features = self.rows[index].inside.features
            assert features is not None
            by_sae.setdefault(id(features.sae), []).append(index)
        for indices in by_sae.values():
            sae = self.rows[indices[0]].inside.features.sae  # type: ignore[union-attr]
            x = torch.cat([self._feature_rows[i] for i in indices])
            k = max(self.rows[i].inside.features.top_k for i in indices)  # type: ignore[union-attr]
            read = _read_features(sae, x, k, torch.cat([self._feature_out[i] for i in indices])
                                  if sae.transcoder else x)
            start = 0
            for index in indices:
                seq, n = self.rows[index], self._feature_rows[index].shape[0]
                features = seq.inside.features
                assert features is not None and seq.recording is not None
                named = read.named(start, start + n, features.indices)
                for j, offset in enumerate(seq.rows_of(features.positions.selects)):
                    row = start + j
                    seq.recording.add_features(seq.first + offset, FeatureCell(
                        read.top_ids[row, :features.top_k], read.top_values[row, :features.top_k],
                        named[j], read.l0[row], read.errors[row]))
                start += n
        self._feature_rows.clear()
        self._feature_out.clear()
        self._inputs.clear()

    @staticmethod
    def _record(seq: InspectedRows, name: str, mine: torch.Tensor,
                selects: Callable[[int, int], bool]) -> None:
        at = seq.rows_of(selects)
        assert seq.recording is not None
        for i in at:  # consecutive runs are the common case: one copy each
            seq.recording.add(name, seq.first + i, mine[i:i + 1])

    # -- the logit lens ---------------------------------------------------------------------
    def lens(self, unembed: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Runs the recorded residual rows through `unembed` (final norm, LM head: [n, H] ->
        float32 logits [n, V]) and records each request's top-k and asked tokens' ranks."""
        for (index, layer), resid in self._lens_rows.items():
            seq = self.rows[index]
            lens = seq.inside.logit_lens
            assert lens is not None and seq.recording is not None
            logprobs = torch.log_softmax(unembed(resid), dim=-1)  # [n, V]
            top = logprobs.topk(lens.top_k, dim=-1)
            ids = torch.tensor(lens.token_ids, dtype=torch.long, device=logprobs.device)
            chosen = logprobs[:, ids]  # [n, T]
            ranks = (logprobs.unsqueeze(1) > chosen.unsqueeze(2)).sum(-1)  # [n, T]
            for j, offset in enumerate(seq.rows_of(lens.positions.selects)):
                seq.recording.add_lens(layer, seq.first + offset, LensCell(
                    top.indices[j].cpu(), top.values[j].exp().float().cpu(), ranks[j].cpu(),
                    chosen[j].exp().float().cpu()))
        self._lens_rows.clear()

    # -- attention patterns -----------------------------------------------------------------
    def pattern(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, scaling: float | None,
                window: int | None, softcap: float | None, bias: Callable | None) -> None:
        """Records the attention probabilities of the asked query rows of layer `layer`:
        q [T, Hq, D] (rotated), keys from the cache (written this step already); `bias`
        (ALiBi's: key positions [L] -> [Hq, L]) added to the scores."""
        if layer not in self.pattern_layers:
            return
        for seq in self.rows:
            capture = seq.inside.capture
            if capture is None or site_name("pattern", layer) not in capture.names:
                continue
            at = seq.rows_of(capture.positions.selects)
            if not at:
                continue
            heads = capture.heads or list(range(q.shape[1]))
            assert seq.recording is not None
            keys = k_cache.index_select(0, seq.slots).float()  # [L, Hkv, D]
            groups = q.shape[1] // keys.shape[1]
            kh = keys.repeat_interleave(groups, dim=1)[:, heads]  # [L, h, D]
            qs = q[seq.start:seq.start + seq.count][at][:, heads].float()  # [n, h, D]
            scores = torch.einsum("nhd,lhd->hnl", qs, kh) * (scaling or q.shape[-1] ** -0.5)
            if softcap is not None:
                scores = torch.tanh(scores / softcap) * softcap
            key_pos = torch.arange(keys.shape[0], device=q.device)
            if bias is not None:
                scores = scores + bias(key_pos)[heads].float()[:, None, :]
            q_pos = torch.tensor([seq.first + i for i in at], device=q.device)[:, None]
            allowed = key_pos[None, :] <= q_pos  # [n, L]
            if window is not None:
                allowed &= key_pos[None, :] > q_pos - window
            scores = scores.masked_fill(~allowed, float("-inf"))
            probs = torch.softmax(scores, dim=-1)  # [h, n, L]
            for j, i in enumerate(at):
                position = seq.first + i
                seq.recording.add_pattern(layer, position, probs[:, j, :position + 1])


def _apply(intervention: ResolvedIntervention, mine: torch.Tensor, seq: InspectedRows,
           x_in: torch.Tensor | None = None) -> list[int]:
    """Applies one intervention to a sequence's rows [n, W] (or [n, Hq, D] for z) in place;
    returns the offsets of the rows it changed. `x_in`: a transcoder's input hook's rows of
    this sequence this step (what it encodes)."""
    at = seq.rows_of(intervention.positions.selects)
    if not at:
        return at
    index = torch.tensor(at, device=mine.device)
    target = mine if intervention.heads is None else mine[:, intervention.heads]
    current = target.index_select(0, index)
    vector = intervention.vector
    if vector is not None:
        vector = vector.to(mine.device, torch.float32)
        if vector.dim() == 2:  # one row per listed position: the rows of those in this step
            listed = intervention.positions.items
            vector = vector[[listed.index(seq.first + i) for i in at]]
            if intervention.heads is not None or current.dim() == 3:
                vector = vector[:, None, :]
    op, scale = intervention.op, intervention.scale
    reads = None if x_in is None else x_in[at]
    if op == "splice":  # the SAE's reconstruction in place of the rows
        new = intervention.sae.output(current.float() if reads is None else reads)
    elif intervention.sae is not None:  # an SAE feature clamped ('set') or ablated ('zero')
        assert intervention.feature is not None
        new = intervention.sae.with_feature(current.float(), intervention.feature[1], scale,
                                            reads)
    elif op == "add":
        new = current.float() + scale * vector
    elif op == "set":
        new = torch.broadcast_to(vector, current.shape)
    elif op == "scale":
        new = current.float() * scale
    else:
        new = torch.zeros_like(current)
    new = new.to(mine.dtype)
    if intervention.heads is None:
        mine.index_copy_(0, index, new)
    else:
        for j, head in enumerate(intervention.heads):
            mine[:, head].index_copy_(0, index, new[:, j])
    return at


# -- hooks on transformers' own layers -------------------------------------------------------
def _first(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _output(output) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def _rows(t: torch.Tensor) -> torch.Tensor:
    """A module's [1, T, W] (one packed sequence) as [T, W], a view; [T, W] as it is (OPT's
    MLP runs on the batch flattened)."""
    return t[0] if t.dim() == 3 else t


def _pre_hook(inspector: StepInspector, site: str, layer: int | None):
    def hook(module, args, kwargs):
        inspector.visit(site, layer, _rows(_first(args, kwargs)))  # in place: returns nothing

    return hook


def _post_hook(inspector: StepInspector, site: str, layer: int | None):
    def hook(module, args, output):
        inspector.visit(site, layer, _rows(_output(output)))

    return hook


@contextmanager
def hooks(inspector: StepInspector, layers, base, sites: Sites) -> Iterator[None]:
    """Forward hooks on the modules of `sites` in each of `layers` for the step's work."""
    with ExitStack() as stack:
        def pre(module, site: str, layer: int | None) -> None:
            stack.callback(module.register_forward_pre_hook(
                _pre_hook(inspector, site, layer), with_kwargs=True).remove)

        def post(module, site: str, layer: int | None) -> None:
            stack.callback(module.register_forward_hook(
                _post_hook(inspector, site, layer)).remove)

        for i, layer in enumerate(layers):
            if inspector.wants("resid_pre", i):
                pre(layer, "resid_pre", i)
            if inspector.wants("resid_post", i):
                post(layer, "resid_post", i)
            for site, path in (("attn_out", sites.attn_out), ("mlp_out", sites.mlp_out)):
                if inspector.wants(site, i):
                    post(module_at(layer, path), site, i)
            if inspector.wants("resid_mid", i):
                assert sites.resid_mid is not None  # refused when validated otherwise
                pre(module_at(layer, sites.resid_mid), "resid_mid", i)
            if inspector.wants("z", i):
                stack.callback(module_at(layer, sites.z).register_forward_pre_hook(
                    lambda m, a, k, i=i: _visit_z(inspector, i, a, k), with_kwargs=True).remove)
        if inspector.wants("normalized", None):
            post(module_at(base, sites.final_norm), "normalized", None)
        yield


def _visit_z(inspector: StepInspector, layer: int, args: tuple, kwargs: dict):
    """z: the output projection's input [1, T, Hq * D] seen as [T, Hq, D]; a copy when it is
    not contiguous, handed on in its place."""
    z = _first(args, kwargs)
    contiguous = z if z.is_contiguous() else z.contiguous()
    inspector.visit("z", layer, contiguous[0].view(contiguous.shape[1], inspector.num_heads, -1))
    if contiguous is z:
        return None
    if args:
        return (contiguous, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": contiguous}


@dataclass
class _Read:
    """What one SAE read on a step's rows: each row's `k` most active features (ids and
    activations), L0 and reconstruction error norm; `named` the activations of given features."""

    top_ids: torch.Tensor  # [n, k]
    top_values: torch.Tensor
    l0: list[int]
    errors: list[float]
    named: Callable[[int, int, list[int]], torch.Tensor]  # rows [a, b), features -> [b-a, f]


def _read_features(sae: Any, x: torch.Tensor, k: int, out: torch.Tensor) -> _Read:
    """`sae` on rows x [n, d_in], one encoder product for all (the invariant C products);
    `out`: the rows of the hook it writes (x itself for an SAE), which the reconstruction
    error is of. A TopK SAE asked for at most its k features stays in its k (feature,
    activation) pairs a row: the same activations without scattering them into [n, d_sae] and
    searching that again."""
    linear = c_products.invariant_linear()
    if sae.architecture == "topk" and k <= sae.k:
        ids, values = sae.encode_top(x, linear)  # [n, sae.k]
        top_values, where = values.topk(k, dim=-1)

        def named(a: int, b: int, features: list[int]) -> torch.Tensor:
            if not features:  # most requests name none: no search a step
                return values.new_empty(b - a, 0)
            return torch.where(ids[a:b, :, None] == torch.tensor(features, dtype=torch.long),
                               values[a:b, :, None], 0.0).sum(dim=1)

        return _Read(ids.gather(-1, where), top_values, (values > 0).sum(-1).tolist(),
                     (out - sae.decode_top(ids, values, x)).norm(dim=-1).tolist(), named)
    acts = sae.encode(x, linear)  # [n, d_sae]
    top = acts.topk(k, dim=-1)  # once for all: each request takes its first top_k
    return _Read(top.indices, top.values, torch.count_nonzero(acts, dim=-1).tolist(),
                 (out - sae.output(x, acts)).norm(dim=-1).tolist(),
                 lambda a, b, features: acts[a:b, features])
