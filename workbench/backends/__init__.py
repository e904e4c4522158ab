"""Where a `Workbench`'s requests run, behind one protocol (`base.Backend`): `local._Local`, the
server's serving objects on an in-kernel engine, and `remote._Remote`, any OpenAI-compatible
server over httpx; both answer with `result.Result`."""

from workbench.backends.base import Backend
from workbench.backends.result import Result

__all__ = ["Backend", "Result"]
