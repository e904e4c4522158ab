"""What a request asks to see or change inside the model, as given: `CaptureParams`,
`LogitLensParams`, `Intervention` (`SamplingParams.capture` / `logit_lens` / `interventions`).

Parsing checks what the values alone decide and refuses naming the exact field (`capture.sites`,
`logit_lens.top_k`, `interventions[1].positions`, ...); sites by `workbench.inside.sites`,
positions by `workbench.inside.positions`. Checking against a model, and expanding layers and
names, is `workbench.inside.resolve`'s, once per request.

>>> CaptureParams.parse({"sites": ["resid_post"], "layers": [0, -1]}).sites
['resid_post']
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import refuse
from workbench.inside.positions import Positions, parse_positions
from workbench.inside.sites import INTERVENTION_SITES, SAE_HOOKS, parse_site, split_sae_name

OPS = ("add", "set", "scale", "zero")
REDUCTIONS = ("mean", "last")
MAX_INTERVENTIONS = 64
MAX_LENS_TOP_K = 20
MAX_LENS_TOKEN_IDS = 128
MAX_FEATURE_INDICES = 256


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_layers(value: Any, parameter: str) -> list[int] | None:
    """'all' (or None) -> None; an index or a non-empty list of them -> the list."""
    if value is None or value == "all":
        return None
    if _is_int(value):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value or not all(_is_int(v) for v in value):
        refuse(f"{parameter} must be 'all' or a non-empty list of layer indices, got {value!r}.",
               parameter, value)
    return list(value)


@dataclass
class CaptureParams:
    """Activations to record for one request.

    `sites` are short forms expanded over `layers` (None: every layer) or full names with their
    layer; `positions` which rows (`workbench.inside.positions`); `reduce` 'mean' or 'last'
    over them; `heads` of patterns; `sparse`: an SAE's features (`.hook_sae_acts_post`) as
    sparse COO tensors rather than dense; `sae`: which loaded SAE an SAE's hook sites go
    through, where several are loaded at the hook.
    """

    sites: list[str]
    layers: list[int] | None = None
    positions: Positions = field(default_factory=Positions)
    reduce: str | None = None
    heads: list[int] | None = None
    sparse: bool = False
    sae: str | None = None

    def __post_init__(self) -> None:  # built by hand: positions in any accepted form
        self.positions = parse_positions(self.positions, "capture.positions")

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
                   "(and 'layers', 'positions', 'reduce', 'heads', 'sparse', 'sae').", p, value)
        unknown = set(value) - {"sites", "layers", "positions", "reduce", "heads", "sparse",
                                "sae"}
        if unknown:
            refuse(f"capture: unknown field(s) {sorted(unknown)}; it takes sites, layers, "
                   "positions, reduce, heads, sparse, sae.", p, sorted(unknown))
        sites = value.get("sites")
        if isinstance(sites, str):
            sites = [sites]
        if not isinstance(sites, list) or not sites:
            refuse("capture.sites must be a non-empty list of site names.", "capture.sites",
                   sites)
        for site in sites:
            sae = split_sae_name(site)
            if sae is None and isinstance(site, str) and ".hook_sae_" in site:
                refuse(f"capture.sites: {site!r}: an SAE's hook is one of "
                       f"{', '.join('hook_sae_' + h for h in SAE_HOOKS)}.", "capture.sites",
                       site)
            parse_site(sae[0] if sae else site, "capture.sites")
        reduce = value.get("reduce")
        if reduce is not None and reduce not in REDUCTIONS:
            refuse(f"capture.reduce must be one of {list(REDUCTIONS)} or null, got {reduce!r}.",
                   "capture.reduce", reduce)
        heads = value.get("heads")
        if heads is not None and (not isinstance(heads, list) or not heads
                                  or not all(_is_int(h) and h >= 0 for h in heads)):
            refuse("capture.heads must be a non-empty list of head indices.", "capture.heads",
                   heads)
        sparse = value.get("sparse", False)
        if not isinstance(sparse, bool):
            refuse("capture.sparse must be true or false.", "capture.sparse", sparse)
        if sparse and (reduce is not None or not any(
                (split_sae_name(s) or ("", ""))[1] == "acts_post" for s in sites)):
            refuse("capture.sparse: sparse is for an SAE's features (a '.hook_sae_acts_post' "
                   "site), per position (no reduce).", "capture.sparse", sparse)
        sae = value.get("sae")
        if sae is not None and (not isinstance(sae, str) or not any(
                split_sae_name(s) for s in sites)):
            refuse("capture.sae names the loaded SAE that '.hook_sae_*' sites go through.",
                   "capture.sae", sae)
        return cls(list(sites), parse_layers(value.get("layers"), "capture.layers"),
                   parse_positions(value.get("positions"), "capture.positions"), reduce, heads,
                   sparse, sae)


@dataclass
class LogitLensParams:
    """The top-k tokens of the residual stream after `layers` (through the final norm and the
    unembedding), at `positions`; `token_ids`: also their ranks and probabilities."""

    layers: list[int] | None = None
    top_k: int = 5
    positions: Positions = field(default_factory=Positions)
    token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.positions = parse_positions(self.positions, "logit_lens.positions")

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
                   f"{top_k!r}.", "logit_lens.top_k", top_k)
        ids = value.get("token_ids") or []
        if not isinstance(ids, list) or len(ids) > MAX_LENS_TOKEN_IDS or not all(
                _is_int(t) and t >= 0 for t in ids):
            refuse(f"logit_lens.token_ids must be a list of at most {MAX_LENS_TOKEN_IDS} token "
                   "ids.", "logit_lens.token_ids", ids)
        return cls(parse_layers(value.get("layers"), "logit_lens.layers"), top_k,
                   parse_positions(value.get("positions"), "logit_lens.positions"),
                   list(dict.fromkeys(ids)))


@dataclass
class Intervention:
    """One change to one site of one layer for this request's rows only.

    `op`: 'add' (`vector`, the named steering vector `name`, or an SAE feature's decoder
    direction `feature` = {"sae": name, "index": i}, times `scale`; a feature can also be
    'set' to an activation `value` or 'zero'ed: `_of_feature`), 'set' (replace by
    `vector`: [width], or [positions, width] for an explicit list of positions: patching),
    'scale' (multiply by `scale`), 'zero'; 'splice' with `sae` = a loaded SAE's name: the
    hook's rows replaced by the SAE's reconstruction of them (SAELens's spliced SAE without the
    error term; a transcoder's output written at its output hook: `_of_sae`). Site 'z' (`blocks.{l}.attn.hook_z`, each head's
    output before the output projection) takes `heads` and vectors of the head size: ablating
    heads is `{"site": "z", "op": "zero", "heads": [...]}`. `vector` is kept as given until
    the request is resolved (`workbench.inside.resolve`: a float32 tensor there).
    """

    site: str
    layer: int
    op: str
    vector: Any = None  # a list, nested list, wire dict or tensor
    name: str | None = None
    scale: float = 1.0
    positions: Positions = field(default_factory=Positions)
    heads: list[int] | None = None
    feature: tuple[str, int] | None = None  # (SAE name, feature index): add its W_dec row
    sae: str | None = None  # op 'splice': the SAE whose reconstruction replaces its hook's rows

    def __post_init__(self) -> None:
        self.positions = parse_positions(self.positions, "interventions[].positions")

    @classmethod
    def parse(cls, value: Any, index: int) -> Intervention:
        p = f"interventions[{index}]"
        if isinstance(value, Intervention):
            return value
        if not isinstance(value, dict):
            refuse(f"{p} must be an object with site, layer, op.", p, value)
        unknown = set(value) - {"site", "layer", "op", "vector", "name", "scale", "positions",
                                "heads", "feature", "value", "sae"}
        if unknown:
            refuse(f"{p}: unknown field(s) {sorted(unknown)}; an intervention takes site, "
                   "layer, op, vector, name, feature, sae, scale, positions, heads.", p,
                   sorted(unknown))
        if "sae" in value:
            return _of_sae(cls, value, p)
        feature = _feature(value.get("feature"), f"{p}.feature")
        if feature is not None:  # at its SAE's hook (site and layer: the SAE's, at resolve)
            return _of_feature(cls, value, feature, p)
        if "value" in value:
            refuse(f"{p}.value: only a feature's 'set' takes a value (a vector's is 'vector').",
                   f"{p}.value", value["value"])
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
            splice = " ('splice' names an SAE: {\"sae\": name, \"op\": \"splice\"})" \
                if op == "splice" else ""
            refuse(f"{p}.op must be one of {list(OPS)}{splice}, got {op!r}.", f"{p}.op", op)
        vector, name = value.get("vector"), value.get("name")
        if op in ("add", "set") and (vector is None) == (name is None):
            refuse(f"{p}: op {op!r} takes exactly one of 'vector' or 'name'.", f"{p}.vector",
                   None)
        if op in ("scale", "zero") and (vector is not None or name is not None):
            refuse(f"{p}: op {op!r} takes no vector.", f"{p}.vector", "given")
        scale = _scale(value, p)
        heads = value.get("heads")
        if heads is not None and (site != "z" or not isinstance(heads, list) or not heads
                                  or not all(_is_int(h) and h >= 0 for h in heads)):
            refuse(f"{p}.heads: a non-empty list of head indices, for site 'z' only.",
                   f"{p}.heads", heads)
        return cls(site, layer, op, vector, name, scale,
                   parse_positions(value.get("positions"), f"{p}.positions"), heads)


FEATURE_OPS = ("add", "set", "zero")  # steer by a feature's direction; clamp it; ablate it


def _of_feature(cls: type[Intervention], value: dict[str, Any], feature: tuple[str, int],
                p: str) -> Intervention:
    """An intervention on an SAE feature, at its SAE's hook: 'add' its decoder row times
    `scale`; 'set' its activation to `value` or 'zero' it (encode, edit, decode, plus the SAE's
    error, so everything not edited stays the model's)."""
    op = value.get("op", "add")
    if op not in FEATURE_OPS:
        refuse(f"{p}.op: a feature takes {list(FEATURE_OPS)}, got {op!r}.", f"{p}.op", op)
    given = sorted(set(value) & {"site", "layer", "vector", "name", "heads"})
    if given:
        refuse(f"{p}: a feature acts at its SAE's hook: leave out {', '.join(given)}.",
               f"{p}.feature", given)
    if op == "set":
        if "scale" in value:
            refuse(f"{p}: op 'set' on a feature takes 'value' (the activation to clamp it to), "
                   "not 'scale'.", f"{p}.scale", value["scale"])
        amount = value.get("value")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or \
                not math.isfinite(amount):
            refuse(f"{p}.value: op 'set' on a feature needs a finite activation to clamp it to, "
                   f"got {amount!r}.", f"{p}.value", amount)
    elif "value" in value:
        refuse(f"{p}.value: only op 'set' takes a value.", f"{p}.value", value["value"])
    elif op == "zero" and "scale" in value:
        refuse(f"{p}.scale: op 'zero' on a feature takes no scale.", f"{p}.scale",
               value["scale"])
    else:
        amount = _scale(value, p) if op == "add" else 0.0
    return cls("", -1, op, None, None, float(amount),
               parse_positions(value.get("positions"), f"{p}.positions"), None, feature)


def _of_sae(cls: type[Intervention], value: dict[str, Any], p: str) -> Intervention:
    """`{"sae": name, "op": "splice"}`: the SAE's hook (a transcoder's output hook) replaced by
    its reconstruction at `positions`."""
    name = value["sae"]
    if not isinstance(name, str) or not name:
        refuse(f"{p}.sae must name a loaded SAE.", f"{p}.sae", name)
    if value.get("op") != "splice":
        refuse(f"{p}.op: an intervention naming an SAE takes op 'splice' (steering by a "
               f"feature names it with 'feature'), got {value.get('op')!r}.", f"{p}.op",
               value.get("op"))
    given = sorted(set(value) - {"sae", "op", "positions"})
    if given:
        refuse(f"{p}: a splice acts at its SAE's hook: leave out {', '.join(given)}.",
               f"{p}.sae", given)
    return cls("", -1, "splice", positions=parse_positions(value.get("positions"),
                                                           f"{p}.positions"), sae=name)


def _scale(value: dict[str, Any], p: str) -> float:
    scale = value.get("scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        refuse(f"{p}.scale must be a finite number.", f"{p}.scale", scale)
    return float(scale)


def _feature(value: Any, parameter: str) -> tuple[str, int] | None:
    """An intervention's `feature`: {"sae": name, "index": i} -> (name, i)."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"sae", "index"} or not isinstance(
            value.get("sae"), str) or not _is_int(value.get("index")) or value["index"] < 0:
        refuse(f"{parameter} must be {{\"sae\": name, \"index\": a feature index >= 0}}.",
               parameter, value)
    return value["sae"], value["index"]


@dataclass
class FeaturesParams:
    """An SAE's features to read at `positions`: the `top_k` most active per position (0:
    none) and the activations of the features `indices` (SAELens's `encode` of the SAE's hook
    activations), with each position's L0 and reconstruction error norm."""

    sae: str
    top_k: int = 10
    indices: list[int] = field(default_factory=list)
    positions: Positions = field(default_factory=Positions)

    def __post_init__(self) -> None:
        self.positions = parse_positions(self.positions, "features.positions")

    @classmethod
    def parse(cls, value: Any) -> FeaturesParams:
        p = "features"
        if isinstance(value, FeaturesParams):
            return value
        if isinstance(value, str):
            value = {"sae": value}
        if not isinstance(value, dict):
            refuse("features must be an SAE's name or an object with 'sae' (and 'top_k', "
                   "'indices', 'positions').", p, value)
        unknown = set(value) - {"sae", "top_k", "indices", "positions"}
        if unknown:
            refuse(f"features: unknown field(s) {sorted(unknown)}; it takes sae, top_k, "
                   "indices, positions.", p, sorted(unknown))
        if not isinstance(value.get("sae"), str) or not value["sae"]:
            refuse("features.sae must name a loaded SAE.", "features.sae", value.get("sae"))
        top_k = value.get("top_k", 10)
        if not _is_int(top_k) or top_k < 0:
            refuse(f"features.top_k must be an integer >= 0, got {top_k!r}.", "features.top_k",
                   top_k)
        indices = value.get("indices") or []
        if not isinstance(indices, list) or len(indices) > MAX_FEATURE_INDICES or not all(
                _is_int(i) and i >= 0 for i in indices):
            refuse(f"features.indices must be a list of at most {MAX_FEATURE_INDICES} feature "
                   "indices >= 0.", "features.indices", indices)
        if top_k == 0 and not indices:
            refuse("features: top_k is 0 and no indices are named: nothing to read.",
                   "features.top_k", top_k)
        return cls(value["sae"], top_k, list(dict.fromkeys(indices)),
                   parse_positions(value.get("positions"), "features.positions"))


def parse_inside(capture: Any, logit_lens: Any, interventions: Any
                 ) -> tuple[CaptureParams | None, LogitLensParams | None,
                            list[Intervention] | None]:
    """A request's three fields, parsed (None and an empty list: not asked)."""
    if interventions is not None and not isinstance(interventions, list):
        refuse("interventions must be a list of objects.", "interventions", interventions)
    if len(interventions or []) > MAX_INTERVENTIONS:
        refuse(f"interventions: at most {MAX_INTERVENTIONS} per request.", "interventions",
               len(interventions or []))
    return (None if capture is None else CaptureParams.parse(capture),
            None if logit_lens is None else LogitLensParams.parse(logit_lens),
            [Intervention.parse(v, i) for i, v in enumerate(interventions)]
            if interventions else None)
