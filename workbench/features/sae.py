"""Sparse autoencoders in SAELens's on-disk format, read and computed as SAELens computes them.

A folder with `cfg.json` and `sae_weights.safetensors` (what `SAE.save_model` writes):
`SparseAutoencoder.load(path)` reads it, checks what it can before any model is involved (the
architecture, the weights' shapes, the input normalisation) and keeps the weights in float32.
`encode(x)` and `decode(acts)` are SAELens 6's inference arithmetic (`sae_lens/saes/*.py`) in
plain torch, step for step:

- the input: cast to float32, normalised where the config says (`constant_norm_rescale`: scaled
  to norm sqrt(d_in); `layer_norm`: centred and divided by its std + 1e-5; `none` and
  `expected_average_only_in`: as they are, since SAELens folds the latter's factor into the
  weights only when it downloads a release, never when it loads a folder), minus `b_dec` when
  `apply_b_dec_to_input`;
- `standard`: ReLU(x W_enc + b_enc); `jumprelu`: that, zero where the pre-activation is not
  above `threshold` (BatchTopK and the Matryoshka BatchTopK save themselves as JumpReLU with
  their global threshold, so they load as this); `topk`: the k largest pre-activations (times
  each feature's decoder norm with `rescale_acts_by_decoder_norm`), ReLU'd, the rest zero;
  `gated`: the magnitude path ReLU(x (W_enc * exp(r_mag)) + b_mag) where the gate
  x W_enc + b_gate is above zero;
- `decode`: acts W_dec + b_dec, the normalisation undone.

`hook_name` (metadata, TransformerLens's name such as `blocks.6.hook_resid_post`) says where in
the model it reads; `check_model` refuses, naming the SAE, a hook the model lacks or a `d_in`
that is not the hook's width. `hook_sae_*` captures and the error term follow SAELens's
HookedSAETransformer.

Transcoders (`transcoder`, `jumprelu_transcoder`, `skip_transcoder`, `jumprelu_skip_transcoder`)
read one hook (`hook_name`) and write another later in the same pass (`metadata.hook_name_out`,
as SAELens names it): `encode` is the SAE's of the input hook's rows (no `b_dec` subtracted,
as SAELens refuses `apply_b_dec_to_input` for them), `decode` is acts W_dec + b_dec at the
output hook with no normalisation undone, and `output` adds the skip connection x W_skip^T
(the skip transcoders' `forward`). `hook_z` SAEs, covariance whitening and a transcoder with a
normalisation on its input (SAELens does not undo it on the other hook) are refused at load.
"""

from __future__ import annotations

import functools
import json
import math
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.errors import refuse
from workbench.inside.sites import RESIDUAL_SITES, parse_site

TRANSCODERS = ("transcoder", "jumprelu_transcoder", "skip_transcoder",
               "jumprelu_skip_transcoder")
ARCHITECTURES = ("standard", "jumprelu", "topk", "gated", *TRANSCODERS)
NORMALIZATIONS = ("none", "expected_average_only_in", "constant_norm_rescale", "layer_norm")
HOOK_SITES = RESIDUAL_SITES  # the [d_model]-wide sites of a layer
LAYER_NORM_EPS = 1e-5  # SAELens's run_time_activation_ln_in
SPARSE_DECODE = 16  # decode row by row when at most one feature in this many is active
Linear = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
_TENSORS = {"standard": ("W_enc", "b_enc", "W_dec", "b_dec"),
            "jumprelu": ("W_enc", "b_enc", "W_dec", "b_dec", "threshold"),
            "topk": ("W_enc", "b_enc", "W_dec", "b_dec"),
            "gated": ("W_enc", "W_dec", "b_dec", "b_gate", "b_mag", "r_mag"),
            "transcoder": ("W_enc", "b_enc", "W_dec", "b_dec"),
            "jumprelu_transcoder": ("W_enc", "b_enc", "W_dec", "b_dec", "threshold"),
            "skip_transcoder": ("W_enc", "b_enc", "W_dec", "b_dec", "W_skip"),
            "jumprelu_skip_transcoder": ("W_enc", "b_enc", "W_dec", "b_dec", "threshold",
                                         "W_skip")}
# where a residual-width hook comes in a layer's pass (a transcoder writes after it reads)
_ORDER = {"resid_pre": 0, "attn_out": 1, "resid_mid": 2, "mlp_out": 3, "resid_post": 4}


@dataclass(eq=False)
class SparseAutoencoder:
    """One SAE (see the module docstring): its config's fields that the arithmetic reads, and
    its weights in float32 (`W_enc` [d_in, d_sae], `W_dec` [d_sae, d_in], the biases)."""

    name: str
    path: str
    architecture: str
    d_in: int
    d_sae: int
    hook_name: str
    site: str  # `workbench.inside.sites`'s short name of the hook
    layer: int
    weights: dict[str, torch.Tensor]
    apply_b_dec_to_input: bool = True
    normalize_activations: str = "none"
    k: int | None = None  # topk
    rescale_acts_by_decoder_norm: bool = False  # topk
    # a transcoder's output hook (metadata.hook_name_out) and its short name and layer; None:
    # an SAE, which writes where it reads
    hook_name_out: str | None = None
    site_out: str | None = None
    layer_out: int | None = None
    # this load, named apart from any other (a name reloaded with other weights is another):
    # a clamp's or ablation's prefix-cache digest names it (`inside.resolve.interventions_key`)
    key: str = field(default_factory=lambda: uuid.uuid4().hex, repr=False)

    @classmethod
    def load(cls, name: str, path: str, parameter: str = "saes") -> SparseAutoencoder:
        """The SAE in the folder `path`, named `name`; refused, naming `parameter`, where the
        folder or what it holds is not an SAE this computes."""
        where = f"{parameter}[{name}]"
        config_path = os.path.join(path, "cfg.json")
        weights_path = os.path.join(path, "sae_weights.safetensors")
        for needed in (config_path, weights_path):
            if not os.path.isfile(needed):
                refuse(f"{where}: {needed!r} is missing (an SAE folder as SAELens saves it holds "
                       "cfg.json and sae_weights.safetensors).", parameter, path)
        try:
            with open(config_path) as f:
                config = json.load(f)
            from safetensors.torch import load_file

            tensors = load_file(weights_path)
        except (OSError, ValueError) as error:
            refuse(f"{where}: cannot read {path!r} ({error}).", parameter, path)
        architecture = config.get("architecture", "standard")
        if architecture not in ARCHITECTURES:
            refuse(f"{where}: architecture {architecture!r} is not an architecture this "
                   f"computes; these are: {', '.join(ARCHITECTURES)} (BatchTopK saves itself "
                   "as jumprelu).", parameter, architecture)
        normalization = config.get("normalize_activations", "none") or "none"
        if normalization not in NORMALIZATIONS:
            refuse(f"{where}: normalize_activations {normalization!r} is not computed here; "
                   f"these are: {', '.join(NORMALIZATIONS)}.", parameter, normalization)
        transcoder = architecture in TRANSCODERS
        if transcoder and normalization in ("constant_norm_rescale", "layer_norm"):
            refuse(f"{where}: a transcoder with normalize_activations {normalization!r}: "
                   "SAELens normalises its input and never undoes it on the output hook, so "
                   "its output is not the model's scale; not served.", parameter, normalization)
        if transcoder and config.get("apply_b_dec_to_input", False):
            refuse(f"{where}: a transcoder with apply_b_dec_to_input (its b_dec is the output "
                   "hook's; SAELens refuses it too).", parameter, "apply_b_dec_to_input")
        if config.get("reshape_activations", "none") not in (None, "none"):
            refuse(f"{where}: reshape_activations {config['reshape_activations']!r} (hook_z "
                   "SAEs) is not served yet.", parameter, config["reshape_activations"])
        metadata = config.get("metadata") or {}
        hook_name = metadata.get("hook_name") or config.get("hook_name")
        if not isinstance(hook_name, str):
            refuse(f"{where}: its cfg.json names no hook (metadata.hook_name).", parameter, path)
        site, layer = _hook_site(hook_name, where, parameter)
        hook_name_out = site_out = layer_out = None
        if transcoder:
            hook_name_out = metadata.get("hook_name_out") or config.get("hook_name_out")
            if not isinstance(hook_name_out, str):
                refuse(f"{where}: a transcoder's cfg.json names the hook it writes "
                       "(metadata.hook_name_out).", parameter, path)
            site_out, layer_out = _hook_site(hook_name_out, where, parameter)
            if 4 * layer_out + _ORDER[site_out] <= 4 * layer + _ORDER[site]:
                refuse(f"{where}: a transcoder writes after it reads: {hook_name_out!r} does "
                       f"not come after {hook_name!r} in the model's pass.", parameter,
                       hook_name_out)
        d_in, d_sae = config.get("d_in"), config.get("d_sae")
        d_out = config.get("d_out", d_in) if transcoder else d_in
        if not all(isinstance(d, int) and d > 0 for d in (d_in, d_sae, d_out)):
            refuse(f"{where}: cfg.json must give d_in and d_sae (and a transcoder's d_out) as "
                   "positive integers.", parameter, path)
        shapes = {"W_enc": (d_in, d_sae), "W_dec": (d_sae, d_out), "b_dec": (d_out,),
                  "W_skip": (d_out, d_in)}
        weights: dict[str, torch.Tensor] = {}
        for key in _TENSORS[architecture]:
            tensor = tensors.get(key)
            want = shapes.get(key, (d_sae,))
            if tensor is None or tuple(tensor.shape) != want:
                got = "missing" if tensor is None else list(tensor.shape)
                refuse(f"{where}: sae_weights.safetensors' {key} must be {list(want)}, got "
                       f"{got}.", parameter, key)
            # W_enc kept as the transpose of a [d_sae, d_in] tensor: the rows a C product reads
            weights[key] = tensor.to(torch.float32).T.contiguous().T if key == "W_enc" \
                else tensor.to(torch.float32).contiguous()
            if not torch.isfinite(weights[key]).all():
                refuse(f"{where}: {key} holds NaN or infinite values.", parameter, key)
        k = config.get("k")
        if architecture == "topk" and not (isinstance(k, int) and 0 < k <= d_sae):
            refuse(f"{where}: a topk SAE needs k in [1, d_sae], got {k!r}.", parameter, k)
        return cls(name, str(path), architecture, d_in, d_sae, hook_name, site, layer, weights,
                   bool(config.get("apply_b_dec_to_input", not transcoder)), normalization,
                   k if architecture == "topk" else None,
                   bool(config.get("rescale_acts_by_decoder_norm", False)), hook_name_out,
                   site_out, layer_out)

    @property
    def transcoder(self) -> bool:
        """Whether it writes another hook than it reads."""
        return self.hook_name_out is not None

    @property
    def writes(self) -> tuple[str, int]:
        """The (site, layer) its decoder writes: the output hook (an SAE's is its input's)."""
        if self.site_out is not None and self.layer_out is not None:
            return self.site_out, self.layer_out
        return self.site, self.layer

    @property
    def d_out(self) -> int:
        return self.weights["W_dec"].shape[1]

    # -- the model it reads ---------------------------------------------------------------------
    def check_model(self, num_layers: int, hidden_size: int, missing_sites: dict[str, str],
                    parameter: str = "saes") -> None:
        """Refuses (naming the SAE) a hook this model does not have or a `d_in` not its width."""
        where = f"{parameter}[{self.name}]"
        hooks = [(self.hook_name, self.site, self.layer, "d_in", self.d_in)]
        if self.hook_name_out is not None:
            hooks.append((self.hook_name_out, *self.writes, "d_out", self.d_out))
        for hook, site, layer, width_name, width in hooks:
            if not 0 <= layer < num_layers:
                refuse(f"{where}: hook {hook!r} is past the model's {num_layers} layers.",
                       parameter, hook)
            if site in missing_sites:
                refuse(f"{where}: hook {hook!r} does not exist in this model: "
                       f"{missing_sites[site]}.", parameter, hook)
            if width != hidden_size:
                refuse(f"{where}: {width_name} {width} is not the width of {hook} "
                       f"({hidden_size}): an SAE made for another model.", parameter, width)

    def describe(self) -> dict[str, Any]:
        """What `/v1/models` and the validation report say of it."""
        out = {"name": self.name, "hook_name": self.hook_name, "architecture": self.architecture,
               "d_in": self.d_in, "d_sae": self.d_sae}
        if self.transcoder:
            out["hook_name_out"] = self.hook_name_out
        return out

    # -- the arithmetic -------------------------------------------------------------------------
    def encode(self, x: torch.Tensor, linear: Linear | None = None) -> torch.Tensor:
        """Feature activations [..., d_sae] of activations x [..., d_in] (SAELens's `encode`).
        `linear(x, weight, bias)`: `x weight^T + bias` for the encoder's product, on the
        encoder's [d_sae, d_in] rows (the engine's C products: each row's sums in one order,
        reading the weights once for all the rows; default torch's `x @ W_enc + b_enc`)."""
        sae_in = self._sae_in(x)[0]
        w = self.weights
        if self.architecture == "gated":
            active = (_product(linear, sae_in, w["W_enc"], w["b_gate"]) > 0).to(torch.float32)
            magnitude = sae_in @ (w["W_enc"] * w["r_mag"].exp()) + w["b_mag"]
            return active * torch.relu(magnitude)
        hidden_pre = _product(linear, sae_in, w["W_enc"], w["b_enc"])
        if self.architecture in ("jumprelu", "jumprelu_transcoder", "jumprelu_skip_transcoder"):
            return torch.relu(hidden_pre) * (hidden_pre > w["threshold"]).to(torch.float32)
        if self.architecture == "topk":
            ids, values = self._top(hidden_pre)
            return torch.zeros_like(hidden_pre).scatter(-1, ids, values)
        return torch.relu(hidden_pre)

    def encode_top(self, x: torch.Tensor, linear: Linear | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """A TopK SAE's features of rows x [n, d_in] as its k (feature, activation) pairs
        [n, k] each, what `encode` scatters into [n, d_sae] (a ReLU'd zero among them where
        fewer than k are positive)."""
        assert self.architecture == "topk"
        return self._top(_product(linear, self._sae_in(x)[0], self.weights["W_enc"],
                                  self.weights["b_enc"]))

    def _top(self, hidden_pre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rescale_acts_by_decoder_norm:
            hidden_pre = hidden_pre * self.decoder_norms
        assert self.k is not None
        top = torch.topk(hidden_pre, k=self.k, dim=-1, sorted=False)
        return top.indices, top.values.relu()

    def pre_activations(self, x: torch.Tensor) -> torch.Tensor:
        """What SAELens's `hook_sae_acts_pre` holds: x W_enc + b_enc (gated: the magnitude
        path's x (W_enc * exp(r_mag)) + b_mag), before the activation function."""
        sae_in, w = self._sae_in(x)[0], self.weights
        if self.architecture == "gated":
            return sae_in @ (w["W_enc"] * w["r_mag"].exp()) + w["b_mag"]
        return sae_in @ w["W_enc"] + w["b_enc"]

    def decode(self, acts: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        """The reconstruction [..., d_in] of feature activations (SAELens's `decode`); `x`: the
        activations they were encoded from, where the normalisation needs them undone. Sparse
        activations (at most one in `SPARSE_DECODE` active) add just their active features'
        decoder rows (the same sum in another order: float32 rounding apart)."""
        flat = acts.reshape(-1, self.d_sae)
        rows, cols = flat.nonzero(as_tuple=True)  # row-major: each row's features together
        if rows.numel() * SPARSE_DECODE <= flat.numel():
            counts = torch.bincount(rows, minlength=flat.shape[0])
            out = self._rows_sum(cols, flat[rows, cols], counts.cumsum(0) - counts)
        else:
            if self.rescale_acts_by_decoder_norm:  # SAELens's act_times_W_dec
                flat = flat * self.inverse_decoder_norms
            out = flat @ self.weights["W_dec"] + self.weights["b_dec"]
        return self._undo_norm(out.reshape(*acts.shape[:-1], self.d_out), x)

    def decode_top(self, ids: torch.Tensor, values: torch.Tensor,
                   x: torch.Tensor | None = None) -> torch.Tensor:
        """`decode` of (feature, activation) pairs [n, m] each (`encode_top`'s) -> [n, d_in]."""
        n, m = ids.shape
        out = self._rows_sum(ids.reshape(-1), values.reshape(-1),
                             torch.arange(0, n * m, m, dtype=torch.long))
        return self._undo_norm(out, x)

    def _rows_sum(self, ids: torch.Tensor, values: torch.Tensor, starts: torch.Tensor
                  ) -> torch.Tensor:
        """Per row (its pairs from `starts`), the sum of value x W_dec[id], plus b_dec."""
        if self.rescale_acts_by_decoder_norm:  # SAELens's act_times_W_dec
            values = values * self.inverse_decoder_norms[ids]
        return torch.nn.functional.embedding_bag(
            ids, self.weights["W_dec"], starts, mode="sum", per_sample_weights=values
        ) + self.weights["b_dec"]

    def _undo_norm(self, out: torch.Tensor, x: torch.Tensor | None) -> torch.Tensor:
        if self.normalize_activations in ("constant_norm_rescale", "layer_norm"):
            if x is None:
                raise ValueError(f"decoding with {self.normalize_activations} needs the input")
            scale, shift = self._sae_in(x)[1:]
            out = out * scale + shift
        return out

    def output(self, x: torch.Tensor, acts: torch.Tensor | None = None) -> torch.Tensor:
        """What it writes in place of its output hook's rows, from its input hook's rows x
        [..., d_in]: decode(encode(x)) (a skip transcoder's `forward` adds x W_skip^T);
        `acts`: encode(x) where the caller has it already."""
        out = self.decode(self.encode(x) if acts is None else acts, x)
        if "W_skip" in self.weights:
            out = out + x.to(torch.float32) @ self.weights["W_skip"].T
        return out

    def with_feature(self, x: torch.Tensor, feature: int, value: float,
                     x_in: torch.Tensor | None = None) -> torch.Tensor:
        """x [n, d_out] (its output hook's rows) with `feature`'s activation set to `value`
        (0: ablated), everything else as it was: SAELens's spliced SAE with
        `use_error_term=True` (decode of the edited features plus the error x - decode(encode(
        x_in))), computed as x plus the edit's share of the decoder, (value - a) W_dec[feature]
        (over its norm with `rescale_acts_by_decoder_norm`, times the normalisation's scale),
        the same sum without decoding the rest. `x_in`: a transcoder's input hook's rows (an
        SAE reads x itself)."""
        x = x.to(torch.float32)
        current = self.encode(x if x_in is None else x_in)[..., feature]
        change = value - current
        if self.rescale_acts_by_decoder_norm:
            change = change * self.inverse_decoder_norms[feature]
        change = change.unsqueeze(-1) * self.weights["W_dec"][feature]
        if self.normalize_activations in ("constant_norm_rescale", "layer_norm"):
            change = change * self._sae_in(x)[1]
        return x + change

    @functools.cached_property
    def decoder_norms(self) -> torch.Tensor:
        """Each feature's decoder row's norm [d_sae] (what `rescale_acts_by_decoder_norm`
        scales by; SAELens computes it at every call, the same bits)."""
        return self.weights["W_dec"].norm(dim=-1)

    @functools.cached_property
    def inverse_decoder_norms(self) -> torch.Tensor:
        return 1 / self.decoder_norms

    def _sae_in(self, x: torch.Tensor) -> tuple[torch.Tensor, Any, Any]:
        """The encoder's input, and how to undo the normalisation (out * scale + shift)."""
        x = x.to(torch.float32)
        scale: Any = 1.0
        shift: Any = 0.0
        if self.normalize_activations == "constant_norm_rescale":
            coefficient = math.sqrt(self.d_in) / x.norm(dim=-1, keepdim=True)
            x, scale = x * coefficient, 1 / coefficient
        elif self.normalize_activations == "layer_norm":
            mu = x.mean(dim=-1, keepdim=True)
            centred = x - mu
            std = centred.std(dim=-1, keepdim=True)
            x, scale, shift = centred / (std + LAYER_NORM_EPS), std, mu
        if self.apply_b_dec_to_input:
            x = x - self.weights["b_dec"]
        return x, scale, shift


def _hook_site(hook_name: str, where: str, parameter: str) -> tuple[str, int]:
    site, layer = parse_site(hook_name, where)
    if site not in HOOK_SITES or layer is None:
        refuse(f"{where}: hook {hook_name!r}: SAEs are served on {', '.join(HOOK_SITES)} of "
               "a layer.", parameter, hook_name)
    return site, layer


def _product(linear: Linear | None, x: torch.Tensor, w_enc: torch.Tensor,
             bias: torch.Tensor) -> torch.Tensor:
    if linear is None:
        return x @ w_enc + bias
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    return linear(flat, w_enc.T, bias).reshape(*x.shape[:-1], w_enc.shape[1])


def save_sae(path: str, weights: dict[str, torch.Tensor], hook_name: str,
             architecture: str = "standard", **config: Any) -> str:
    """Writes an SAE folder in SAELens's format (`cfg.json`, `sae_weights.safetensors`): what
    tests and notebooks make SAEs with; `config` adds cfg.json fields (`k`, `normalize_activations`,
    `apply_b_dec_to_input`, `metadata={"hook_name_out": ...}` for a transcoder, ...). Returns
    `path`."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    d_in, d_sae = weights["W_enc"].shape
    metadata = {"hook_name": hook_name, **config.pop("metadata", {})}
    transcoder = architecture in TRANSCODERS
    if transcoder:
        config.setdefault("d_out", weights["W_dec"].shape[1])
    cfg = {"architecture": architecture, "d_in": d_in, "d_sae": d_sae, "dtype": "float32",
           "device": "cpu", "apply_b_dec_to_input": not transcoder,
           "normalize_activations": "none", "reshape_activations": "none", **config,
           "metadata": metadata}
    with open(os.path.join(path, "cfg.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_file({k: v.contiguous() for k, v in weights.items()},
              os.path.join(path, "sae_weights.safetensors"))
    return path
