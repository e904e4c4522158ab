"""A request's capture, logit lens and interventions checked against the model, once.

`resolve(capture, logit_lens, interventions, shape, num_positions)` checks the parsed asks
(`workbench.inside.spec`) against the model (`ModelShape`: its layers, widths, which sites its
layers have, the server's capture limit and steering vectors), expands layers and site names,
reads vectors into float32 tensors and digests the interventions for the prefix cache: an
`Inside`, what every later stage reads (the engine's recording and step, the validation report).
`SamplingParams.resolve_inside` calls it and keeps the result on the params, so a request is
resolved once however many stages look (over HTTP: the serving layer, then the engine). Refusals
name the request field (`capture.sites`, `logit_lens.token_ids`, `interventions[0].vector`, ...).
"""

from __future__ import annotations

import hashlib
import importlib
import json
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import refuse
from workbench.inside.positions import Positions
from workbench.inside.sites import parse_site, site_name, split_name, split_sae_name
from workbench.inside.spec import CaptureParams, FeaturesParams, Intervention, LogitLensParams
from workbench.inside.vectors import to_tensor


@dataclass(frozen=True)
class ModelShape:
    """What resolution needs to know of the model (the engine builds it once)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    head_dim: int
    vocab_size: int
    missing_sites: dict[str, str] = field(default_factory=dict)  # site -> why this model has none
    max_capture_bytes: int = 256 << 20  # a request's capture and lens at most (a server flag)
    steering_vectors: dict[str, Any] = field(default_factory=dict)  # name -> [hidden] tensor
    saes: dict[str, Any] = field(default_factory=dict)  # name -> `SparseAutoencoder` (loaded)


@dataclass
class ResolvedCapture:
    """A capture for this model: the full names it answers; `saes`: those of them inside an
    SAE spliced at a site (name -> (the SAE, its hook: `acts_post`, `recons`, ...)), computed
    from the site's rows (a transcoder's: its input hook's and output hook's), which it records
    (`recorded`) whether asked for or not; `sparse`: their features as sparse tensors."""

    names: list[str]
    positions: Positions
    reduce: str | None
    heads: list[int] | None
    saes: dict[str, tuple[Any, str]] = field(default_factory=dict)
    sparse: bool = False

    @property
    def recorded(self) -> list[str]:
        """The model's sites whose rows the engine records for it."""
        return list(dict.fromkeys([*(n for n in self.names if n not in self.saes),
                                   *(h for sae, _ in self.saes.values()
                                     for h in (sae.hook_name, sae.hook_name_out) if h)]))

    def to_json(self) -> dict[str, Any]:
        out = {"sites": list(self.names), "positions": self.positions.to_json(),
               "reduce": self.reduce, "heads": self.heads}
        if self.sparse:
            out["sparse"] = True
        if self.saes:
            out["saes"] = sorted({sae.name for sae, _ in self.saes.values()})
        return out


@dataclass
class ResolvedLens:
    """A logit lens for this model: its layers, each in [0, num_layers)."""

    layers: list[int]
    top_k: int
    positions: Positions
    token_ids: list[int]

    def to_json(self) -> dict[str, Any]:
        return {"layers": list(self.layers), "top_k": self.top_k,
                "positions": self.positions.to_json(), "token_ids": list(self.token_ids)}


@dataclass
class ResolvedFeatures:
    """Features to read for this model: its SAE (`workbench.features.sae.SparseAutoencoder`),
    read at the SAE's hook, `site` of `layer`."""

    sae: Any
    top_k: int
    indices: list[int]
    positions: Positions

    @property
    def site(self) -> str:
        return self.sae.site

    @property
    def layer(self) -> int:
        return self.sae.layer

    def to_json(self) -> dict[str, Any]:
        return {"sae": self.sae.name, "hook_name": self.sae.hook_name, "top_k": self.top_k,
                "indices": list(self.indices), "positions": self.positions.to_json()}


@dataclass
class ResolvedIntervention:
    """An intervention for this model: its layer in [0, num_layers), its vector a float32
    tensor ([W], or [P, W] for a list of P positions) or None."""

    site: str
    layer: int
    op: str
    vector: Any
    name: str | None
    scale: float
    positions: Positions
    heads: list[int] | None
    feature: tuple[str, int] | None = None  # (SAE, index): op 'add': `vector` its W_dec row
    # op 'set' / 'zero' on a feature, or 'splice': its SAE (encode, edit or decode, write)
    sae: Any = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"site": site_name(self.site, self.layer), "op": self.op,
                               "positions": self.positions.to_json()}
        if self.feature is not None:
            out["feature"] = {"sae": self.feature[0], "index": self.feature[1]}
            if self.op == "set":
                out["value"] = self.scale
        elif self.op == "splice":
            out["sae"] = self.sae.name
        elif self.name is not None:
            out["name"] = self.name
        elif self.vector is not None:
            out["vector_shape"] = list(self.vector.shape)
        if self.op in ("add", "scale"):
            out["scale"] = self.scale
        if self.heads is not None:
            out["heads"] = self.heads
        return out


@dataclass(eq=False)
class Inside:
    """A request's resolved capture, logit lens and interventions (see the module docstring).
    Read-only once built: copies of the params share it (`copy.deepcopy` returns it)."""

    capture: ResolvedCapture | None
    logit_lens: ResolvedLens | None
    interventions: list[ResolvedIntervention]
    features: ResolvedFeatures | None
    shape: ModelShape  # what it was resolved against
    num_positions: int  # the longest sequence it was sized for
    nbytes: int  # what its capture and lens may record, at most
    key: str | None  # the interventions' digest (`interventions_key`); None without any
    stop_at_layer: int | None = None  # the forward ends before this layer, in [1, num_layers]

    @property
    def records(self) -> bool:
        """Whether it records anything (else it only intervenes)."""
        return self.capture is not None or self.logit_lens is not None or \
            self.features is not None

    @property
    def last_layer(self) -> int | None:
        """The deepest layer it reads or changes; None where it reads after the last layer
        (the final norm's output): what `stop_at_layer` may end a forward after."""
        layers = [layer for _, _, layer in _touched(self)]
        return None if None in layers else max(layers)  # type: ignore[type-var]

    def resolved_for(self, shape: ModelShape, num_positions: int) -> bool:
        return self.shape is shape and self.num_positions == num_positions

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.capture is not None:
            out["capture"] = self.capture.to_json()
        if self.logit_lens is not None:
            out["logit_lens"] = self.logit_lens.to_json()
        if self.interventions:
            out["interventions"] = [i.to_json() for i in self.interventions]
        if self.features is not None:
            out["features"] = self.features.to_json()
        return out

    def __deepcopy__(self, memo: dict) -> Inside:
        return self

    def __copy__(self) -> Inside:
        return self


def resolve(capture: CaptureParams | None, logit_lens: LogitLensParams | None,
            interventions: list[Intervention], shape: ModelShape, num_positions: int,
            features: FeaturesParams | None = None, stop_at_layer: int | None = None) -> Inside:
    """The request's asks for this model, sequences of at most `num_positions` (see the module
    docstring); refuses a capture and lens over `shape.max_capture_bytes` together, and, with
    `stop_at_layer`, anything at or after the layer the forward ends before."""
    size = 0
    resolved_capture = resolved_lens = resolved_features = None
    if features is not None:
        resolved_features, bytes_ = _features(features, shape, num_positions)
        size += bytes_
    if capture is not None:
        resolved_capture, bytes_ = _capture(capture, shape, num_positions)
        size += bytes_
    if logit_lens is not None:
        resolved_lens, bytes_ = _lens(logit_lens, shape, num_positions)
        size += bytes_
    if size > shape.max_capture_bytes:
        name = "capture" if capture is not None else "logit_lens"
        refuse(f"{name}: this request could record {size / 2**20:.1f} MiB "
               f"({num_positions} positions), more than the server's limit of "
               f"{shape.max_capture_bytes / 2**20:.0f} MiB (--max-capture-mb); ask for "
               "fewer sites, layers or positions, or a reduction.", name, size)
    changes = [_intervention(i, shape, index) for index, i in enumerate(interventions)]
    inside = Inside(resolved_capture, resolved_lens, changes, resolved_features, shape,
                    num_positions, size, interventions_key(changes) if changes else None)
    if stop_at_layer is not None:
        inside.stop_at_layer = _stop_at_layer(stop_at_layer, inside)
    return inside


def _touched(inside: Inside) -> list[tuple[str, str, int | None]]:
    """Every (request field, site, layer) the request reads or changes; layer None: after
    the last layer (the final norm's output)."""
    out: list[tuple[str, str, int | None]] = []
    if inside.capture is not None:
        for name in inside.capture.recorded:
            site, layer = split_name(name)
            out.append(("capture.sites", site, layer))
    if inside.logit_lens is not None:
        out += [("logit_lens.layers", "resid_post", layer) for layer in inside.logit_lens.layers]
    for index, i in enumerate(inside.interventions):
        out.append((f"interventions[{index}]", i.site, i.layer))
        if i.sae is not None and i.sae.transcoder:
            out.append((f"interventions[{index}]", i.sae.site, i.sae.layer))
    if inside.features is not None:
        out.append(("features.sae", inside.features.site, inside.features.layer))
        out.append(("features.sae", *inside.features.sae.writes))
    return out


def _stop_at_layer(stop: int, inside: Inside) -> int:
    """`stop_at_layer` for this model, in [1, num_layers] (negative: from the end, as
    TransformerLens's), after every layer the request reads or changes."""
    num_layers = inside.shape.num_layers
    resolved = stop + num_layers if stop < 0 else stop
    if not 1 <= resolved <= num_layers:
        refuse(f"stop_at_layer: {stop} is outside the model's {num_layers} layers (1 to "
               f"{num_layers}, or -{num_layers - 1} to -1 from the end).", "stop_at_layer", stop)
    for parameter, site, layer in _touched(inside):
        if layer is None or layer >= resolved:
            where = "after the last layer" if layer is None else f"at layer {layer}"
            refuse(f"{parameter}: {site_name(site, layer)} is {where}, which a forward that "
                   f"stops before layer {resolved} (stop_at_layer) never computes.",
                   parameter, site_name(site, layer))
    return resolved


def _sae(name: str, shape: ModelShape, parameter: str) -> Any:
    if name not in shape.saes:
        known = sorted(shape.saes) or "none (--sae NAME=PATH, LLM(saes=...), /v1/load_sae)"
        refuse(f"{parameter}: no SAE {name!r}; loaded: {known}.", parameter, name)
    return shape.saes[name]


def _features(features: FeaturesParams, shape: ModelShape, num_positions: int
              ) -> tuple[ResolvedFeatures, int]:
    sae = _sae(features.sae, shape, "features.sae")
    if features.top_k > sae.d_sae:
        refuse(f"features.top_k: {features.top_k} is more than the SAE's {sae.d_sae} features.",
               "features.top_k", features.top_k)
    bad = [i for i in features.indices if i >= sae.d_sae]
    if bad:
        refuse(f"features.indices: {bad} out of range: {features.sae!r} has {sae.d_sae} "
               "features.", "features.indices", bad)
    rows = features.positions.most(num_positions)
    return (ResolvedFeatures(sae, features.top_k, list(features.indices), features.positions),
            rows * (8 * features.top_k + 4 * len(features.indices) + 8))


def _layers(layers: list[int] | None, num_layers: int, parameter: str) -> list[int]:
    if layers is None:
        return list(range(num_layers))
    bad = [layer for layer in layers if not -num_layers <= layer < num_layers]
    if bad:
        refuse(f"{parameter}: layer(s) {bad} out of range: the model has {num_layers} layers "
               f"(0..{num_layers - 1}, or negative from the end).", parameter, bad)
    return sorted({layer % num_layers for layer in layers})


def _capture(capture: CaptureParams, shape: ModelShape, num_positions: int
             ) -> tuple[ResolvedCapture, int]:
    """Expands the sites to full names for this model; with the bytes it may take (float32,
    `num_positions` at most)."""
    layers = _layers(capture.layers, shape.num_layers, "capture.layers")
    names: list[str] = []
    saes: dict[str, tuple[Any, str]] = {}
    for given in capture.sites:
        inside_sae = split_sae_name(given)
        if inside_sae is not None:
            name = _sae_capture(given, inside_sae, shape)
            saes[name] = (_sae_at(inside_sae[0], shape, capture.sae), inside_sae[1])
            names.append(name)
            continue
        site, layer = parse_site(given, "capture.sites")
        if site == "z":
            refuse("capture.sites: hook_z is an intervention site only; capture attn_out or "
                   "hook_pattern.", "capture.sites", given)
        if site in shape.missing_sites:
            refuse(f"capture.sites: {site_name(site, layer or 0)} does not exist in this model: "
                   f"{shape.missing_sites[site]}.", "capture.sites", given)
        if layer is not None:
            _layers([layer], shape.num_layers, "capture.sites")
        over = [None] if site == "normalized" else \
            [layer % shape.num_layers] if layer is not None else layers
        names.extend(site_name(site, at) for at in over)
    names = list(dict.fromkeys(names))
    if capture.heads is not None and max(capture.heads) >= shape.num_heads:
        refuse(f"capture.heads: the model has {shape.num_heads} heads, got {capture.heads}.",
               "capture.heads", capture.heads)
    rows = 1 if capture.reduce else capture.positions.most(num_positions)
    heads = len(capture.heads) if capture.heads else shape.num_heads
    # bytes a row: 4 a value; a sparse row of a TopK SAE's features at most k (value, two
    # int64 indices), of another SAE's no more than dense (what its L0 will be is not known)
    widths = {name: 4 * sae.d_sae if hook in ("acts_pre", "acts_post") else
              4 * sae.d_in if hook == "input" else 4 * sae.d_out
              for name, (sae, hook) in saes.items()}
    if capture.sparse:
        widths.update({name: 20 * sae.k for name, (sae, hook) in saes.items()
                       if hook == "acts_post" and sae.k is not None})
    size = sum(4 * heads * rows * num_positions if name.endswith("hook_pattern")
               else rows * widths.get(name, 4 * shape.hidden_size) for name in names)
    return ResolvedCapture(names, capture.positions, capture.reduce,
                           None if capture.heads is None else list(capture.heads), saes,
                           capture.sparse), size


def _sae_capture(given: str, inside_sae: tuple[str, str], shape: ModelShape) -> str:
    """The full name of a capture site inside an SAE (its site given with its layer)."""
    site, layer = parse_site(inside_sae[0], "capture.sites")
    if layer is None:
        refuse(f"capture.sites: {given!r}: an SAE's hook names its site in full "
               "('blocks.6.hook_resid_post.hook_sae_acts_post').", "capture.sites", given)
    layer = _layers([layer], shape.num_layers, "capture.sites")[0]
    return f"{site_name(site, layer)}.hook_sae_{inside_sae[1]}"


def _sae_at(base: str, shape: ModelShape, name: str | None) -> Any:
    """The SAE spliced at the site `base` (a transcoder at the hook it writes, as SAELens names
    its hooks): the one loaded there, or the one `name`d (`capture.sae`); refused where none
    is, or several are and none is named."""
    site, layer = parse_site(base, "capture.sites")
    hook = site_name(site, (layer or 0) % shape.num_layers)
    if name is not None:
        sae = _sae(name, shape, "capture.sae")
        if (sae.hook_name_out or sae.hook_name) != hook:
            refuse(f"capture.sae: {name!r} is spliced at {sae.hook_name_out or sae.hook_name}, "
                   f"not {hook}.", "capture.sae", name)
        return sae
    found = [sae for sae in shape.saes.values() if (sae.hook_name_out or sae.hook_name) == hook]
    if len(found) != 1:
        what = "none is" if not found else f"{len(found)} are ({', '.join(s.name for s in found)})"
        refuse(f"capture.sites: an SAE's hook at {hook} needs one SAE loaded there; {what}: "
               "name one with capture.sae.", "capture.sites", base)
    return found[0]


def _lens(lens: LogitLensParams, shape: ModelShape, num_positions: int
          ) -> tuple[ResolvedLens, int]:
    layers = _layers(lens.layers, shape.num_layers, "logit_lens.layers")
    bad = [t for t in lens.token_ids if t >= shape.vocab_size]
    if bad:
        refuse(f"logit_lens.token_ids: {bad} out of the vocabulary of {shape.vocab_size}.",
               "logit_lens.token_ids", bad)
    cells = len(layers) * lens.positions.most(num_positions)
    return (ResolvedLens(layers, lens.top_k, lens.positions, list(lens.token_ids)),
            cells * (12 * lens.top_k + 12 * len(lens.token_ids)))


def _intervention(given: Intervention, shape: ModelShape, index: int) -> ResolvedIntervention:
    """Checks one intervention against the model; its vector read into a float32 tensor."""
    p = f"interventions[{index}]"
    if given.feature is not None:
        sae = _sae(given.feature[0], shape, f"{p}.feature.sae")
        if given.feature[1] >= sae.d_sae:
            refuse(f"{p}.feature.index: {given.feature[1]} out of range: {sae.name!r} has "
                   f"{sae.d_sae} features.", f"{p}.feature.index", given.feature[1])
        if given.op == "add":  # at the hook its decoder writes (a transcoder's output)
            return ResolvedIntervention(*sae.writes, "add", sae.weights["W_dec"][
                given.feature[1]].clone(), None, given.scale, given.positions, None,
                given.feature)
        return ResolvedIntervention(*sae.writes, given.op, None, None, given.scale,
                                    given.positions, None, given.feature, sae)
    if given.sae is not None:
        sae = _sae(given.sae, shape, f"{p}.sae")
        return ResolvedIntervention(*sae.writes, "splice", None, None, 1.0, given.positions,
                                    None, None, sae)
    layer = _layers([given.layer], shape.num_layers, f"{p}.layer")[0]
    if given.site in shape.missing_sites:
        refuse(f"{p}: {site_name(given.site, layer)} does not exist in this model: "
               f"{shape.missing_sites[given.site]}.", f"{p}.site", given.site)
    if given.heads is not None and max(given.heads) >= shape.num_heads:
        refuse(f"{p}.heads: the model has {shape.num_heads} heads, got {given.heads}.",
               f"{p}.heads", given.heads)
    width = shape.head_dim if given.site == "z" else shape.hidden_size
    vector = given.vector
    if given.name is not None:
        if given.name not in shape.steering_vectors:
            known = sorted(shape.steering_vectors) or "none (--steering-vectors)"
            refuse(f"{p}.name: no steering vector {given.name!r}; loaded: {known}.",
                   f"{p}.name", given.name)
        vector = shape.steering_vectors[given.name]
    if vector is not None:
        vector = _vector(vector, given, width, p)
    return ResolvedIntervention(given.site, layer, given.op, vector, given.name, given.scale,
                                given.positions, given.heads)


def _vector(value: Any, given: Intervention, width: int, p: str) -> Any:
    torch = importlib.import_module("torch")  # deferred, so importing this loads no torch
    vector = to_tensor(value, f"{p}.vector")
    rows = len(given.positions.items) if given.positions.kind == "list" else None
    if vector.dim() == 2 and given.op == "set" and rows is not None:
        ok = vector.shape == (rows, width)
    else:
        ok = vector.dim() == 1 and vector.shape[0] == width
    if not ok:
        per = f" or [{rows}, {width}] (one row per listed position)" if rows else ""
        refuse(f"{p}.vector must have shape [{width}]{per}, got {list(vector.shape)}.",
               f"{p}.vector", list(vector.shape))
    if not torch.isfinite(vector).all():
        refuse(f"{p}.vector must be finite.", f"{p}.vector", "non-finite")
    return vector


def interventions_key(interventions: list[ResolvedIntervention]) -> str:
    """A digest of what resolved interventions do (vectors included): equal keys, equal KV."""
    digest = hashlib.sha256()
    for intervention in interventions:
        digest.update(json.dumps(intervention.to_json(), sort_keys=True).encode())
        if intervention.vector is not None:
            digest.update(intervention.vector.numpy().tobytes())
        if intervention.sae is not None:  # a feature clamped or ablated: which load of its SAE
            digest.update(intervention.sae.key.encode())
    return digest.hexdigest()
