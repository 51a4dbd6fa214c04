"""KOSMOS MoE backward: the runner of ``csrc/moe_bwd_sm90.cu`` (ONE cooperative launch per
backward) for ops ``moe-bwd`` and ``moe-step`` (ops/moe_bwd.py).

``prepare_moe_bwd(point, ctx, inputs, ...)`` -> :class:`MoeBwdRunner` (the contract of
docs/moe_interface, with ``grads[name][r]`` of ops/moe_bwd.GRADS: ``run`` / ``check`` /
``grads`` / ``outputs`` / ``routes`` / ``info`` / ``run_traced`` / ``close``).

The forward is the forward kernel's runner (impls/kosmos_moe.py) with its gate/up
pre-activations saved (``save_preact``: moe_params.h gus / gush); the backward kernel reads that
forward's saved state (routes, weights, logits, sorted-row placement, tile tables, xs, hs, os,
the pre-activations) through its arguments (``MoeBwdArgs.f``, a copy of the forward's):

* ``moe-bwd``: the forward runs once here (outside the timing); each call is one backward launch.
* ``moe-step``: each call is the forward launch then the backward launch (two launches per step,
  one per direction), y and the routes written by the forward.

Fabrics: world 1 and ``local`` (W ranks in one launch, as the forward: every rank's tokens one
token buffer, every rank's experts one stacked weight set, so dW1 / dW2 of an expert sum every
rank's rows in token = rank order, and dWr / dWs are per rank, a batch of the wgrad GEMMs).
``host`` (rank-0 view, ops/moe_host_bwd.py): as the forward, from inside the launch through
mapped pinned memory: rank 0's upstream rows for the peers' experts out (send_gout) and their
input gradients in (send_dx, added by the fold), the peers' upstream rows on rank 0's experts in
(recv_gout, behind rank 0's own rows in each segment) and their input gradients out (recv_dx);
dW1 / dW2 of rank 0's experts sum its own rows, then the peers'. ``nvlink``: not implemented
(:func:`unsupported_bwd` says so; the op records a skipped row).

Weights as the backward reads them (B operands K x N, N contiguous): W1_e (2F x H) and W2_e
(H x F) as the layer has them (the dgrads' B is the weight itself), the router weight padded to
E8 rows (E rounded up to 8), the shared expert's Ws1 / Ws2 as they are.
"""
from __future__ import annotations

import ctypes

from ..kernels import moe_bwd_sm90 as K
from .kosmos import DEFAULT_TIMEOUT_S
from .kosmos_moe import DEFAULT_TRACE_CAP, MoeRunner, raise_on_watchdog, runner_settings, sync_quietly, traced_call, unsupported


def unsupported_bwd(shape, fabric: str) -> str | None:
    """Why the backward kernel cannot run `shape` on `fabric` (None: it can). No GPU needed."""
    if shape.world > 1 and fabric not in ("local", "host"):
        return f"kosmos moe backward: fabric {fabric} is not implemented yet (world 1, local and host)"
    why = unsupported(shape, fabric if shape.world > 1 else "world1")
    if why:
        return why
    if shape.T * shape.world * shape.topk >= (1 << 23):
        return "kosmos moe backward: too many token choices for one launch"
    return None


class MoeBwdRunner:
    def __init__(self, shape, ctx, inputs, *, ranks: list[int], step: bool, fabric: str = "local",
                 timeout_s: float | None = None, grid: int | None = None, spin_ns: int = 32,
                 trace_cap: int = DEFAULT_TRACE_CAP, debug_skip_gather: bool = False, queue_order: str = "demand",
                 math: str = "joint"):
        import torch

        host = fabric == "host" and shape.world > 1
        why = unsupported_bwd(shape, "host" if host else ("local" if len(ranks) > 1 else "world1"))
        if why:
            raise ValueError(why)
        view = inputs.host.get("view") if host else None
        if host and getattr(view, "grad", None) is None:
            raise ValueError("kosmos moe backward: the host fabric needs the view's backward side "
                             "(inputs.host['view'].grad, ops/moe_host_bwd.py)")
        if list(ranks) != list(range(len(ranks))):
            raise ValueError("kosmos moe backward: executes ranks 0..W-1 (local), rank 0 (world 1)")
        self.shape, self.ranks, self.step, self.closed = shape, list(ranks), bool(step), False
        self.dev = ctx.device
        self.timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
        self.fwd = MoeRunner(shape, ctx, inputs, ranks=ranks, fabric="host" if host else "local",
                             timeout_s=self.timeout_s, grid=grid, spin_ns=spin_ns, trace_cap=trace_cap, save_preact=True,
                             queue_order=queue_order, math=math)
        self.math = math
        self.lib = K.load(math)
        dev, fa = self.dev, self.fwd.args
        W, T1 = len(ranks), shape.T
        T, H, F, Fs, E, k, Et = fa.T, fa.H, fa.F, fa.Fs, fa.E, fa.topk, fa.E_tiles
        E8, E_loc = K.e8(E), shape.E_loc
        bf = torch.bfloat16
        cat = lambda ts: torch.cat(ts).contiguous() if len(ts) > 1 else ts[0].contiguous()  # noqa: E731
        # inputs, arranged once
        self.dy = cat([inputs.dy[r] for r in ranks])
        self.w1 = cat([inputs.W1[r] for r in ranks])
        self.w2 = cat([inputs.W2[r] for r in ranks])
        self.wr = torch.zeros(E8, H, dtype=bf, device=dev)
        self.wr[:E] = inputs.Wr
        self.ws1, self.ws2 = (t.contiguous() for t in inputs.shared) if Fs else (None, None)
        # the backward's sorted / token buffers (zeroed once: every row the wgrads read is
        # written each call, pad rows included)
        rows_s = fa.tiles_max * K.BM
        self.dos = torch.zeros(rows_s, H, dtype=bf, device=dev)
        self.dgus = torch.zeros(rows_s, 2 * F, dtype=bf, device=dev)
        self.dxs = torch.zeros(rows_s, H, dtype=bf, device=dev)
        self.dlogits = torch.zeros(T, E8, dtype=bf, device=dev)
        self.dxr = torch.zeros(T, H, dtype=bf, device=dev)
        self.dgush = torch.zeros(T, 2 * Fs, dtype=bf, device=dev) if Fs else None
        self.dxsh = torch.zeros(T, H, dtype=bf, device=dev) if Fs else None
        self.dwc = torch.zeros(T * k, dtype=torch.float32, device=dev)  # dw of every choice (the movers' GATHER)
        # the gradients (ops/moe_bwd.grad_buffers' shapes, per rank views below)
        self.dx = torch.empty(T, H, dtype=bf, device=dev)
        self.dwr = torch.empty(W, E, H, dtype=bf, device=dev)
        self.dw1 = torch.empty(Et, 2 * F, H, dtype=bf, device=dev)  # the experts here (host: rank 0's)
        self.dw2 = torch.empty(Et, H, F, dtype=bf, device=dev)
        self.dws1 = torch.empty(W, 2 * Fs, H, dtype=bf, device=dev) if Fs else None
        self.dws2 = torch.empty(W, H, Fs, dtype=bf, device=dev) if Fs else None
        self.ctr = torch.zeros(K.ctr_words(T, k, Et, fa.peer_rows), dtype=torch.int32, device=dev)
        self.state = torch.zeros(4, dtype=torch.int32, device=dev)
        self.err = torch.zeros(64, dtype=torch.uint8, device=dev)
        self.err_seen = 0
        self.trace_cap = int(trace_cap)
        self.trace_buf = self.trace_count = None

        max_wgs = ctypes.c_int(0)
        self._ok(self.lib.kosmos_moe_bwd_max_wgs(dev.index or 0, ctypes.byref(max_wgs)))
        self.grid = int(grid or max_wgs.value)

        a = K.MoeBwdArgs()
        a.f = fa  # a copy of the forward's arguments: its saved state's pointers and sizes
        ptr = lambda t: t.data_ptr() if t is not None else None  # noqa: E731
        for name in ("dy", "w1", "w2", "wr", "ws1", "ws2", "dos", "dgus", "dxs", "dlogits", "dxr", "dgush", "dxsh",
                     "dx", "dwr", "dw1", "dw2", "dws1", "dws2", "dwc", "ctr", "state", "err"):
            setattr(a, name, ptr(getattr(self, name)))
        a.timeout_ns = int(self.timeout_s * 1e9)
        a.W, a.T1, a.E8, a.ctr_words = W, T1, E8, self.ctr.numel()
        a.grid, a.trace_cap, a.spin_ns = self.grid, self.trace_cap, int(spin_ns)
        a.debug_skip_gather = int(debug_skip_gather)
        if host:  # the view's backward buffers, pinned host memory (ops/moe_host_bwd.py)
            gv = view.grad
            for p in view.peers:
                a.recv_gout[p], a.recv_dx[p] = gv.recv_gout[p].data_ptr(), gv.recv_dx[p].data_ptr()
                a.send_gout[p], a.send_dx[p] = gv.send_gout[p].data_ptr(), gv.send_dx[p].data_ptr()
        self.args = a
        self.handle = self.lib.kosmos_moe_bwd_create()
        if not self.handle:
            raise MemoryError("kosmos_moe_bwd_create failed")
        self._set()

        views = lambda t, n: {r: t[i * n:(i + 1) * n] for i, r in enumerate(ranks)}  # noqa: E731
        self.grads = {"dx": views(self.dx, T1), "dWr": {r: self.dwr[i] for i, r in enumerate(ranks)},
                      "dW1": views(self.dw1, E_loc), "dW2": views(self.dw2, E_loc)}
        if Fs:
            self.grads["dWs1"] = {r: self.dws1[i] for i, r in enumerate(ranks)}
            self.grads["dWs2"] = {r: self.dws2[i] for i, r in enumerate(ranks)}
        self.routes = self.fwd.routes
        self.outputs = self.fwd.outputs if self.step else {}
        self.info = {**self.fwd.info, "moe_kernel": "kosmos moe fwd+bwd sm90 (one cooperative launch per direction)",
                     "grid_bwd": self.grid}
        if not self.step:  # moe-bwd: the saved state, made once (routes written here)
            self.fwd.run()
            self.fwd.check()

    # ---- helpers ----
    def _ok(self, rc: int) -> None:
        if rc != 0:
            raise RuntimeError(f"kosmos moe backward: {K.last_error(self.lib)} (rc {rc})")

    def _set(self) -> None:
        self._ok(self.lib.kosmos_moe_bwd_set(ctypes.c_void_p(self.handle), ctypes.byref(self.args)))

    def _launch(self) -> None:
        import torch

        stream = torch.cuda.current_stream(self.dev).cuda_stream
        self._ok(self.lib.kosmos_moe_bwd_launch(ctypes.c_void_p(self.handle), ctypes.c_void_p(stream)))

    def _raise_if_timed_out(self) -> None:
        if self.closed:
            raise RuntimeError("kosmos moe backward runner used after close()")
        fa = self.args.f
        name = lambda flag: K.counter_name(flag, fa.T, fa.topk, fa.E_tiles, fa.peer_rows)  # noqa: E731
        raise_on_watchdog(self, "kosmos moe backward", K.ITEM_KINDS, name)

    def set_debug_skip_gather(self, skip: bool) -> None:
        """Test hook: the GATHER items never run (DH / WG2 wait for rows that never arrive: the watchdog fires)."""
        self.args.debug_skip_gather = int(skip)
        self._set()

    # ---- Runner interface ----
    def run(self) -> None:
        """One backward (moe-step: forward then backward), asynchronous: no host synchronisation."""
        if self.closed:
            raise RuntimeError("kosmos moe backward runner used after close()")
        if self.step:
            self.fwd.run()
        self._launch()

    def check(self) -> None:
        """Synchronize; raise WatchdogError if a call (either direction) timed out."""
        import torch

        torch.cuda.synchronize(self.dev)
        self.fwd._raise_if_timed_out()
        self._raise_if_timed_out()

    def run_traced(self):
        """One call with the backward launch's role records (moe-step: the forward runs untraced
        first); a DataFrame (rank, wg, sm, role, item, kind, t0_ns, t1_ns)."""
        return traced_call(self, self.run, K)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        sync_quietly(self.dev)
        if self.handle:
            self.lib.kosmos_moe_bwd_destroy(ctypes.c_void_p(self.handle))
            self.handle = None
        self.fwd.close()
        self.grads, self.outputs, self.routes = {}, {}, {}


def prepare_moe_bwd(point, ctx, inputs, *, config=None, timeout_s: float | None = None, **kw) -> MoeBwdRunner:
    """The runner of `point` (op moe-bwd or moe-step) for this process (world 1; local: every rank in one launch)."""
    shape = inputs.shape
    fabric = getattr(ctx, "fabric", "local")
    if shape.world > 1 and fabric not in ("local", "host"):
        raise ValueError(unsupported_bwd(shape, fabric))
    ranks = list(range(shape.world)) if shape.world > 1 and fabric == "local" else [ctx.rank]
    step = getattr(point, "op", "moe-bwd") == "moe-step"
    settings = runner_settings(config, kw, point)
    settings.pop("mover", None)  # the backward's movers follow the fabric (unsupported_moe_bwd)
    return MoeBwdRunner(shape, ctx, inputs, ranks=ranks, step=step, fabric=fabric, timeout_s=timeout_s, **settings)


def unsupported_moe_bwd(point) -> str | None:
    """Why the backward kernel does not run `point` (None: it does); KosmosImpl.unsupported calls it."""
    from ..ops.moe import moe_shape  # noqa: PLC0415

    from ..kosmos.config import KosmosConfig  # noqa: PLC0415

    if KosmosConfig.from_point(point).mover == "ce":
        return "kosmos moe backward: SM movers only (the copy-engine movers are the forward kernel's)"
    return unsupported_bwd(moe_shape(point), point.fabric if point.world > 1 else "world1")
