"""The KOSMOS side in one place: the configuration and its regime rules (``config``), the
builder model (``builder``), the reference WG decision (``decide``) and the planning function
from (point, configuration) to the per-rank schedules and the copy-engine plan (``plan``)."""
from __future__ import annotations

__all__ = ["FIELDS", "KosmosConfig", "Resolved", "resolve"]


def __getattr__(name):  # lazy: ``python3 -m kosmos_bench.kosmos.config`` runs config as __main__
    if name in __all__:
        from . import config

        return getattr(config, name)
    raise AttributeError(name)
