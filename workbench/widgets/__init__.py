"""ipywidgets views over the inspect objects (`workbench.inspect`), nothing more.

Each view is built only from an inspect object (a `BeamTree`, a `LogprobTable`, a
`BranchTree`), keeps its state in ordinary widget values (so tests assert on `children` and `.value` headless), and has
an HTML fallback (`to_html()`, also its `_repr_html_`) for places where widgets do not render:
GitHub, nbconvert, a kernel without the widget manager.

- `BeamExplorer`: prompt, beam width, length penalty, a step slider and a node selector over a
  beam search's `BeamTree`.
- `LogprobViewer`: a position slider over a `LogprobTable`, showing that position's top-k.
- `TokenExplorer`: an output's tokens; pick one and an alternative, and the branch forced
  there runs (`LLM.branch` / `Workbench.branch`): a `BranchTree` of every branch so far.
- `FeatureExplorer`: an SAE's features: a feature's dashboard (`FeatureDashboards`), the
  features most active on a text, a prompt steered by a feature beside the default.
"""

from workbench.widgets.beam_explorer import BeamExplorer, tree_until
from workbench.widgets.feature_explorer import FeatureExplorer
from workbench.widgets.logprob_viewer import LogprobViewer
from workbench.widgets.token_explorer import TokenExplorer

__all__ = ["BeamExplorer", "FeatureExplorer", "LogprobViewer", "TokenExplorer", "tree_until"]
