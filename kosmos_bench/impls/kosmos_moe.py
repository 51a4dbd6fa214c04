"""KOSMOS MoE forward: the runner of ``csrc/moe_fwd_sm90.cu`` (one cooperative launch per call).

``prepare_moe(point, ctx, inputs, ...)`` -> :class:`MoeRunner` (the contract of
docs/moe_interface: ``run`` / ``check`` / ``outputs[r]`` / ``routes[r]`` / ``info`` /
``run_traced`` / ``close``).

Fabrics:
* world 1 and ``local`` (W ranks emulated in ONE launch): every executed rank's tokens are the
  rows of one token buffer (rank r at rows r*T..), every rank's experts one stacked weight set
  (global expert ids), so the kernel sees T*W tokens and E experts; dispatch places each row in
  the segment of its expert, which on a single GPU *is* the owner rank's receive buffer.
  ``outputs[r]`` / ``routes[r]`` are views of the shared output buffers.
* ``host`` (rank-0 view, ops/moe_host.py): rank 0 routes its tokens over all E experts; its own
  experts' segments hold its own rows and then the peers' rows, which PEER_DISPATCH items read
  from pinned host memory (PCIe, host -> device); COMBINE items write the outputs of those rows
  back to the peers' pinned buffers (device -> host); DISPATCH writes rank 0's rows for remote
  experts to the peers' pinned send buffers (device -> host) and FOLD reads the peers' outputs
  of them from pinned host memory (host -> device). All four directions move the view's bytes,
  from inside the one launch (SM loads/stores to mapped pinned memory, no copy engine).
* ``nvlink``: not implemented (:func:`unsupported` says so; the op records a skipped row).

Weights are arranged once here, as the kernel reads them (the Hopper builder's B operand is
K x N, N contiguous; the layer's weights are N x K): the router weight transposed and padded to
the 256-wide router tile, W1_e^T with the columns of every n-tile = [128 gate | 128 up] (256 wide;
ping-pong build, ``math_wgs pingpong``: [64 gate | 64 up], kernels/moe_sm90.py W1_TILE) (so each
math thread holds matching gate/up accumulators and SwiGLU is fused in the epilogue),
W2_e^T; the shared expert likewise. A one-time copy per point (prepare), never per call.
"""
from __future__ import annotations

import ctypes

import numpy as np

from ..kernels import moe_sm90 as K
from ..kosmos.config import QUEUE_ORDERS
from ..trace.analysis import decode_launch
from .kosmos import DEFAULT_TIMEOUT_S, WatchdogError

DEFAULT_TRACE_CAP = 4096


def unsupported(shape, fabric: str, mover: str = "sm") -> str | None:
    """Why this kernel cannot run `shape` on `fabric` with `mover` (None: it can). No GPU needed."""
    if fabric not in ("local", "world1", "host") and shape.world > 1:
        return f"kosmos moe: fabric {fabric} is not implemented yet (world 1, local and host)"
    if mover == "ce" and (fabric != "host" or shape.world == 1):
        return f"kosmos moe: mover ce: copy-engine movers are host-fabric only (fabric {fabric}, world {shape.world})"
    ws = shape.world if fabric == "local" else 1
    T = shape.T * ws
    E = shape.E
    if E > K.MAX_E:
        return f"kosmos moe: {E} experts in one launch > {K.MAX_E} (the router tile)"
    if shape.topk > K.MAX_TOPK:
        return f"kosmos moe: topk {shape.topk} > {K.MAX_TOPK}"
    if shape.F % 128 or shape.shared_F % 128:
        return "kosmos moe: the FFN widths must be multiples of 128 (gate/up halves of 256-wide tiles)"
    if shape.n_group > 32:
        return "kosmos moe: at most 32 expert groups"
    if T * shape.topk >= (1 << 24):
        return "kosmos moe: too many token choices for one launch"
    return None


def _w1_columns(F: int, device, tile: int = 256):
    """Row order of W1 (2F x H) so that every `tile` rows are [tile/2 gate | tile/2 up] of the same h columns."""
    import torch

    half = tile // 2
    n = torch.arange(F // half, device=device)[:, None] * half + torch.arange(half, device=device)[None, :]
    return torch.cat([n, n + F], dim=1).reshape(-1)


def arrange_w1(W1, math: str = "joint"):
    """(E x 2F x H) -> (E x H x 2F) in the column order of the `math` build's kernel (module doc)."""
    F = W1.shape[-2] // 2
    return W1.index_select(-2, _w1_columns(F, W1.device, K.W1_TILE[math])).transpose(-1, -2).contiguous()


class MoeRunner:
    def __init__(self, shape, ctx, inputs, *, ranks: list[int], fabric: str = "local", timeout_s: float | None = None,
                 grid: int | None = None, spin_ns: int = 32, trace_cap: int = DEFAULT_TRACE_CAP,
                 debug_skip_scan: bool = False, save_preact: bool = False, queue_order: str = "demand",
                 mover: str = "sm", math: str = "joint"):
        import torch

        host = fabric == "host" and shape.world > 1
        why = unsupported(shape, "host" if host else ("local" if len(ranks) > 1 else "world1"), mover)
        if why:
            raise ValueError(why)
        self.mover = mover
        self.shape, self.ranks, self.closed = shape, list(ranks), False
        self.dev = ctx.device
        self.math = math
        self.lib = K.load(math)
        dev = self.dev
        W = len(ranks)
        T1 = shape.T
        T, H, F, Fs = T1 * W, shape.H, shape.F, shape.shared_F
        E = shape.E  # routed over every expert; tiles for the executed ranks' experts
        E_tiles = shape.E_loc * W
        if ranks[0] != 0 or (E_tiles != E and not host):
            raise ValueError("kosmos moe: executes ranks 0..W-1 (local), rank 0 (world 1, host)")
        view = inputs.host.get("view") if host else None
        if host and view is None:
            raise ValueError("kosmos moe: the host fabric needs the rank-0 view (inputs.host['view'], ops/moe_host.py)")
        k = shape.topk
        bf = torch.bfloat16
        self.T, self.E, self.k = T, E, k
        # inputs, arranged once (module doc)
        self.x = torch.cat([inputs.x[r] for r in ranks]).contiguous() if W > 1 else inputs.x[ranks[0]].contiguous()
        Wr = inputs.Wr
        self.wr_t = torch.zeros(H, 256, dtype=bf, device=dev)
        self.wr_t[:, :E] = Wr.t()
        self.bias = inputs.bias.float().contiguous()
        W1 = torch.cat([inputs.W1[r] for r in ranks]) if W > 1 else inputs.W1[ranks[0]]
        W2 = torch.cat([inputs.W2[r] for r in ranks]) if W > 1 else inputs.W2[ranks[0]]
        self.w1_t = arrange_w1(W1, math)
        self.w2_t = W2.transpose(-1, -2).contiguous()
        if Fs:
            ws1, ws2 = inputs.shared
            self.ws1_t = arrange_w1(ws1[None], math)[0].contiguous()
            self.ws2_t = ws2.t().contiguous()
        else:
            self.ws1_t = self.ws2_t = None
        peer = self._peer_tables(view, shape, dev) if host else None
        R = peer["rows"] if peer else 0
        nb = -(-T // K.BM)
        tm = K.tiles_max(T, k, E_tiles, R)
        i32 = torch.int32
        self.y = torch.empty(T, H, dtype=bf, device=dev)
        self.routes_buf = torch.empty(T, k, dtype=i32, device=dev)
        self.weights = torch.empty(T, k, dtype=torch.float32, device=dev)
        self.rank_buf = torch.empty(T, k, dtype=i32, device=dev)
        self.logits = torch.empty(T, E, dtype=torch.float32, device=dev)
        self.blk_cnt = torch.empty(nb, E, dtype=i32, device=dev)
        self.blk_base = torch.empty(nb, E, dtype=i32, device=dev)
        self.seg_start = torch.empty(E, dtype=i32, device=dev)
        self.tile_order = torch.empty(tm, dtype=i32, device=dev)
        self.tile_expert = torch.empty(tm, dtype=i32, device=dev)
        self.tile_rows = torch.empty(tm, dtype=i32, device=dev)
        self.meta = torch.zeros(4, dtype=i32, device=dev)
        # sorted buffers: zeroed once so padded rows are finite (they are computed, never read)
        self.xs = torch.zeros(tm * K.BM, H, dtype=bf, device=dev)
        self.hs = torch.zeros(tm * K.BM, F, dtype=bf, device=dev)
        self.os = torch.zeros(tm * K.BM, H, dtype=bf, device=dev)
        self.hsh = torch.zeros(T, Fs, dtype=bf, device=dev) if Fs else None
        self.ysh = torch.zeros(T, H, dtype=bf, device=dev) if Fs else None
        # save_preact (the backward's runner, impls/kosmos_moe_bwd.py): the gate/up pre-activations
        # [g | u] of every sorted row and token, kept for the SwiGLU backward (moe_params.h gus)
        self.gus = torch.zeros(tm * K.BM, 2 * F, dtype=bf, device=dev) if save_preact else None
        self.gush = torch.zeros(T, 2 * Fs, dtype=bf, device=dev) if save_preact and Fs else None
        self.own_total = torch.empty(E, dtype=i32, device=dev)
        self.sorted_choice = torch.empty(tm * K.BM, dtype=i32, device=dev)  # t*k+j of each own sorted row
        self.calls = 0  # launches so far: the next one's epoch is calls + 1 (the kernel's state[0] + 1)
        self.ce_plans = []
        self.ctr = torch.zeros(K.ctr_words(T, k, E_tiles, R), dtype=i32, device=dev)
        self.state = torch.zeros(4, dtype=i32, device=dev)
        self.err = torch.zeros(64, dtype=torch.uint8, device=dev)
        self.err_seen = 0
        self.trace_cap = int(trace_cap)
        self.trace_buf = self.trace_count = None

        max_wgs = ctypes.c_int(0)
        self._ok(self.lib.kosmos_moe_max_wgs(dev.index or 0, ctypes.byref(max_wgs)))
        self.grid = int(grid or max_wgs.value)
        self.timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)

        a = K.MoeArgs()
        ptr = lambda t: t.data_ptr() if t is not None else None  # noqa: E731
        a.x, a.bias, a.y, a.routes, a.weights, a.rank = (ptr(self.x), ptr(self.bias), ptr(self.y),
                                                          ptr(self.routes_buf), ptr(self.weights), ptr(self.rank_buf))
        a.logits, a.blk_cnt, a.blk_base, a.seg_start = ptr(self.logits), ptr(self.blk_cnt), ptr(self.blk_base), ptr(self.seg_start)
        a.tile_order, a.tile_expert, a.tile_rows, a.meta = (ptr(self.tile_order), ptr(self.tile_expert),
                                                            ptr(self.tile_rows), ptr(self.meta))
        a.xs, a.hs, a.os, a.hsh, a.ysh = ptr(self.xs), ptr(self.hs), ptr(self.os), ptr(self.hsh), ptr(self.ysh)
        a.gus, a.gush = ptr(self.gus), ptr(self.gush)
        a.ctr, a.state, a.err = ptr(self.ctr), ptr(self.state), ptr(self.err)
        a.own_total, a.sorted_choice, a.E_tiles, a.E_loc = ptr(self.own_total), ptr(self.sorted_choice), E_tiles, shape.E_loc
        if peer:
            self._peer = peer  # keeps the tables alive
            a.ref_routes, a.ref_slot = ptr(peer["ref_routes"]), ptr(peer["ref_slot"])
            a.peer_expert, a.peer_rel, a.peer_total = ptr(peer["expert"]), ptr(peer["rel"]), ptr(peer["total"])
            a.peer_inv, a.peer_first = ptr(peer["inv"]), ptr(peer["first"])
            a.peer_rows = R
            bufs = {n: getattr(view, n) for n in ("recv_rows", "recv_out", "send_rows", "send_out")}
            if mover == "ce":  # the kernel's side of them: device copies the copy-engine plans move
                bufs = self._ce_setup(view, peer, shape, dev)
                a.ce_flags = ptr(self.ce_flags)
            for p in view.peers:
                for n, b in bufs.items():
                    getattr(a, n)[p] = b[p].data_ptr()
            for p in range(K.MAX_PEERS + 1):
                a.peer_begin[p] = peer["begin"][min(p, len(peer["begin"]) - 1)]
        a.timeout_ns = int(self.timeout_s * 1e9)
        a.T, a.H, a.F, a.Fs, a.E, a.topk = T, H, F, Fs, E, k
        a.n_group, a.topk_group = shape.n_group, shape.topk_group
        a.scoring = 0 if shape.scoring == "softmax" else 1
        a.scale = float(shape.scale)
        a.route_blocks, a.tiles_max, a.ctr_words = nb, tm, self.ctr.numel()
        a.grid, a.trace_cap, a.spin_ns = self.grid, self.trace_cap, int(spin_ns)
        a.debug_skip_scan = int(debug_skip_scan)
        a.queue_order = QUEUE_ORDERS.index(queue_order)  # moe_params.h queue_order: the expert-tile order
        self.args = a
        self.handle = self.lib.kosmos_moe_create()
        if not self.handle:
            raise MemoryError("kosmos_moe_create failed")
        self._set()
        self.outputs = {r: self.y[i * T1:(i + 1) * T1] for i, r in enumerate(ranks)}
        self.routes = {r: self.routes_buf[i * T1:(i + 1) * T1] for i, r in enumerate(ranks)}
        self.info = {"moe_kernel": "kosmos moe fwd sm90 (one cooperative launch)", "grid": self.grid,
                     "tiles_max": tm, "experts_per_launch": E_tiles, "tokens_per_launch": T, "peer_rows": R}

    @staticmethod
    def _peer_tables(view, shape, dev) -> dict:
        """Device tables of the host view's peer rows (moe_params.h): their local expert, their row
        among that expert's peer rows (peers in order, each peer's rows in its (expert, token, j)
        order), rows per expert, the per-peer prefix, and the reference routing's send slots."""
        import torch

        E_loc = shape.E_loc
        begin, experts, rels = [0, 0], [], []
        seen = torch.zeros(E_loc, dtype=torch.int64)  # peer rows per expert of the peers before p
        for p in view.peers:
            e = view.recv_meta[p][:, 0].long()
            cnt = torch.bincount(e, minlength=E_loc)
            first = torch.cumsum(cnt, 0) - cnt  # first row of expert e in peer p's buffer
            rels.append(seen[e] + torch.arange(e.numel()) - first[e])
            experts.append(e)
            seen += cnt
            begin.append(begin[-1] + e.numel())
        cat = lambda xs: torch.cat(xs).to(torch.int32).to(dev) if xs else torch.zeros(1, dtype=torch.int32, device=dev)  # noqa: E731
        first = torch.cumsum(seen, 0) - seen  # expert e's first entry in inv
        inv = torch.zeros(max(1, begin[-1]), dtype=torch.int64)
        if experts:
            inv[first[torch.cat(experts)] + torch.cat(rels)] = torch.arange(begin[-1])
        return {"rows": begin[-1], "begin": begin, "expert": cat(experts), "rel": cat(rels),
                "inv": inv.to(torch.int32).to(dev), "first": first.to(torch.int32).to(dev),
                "total": seen.to(torch.int32).to(dev),
                "ref_routes": view.routes0.to(torch.int32).to(dev).contiguous(),
                "ref_slot": view.slot0.to(torch.int32).to(dev).contiguous()}

    def _ce_setup(self, view, peer: dict, shape, dev) -> dict:
        """mover ce (host fabric): device copies of the view's four peer buffers for the kernel,
        the copy-engine flags (moe_params.h ce_flags) and two plans of the main library's
        copy-engine runtime (runtime.cu): host -> device, recv_rows expert by expert (the order
        the kernel's demand order needs them; one release per expert, on its last block) and then
        send_out peer by peer (one release each); device -> host, send_rows peer by peer after
        the kernel's last DISPATCH, then recv_out expert by expert as the kernel releases them.
        Returns the device buffers, by name and peer."""
        import torch

        from .. import kernels
        from .kosmos import plan_streams

        self.klib = kernels.load()
        E_loc = shape.E_loc
        names = ("recv_rows", "recv_out", "send_rows", "send_out")
        bufs = {n: {p: torch.empty_like(getattr(view, n)[p], device=dev) for p in view.peers} for n in names}
        self.ce_bufs = bufs
        self.ce_flags = torch.zeros(2 * E_loc + 8, dtype=torch.int32, device=dev)
        flag = lambda i: self.ce_flags.data_ptr() + 4 * i  # noqa: E731
        row = shape.H * 2
        cnt = {p: torch.bincount(view.recv_meta[p][:, 0].long(), minlength=E_loc).tolist() for p in view.peers}
        first = {p: np.concatenate([[0], np.cumsum(cnt[p])[:-1]]).astype(int).tolist() for p in view.peers}
        blocks = [(e, p) for e in range(E_loc) for p in view.peers if cnt[p][e]]
        last = {e: p for e, p in blocks}  # each expert's last block releases it
        h2d = [(bufs["recv_rows"][p], view.recv_rows[p], first[p][e], cnt[p][e], flag(e) if last[e] == p else 0)
               for e, p in blocks]
        h2d += [(bufs["send_out"][p], view.send_out[p], 0, len(view.send_out[p]), flag(E_loc + p - 1))
                for p in view.peers if len(view.send_out[p])]
        d2h = [(view.send_rows[p], bufs["send_rows"][p], 0, len(view.send_rows[p]), flag(E_loc + 7))
               for p in view.peers if len(view.send_rows[p])]
        d2h += [(view.recv_out[p], bufs["recv_out"][p], first[p][e], cnt[p][e], flag(E_loc + 8 + e)) for e, p in blocks]
        streams = plan_streams(self.klib, dev.index or 0, 3)
        if h2d:
            self.ce_plans.append(self._ce_plan(h2d, streams[0], streams[1], row, waits=False))
        if d2h:
            self.ce_plans.append(self._ce_plan(d2h, streams[2], streams[2], row, waits=True))
        return bufs

    def _ce_plan(self, entries, copy_stream: int, flag_stream: int, row: int, *, waits: bool):
        """A copy-engine plan of (dst, src, first row, rows, word) entries: each copy releases its
        word (its address; 0: none) with the call's epoch, or (waits) first waits for the word
        to reach it."""
        n = len(entries)
        u64 = lambda xs: np.ascontiguousarray(np.array(xs, dtype=np.uint64))  # noqa: E731
        cols = [u64([d.data_ptr() + r0 * row for d, _, r0, _, _ in entries]),
                u64([s_.data_ptr() + r0 * row for _, s_, r0, _, _ in entries]),
                u64([row] * n), u64([rows for *_, rows, _ in entries]), u64([row] * n)]
        words = u64([w for *_, w in entries])
        ones, zeros = np.ones(n, dtype=np.uint32), np.zeros(n, dtype=np.uint32)
        P64, P32 = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
        release = u64([0] * n) if waits else words
        head = 0 if waits else (1 if n > 1 else n)
        h = self.klib.kosmos_ce_plan_create(ctypes.c_void_p(copy_stream), ctypes.c_void_p(flag_stream), n,
                                            *(c.ctypes.data_as(P64) for c in cols), release.ctypes.data_as(P64),
                                            (zeros if waits else ones).ctypes.data_as(P32), zeros.ctypes.data_as(P32),
                                            head, n - 1 if not waits else n)
        if not h:
            raise RuntimeError(f"kosmos moe: copy-engine plan: {self._klib_error()}")
        self._keep = getattr(self, "_keep", []) + [cols, words, ones, zeros, release]
        if waits:
            self._ce_ok(self.klib.kosmos_ce_plan_set_waits(h, n, words.ctypes.data_as(P64), ones.ctypes.data_as(P32)),
                        "kosmos_ce_plan_set_waits")
        return h

    def _klib_error(self) -> str:
        from .. import kernels

        return kernels.last_error(self.klib)

    def _ce_ok(self, rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"kosmos moe: {what}: {self._klib_error()} (rc {rc})")

    # ---- helpers ----
    def _ok(self, rc: int) -> None:
        if rc != 0:
            raise RuntimeError(f"kosmos moe: {K.last_error(self.lib)} (rc {rc})")

    def _set(self) -> None:
        ptr = lambda t: ctypes.c_void_p(t.data_ptr() if t is not None else None)  # noqa: E731
        self._ok(self.lib.kosmos_moe_set(ctypes.c_void_p(self.handle), ctypes.byref(self.args), ptr(self.wr_t),
                                         ptr(self.w1_t), ptr(self.w2_t), ptr(self.ws1_t), ptr(self.ws2_t)))

    def _launch(self) -> None:
        import torch

        stream = torch.cuda.current_stream(self.dev).cuda_stream
        epoch = self.calls + 1
        # copy-engine plans (mover ce): the host -> device copies' first entry before the launch,
        # the rest after it; the device -> host copies wait on the kernel, so all of them after it
        for plan in self.ce_plans:
            self._ce_ok(self.klib.kosmos_ce_plan_begin(plan, ctypes.c_void_p(stream), epoch), "kosmos_ce_plan_begin")
        self._ok(self.lib.kosmos_moe_launch(ctypes.c_void_p(self.handle), ctypes.c_void_p(stream)))
        self.calls += 1
        for plan in self.ce_plans:
            self._ce_ok(self.klib.kosmos_ce_plan_end(plan, ctypes.c_void_p(stream), epoch), "kosmos_ce_plan_end")

    def _raise_if_timed_out(self) -> None:
        if self.closed:
            raise RuntimeError("kosmos moe runner used after close()")
        name = lambda flag: K.counter_name(flag, self.T, self.k, self.args.E_tiles, self.args.peer_rows)  # noqa: E731
        raise_on_watchdog(self, "kosmos moe", K.ITEM_KINDS, name)

    def set_debug_skip_scan(self, skip: bool) -> None:
        """Test hook: the SCAN item never runs (every item after it waits: the watchdog fires)."""
        self.args.debug_skip_scan = int(skip)
        self._set()

    # ---- Runner interface ----
    def run(self) -> None:
        """One forward (asynchronous: one cooperative launch, no host synchronisation)."""
        if self.closed:
            raise RuntimeError("kosmos moe runner used after close()")
        self._launch()

    def check(self) -> None:
        """Synchronize; raise WatchdogError if a call timed out."""
        import torch

        torch.cuda.synchronize(self.dev)
        self._raise_if_timed_out()

    def expert_counts(self):
        """Tokens per expert of the last call (E,) int64 (synchronizes)."""
        import torch

        return torch.bincount(self.routes_buf.long().flatten(), minlength=self.E)

    def run_traced(self):
        """One call with role records; a DataFrame (rank, wg, sm, role, item, kind, t0_ns, t1_ns)."""
        return traced_call(self, self._launch, K)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        sync_quietly(self.dev)
        if self.handle:
            self.lib.kosmos_moe_destroy(ctypes.c_void_p(self.handle))
            self.handle = None
        for plan in self.ce_plans:
            self.klib.kosmos_ce_plan_destroy(plan)
        self.ce_plans = []
        self.outputs = {}
        self.routes = {}


# ------------------------------------------------------------------ shared with the backward's runner
def traced_call(r, call, kmod):
    """One call (`call()`, then `r.check()`) of runner r with its kernel's role records on;
    the decoded DataFrame (kmod: the kernel's ctypes module, ROLE_CODES and KINDS)."""
    import torch

    if r.trace_buf is None:
        r.trace_buf = torch.zeros(r.grid * r.trace_cap * 24, dtype=torch.uint8, device=r.dev)
        r.trace_count = torch.zeros(r.grid, dtype=torch.int32, device=r.dev)
    r.trace_count.zero_()
    r.args.trace, r.args.trace_count = r.trace_buf.data_ptr(), r.trace_count.data_ptr()
    r._set()
    try:
        call()
        r.check()
    finally:
        r.args.trace = r.args.trace_count = None
        r._set()
    df, r.info["trace_dropped"] = decode_trace(r.trace_buf, r.trace_count, r.grid, r.trace_cap, r.ranks[0],
                                               kmod.ROLE_CODES, kmod.ITEM_KINDS)
    return df


def sync_quietly(dev) -> None:
    """Wait for the device before freeing a runner's memory; a failed call's error is already reported."""
    try:
        import torch

        torch.cuda.synchronize(dev)
    except Exception:  # noqa: BLE001 - closing after a failed call
        pass


def watchdog_message(err, seen: int, what: str, kinds, counter_name) -> tuple[int, str | None]:
    """(records so far, the message of a new one or None) from the kernel's error record
    (KosmosErrorRecord, 64 bytes of device memory); kinds / counter_name(flag) name its item
    kind and counter word."""
    raw = err.cpu().numpy().tobytes()[:48]
    count, epoch, _rank, wg, queue, item, _frank, flag, expected, seen_v = np.frombuffer(raw[:40], dtype="<i4")
    waited = int(np.frombuffer(raw[40:48], dtype="<u8")[0])
    if int(count) == seen:
        return seen, None
    kind = kinds[queue] if 0 <= queue < len(kinds) else str(queue)
    return int(count), (f"{what} watchdog: {kind} item {item} (CTA {wg}) waited {waited / 1e6:.1f} ms for "
                        f"{counter_name(int(flag))} (expected >= {expected}, saw {seen_v}) in call {epoch}")


def raise_on_watchdog(r, what: str, kinds, counter_name) -> None:
    """Raise WatchdogError when runner r's kernel recorded a new watchdog abort (after zeroing
    its counters, so that the next call starts clean)."""
    r.err_seen, msg = watchdog_message(r.err, r.err_seen, what, kinds, counter_name)
    if msg:
        _reset_after_abort(r.ctr, r.dev)
        raise WatchdogError(msg)


def _reset_after_abort(ctr, dev) -> None:
    """An aborted call leaves its counters where they stopped: zero them for the next call."""
    import torch

    ctr.zero_()
    torch.cuda.synchronize(dev)


def decode_trace(buf, counts_t, grid: int, cap: int, rank: int, role_codes: dict, kinds) -> tuple:
    """(DataFrame (rank, wg, sm, role, item, t0_ns, t1_ns, kind, lane), records dropped) of one
    traced launch: KosmosTraceRecord [grid][cap], the item's high byte its kind."""
    return decode_launch(buf.cpu().numpy().tobytes(), counts_t.cpu().numpy(), grid, cap, rank=rank,
                         role_codes=role_codes, kinds=tuple(kinds))


def prepare_moe(point, ctx, inputs, *, config=None, timeout_s: float | None = None, **kw) -> MoeRunner:
    """The runner of `point` for this process (world 1; local fabric: every rank in one launch)."""
    shape = inputs.shape  # the op's moe_shape(point), as the inputs were made for it
    fabric = getattr(ctx, "fabric", "local")
    if shape.world > 1 and fabric not in ("local", "host"):
        raise ValueError(unsupported(shape, fabric) or f"kosmos moe: fabric {fabric}")
    ranks = list(range(shape.world)) if shape.world > 1 and fabric == "local" else [ctx.rank]
    settings = runner_settings(config, kw, point)
    mover = moe_mover(settings.pop("mover", None), fabric, shape.world)
    return MoeRunner(shape, ctx, inputs, ranks=ranks, fabric=fabric, timeout_s=timeout_s, mover=mover, **settings)


def moe_mover(mover: str | None, fabric: str, world: int) -> str:
    """The forward kernel's movers: the configuration's ``mover``, else (auto) kosmos.builder's
    rule (the copy engine on the host fabric at world > 1, SM movers elsewhere)."""
    from ..kosmos.builder import mover_choice  # noqa: PLC0415

    return mover_choice(mover, "moe", fabric, "sm90", "self", world)


def runner_settings(config, kw: dict, point=None) -> dict:
    """The MoE runners' keyword arguments: kw (a caller's explicit ones win) with spin_ns,
    queue_order, mover and the forward's math schedule (math_wgs) from `config`, else from the
    point's KosmosConfig (its --set / sweep keys), else the defaults."""
    from ..kosmos.config import DEFAULTS, KosmosConfig  # noqa: PLC0415

    if config is None:
        config = KosmosConfig.from_point(point) if point is not None else DEFAULTS
    out = dict(kw)
    out.setdefault("spin_ns", config.spin_ns)
    out.setdefault("math", config.math_wgs)
    out["queue_order"] = out.get("queue_order") or config.queue_order or "demand"
    out["mover"] = out.get("mover") or config.mover
    return out


def unsupported_moe(point) -> str | None:
    """Why the kernel does not run `point` (None: it does); KosmosImpl.validate calls it."""
    from ..ops.moe import moe_shape  # noqa: PLC0415

    from ..kosmos.config import KosmosConfig  # noqa: PLC0415

    fabric = point.fabric if point.world > 1 else "world1"
    return unsupported(moe_shape(point), fabric, moe_mover(KosmosConfig.from_point(point).mover, fabric, point.world))
