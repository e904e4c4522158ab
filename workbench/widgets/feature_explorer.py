"""`FeatureExplorer`: an SAE's features, explored: pick a feature and see its dashboard, type a
text and see the features most active on it, steer a prompt by a feature and read the steered
and the default continuations side by side.

It drives a local `LLM` or a `Workbench(url=...)` (the SAE loaded on its server by name) the
same way: a text is read with `features` (the top features at every position), a steer runs two
greedy requests, one with `interventions=[{"feature": {"sae", "index"}, "scale"}]`. Dashboards
(`FeatureDashboards`, the folder a `workbench feature-dashboards` job wrote) are optional: without
them a feature shows what the text read says of it. Errors are shown in the widget (`status`),
in the OpenAI error shape's words, never swallowed; the methods (`show`, `read`, `steer`) raise
them too. `to_html()` is the fallback where widgets do not render.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ipywidgets as widgets

from workbench.display import html as h
from workbench.errors import ValidationError
from workbench.widgets.beam_explorer import error_html

SHOWN_CONTEXTS = 8  # a feature's top contexts in the view (its dashboard holds them all)
SHOWN_POSITIONS = 8  # positions in the read text's table (all are coloured)


class FeatureExplorer(widgets.VBox):
    """An SAE's features (see the module docstring). `source`: an `LLM` or a `Workbench`;
    `sae`: the loaded SAE's name; `dashboards`: a `FeatureDashboards` or its folder;
    `max_tokens`: of each steered continuation; `top`: features listed for a text."""

    def __init__(self, source: Any, sae: str, dashboards: Any = None, *, max_tokens: int = 24,
                 top: int = 10, **kwargs: Any):
        from workbench.inspect.dashboards import FeatureDashboards

        if isinstance(dashboards, (str, Path)):
            dashboards = FeatureDashboards(dashboards)
        self.source, self.sae, self.dashboards = source, sae, dashboards
        self.max_tokens, self.top = max_tokens, top
        self.d_sae = self._d_sae()
        self.read_out: Any = None  # the last text's `FeatureActivations`
        self.steered: tuple[str, str] | None = None  # (steered, default) of the last steer
        wide = widgets.Layout(width="60%")
        self.feature = widgets.BoundedIntText(value=0, min=0, max=self.d_sae - 1,
                                              description="feature")
        self.show_button = widgets.Button(description="Show", icon="eye")
        self.text = widgets.Textarea(placeholder="a text: the features most active on it",
                                     description="text", layout=wide)
        self.read_button = widgets.Button(description="Read", icon="search")
        self.active = widgets.Select(options=[], rows=5, description="active",
                                     layout=widgets.Layout(width="60%"))
        self.prompt = widgets.Text(placeholder="a prompt to steer", description="prompt",
                                   layout=wide)
        self.strength = widgets.FloatText(value=8.0, description="strength",
                                          layout=widgets.Layout(width="200px"))
        self.steer_button = widgets.Button(description="Steer", icon="arrow-right")
        self.status = widgets.HTML()
        self.view = widgets.HTML()
        super().__init__(children=[
            widgets.HBox([self.feature, self.show_button]),
            widgets.HBox([self.text, self.read_button]), self.active,
            widgets.HBox([self.prompt, self.strength, self.steer_button]),
            self.status, self.view], **kwargs)
        self.add_class("wb-feature-explorer")
        self.show_button.on_click(lambda _: self._quietly(self.show, self.feature.value))
        self.read_button.on_click(lambda _: self._quietly(self.read, self.text.value))
        self.steer_button.on_click(lambda _: self._quietly(
            self.steer, self.prompt.value, self.feature.value, self.strength.value))
        self.active.observe(self._on_active, names="value")
        self._render()

    # -- actions -----------------------------------------------------------------------------
    def show(self, feature: int) -> Any:
        """Shows feature `feature`: its dashboard (with dashboards), and its activation on the
        last text read; returns the dashboard (None without dashboards)."""
        if not 0 <= feature < self.d_sae:
            raise ValidationError(f"feature {feature} is outside the SAE's {self.d_sae} "
                                  "features.", parameter="feature", value=feature)
        self.feature.value = feature
        self.status.value = ""
        self._render()
        return self.dashboards.feature(feature) if self.dashboards is not None else None

    def read(self, text: str) -> Any:
        """Reads `text` through the SAE: lists its most active features (by their largest
        activation in it) and shows the text coloured by the first; returns the
        `FeatureActivations`."""
        if not text:
            raise ValidationError("type a text to read.", parameter="text", value=text)
        self.text.value = text
        out = self._run(text, 1, {"features": {"sae": self.sae, "top_k": self.top,
                                               "positions": "prompt"}})
        self.read_out = out[0]
        ranked = _most_active(self.read_out, self.top)
        self.active.unobserve(self._on_active, names="value")
        self.active.options = [(f"{f}: {v:.3f}", f) for f, v in ranked]
        self.active.value = ranked[0][0] if ranked else None
        self.active.observe(self._on_active, names="value")
        if ranked:
            self.feature.value = ranked[0][0]
        self.status.value = ""
        self._render()
        return self.read_out

    def steer(self, prompt: str, feature: int, strength: float) -> tuple[str, str]:
        """Greedy continuations of `prompt` with `strength` x the feature's decoder row added at
        the SAE's hook, and without; shown side by side and returned (steered, default)."""
        if not prompt:
            raise ValidationError("type a prompt to steer.", parameter="prompt", value=prompt)
        self.prompt.value, self.feature.value = prompt, feature
        self.strength.value = strength
        steered = self._run(prompt, self.max_tokens, {"interventions": [
            {"feature": {"sae": self.sae, "index": feature}, "scale": strength}]})[1]
        default = self._run(prompt, self.max_tokens, {})[1]
        self.steered = (steered, default)
        self.status.value = ""
        self._render()
        return self.steered

    # -- running -----------------------------------------------------------------------------
    def _run(self, prompt: str, max_tokens: int, fields: dict[str, Any]) -> tuple[Any, str]:
        """(the features read or None, the continuation's text) of one greedy request."""
        self._busy(True)
        try:
            if hasattr(self.source, "llm_engine"):  # a local LLM
                from workbench.sampling_params import SamplingParams

                out = self.source.generate(prompt, SamplingParams(
                    max_tokens=max_tokens, temperature=0.0, **fields))[0]
                return out.features, out.outputs[0].text
            result = self.source.completions(prompt, max_tokens=max_tokens, temperature=0.0,
                                             **fields)
            if not result.ok:  # the server's refusal, in its words
                error = (result.error or {}).get("error", result.error) or {}
                raise ValidationError(str(error.get("message", error)))  # it names the field
            return result.features, result.text or ""
        finally:
            self._busy(False)

    def _quietly(self, action: Any, *args: Any) -> None:
        """A control's action: an error is shown in the widget (a handler has nowhere to
        raise it)."""
        try:
            action(*args)
        except Exception as exc:
            self.status.value = error_html(exc)

    def _busy(self, on: bool) -> None:
        for button in (self.show_button, self.read_button, self.steer_button):
            button.disabled = on
        self.status.value = '<div class="wb-busy" style="font-style:italic">running …</div>' \
            if on else ""

    def _on_active(self, change: dict) -> None:
        if change["new"] is not None:
            self._quietly(self.show, change["new"])

    def _d_sae(self) -> int:
        if self.dashboards is not None:
            return len(self.dashboards)
        saes = getattr(self.source, "saes", None)
        if isinstance(saes, dict) and self.sae in saes:
            return int(saes[self.sae].d_sae)
        if hasattr(self.source, "models"):  # a Workbench: the SAE on the model's card
            for card in (self.source.models().response or {}).get("data", []):
                for sae in card.get("saes") or []:
                    if sae["name"] == self.sae:
                        return int(sae["d_sae"])
        raise ValidationError(f"no SAE {self.sae!r} is loaded on this model.", parameter="sae",
                              value=self.sae)

    # -- drawing -----------------------------------------------------------------------------
    def _render(self) -> None:
        self.view.value = self.to_html()

    def to_html(self) -> str:
        """The last steer side by side, the last text read coloured by the selected feature,
        then that feature's dashboard (its first `SHOWN_CONTEXTS` contexts; where widgets do
        not render, this alone)."""
        feature = self.feature.value
        parts = []
        if self.steered is not None:
            steered, default = self.steered
            column = ('<div style="flex:1;min-width:0"><div style="font-size:12px;'
                      'font-weight:bold">{}</div><div style="font-family:monospace;'
                      'white-space:pre-wrap;overflow-wrap:anywhere">{}</div></div>')
            parts.append(
                '<div class="wb-steer" style="display:flex;gap:16px;margin-top:8px">'
                + column.format(h.escape(f"steered: {self.strength.value:g} × feature "
                                         f"{feature}"), h.escape(self.prompt.value + steered))
                + column.format("default", h.escape(self.prompt.value + default)) + "</div>")
        if self.read_out is not None:
            parts.append(self.read_out.html(feature=feature, last=SHOWN_POSITIONS))
        if self.dashboards is not None:
            parts.append(self.dashboards.feature(feature).html(top=SHOWN_CONTEXTS, samples=1))
        else:
            parts.append(h.caption(f"feature {feature} of {self.sae} (no dashboards: pass "
                                   "dashboards= for its top contexts)"))
        return h.themed(f'<div class="wb-feature-view">{"".join(parts)}</div>')

    def _repr_html_(self) -> str:
        return self.to_html()


def _most_active(features: Any, top: int) -> list[tuple[int, float]]:
    """(feature, its largest activation) over the positions read, largest first, skipping the
    first position (an attention sink's activations dwarf the rest) where others were read."""
    best: dict[int, float] = {}
    positions = features.positions[1:] or features.positions
    for position in positions:
        for f, v in features.top(position):
            if v > 0:
                best[f] = max(best.get(f, 0.0), v)
    return sorted(best.items(), key=lambda fv: (-fv[1], fv[0]))[:top]
