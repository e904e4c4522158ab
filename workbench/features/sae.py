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
that is not the hook's width. Transcoders (one hook in, another out), `hook_z` SAEs and
covariance whitening are refused at load, named.
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

ARCHITECTURES = ("standard", "jumprelu", "topk", "gated")
NORMALIZATIONS = ("none", "expected_average_only_in", "constant_norm_rescale", "layer_norm")
HOOK_SITES = RESIDUAL_SITES  # the [d_model]-wide sites of a layer
LAYER_NORM_EPS = 1e-5  # SAELens's run_time_activation_ln_in
SPARSE_DECODE = 16  # decode row by row when at most one feature in this many is active
Linear = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
_TENSORS = {"standard": ("W_enc", "b_enc", "W_dec", "b_dec"),
            "jumprelu": ("W_enc", "b_enc", "W_dec", "b_dec", "threshold"),
            "topk": ("W_enc", "b_enc", "W_dec", "b_dec"),
            "gated": ("W_enc", "W_dec", "b_dec", "b_gate", "b_mag", "r_mag")}


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
            why = ("a transcoder reads one hook and writes another: not served yet"
                   if "transcoder" in str(architecture) else "not an architecture this computes")
            refuse(f"{where}: architecture {architecture!r}: {why}; these are: "
                   f"{', '.join(ARCHITECTURES)} (BatchTopK saves itself as jumprelu).",
                   parameter, architecture)
        normalization = config.get("normalize_activations", "none") or "none"
        if normalization not in NORMALIZATIONS:
            refuse(f"{where}: normalize_activations {normalization!r} is not computed here; "
                   f"these are: {', '.join(NORMALIZATIONS)}.", parameter, normalization)
        if config.get("reshape_activations", "none") not in (None, "none"):
            refuse(f"{where}: reshape_activations {config['reshape_activations']!r} (hook_z "
                   "SAEs) is not served yet.", parameter, config["reshape_activations"])
        metadata = config.get("metadata") or {}
        hook_name = metadata.get("hook_name") or config.get("hook_name")
        if not isinstance(hook_name, str):
            refuse(f"{where}: its cfg.json names no hook (metadata.hook_name).", parameter, path)
        site, layer = parse_site(hook_name, where)
        if site not in HOOK_SITES or layer is None:
            refuse(f"{where}: hook {hook_name!r}: SAEs are served on {', '.join(HOOK_SITES)} of "
                   "a layer.", parameter, hook_name)
        d_in, d_sae = config.get("d_in"), config.get("d_sae")
        if not (isinstance(d_in, int) and isinstance(d_sae, int) and d_in > 0 and d_sae > 0):
            refuse(f"{where}: cfg.json must give d_in and d_sae as positive integers.",
                   parameter, path)
        shapes = {"W_enc": (d_in, d_sae), "W_dec": (d_sae, d_in), "b_dec": (d_in,)}
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
                   bool(config.get("apply_b_dec_to_input", True)), normalization,
                   k if architecture == "topk" else None,
                   bool(config.get("rescale_acts_by_decoder_norm", False)))

    # -- the model it reads ---------------------------------------------------------------------
    def check_model(self, num_layers: int, hidden_size: int, missing_sites: dict[str, str],
                    parameter: str = "saes") -> None:
        """Refuses (naming the SAE) a hook this model does not have or a `d_in` not its width."""
        where = f"{parameter}[{self.name}]"
        if not 0 <= self.layer < num_layers:
            refuse(f"{where}: hook {self.hook_name!r} is past the model's {num_layers} layers.",
                   parameter, self.hook_name)
        if self.site in missing_sites:
            refuse(f"{where}: hook {self.hook_name!r} does not exist in this model: "
                   f"{missing_sites[self.site]}.", parameter, self.hook_name)
        if self.d_in != hidden_size:
            refuse(f"{where}: d_in {self.d_in} is not the width of {self.hook_name} "
                   f"({hidden_size}): an SAE made for another model.", parameter, self.d_in)

    def describe(self) -> dict[str, Any]:
        """What `/v1/models` and the validation report say of it."""
        return {"name": self.name, "hook_name": self.hook_name, "architecture": self.architecture,
                "d_in": self.d_in, "d_sae": self.d_sae}

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
        if self.architecture == "jumprelu":
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
        return self._undo_norm(out.reshape(*acts.shape[:-1], self.d_in), x)

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

    def with_feature(self, x: torch.Tensor, feature: int, value: float) -> torch.Tensor:
        """x [n, d_in] with `feature`'s activation set to `value` (0: ablated), everything
        else as it was: SAELens's spliced SAE with `use_error_term=True` (decode of the edited
        features plus the error x - decode(encode(x))), computed as x plus the edit's share of
        the decoder, (value - a) W_dec[feature] (over its norm with
        `rescale_acts_by_decoder_norm`, times the normalisation's scale), the same sum without
        decoding the rest."""
        x = x.to(torch.float32)
        current = self.encode(x)[..., feature]
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
    `apply_b_dec_to_input`, ...). Returns `path`."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    d_in, d_sae = weights["W_dec"].shape[1], weights["W_dec"].shape[0]
    metadata = {"hook_name": hook_name, **config.pop("metadata", {})}
    cfg = {"architecture": architecture, "d_in": d_in, "d_sae": d_sae, "dtype": "float32",
           "device": "cpu", "apply_b_dec_to_input": True, "normalize_activations": "none",
           "reshape_activations": "none", **config, "metadata": metadata}
    with open(os.path.join(path, "cfg.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_file({k: v.contiguous() for k, v in weights.items()},
              os.path.join(path, "sae_weights.safetensors"))
    return path
