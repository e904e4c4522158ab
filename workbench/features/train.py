"""Training a sparse autoencoder with SAELens's trainer on activation rows, and measuring it.

Data flow: rows [n, d_in] of one hook (any float dtype, held in memory: a capture job's site,
`workbench/jobs/sae_training.py`) -> `ShuffledBatches` (float32 batches of `batch_size` rows,
each epoch a fresh permutation from a generator seeded with `seed`, as many epochs as
`training_tokens` asks) -> SAELens's `SAETrainer` on its training SAE of the architecture
(`TopKTrainingSAE`, `BatchTopKTrainingSAE`, `StandardTrainingSAE`, `JumpReLUTrainingSAE`) ->
`save_inference_model(out)`: `cfg.json` (`metadata.hook_name` = the hook) and
`sae_weights.safetensors`, the folder both SAELens's `SAE.load_from_disk` and workbench's
`SparseAutoencoder.load` read -> `reconstruction(sae, held-out rows)`: L0, the fraction of
variance unexplained and the features that never fire.

The training is SAELens's, unchanged: its initialisation (from torch's global generator, which
`train` seeds), Adam, its losses (TopK's auxiliary loss for dead features, the L1 or L0
penalty), gradient clipping and the folds at the end (`normalize_activations=
"expected_average_only_in"`: activations scaled to norm sqrt(d_in) while training, the factor
folded into the saved weights, which then read raw activations; TopK's decoder norms folded;
BatchTopK saved as JumpReLU with its learned threshold). Two things are done here before
`fit()`: the scaling factor's estimate (SAELens's own `estimate_scaling_factor`, but on its own
pass over the rows, so the training batches are the same with or without it), and the
decoder bias set to the rows' mean (`b_dec_init="mean"`, SAELens 5's `b_dec_init_method`, the
TopK paper's start; SAELens 6 starts from zeros, and a residual stream's mean, most of its
rows' length, then takes the rate's 1e-3 a step tens of thousands of steps to learn).
Given the seed and the thread count, two runs give the same weights (on the CPU).

Only the architectures workbench serves are trained: `ARCHITECTURES`. SAELens is optional
(`pip install 'workbench[train]'`) and imported only when `train` runs.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from workbench.errors import refuse

# what each architecture's training SAE is called in SAELens, and which of its config's fields
# `k` / `sparsity_coefficient` sets (BatchTopK saves itself as JumpReLU: `SparseAutoencoder`
# serves all four)
ARCHITECTURES = {
    "topk": ("TopKTrainingSAE", "k"),
    "batchtopk": ("BatchTopKTrainingSAE", "k"),
    "standard": ("StandardTrainingSAE", "l1_coefficient"),
    "jumprelu": ("JumpReLUTrainingSAE", "l0_coefficient"),
}
NORMALIZATIONS = ("expected_average_only_in", "none")
B_DEC_INITS = ("mean", "zeros")
DEFAULT_K = 32
SAELENS_DEAD_WINDOW = 1000  # SAETrainerConfig's dead_feature_window, in steps
NORM_ESTIMATE_ROWS = 1 << 20  # rows the scaling factor is estimated on, at most
INSTALL_HINT = "pip install 'workbench[train]'"


@dataclass(frozen=True)
class TrainingConfig:
    """What to train: the architecture (`ARCHITECTURES`), `d_sae` features, `k` (TopK: the
    active features per row; BatchTopK: their mean over a batch; default 32) or
    `sparsity_coefficient` (standard: SAELens's `l1_coefficient`; JumpReLU: its
    `l0_coefficient`; default SAELens's 1.0), on `training_tokens` rows (None: one epoch),
    in batches of `batch_size`, Adam at `lr` (SAELens's constant schedule), `seed`. The
    defaults, 1024 rows and 3e-3, are for runs of a few million tokens on a CPU (SAELens's,
    4096 and 3e-4, for runs of hundreds of millions: after 100k tokens of SmolLM2's layer 15
    they leave 87 % of the variance unexplained, these 23 %);
    `dead_feature_window`: the steps after which a feature that has not fired counts as dead
    (what TopK's auxiliary loss revives; default SAELens's 1000, or a tenth of the run where
    that is shorter: at 1000 a run of fewer steps would never revive any); `b_dec_init`:
    the decoder bias's start, the training rows' mean (default) or SAELens 6's zeros;
    `lr_decay_steps`: SAELens's linear decay of the rate to zero over the last steps
    (default none). `check(rows)` fills the defaults and refuses, naming the parameter, what
    SAELens would not train as asked."""

    architecture: str = "topk"
    d_sae: int = 4608
    k: float | None = None
    sparsity_coefficient: float | None = None
    training_tokens: int | None = None
    batch_size: int = 1024
    lr: float = 3e-3
    seed: int = 0
    normalize_activations: str = "expected_average_only_in"
    dead_feature_window: int | None = None
    b_dec_init: str = "mean"
    lr_decay_steps: int = 0

    def check(self, rows: int | None = None) -> TrainingConfig:
        """This config with its defaults filled in (those that depend on the run's length
        where `rows`, the training rows, is given); refused, naming the parameter, where a
        value is out of range or does not apply to the architecture."""
        if self.architecture not in ARCHITECTURES:
            refuse(f"architecture {self.architecture!r} is not one workbench trains and serves; "
                   f"these are: {', '.join(ARCHITECTURES)} (batchtopk saves as jumprelu).",
                   "architecture", self.architecture)
        _positive_int(self.d_sae, "d_sae")
        _positive_int(self.batch_size, "batch_size")
        if not _is_int(self.seed) or self.seed < 0:
            refuse(f"seed must be an integer >= 0, got {self.seed!r}.", "seed", self.seed)
        if self.training_tokens is not None:
            _positive_int(self.training_tokens, "training_tokens")
            if self.training_tokens < self.batch_size:
                refuse(f"training_tokens {self.training_tokens} is less than one batch "
                       f"(batch_size {self.batch_size}).", "training_tokens",
                       self.training_tokens)
        if not (isinstance(self.lr, (int, float)) and not isinstance(self.lr, bool)
                and math.isfinite(self.lr) and self.lr > 0):
            refuse(f"lr must be a positive finite number, got {self.lr!r}.", "lr", self.lr)
        if self.normalize_activations not in NORMALIZATIONS:
            refuse(f"normalize_activations must be one of {list(NORMALIZATIONS)}, got "
                   f"{self.normalize_activations!r}.", "normalize_activations",
                   self.normalize_activations)
        takes = ARCHITECTURES[self.architecture][1]
        k, coefficient = self.k, self.sparsity_coefficient
        if takes == "k":
            if coefficient is not None:
                refuse(f"sparsity_coefficient: a {self.architecture} SAE's sparsity is k, it "
                       "takes no sparsity coefficient.", "sparsity_coefficient", coefficient)
            k = DEFAULT_K if k is None else k
            integral = _is_int(k) if self.architecture == "topk" else (
                isinstance(k, (int, float)) and not isinstance(k, bool) and math.isfinite(k))
            if not integral or not 0 < k <= self.d_sae:
                kind = "an integer in [1" if self.architecture == "topk" else "a number in (0"
                refuse(f"k must be {kind}, d_sae={self.d_sae}], got {k!r}.", "k", k)
        else:
            if k is not None:
                refuse(f"k: a {self.architecture} SAE takes a sparsity_coefficient (SAELens's "
                       f"{takes}), not k.", "k", k)
            coefficient = 1.0 if coefficient is None else coefficient
            if isinstance(coefficient, bool) or not isinstance(coefficient, (int, float)) or \
                    not math.isfinite(coefficient) or coefficient < 0:
                refuse(f"sparsity_coefficient must be a finite number >= 0, got "
                       f"{coefficient!r}.", "sparsity_coefficient", coefficient)
        if self.b_dec_init not in B_DEC_INITS:
            refuse(f"b_dec_init must be one of {list(B_DEC_INITS)}, got {self.b_dec_init!r}.",
                   "b_dec_init", self.b_dec_init)
        if not _is_int(self.lr_decay_steps) or self.lr_decay_steps < 0:
            refuse(f"lr_decay_steps must be an integer >= 0, got {self.lr_decay_steps!r}.",
                   "lr_decay_steps", self.lr_decay_steps)
        window = self.dead_feature_window
        if window is not None:
            _positive_int(window, "dead_feature_window")
        tokens = self.training_tokens
        if rows is not None:
            tokens = tokens or rows
            steps = math.ceil(tokens / self.batch_size)
            window = window or min(SAELENS_DEAD_WINDOW, max(1, steps // 10))
            if self.lr_decay_steps > steps:
                refuse(f"lr_decay_steps {self.lr_decay_steps} is more than the run's {steps} "
                       "steps.", "lr_decay_steps", self.lr_decay_steps)
        return TrainingConfig(self.architecture, self.d_sae, k, coefficient, tokens,
                              self.batch_size, float(self.lr), self.seed,
                              self.normalize_activations, window, self.b_dec_init,
                              self.lr_decay_steps)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(value: Any, parameter: str) -> None:
    if not _is_int(value) or value < 1:
        refuse(f"{parameter} must be a positive integer, got {value!r}.", parameter, value)


class ShuffledBatches:
    """An endless iterator of float32 batches of `batch_size` rows of `rows` [n, d]: each
    epoch one permutation of all rows (from a `torch.Generator` seeded with `seed`); a batch
    that crosses an epoch's end takes the next epoch's first rows (so every batch is full, as
    SAELens's trainer counts them)."""

    def __init__(self, rows: torch.Tensor, batch_size: int, seed: int):
        self.rows, self.batch_size = rows, batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self.order = torch.empty(0, dtype=torch.long)

    def __iter__(self) -> ShuffledBatches:
        return self

    def __next__(self) -> torch.Tensor:
        while self.order.numel() < self.batch_size:
            self.order = torch.cat([self.order, torch.randperm(len(self.rows),
                                                               generator=self.generator)])
        take, self.order = self.order[:self.batch_size], self.order[self.batch_size:]
        return self.rows[take].to(torch.float32)


@dataclass(frozen=True)
class TrainingRun:
    """What a training run did: the rows it saw (`tokens`, in `steps` batches, over `epochs`
    of `rows` rows), how long SAELens's `fit()` took and the scaling factor it folded in."""

    path: str
    rows: int
    tokens: int
    steps: int
    epochs: float
    seconds: float
    scaling_factor: float | None
    sae_lens_version: str

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else math.nan


def sae_lens() -> Any:
    """SAELens, imported on first use; an ImportError naming the extra where it is absent."""
    try:
        import sae_lens as module  # deferred: optional, and its import takes seconds
    except ImportError as exc:
        raise ImportError(f"training an SAE needs SAELens: {INSTALL_HINT}") from exc
    return module


def train(rows: torch.Tensor, hook_name: str, out: str, config: TrainingConfig,
          metadata: dict[str, Any] | None = None) -> TrainingRun:
    """Trains an SAE of `config` on `rows` [n, d_in] with SAELens's trainer and saves it into
    the folder `out` in SAELens's format (`metadata`: more of cfg.json's metadata, such as
    `model_name`). `out` must be new or empty."""
    if rows.ndim != 2 or rows.shape[0] == 0:
        refuse(f"rows must be [rows, d_in] with at least one row, got {list(rows.shape)}.",
               "rows", list(rows.shape))
    n, d_in = rows.shape
    config = config.check(n)
    check_out(out)
    lens = sae_lens()
    from sae_lens.config import SAETrainerConfig
    from sae_lens.saes.sae import SAEMetadata

    name, takes = ARCHITECTURES[config.architecture]
    sparsity: dict[str, Any] = {takes: config.k if takes == "k" else config.sparsity_coefficient}
    sae_config = getattr(lens, f"{name}Config")(
        d_in=d_in, d_sae=config.d_sae, dtype="float32", device="cpu",
        normalize_activations=config.normalize_activations, **sparsity,
        metadata=SAEMetadata(hook_name=hook_name, **(metadata or {})))
    torch.manual_seed(config.seed)  # SAELens initialises the weights from torch's generator
    sae = getattr(lens, name)(sae_config)
    assert config.training_tokens is not None and config.dead_feature_window is not None
    steps = math.ceil(config.training_tokens / config.batch_size)
    tokens = steps * config.batch_size  # whole batches, as SAELens's trainer counts them
    trainer = lens.SAETrainer(
        cfg=SAETrainerConfig(total_training_samples=tokens,
                             train_batch_size_samples=config.batch_size, lr=config.lr,
                             lr_end=config.lr, lr_decay_steps=config.lr_decay_steps,
                             device="cpu",
                             dead_feature_window=config.dead_feature_window),
        sae=sae, data_provider=ShuffledBatches(rows, config.batch_size, config.seed))
    scaling = None
    if config.normalize_activations == "expected_average_only_in":
        estimate_batches = max(1, min(n, NORM_ESTIMATE_ROWS) // config.batch_size)
        trainer.activation_scaler.estimate_scaling_factor(
            d_in, ShuffledBatches(rows, config.batch_size, config.seed), estimate_batches)
        scaling = float(trainer.activation_scaler.scaling_factor)
    if config.b_dec_init == "mean":  # in the units the SAE sees: scaled
        with torch.no_grad():
            sae.b_dec.copy_(mean_row(rows) * (scaling or 1.0))
    began = time.perf_counter()
    trained = trainer.fit()
    seconds = time.perf_counter() - began
    trained.save_inference_model(out)
    return TrainingRun(out, n, tokens, steps, tokens / n, seconds, scaling, lens.__version__)


def mean_row(rows: torch.Tensor, chunk: int = 65536) -> torch.Tensor:
    """The mean of `rows` [n, d], summed in float64 a chunk at a time."""
    total = torch.zeros(rows.shape[1], dtype=torch.float64)
    for a in range(0, len(rows), chunk):
        total += rows[a:a + chunk].to(torch.float64).sum(0)
    return total / len(rows)


def check_out(out: str) -> None:
    """`out` must be a new or empty folder: a trained SAE never overwrites files."""
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        refuse(f"out {out!r} exists and is not an empty folder: name a new or empty folder "
               "for the trained SAE.", "out", out)


@dataclass(frozen=True)
class Reconstruction:
    """An SAE on held-out rows: `l0` the mean number of active features per row, `fvu` the
    fraction of variance unexplained (the squared error summed over rows and dimensions over
    the rows' summed squared distance from their mean), `dead_features` the features active on
    none of the rows."""

    rows: int
    l0: float
    fvu: float
    dead_features: int
    d_sae: int

    @property
    def explained_variance(self) -> float:
        return 1.0 - self.fvu

    @property
    def dead_share(self) -> float:
        return self.dead_features / self.d_sae

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "explained_variance": self.explained_variance,
                "dead_share": self.dead_share}


@torch.no_grad()
def reconstruction(sae: Any, rows: torch.Tensor, batch_size: int = 4096) -> Reconstruction:
    """`Reconstruction` of `sae` (a `SparseAutoencoder`) on `rows` [n, d_in], in batches,
    sums in float64: two passes (the rows' mean, then the squared distances from it)."""
    n = rows.shape[0]
    if n == 0:
        refuse("no held-out rows to evaluate the SAE on.", "rows", 0)
    mean = mean_row(rows, batch_size)
    error = variance = active_count = 0.0
    fired = torch.zeros(sae.d_sae, dtype=torch.bool)
    for a in range(0, n, batch_size):
        x = rows[a:a + batch_size].to(torch.float32)
        acts = sae.encode(x)
        active = acts != 0
        fired |= active.any(0)
        active_count += float(active.sum())
        error += float((sae.decode(acts, x).double() - x.double()).pow(2).sum())
        variance += float((x.double() - mean).pow(2).sum())
    return Reconstruction(n, active_count / n, error / variance, int((~fired).sum()), sae.d_sae)
