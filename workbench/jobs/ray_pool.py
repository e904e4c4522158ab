"""Ray, optional: connecting, and one pool of engine replicas over Ray Data.

Nothing here schedules, retries or restarts anything itself: `run_pool` is one Ray Data
`map_batches` over an `ActorPoolStrategy` of replicas (a class whose constructor loads the
engine once), with Ray Data's own fault tolerance, the actor pool's defaults (a dead replica
process is restarted, without limit, and its batch retried on a live one: tested by
tests/jobs/test_capture_ray.py), except one: the first item waits until every replica has
loaded its engine (Ray Data's `wait_for_min_actors_s`), so the replica that loads first does not
take the whole job, and a pool the cluster cannot place fails with Ray's timeout instead of
waiting without end. Only small rows travel
through Ray (lines, document texts, manifest rows); a capture replica writes its tensors to the
output folder itself.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

INSTALL_HINT = "pip install 'workbench[ray]'"
REPLICA_START_TIMEOUT_S = 3600  # an 8B checkpoint read from a slow network disk, per replica


def require_ray() -> Any:
    """The `ray` module, or an ImportError saying how to install it."""
    try:
        import ray  # optional dependency: deferred, only --ray needs it
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"--ray / ray=... needs Ray and pyarrow: {INSTALL_HINT}") from exc
    return ray


def connect(address: str | None = None, num_cpus: int | None = None) -> Any:
    """`ray.init` unless Ray is already initialised (a notebook's own `ray.init(address=...)`
    wins): `address` None or "local" starts a local Ray; "auto" or "ray://host:port" joins a
    cluster. Returns the `ray` module."""
    ray = require_ray()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address and address != "local":
            kwargs["address"] = address
        elif num_cpus is not None:
            kwargs["num_cpus"] = num_cpus
        ray.init(**kwargs)
    return ray


def run_pool(items: list[dict[str, Any]], replica: type, constructor_kwargs: dict[str, Any], *,
             replicas: int = 1, num_cpus: float = 1, batch_size: int = 1,
             address: str | None = None, options: dict[str, Any] | None = None
             ) -> Iterator[dict[str, Any]]:
    """Each item through `replica(**constructor_kwargs)(batch)` on a pool of `replicas` actors
    (`num_cpus` each), `batch_size` items a call; yields the result rows as they come (in no
    promised order: callers sort by their own key). `options`: more of `map_batches`' Ray
    arguments (`runtime_env`, `resources`, `memory`, ...)."""
    ray = connect(address, num_cpus=None)
    explain_object_store_warning()
    ds = ray.data.from_items(items, override_num_blocks=max(1, len(items)))
    out = ds.map_batches(bound(replica, constructor_kwargs),
                         batch_size=batch_size, batch_format="pandas",
                         compute=ray.data.ActorPoolStrategy(size=replicas), num_cpus=num_cpus,
                         **(options or {}))
    if out.context.wait_for_min_actors_s <= 0:  # the dataset's own copy; a caller's setting wins
        out.context.wait_for_min_actors_s = REPLICA_START_TIMEOUT_S
    yield from out.iter_rows()


OBJECT_STORE_NOTE = (
    "workbench: Ray may print a warning from core_worker.cc that an actor \"has constructor "
    "arguments in the object store and max_restarts > 0\": those are Ray Data's own arguments "
    "to each replica (its context and its transform, which this driver holds for the whole "
    "job); the replicas' own arguments travel with their class. Nothing is wrong.")
_explained = False


def explain_object_store_warning() -> None:
    """Says once per process, before the first pool starts, what the C++ warning Ray prints
    as each replica starts means (it reads like an error and is not one: Ray Data's actor pool
    passes object references to every actor it may restart), where Ray's C++ log writes it:
    file descriptor 2 (a terminal; a notebook server's log, not its cells)."""
    global _explained
    if not _explained:
        _explained = True
        sys.stderr.flush()
        os.write(2, (OBJECT_STORE_NOTE + "\n").encode())


def bound(replica: Any, kwargs: dict[str, Any]) -> Any:
    """`replica` with its constructor's arguments bound into the class itself: pickled with the
    class, so a restarted actor never needs them from the object store (where constructor
    arguments could be gone by the time Ray restarts a replica)."""

    def __init__(self: Any) -> None:
        replica.__init__(self, **kwargs)

    return type(replica.__name__, (replica,), {"__init__": __init__,
                                               "__module__": replica.__module__})
