"""What a request asks to see or change inside the model: `CaptureParams`, `LogitLensParams`,
`Intervention`, by TransformerLens's hook names.

Sites are named as TransformerLens names them (`blocks.{l}.hook_resid_pre`, `hook_resid_mid`,
`hook_resid_post`, `hook_attn_out`, `hook_mlp_out`, `blocks.{l}.attn.hook_pattern`,
`blocks.{l}.attn.hook_z`, `ln_final.hook_normalized`) or by their short forms with `layers`.
Validation happens in two steps, as `SamplingParams`': the constructors check what the values
alone decide; `resolve(shape, ...)` checks them against the model (`ModelShape`: its layers,
widths, which sites its layers have) and expands layers. Both raise `ValidationError` naming
the request field (`capture`, `logit_lens`, `interventions[i].vector`, ...).

>>> CaptureParams.parse({"sites": ["resid_post"], "layers": [0, -1]}).sites
['resid_post']
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import refuse

# site -> what the engine records there (the table in docs/inside.md)
RESIDUAL_SITES = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
LAYER_SITES = (*RESIDUAL_SITES, "pattern")
CAPTURE_SITES = (*LAYER_SITES, "normalized")
INTERVENTION_SITES = (*RESIDUAL_SITES, "z")
OPS = ("add", "set", "scale", "zero")
REDUCTIONS = ("mean", "last")
MAX_INTERVENTIONS = 64
MAX_LENS_TOP_K = 20
MAX_LENS_TOKEN_IDS = 128


def site_name(site: str, layer: int | None) -> str:
    """The TransformerLens name of a site at a layer: ("resid_post", 3) ->
    'blocks.3.hook_resid_post'."""
    if site == "normalized":
        return "ln_final.hook_normalized"
    if site in ("pattern", "z"):
        return f"blocks.{layer}.attn.hook_{site}"
    return f"blocks.{layer}.hook_{site}"


def parse_site(name: Any, parameter: str) -> tuple[str, int | None]:
    """A site by its full name or short form -> (site, layer or None when not in the name)."""
    if not isinstance(name, str):
        refuse(f"{parameter}: a site is a string such as 'blocks.0.hook_resid_post', got "
               f"{type(name).__name__}.", parameter, name)
    short = name.removeprefix("hook_").removeprefix("attn.hook_")
    if name in ("ln_final.hook_normalized", "normalized", "ln_final"):
        return "normalized", None
    if short in CAPTURE_SITES or short == "z":
        return short, None
    parts = name.split(".")
    if len(parts) >= 3 and parts[0] == "blocks":
        try:
            layer = int(parts[1])
        except ValueError:
            layer = None
        rest = ".".join(parts[2:])
        site = rest.removeprefix("attn.hook_") if rest.startswith("attn.") \
            else rest.removeprefix("hook_")
        if layer is not None and (site in LAYER_SITES or site == "z") and (
                rest.startswith("attn.") == (site in ("pattern", "z"))):
            return site, layer
    known = ", ".join(f"blocks.{{l}}.hook_{s}" for s in RESIDUAL_SITES)
    refuse(f"{parameter}: unknown site {name!r}; sites are {known}, "
           "blocks.{l}.attn.hook_pattern, blocks.{l}.attn.hook_z, ln_final.hook_normalized "
           "(or their short forms: resid_post, pattern, ...)", parameter, name)


@dataclass(frozen=True)
class Positions:
    """Which token positions: 'all', 'prompt', 'generated', a range [start, stop) or a list."""

    kind: str = "all"  # all | prompt | generated | range | list
    start: int = 0
    stop: int | None = None
    items: tuple[int, ...] = ()

    @classmethod
    def parse(cls, value: Any, parameter: str, lists: bool = False) -> Positions:
        if value is None or value in ("all", "prompt", "generated"):
            return cls(value or "all")
        if isinstance(value, dict) and set(value) <= {"start", "stop"}:
            value = [value.get("start", 0), value.get("stop")]
        if isinstance(value, (list, tuple)) and len(value) == 2 and not lists and all(
                v is None or _is_int(v) for v in value):
            start, stop = value[0] or 0, value[1]
            if start < 0 or (stop is not None and stop <= start):
                refuse(f"{parameter}: a range [start, stop) needs 0 <= start < stop, got "
                       f"{list(value)}.", parameter, value)
            return cls("range", start, stop)
        if lists and isinstance(value, (list, tuple)) and value and all(
                _is_int(v) and v >= 0 for v in value):
            return cls("list", items=tuple(value))
        what = "'all', 'prompt', 'generated', [start, stop]" + (" or a list of positions"
                                                                 if lists else "")
        refuse(f"{parameter} must be {what}; got {value!r}.", parameter, value)

    def selects(self, position: int, num_prompt: int) -> bool:
        if self.kind == "all":
            return True
        if self.kind == "prompt":
            return position < num_prompt
        if self.kind == "generated":
            return position >= num_prompt
        if self.kind == "range":
            return position >= self.start and (self.stop is None or position < self.stop)
        return position in self.items

    def most(self, total: int) -> int:
        """An upper bound on how many positions of a sequence of `total` it selects."""
        if self.kind == "range":
            return max(0, min(total, self.stop or total) - self.start)
        if self.kind == "list":
            return len(self.items)
        return total

    def to_json(self) -> Any:
        if self.kind == "range":
            return [self.start, self.stop]
        if self.kind == "list":
            return list(self.items)
        return self.kind


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _layers(value: Any, parameter: str) -> list[int] | None:
    if value is None or value == "all":
        return None
    if _is_int(value):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value or not all(_is_int(v) for v in value):
        refuse(f"{parameter} must be 'all' or a non-empty list of layer indices, got {value!r}.",
               parameter, value)
    return list(value)


def _resolve_layers(layers: list[int] | None, num_layers: int, parameter: str) -> list[int]:
    if layers is None:
        return list(range(num_layers))
    bad = [layer for layer in layers if not -num_layers <= layer < num_layers]
    if bad:
        refuse(f"{parameter}: layer(s) {bad} out of range: the model has {num_layers} layers "
               f"(0..{num_layers - 1}, or negative from the end).", parameter, bad)
    return sorted({layer % num_layers for layer in layers})


@dataclass(frozen=True)
class ModelShape:
    """What validation needs to know of the model (the engine builds it once)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    head_dim: int
    vocab_size: int
    missing_sites: dict[str, str] = field(default_factory=dict)  # site -> why this model has none
    max_capture_bytes: int = 256 << 20  # a request's capture and lens at most (a server flag)
    steering_vectors: dict[str, Any] = field(default_factory=dict)  # name -> [hidden] tensor


@dataclass
class CaptureParams:
    """Activations to record for one request (TransformerLens names; module docstring).

    `sites` are short forms expanded over `layers` (None: every layer) or full names with their
    layer; `positions` which rows; `reduce` 'mean' or 'last' over them; `heads` of patterns.
    """

    sites: list[str]
    layers: list[int] | None = None
    positions: Positions = field(default_factory=Positions)
    reduce: str | None = None
    heads: list[int] | None = None
    names: list[str] = field(default_factory=list)  # resolved: the full names recorded

    @classmethod
    def parse(cls, value: Any) -> CaptureParams:
        """From a request's `capture`: a name, a list of names, or a dict of the fields."""
        p = "capture"
        if isinstance(value, CaptureParams):
            return value
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list):
            value = {"sites": value}
        if not isinstance(value, dict):
            refuse("capture must be a site name, a list of them, or an object with 'sites' "
                   "(and 'layers', 'positions', 'reduce', 'heads').", p, value)
        unknown = set(value) - {"sites", "layers", "positions", "reduce", "heads"}
        if unknown:
            refuse(f"capture: unknown field(s) {sorted(unknown)}; it takes sites, layers, "
                   "positions, reduce, heads.", p, sorted(unknown))
        sites = value.get("sites")
        if isinstance(sites, str):
            sites = [sites]
        if not isinstance(sites, list) or not sites:
            refuse("capture.sites must be a non-empty list of site names.", p, sites)
        for site in sites:
            parse_site(site, "capture")
        reduce = value.get("reduce")
        if reduce is not None and reduce not in REDUCTIONS:
            refuse(f"capture.reduce must be one of {list(REDUCTIONS)} or null, got {reduce!r}.",
                   p, reduce)
        heads = value.get("heads")
        if heads is not None and (not isinstance(heads, list) or not heads
                                  or not all(_is_int(h) and h >= 0 for h in heads)):
            refuse("capture.heads must be a non-empty list of head indices.", p, heads)
        return cls(list(sites), _layers(value.get("layers"), p),
                   Positions.parse(value.get("positions"), p), reduce, heads)

    def resolve(self, shape: ModelShape, num_positions: int, parameter: str = "capture") -> int:
        """Expands the sites to full names for this model; returns the bytes it may take
        (float32, `num_positions` at most) and refuses beyond `shape.max_capture_bytes`."""
        layers = _resolve_layers(self.layers, shape.num_layers, parameter)
        names: list[str] = []
        for given in self.sites:
            site, layer = parse_site(given, parameter)
            if site == "z":
                refuse("capture: hook_z is an intervention site only; capture attn_out or "
                       "hook_pattern.", parameter, given)
            if site in shape.missing_sites:
                refuse(f"capture: {site_name(site, layer or 0)} does not exist in this model: "
                       f"{shape.missing_sites[site]}.", parameter, given)
            if layer is not None:
                _resolve_layers([layer], shape.num_layers, parameter)
            over = [None] if site == "normalized" else \
                [layer % shape.num_layers] if layer is not None else layers
            names.extend(site_name(site, at) for at in over)
        self.names = list(dict.fromkeys(names))
        if self.heads is not None and max(self.heads) >= shape.num_heads:
            refuse(f"capture.heads: the model has {shape.num_heads} heads, got {self.heads}.",
                   parameter, self.heads)
        rows = 1 if self.reduce else self.positions.most(num_positions)
        heads = len(self.heads) if self.heads else shape.num_heads
        size = 0
        for name in self.names:
            pattern = name.endswith("hook_pattern")
            size += 4 * (heads * rows * num_positions if pattern else rows * shape.hidden_size)
        return size

    def to_json(self) -> dict[str, Any]:
        return {"sites": self.names or self.sites, "positions": self.positions.to_json(),
                "reduce": self.reduce, "heads": self.heads}


@dataclass
class LogitLensParams:
    """The top-k tokens of the residual stream after `layers` (through the final norm and the
    unembedding), at `positions`; `token_ids`: also their ranks and probabilities."""

    layers: list[int] | None = None
    top_k: int = 5
    positions: Positions = field(default_factory=Positions)
    token_ids: list[int] = field(default_factory=list)

    @classmethod
    def parse(cls, value: Any) -> LogitLensParams:
        p = "logit_lens"
        if isinstance(value, LogitLensParams):
            return value
        if value is True:
            value = {}
        if not isinstance(value, dict):
            refuse("logit_lens must be an object with 'layers', 'top_k', 'positions', "
                   "'token_ids' (or true).", p, value)
        unknown = set(value) - {"layers", "top_k", "positions", "token_ids"}
        if unknown:
            refuse(f"logit_lens: unknown field(s) {sorted(unknown)}; it takes layers, top_k, "
                   "positions, token_ids.", p, sorted(unknown))
        top_k = value.get("top_k", 5)
        if not _is_int(top_k) or not 1 <= top_k <= MAX_LENS_TOP_K:
            refuse(f"logit_lens.top_k must be an integer in [1, {MAX_LENS_TOP_K}], got "
                   f"{top_k!r}.", p, top_k)
        ids = value.get("token_ids") or []
        if not isinstance(ids, list) or len(ids) > MAX_LENS_TOKEN_IDS or not all(
                _is_int(t) and t >= 0 for t in ids):
            refuse(f"logit_lens.token_ids must be a list of at most {MAX_LENS_TOKEN_IDS} token "
                   "ids.", p, ids)
        return cls(_layers(value.get("layers"), p), top_k,
                   Positions.parse(value.get("positions"), p), list(dict.fromkeys(ids)))

    def resolve(self, shape: ModelShape, num_positions: int) -> int:
        self.layers = _resolve_layers(self.layers, shape.num_layers, "logit_lens")
        bad = [t for t in self.token_ids if t >= shape.vocab_size]
        if bad:
            refuse(f"logit_lens.token_ids: {bad} out of the vocabulary of {shape.vocab_size}.",
                   "logit_lens", bad)
        cells = len(self.layers) * self.positions.most(num_positions)
        return cells * (12 * self.top_k + 12 * len(self.token_ids))

    def to_json(self) -> dict[str, Any]:
        return {"layers": self.layers, "top_k": self.top_k,
                "positions": self.positions.to_json(), "token_ids": self.token_ids}


@dataclass
class Intervention:
    """One change to one site of one layer for this request's rows only.

    `op`: 'add' (`vector` or the named steering vector `name`, times `scale`), 'set' (replace by
    `vector`: [width], or [positions, width] for an explicit list of positions: patching),
    'scale' (multiply by `scale`), 'zero'. Site 'z' (`blocks.{l}.attn.hook_z`, each head's
    output before the output projection) takes `heads` and vectors of the head size: ablating
    heads is `{"site": "z", "op": "zero", "heads": [...]}`.
    """

    site: str
    layer: int
    op: str
    vector: Any = None  # a list, nested list, wire dict or tensor; resolved to a float32 tensor
    name: str | None = None
    scale: float = 1.0
    positions: Positions = field(default_factory=Positions)
    heads: list[int] | None = None

    @classmethod
    def parse(cls, value: Any, index: int) -> Intervention:
        p = f"interventions[{index}]"
        if isinstance(value, Intervention):
            return value
        if not isinstance(value, dict):
            refuse(f"{p} must be an object with site, layer, op.", p, value)
        unknown = set(value) - {"site", "layer", "op", "vector", "name", "scale", "positions",
                                "heads"}
        if unknown:
            refuse(f"{p}: unknown field(s) {sorted(unknown)}; an intervention takes site, "
                   "layer, op, vector, name, scale, positions, heads.", p, sorted(unknown))
        site, layer = parse_site(value.get("site"), f"{p}.site")
        if site not in INTERVENTION_SITES:
            refuse(f"{p}.site: {value.get('site')!r} cannot be intervened on; sites are "
                   f"{', '.join(INTERVENTION_SITES)}.", f"{p}.site", value.get("site"))
        given = value.get("layer")
        if given is not None and not _is_int(given):
            refuse(f"{p}.layer must be an integer.", f"{p}.layer", given)
        if layer is None:
            layer = given
        elif given is not None and given != layer:
            refuse(f"{p}: layer {given} differs from the site's {layer}.", f"{p}.layer", given)
        if layer is None:
            refuse(f"{p}.layer is required.", f"{p}.layer", None)
        op = value.get("op")
        if op not in OPS:
            refuse(f"{p}.op must be one of {list(OPS)}, got {op!r}.", f"{p}.op", op)
        vector, name = value.get("vector"), value.get("name")
        if op in ("add", "set") and (vector is None) == (name is None):
            refuse(f"{p}: op {op!r} takes exactly one of 'vector' or 'name'.", f"{p}.vector",
                   None)
        if op in ("scale", "zero") and (vector is not None or name is not None):
            refuse(f"{p}: op {op!r} takes no vector.", f"{p}.vector", "given")
        scale = value.get("scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(
                scale):
            refuse(f"{p}.scale must be a finite number.", f"{p}.scale", scale)
        heads = value.get("heads")
        if heads is not None and (site != "z" or not isinstance(heads, list) or not heads
                                  or not all(_is_int(h) and h >= 0 for h in heads)):
            refuse(f"{p}.heads: a non-empty list of head indices, for site 'z' only.",
                   f"{p}.heads", heads)
        return cls(site, layer, op, vector, name, float(scale),
                   Positions.parse(value.get("positions"), f"{p}.positions", lists=True), heads)

    def resolve(self, shape: ModelShape, index: int) -> None:
        """Checks it against the model; `vector` becomes a float32 tensor ([W] or [P, W])."""
        torch = importlib.import_module("torch")  # deferred, so importing this loads no torch

        p = f"interventions[{index}]"
        self.layer = _resolve_layers([self.layer], shape.num_layers, f"{p}.layer")[0]
        if self.site in shape.missing_sites:
            refuse(f"{p}: {site_name(self.site, self.layer)} does not exist in this model: "
                   f"{shape.missing_sites[self.site]}.", f"{p}.site", self.site)
        if self.heads is not None and max(self.heads) >= shape.num_heads:
            refuse(f"{p}.heads: the model has {shape.num_heads} heads, got {self.heads}.",
                   f"{p}.heads", self.heads)
        width = shape.head_dim if self.site == "z" else shape.hidden_size
        if self.name is not None:
            if self.name not in shape.steering_vectors:
                known = sorted(shape.steering_vectors) or "none (--steering-vectors)"
                refuse(f"{p}.name: no steering vector {self.name!r}; loaded: {known}.",
                       f"{p}.name", self.name)
            self.vector = shape.steering_vectors[self.name]
        if self.vector is None:
            return
        vector = _tensor(self.vector, f"{p}.vector", torch)
        rows = len(self.positions.items) if self.positions.kind == "list" else None
        if vector.dim() == 2 and self.op == "set" and rows is not None:
            ok = vector.shape == (rows, width)
        else:
            ok = vector.dim() == 1 and vector.shape[0] == width
        if not ok:
            per = f" or [{rows}, {width}] (one row per listed position)" if rows else ""
            refuse(f"{p}.vector must have shape [{width}]{per}, got {list(vector.shape)}.",
                   f"{p}.vector", list(vector.shape))
        if not torch.isfinite(vector).all():
            refuse(f"{p}.vector must be finite.", f"{p}.vector", "non-finite")
        self.vector = vector

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"site": site_name(self.site, self.layer), "op": self.op,
                               "positions": self.positions.to_json()}
        if self.name is not None:
            out["name"] = self.name
        elif self.vector is not None:
            out["vector_shape"] = list(getattr(self.vector, "shape", []))
        if self.op in ("add", "scale"):
            out["scale"] = self.scale
        if self.heads is not None:
            out["heads"] = self.heads
        return out


MAX_VECTOR_FLOATS = 1 << 22  # an inline vector at most (16 MiB of float32)


def _tensor(value: Any, parameter: str, torch: Any) -> Any:
    """A float32 tensor from a list, nested list, tensor, array or wire dict
    ({dtype, shape, data: base64 little-endian})."""
    if isinstance(value, dict):
        import numpy as np

        try:
            dtype = np.dtype(value["dtype"]).newbyteorder("<")
            data = base64.b64decode(value["data"], validate=True)
            shape = [int(s) for s in value["shape"]]
            if math.prod(shape) > MAX_VECTOR_FLOATS:
                raise ValueError("too large")
            array = np.frombuffer(data, dtype=dtype).reshape(shape)
        except (KeyError, TypeError, ValueError) as error:
            refuse(f"{parameter}: a tensor object is {{dtype, shape, data: base64}} ({error}).",
                   parameter, "tensor")
        return torch.tensor(array.astype(np.float32))
    try:
        tensor = torch.as_tensor(value, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as error:
        refuse(f"{parameter} must be a list of numbers ({error}).", parameter, "list")
    if tensor.numel() > MAX_VECTOR_FLOATS:
        refuse(f"{parameter}: at most {MAX_VECTOR_FLOATS} numbers.", parameter, tensor.numel())
    return tensor


def load_vector(path: str, width: int, parameter: str = "steering_vectors") -> Any:
    """One [width] float32 vector from a file: .pt (a tensor), .npy, .safetensors (its one
    tensor) or .json (a list of numbers); refused naming `parameter` otherwise."""
    torch = importlib.import_module("torch")  # deferred: only a server given vectors reads them

    try:
        if path.endswith(".npy"):
            import numpy as np

            value: Any = np.load(path)
        elif path.endswith(".safetensors"):
            from safetensors.torch import load_file

            tensors = load_file(path)
            if len(tensors) != 1:
                raise ValueError(f"it holds {len(tensors)} tensors, not one")
            value = next(iter(tensors.values()))
        elif path.endswith(".json"):
            with open(path) as f:
                value = json.load(f)
        else:
            value = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, ValueError, RuntimeError) as error:
        refuse(f"{parameter}: cannot read {path!r} ({error}).", parameter, path)
    vector = _tensor(value, parameter, torch).flatten()
    if vector.shape[0] != width or not torch.isfinite(vector).all():
        refuse(f"{parameter}: {path!r} must hold {width} finite numbers (the model's hidden "
               f"size), got {vector.shape[0]}.", parameter, path)
    return vector


def interventions_key(interventions: list[Intervention]) -> str:
    """A digest of what resolved interventions do (vectors included): equal keys, equal KV."""
    digest = hashlib.sha256()
    for intervention in interventions:
        digest.update(json.dumps(intervention.to_json(), sort_keys=True).encode())
        if intervention.vector is not None:
            digest.update(intervention.vector.numpy().tobytes())
    return digest.hexdigest()


@dataclass
class InsideParams:
    """A request's capture, logit lens and interventions together (`SamplingParams.inside`)."""

    capture: CaptureParams | None = None
    logit_lens: LogitLensParams | None = None
    interventions: list[Intervention] = field(default_factory=list)

    @classmethod
    def parse(cls, capture: Any = None, logit_lens: Any = None,
              interventions: Any = None) -> InsideParams | None:
        if capture is None and logit_lens is None and not interventions:
            return None
        if interventions is not None and not isinstance(interventions, list):
            refuse("interventions must be a list of objects.", "interventions", interventions)
        if len(interventions or []) > MAX_INTERVENTIONS:
            refuse(f"interventions: at most {MAX_INTERVENTIONS} per request.", "interventions",
                   len(interventions or []))
        return cls(None if capture is None else CaptureParams.parse(capture),
                   None if logit_lens is None else LogitLensParams.parse(logit_lens),
                   [Intervention.parse(v, i) for i, v in enumerate(interventions or [])])

    @property
    def records(self) -> bool:
        """Whether it records anything (else it only intervenes)."""
        return self.capture is not None or self.logit_lens is not None

    def resolve(self, shape: ModelShape, num_positions: int) -> None:
        size = 0
        if self.capture is not None:
            size += self.capture.resolve(shape, num_positions)
        if self.logit_lens is not None:
            size += self.logit_lens.resolve(shape, num_positions)
        if size > shape.max_capture_bytes:
            field_name = "capture" if self.capture is not None else "logit_lens"
            refuse(f"{field_name}: this request could record {size / 2**20:.1f} MiB "
                   f"({num_positions} positions), more than the server's limit of "
                   f"{shape.max_capture_bytes / 2**20:.0f} MiB (--max-capture-mb); ask for "
                   "fewer sites, layers or positions, or a reduction.", field_name, size)
        for i, intervention in enumerate(self.interventions):
            intervention.resolve(shape, i)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.capture is not None:
            out["capture"] = self.capture.to_json()
        if self.logit_lens is not None:
            out["logit_lens"] = self.logit_lens.to_json()
        if self.interventions:
            out["interventions"] = [i.to_json() for i in self.interventions]
        return out
