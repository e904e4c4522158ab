"""`ModelComparison`: one text teacher-forced through several variants of a model, per token.

Rows are the text's tokens; per variant (the base model, an adapter, interventions) its
logprob of each token, the difference to the reference variant's (`delta`: > 0, the variant
finds the text likelier there), KL(reference || variant) over the whole vocabulary and the
reverse, the variant's argmax token and its entropy. Built from the comparison body of
`LLM.compare`, `Workbench.compare` or `POST /v1/compare` (`workbench/serving/compare.py`,
where the numbers are computed, exactly, from the engine's full distributions). Against a
server that only returns top-k prompt logprobs (vLLM) the logprobs, deltas, ranks and argmax
tokens are still exact but KL is not computable: `kl_available` is False and
`kl_unavailable_reason` says why; the KL columns are then missing, never approximated.
`diff(name)` is the reference vs one variant as a `LogprobDiff`.

>>> body = {"model": "m", "reference": 0, "prompt_tokens": 2, "token_ids": [5, 6],
...         "tokens": ["a", "b"], "kl_available": True, "kl_unavailable_reason": None,
...         "variants": [{"name": "base", "logprobs": [-1.0, -2.0], "kl": [0.0, 0.0]},
...                      {"name": "lora", "logprobs": [-0.5, -2.5], "kl": [0.1, 0.3]}]}
>>> c = ModelComparison.from_body(body)
>>> c.delta("lora"), c.summary()["lora"]["mean_kl"]
([0.5, -0.5], 0.2)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from workbench.display import html as h
from workbench.display.figure import neutral
from workbench.display.frames import frame
from workbench.inspect.logprob_diff import DiffRow, LogprobDiff


@dataclass(frozen=True)
class VariantScores:
    """One variant's numbers, one per scored token (None where unknown)."""

    name: str
    model: str | None
    logprobs: tuple[float | None, ...]
    ranks: tuple[int | None, ...] = ()
    argmax_ids: tuple[int | None, ...] = ()
    argmax_tokens: tuple[str | None, ...] = ()
    entropy: tuple[float | None, ...] | None = None
    kl: tuple[float | None, ...] | None = None  # KL(reference || this), nats; None: infinite
    kl_reverse: tuple[float | None, ...] | None = None  # KL(this || reference)
    interventions: int = 0

    @classmethod
    def of(cls, row: dict[str, Any]) -> "VariantScores":
        def seq(key: str) -> tuple | None:
            value = row.get(key)
            return None if value is None else tuple(value)

        return cls(row["name"], row.get("model"), tuple(row["logprobs"]),
                   seq("ranks") or (), seq("argmax_ids") or (), seq("argmax_tokens") or (),
                   seq("entropy"), seq("kl"), seq("kl_reverse"), int(row.get("interventions")
                                                                     or 0))

    @property
    def total_logprob(self) -> float | None:
        """The text's log-likelihood under this variant."""
        return None if None in self.logprobs else sum(self.logprobs)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(self).items()}


@dataclass(frozen=True)
class ModelComparison:
    """Variants of a model on the same tokens (see the module docstring)."""

    model: str
    tokens: tuple[str, ...]
    token_ids: tuple[int, ...]
    variants: tuple[VariantScores, ...]
    reference: int = 0
    prompt_tokens: int = 0
    kl_available: bool = True
    kl_unavailable_reason: str | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> "ModelComparison":
        """From a comparison body (`/v1/compare`'s answer, or `LLM.compare`'s)."""
        return cls(body.get("model", ""), tuple(body["tokens"]), tuple(body["token_ids"]),
                   tuple(VariantScores.of(v) for v in body["variants"]),
                   int(body.get("reference", 0)), int(body.get("prompt_tokens", 0)),
                   bool(body.get("kl_available", True)), body.get("kl_unavailable_reason"))

    # -- access -----------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [v.name for v in self.variants]

    @property
    def base(self) -> VariantScores:
        """The reference variant."""
        return self.variants[self.reference]

    def __getitem__(self, name: str | int) -> VariantScores:
        if isinstance(name, int):
            return self.variants[name]
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(f"no variant {name!r}; variants: {self.names}")

    def __len__(self) -> int:
        return len(self.tokens)

    def delta(self, name: str | int) -> list[float | None]:
        """The variant's logprob minus the reference's, per token."""
        ref, var = self.base.logprobs, self[name].logprobs
        return [None if a is None or b is None else b - a for a, b in zip(ref, var)]

    def agrees(self, name: str | int) -> list[bool | None]:
        """Per token: whether the variant's argmax token is the reference's."""
        ref, var = self.base, self[name]
        a = ref.argmax_ids if None not in ref.argmax_ids and ref.argmax_ids else ref.argmax_tokens
        b = var.argmax_ids if None not in var.argmax_ids and var.argmax_ids else var.argmax_tokens
        if not a or not b:
            return [None] * len(self)
        return [None if x is None or y is None else x == y for x, y in zip(a, b)]

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per variant: total logprob, its difference to the reference's, mean and max KL (None
        where unavailable), the share of tokens whose argmax agrees with the reference's."""
        out = {}
        ref_total = self.base.total_logprob
        for v in self.variants:
            total = v.total_logprob
            # an infinite KL travels as None (JSON has no infinity): it makes the mean infinite
            kl = [math.inf if x is None else x for x in v.kl or ()]
            agrees = [a for a in self.agrees(v.name) if a is not None]
            out[v.name] = {
                "total_logprob": total,
                "delta_total": None if total is None or ref_total is None else total - ref_total,
                "mean_kl": sum(kl) / len(kl) if kl and self.kl_available else None,
                "max_kl": max(kl) if kl and self.kl_available else None,
                "argmax_agreement": sum(agrees) / len(agrees) if agrees else None}
        return out

    def diff(self, name: str | int) -> LogprobDiff:
        """The reference vs one variant as a `LogprobDiff` (same tokens: every row comparable)."""
        ref, var = self.base, self[name]
        rows = tuple(DiffRow(i, t, a, t, b) for i, (t, a, b) in
                     enumerate(zip(self.tokens, ref.logprobs, var.logprobs)))
        return LogprobDiff(rows, ref.name, var.name)

    # -- plain data -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "reference": self.reference,
                "prompt_tokens": self.prompt_tokens, "tokens": list(self.tokens),
                "token_ids": list(self.token_ids), "kl_available": self.kl_available,
                "kl_unavailable_reason": self.kl_unavailable_reason,
                "variants": [v.to_dict() for v in self.variants]}

    def to_frame(self):
        """One row per token: its text and id, then per variant `<name> logprob`, `<name>
        delta`, `<name> kl` (with KL available), `<name> argmax`."""
        records, columns, dtypes = [], ["position", "token", "token_id"], {}
        for v in self.variants:
            mine = [f"{v.name} logprob", f"{v.name} delta"]
            if self.kl_available:
                mine += [f"{v.name} kl", f"{v.name} kl_reverse"]
            mine.append(f"{v.name} argmax")
            columns += mine
            dtypes.update({c: "Float64" for c in mine[:-1]})
        for i, (token, tid) in enumerate(zip(self.tokens, self.token_ids)):
            row: dict[str, Any] = {"position": i, "token": token, "token_id": tid}
            for v in self.variants:
                row[f"{v.name} logprob"] = v.logprobs[i]
                row[f"{v.name} delta"] = self.delta(v.name)[i]
                if self.kl_available:
                    row[f"{v.name} kl"] = _at(v.kl, i)
                    row[f"{v.name} kl_reverse"] = _at(v.kl_reverse, i)
                row[f"{v.name} argmax"] = _at(v.argmax_tokens, i)
            records.append(row)
        return frame(records, columns, dtypes).set_index("position")

    def __repr__(self) -> str:
        parts = []
        for name, s in self.summary().items():
            if name == self.base.name:
                continue
            kl = f", mean KL {s['mean_kl']:.4f}" if s["mean_kl"] is not None else ""
            dt = s["delta_total"]
            parts.append(f"{name}: Δ {dt:+.3f}{kl}" if dt is not None else name)
        kl_note = "" if self.kl_available else "; KL unavailable"
        return (f"ModelComparison({len(self)} tokens vs {self.base.name}: "
                f"{'; '.join(parts)}{kl_note})")

    # -- views ------------------------------------------------------------------------------
    def _repr_html_(self) -> str:
        div_id = h.content_id("wb-model-compare", self.to_dict())
        note = ("Δ = the variant's logprob minus the reference's (green: likelier under the "
                "variant); KL = KL(reference ‖ variant) over the whole vocabulary, in nats")
        if not self.kl_available:
            note = (f"Δ = the variant's logprob minus the reference's; KL unavailable: "
                    f"{self.kl_unavailable_reason}")
        return h.themed(f'<div id="{div_id}">{h.caption(h.escape(repr(self)))}'
                        f"{self._summary_html()}{h.caption(h.escape(note))}"
                        f"{self._rows_html()}</div>")

    def _summary_html(self) -> str:
        rows = []
        for name, s in self.summary().items():
            ref = " (reference)" if name == self.base.name else ""
            rows.append([h.escape(name + ref), h.fmt(s["total_logprob"], 3),
                         _delta_cell(s["delta_total"], 3), h.fmt(s["mean_kl"]),
                         h.fmt(s["max_kl"]),
                         h.fmt(None if s["argmax_agreement"] is None
                               else 100 * s["argmax_agreement"], 1)])
        return h.table(["variant", "total logprob", "Δ total", "mean KL", "max KL",
                        "argmax agrees %"], rows, escape_cells=False)

    def _rows_html(self) -> str:
        others = [v for v in self.variants if v.name != self.base.name]
        headers = ["pos", "token", f"{self.base.name} logprob"]
        for v in others:
            headers += [f"{v.name} logprob", f"{v.name} Δ"]
            if self.kl_available:
                headers.append(f"{v.name} KL")
        rows = []
        for i, token in enumerate(self.tokens):
            row = [str(i), f'<span style="white-space:pre">{h.token_html(token)}</span>',
                   h.fmt(self.base.logprobs[i])]
            for v in others:
                row += [h.fmt(v.logprobs[i]), _delta_cell(self.delta(v.name)[i])]
                if self.kl_available:
                    row.append(h.fmt(_at(v.kl, i)))
            rows.append(row)
        return h.table(headers, rows, escape_cells=False)

    def plot(self, ax: Any = None) -> Any:
        """Per position, each variant's Δ logprob (top) and KL (below, when available) against
        the reference (matplotlib); `ax`: one axes, or two for both; returns the Δ axes (the
        KL one is `ax.figure.axes[1]`)."""
        import matplotlib.pyplot as plt  # optional: deferred, only plots need matplotlib

        others = [v for v in self.variants if v.name != self.base.name]
        nan = float("nan")
        if ax is None:
            n = 2 if self.kl_available else 1
            _, ax = plt.subplots(n, 1, figsize=(8, 2.4 * n), sharex=True, squeeze=False)
            ax = ax[:, 0]
        axes = list(ax) if hasattr(ax, "__len__") else [ax]
        positions = list(range(len(self)))
        for v in others:
            axes[0].plot(positions, [nan if d is None else d for d in self.delta(v.name)],
                         marker="o", ms=3, label=v.name)
        axes[0].axhline(0.0, color="#888888", lw=0.8)
        axes[0].set_ylabel("Δ logprob", fontsize=8)
        axes[0].legend(fontsize=8)
        axes[0].set_title(f"each variant against {self.base.name}, per token", fontsize=9)
        if self.kl_available and len(axes) > 1:
            for v in others:
                axes[1].plot(positions, [nan if k is None else k for k in v.kl or ()],
                             marker="o", ms=3, label=v.name)
            axes[1].set_ylabel("KL (nats)", fontsize=8)
        axes[-1].set_xlabel("token position in the text")
        if len(self) <= 40:
            axes[-1].set_xticks(positions, [h.visible(t) for t in self.tokens], rotation=90,
                                fontsize=7)
        for a in axes:
            neutral(a)
        return axes[0]


def _at(values: Any, i: int) -> Any:
    return None if not values or i >= len(values) else values[i]


def _delta_cell(value: float | None, digits: int = 4) -> str:
    """A difference on a pale green (> 0) or red (< 0) background, dark ink."""
    if value is None or math.isnan(value):
        return h.fmt(value)
    colour = "#d8f0d8" if value > 0 else "#f6d6d6" if value < 0 else "#eeeeee"
    return f'<span style="{h.on(colour)};padding:0 3px">{h.fmt(value, digits)}</span>'


def body_from_tables(tables: list[Any], names: list[str], models: list[str],
                     token_ids: list[int], start: int, reference: int, model: str,
                     reason: str) -> dict[str, Any]:
    """A comparison body from each variant's scored `LogprobTable` (top-1 prompt logprobs of
    a server without full distributions): logprobs, ranks and argmax tokens exact, KL marked
    unavailable with `reason`."""
    rows = []
    for name, variant_model, table in zip(names, models, tables):
        best = [next((a for a in r.top if a.rank == 1), None) for r in table]
        rows.append({"name": name, "model": variant_model, "logprobs": list(table.logprobs),
                     "ranks": [r.rank for r in table],
                     "argmax_ids": [None if a is None else a.token_id for a in best],
                     "argmax_tokens": [None if a is None else a.token for a in best],
                     "entropy": None, "kl": None, "kl_reverse": None})
    return {"object": "comparison", "model": model, "reference": reference,
            "prompt_tokens": start, "token_ids": token_ids[start:],
            "tokens": list(tables[0].tokens), "kl_available": False,
            "kl_unavailable_reason": reason, "variants": rows}
