"""`FeatureDashboards`: a dashboards job's folder read back (`workbench.jobs.dashboards`), and
`FeatureDashboard`, one feature's.

>>> d = FeatureDashboards("dash/")                  # doctest: +SKIP
>>> d.features                  # pandas: one row per feature (fires, density, logits, ...)
>>> d.feature(17)               # its top contexts coloured by activation, samples, histogram
>>> d.densest(10)               # the features that fire most, a frame

The HTML of a feature: its density and largest activation, the tokens its decoder row raises and
lowers most, each top context's window with every token coloured by the feature's activation
(light and dark pages alike), the samples by interval of its distribution, and a histogram drawn
in text; `plot()` draws the histogram with matplotlib. Only pandas and the Parquet files are
read: the folder opens without an engine or torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.display import html as h
from workbench.inspect.features import activation_color

FEATURES_FILE, CONTEXTS_FILE, DASHBOARDS_FILE = ("features.parquet", "contexts.parquet",
                                                 "dashboards.json")
SHOWN_SAMPLES = 2  # samples shown an interval in the HTML (`samples` holds them all)


class FeatureDashboards:
    """A finished dashboards job's folder (see the module docstring)."""

    def __init__(self, out: str | Path):
        import pandas as pd

        self.out = Path(out)
        if not (self.out / DASHBOARDS_FILE).is_file():
            raise FileNotFoundError(f"{str(self.out)!r} has no {DASHBOARDS_FILE}: the job has "
                                    "not finished (run it again to resume)")
        self.meta = json.loads((self.out / DASHBOARDS_FILE).read_text())
        self.features = pd.read_parquet(self.out / FEATURES_FILE)
        self.contexts = pd.read_parquet(self.out / CONTEXTS_FILE)
        self._by_feature = self.contexts.groupby("feature").indices

    def __len__(self) -> int:
        return len(self.features)

    def __repr__(self) -> str:
        m = self.meta
        return (f"FeatureDashboards({str(self.out)!r}: {m['d_sae']} features of {m['site']}, "
                f"{m['tokens']} tokens in {m['documents']} documents)")

    def feature(self, index: int) -> FeatureDashboard:
        """Feature `index`'s dashboard."""
        if not 0 <= index < len(self.features):
            raise IndexError(f"feature {index} is outside the SAE's {len(self.features)}")
        row = self.features.iloc[index]
        rows = self.contexts.iloc[self._by_feature.get(index, [])]
        records = rows.to_dict("records")
        return FeatureDashboard(
            index, int(row["fires"]), float(row["density"]), float(row["max_activation"]),
            [int(c) for c in row["histogram"]], self.meta["bin_edges"],
            list(zip(row["top_logit_tokens"], row["top_logits"].tolist())),
            list(zip(row["bottom_logit_tokens"], row["bottom_logits"].tolist())),
            [r for r in records if r["kind"] == "top"],
            [r for r in records if r["kind"] == "sample"], self.meta["site"])

    def densest(self, n: int = 10) -> Any:
        """The `n` features that fire on the most positions, a frame."""
        return self.features.nlargest(n, "fires")[["feature", "fires", "density",
                                                    "max_activation"]]


@dataclass
class FeatureDashboard:
    """One feature's dashboard (see the module docstring)."""

    feature: int
    fires: int
    density: float
    max_activation: float
    histogram: list[int]  # counts over `edges` (quarter octaves from 0)
    edges: list[float]
    top_logits: list[tuple[str, float]]
    bottom_logits: list[tuple[str, float]]
    top: list[dict[str, Any]]  # contexts, most active first: doc_id, position, tokens, ...
    samples: list[dict[str, Any]]  # by interval of the distribution (0: its lowest tenth)
    site: str = ""

    def _context(self, c: dict[str, Any]) -> str:
        most = self.max_activation or 1.0
        spans = []
        for i, (token, act) in enumerate(zip(c["tokens"], c["activations"])):
            here = c["window_start"] + i == c["position"]
            style = h.on(activation_color(act / most)) if act > 0 else ""
            border = ";outline:1px solid currentColor" if here else ""
            spans.append(f'<span style="{style}{border};white-space:pre" '
                         f'title="{act:.3f}">{h.token_html(token)}</span>')
        return (f'<div style="font-family:monospace;font-size:12px;line-height:1.7">'
                f'<span style="opacity:0.7">{h.fmt(c["activation"], 3)} · '
                f'{h.escape(c["doc_id"])}:{c["position"]}</span> {"".join(spans)}</div>')

    def _histogram(self) -> str:
        used = [i for i, n in enumerate(self.histogram) if n]
        if not used:
            return h.caption("never fires on these documents")
        peak = max(self.histogram)
        lines = [f"{self.edges[i]:>10.4g} {'█' * max(1, round(30 * self.histogram[i] / peak))}"
                 f" {self.histogram[i]}" for i in range(used[0], used[-1] + 1)]
        return (f'<pre style="font-size:11px;line-height:1.15;margin:2px 0">'
                f"{h.escape(chr(10).join(lines))}</pre>")

    def html(self, top: int | None = None, samples: int = SHOWN_SAMPLES) -> str:
        """The dashboard (see the module docstring): its first `top` contexts (all by
        default) and `samples` samples an interval."""
        logits = "".join(
            f"<div><b>{label}</b> " + ", ".join(f"{h.token_html(t)} ({v:+.2f})" for t, v in pairs)
            + "</div>" for label, pairs in (("raises", self.top_logits),
                                            ("lowers", self.bottom_logits)))
        shown: dict[int, int] = {}
        drawn = []
        for c in self.samples:
            if shown.get(c["interval"], 0) < samples:
                shown[c["interval"]] = shown.get(c["interval"], 0) + 1
                drawn.append(f'<div style="font-size:11px;opacity:0.7">interval '
                             f'{c["interval"]}</div>{self._context(c)}')
        return h.themed(
            f'<div class="wb-dash"><div style="font-size:13px"><b>feature {self.feature}</b>'
            f"{' of ' + h.escape(self.site) if self.site else ''}: fires on {self.fires} "
            f"positions (density {self.density:.3%}), largest {h.fmt(self.max_activation, 3)}"
            f'</div><div style="font-size:12px;margin:4px 0">{logits}</div>'
            f"{h.caption('top contexts (the position outlined, each token coloured by this feature)')}"
            + "".join(self._context(c) for c in self.top[:top])
            + (h.caption(f"… {len(self.top) - top} more: .top") if top is not None and
               len(self.top) > top else "")
            + (h.caption("samples across its activations (interval 0: its lowest tenth)")
               + "".join(drawn) if drawn else "")
            + h.caption("activations (bin's lower edge, count)") + self._histogram()
            + "</div>")

    def _repr_html_(self) -> str:
        return self.html()

    def plot(self, ax: Any = None) -> Any:
        """The histogram of its non-zero activations (log-spaced bins). Returns the axes."""
        import matplotlib.pyplot as plt  # optional: deferred, only plots need matplotlib

        from workbench.display.figure import neutral

        used = [i for i, n in enumerate(self.histogram) if n] or [1]
        lo, hi = used[0], used[-1] + 1
        if ax is None:
            _, ax = plt.subplots(figsize=(6, 2.4))
        edges = [max(e, self.edges[1] / 2) for e in self.edges[lo:hi]] + [
            self.edges[hi] if hi < len(self.edges) else self.edges[-1] * 2 ** 0.25]
        ax.stairs(self.histogram[lo:hi], edges, fill=True, color="#c2410c")
        ax.set_xscale("log")
        ax.set_xlabel("activation")
        ax.set_ylabel("positions")
        ax.set_title(f"feature {self.feature}: density {self.density:.3%}", fontsize=10)
        return neutral(ax)

    def __repr__(self) -> str:
        return (f"FeatureDashboard(feature {self.feature}: fires {self.fires}, largest "
                f"{self.max_activation:.3f}, {len(self.top)} top contexts)")
