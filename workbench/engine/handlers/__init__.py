"""Per-kind request handlers: how a step's rows advance a request, and what it reports.

Generation (sampling), beam search and pooling each have one handler per engine; a request's
`kind`, set when it is added, names its handler, so the engine's step never asks which kind a
request is. Handlers compute a step's results; the bookkeeper (`engine/bookkeeper.py`) applies
them. See `base.KindHandler` for the methods every handler has.
"""

from workbench.engine.handlers.base import KindHandler
from workbench.engine.handlers.beam import BeamHandler
from workbench.engine.handlers.generation import GenerationHandler
from workbench.engine.handlers.pooling import PoolingHandler

__all__ = ["BeamHandler", "GenerationHandler", "KindHandler", "PoolingHandler"]
