"""The KOSMOS side in one place: the configuration and its regime rules (``config``), the
builder model (``builder``), the reference WG decision (``decide``) and the planning function
from (point, configuration) to the per-rank schedules and the copy-engine plan (``plan``)."""
from .config import FIELDS, KosmosConfig, Resolved, resolve

__all__ = ["FIELDS", "KosmosConfig", "Resolved", "resolve"]
