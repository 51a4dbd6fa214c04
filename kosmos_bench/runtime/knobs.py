"""Environment knobs (KOSMOS_*): one parser, one error wording."""
from __future__ import annotations

import os


def env_int(name: str, default: int, *, lo: int = 0, env=None, words: tuple[str, ...] = ()) -> int | str:
    """$name as an integer >= lo (default when unset); a value in ``words`` is returned as is.
    Anything else raises ValueError naming the knob and what it takes."""
    env = os.environ if env is None else env
    v = str(env.get(name, default)).strip()
    if v in words:
        return v
    try:
        n = int(v)
    except ValueError:
        n = lo - 1
    if n < lo:
        alt = "".join(f" or {w!r}" for w in words)
        raise ValueError(f"{name}={v!r}: expected an integer >= {lo}{alt}")
    return n
