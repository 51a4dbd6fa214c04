"""kosmos: the self-scheduling persistent AG+GEMM and GEMM+RS kernels of csrc/.

One implementation object, ``kosmos``, for ops ag-gemm, gemm-rs and ag-wgrad (the all-gather
along the GEMM's K: At gathered by token rows, the sm90 A-transposed kernel; schedule.py) on
three fabrics:

* ``local``  — W emulated ranks in ONE cooperative launch on one GPU; rank r owns WGs
  ``schedule.wg_starts(G, W)[r:r+2]``; peers' buffers are other device allocations.
* ``host``   — rank-0 view: peers' A shards (ag-gemm; ag-wgrad: At shards) and peers' partial contributions to
  band 0 (gemm-rs, computed with torch in prepare) live in pinned host memory and cross
  PCIe; rank 0 pushes its partials for peers into pinned host memory (gemm-rs). Peers do
  not execute.
* ``nvlink`` — one process per rank; peer pointers from torch symmetric memory, or CUDA IPC
  handles where its rendezvous is refused (flags and the buffers peers touch live in one
  peer-visible allocation; ``_symmetric``). One GPU per rank on a multi-GPU node (never run
  there yet), or shared-GPU mode (kosmos_bench/sharing.py: W processes time-share one GPU,
  gloo group, longer default watchdog; tests/test_nvlink_shared_gpu.py).

The tunables are the point's configuration (``kosmos.config.KosmosConfig.from_point``: the
Point fields policy, queue_order, local_first, chunk, builder, mover and the point's
``knobs``; docs/knobs.md lists them); the schedules and the copy-engine plan come from
``kosmos.plan.plan``, as in the simulator. bf16 only. ``mover`` 'ce': host-fabric ag-gemm
bands (ag-wgrad: At's row bands, whole, in the tiles' K order) move by the copy engine, flags
released by stream memory operations, every WG builds;
unset (auto), ``kosmos.builder.mover_choice`` picks it (ce for host ag-gemm with the sm90
builder and policy self, else sm).
``builder`` 'mma': the portable mma.sync builder, 256-thread WGs, 128x128 tiles; 'sm90':
the Hopper wgmma+TMA builder in 384-thread CTAs, one per SM, 128x256 tiles,
csrc/ag_gemm_sm90.cu (ag-gemm and gemm-rs); unset, picked by device
(``kosmos.builder.builder_choice``: sm90 for the ops of ``AUTO_OPS``).

Extra ``prepare`` keywords: ``out`` (ag-gemm / ag-wgrad: {rank: tensor} to write C_r into,
e.g. the layer step's packed weight gradient), ``config`` (a KosmosConfig instead of the point's), ``num_wgs``
(default: all co-resident), ``timeout_s`` (watchdog, default ``$KOSMOS_TIMEOUT_S`` or 5 s;
``sharing.SHARED_GPU_TIMEOUT_S`` when ``ctx.shared_gpu``),
``debug_skip_rank`` (local fabric: that emulated rank never signals; the watchdog test),
``trace_cap`` (records/WG); ``max_inflight``, ``mover_bulk``, ``mover``, ``builder``,
``ce_slices`` override those configuration fields (tests).

Runner: ``run()`` launches without synchronizing (and first raises :class:`WatchdogError`
if an earlier call timed out); ``check()`` synchronizes and raises for this call;
``run_traced()`` runs once with tracing and returns the role timeline (rank, wg, sm, role,
item, t0_ns, t1_ns; t0 relative to the call's first record); ``info`` holds extra columns.
"""
from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import shutil

import numpy as np

from .. import schedule as S
from .. import sharing
from ..kosmos import builder as kb
from ..kosmos.config import KosmosConfig
from ..kosmos.plan import ce_rank_arrays
from ..kosmos.plan import info as plan_info
from ..kosmos.plan import plan as make_plan
from ..point import Point, parse_policy
from ..trace.analysis import decode_launch
from .base import common_unsupported

DEFAULT_TIMEOUT_S = float(os.environ.get("KOSMOS_TIMEOUT_S", "5"))
# Why torch symmetric memory was not usable in this process (set once; later nvlink runners go
# straight to CUDA IPC handles): KosmosRunner._symmetric.
_SYMM_REFUSED: str | None = None
DEFAULT_TRACE_CAP = 4096

# The CE plans' two streams (copies, flag releases), made once per device and process
# (kosmos_stream_create: non-blocking, never used by anything but CE plans) and shared by every
# runner. Streams made per runner left every second runner of a process 5% slower, call after
# call (70b FC1 8k: 2238 / 2360 / 2236 / 2357 us for four runners made one after another, with
# or without address reuse; results/issue4-h200-20261203/probes/b2b_runner_parity.parquet), and
# torch's pool streams are worse (t14: releases behind earlier copies). Runners of one device run
# one after another, so one pair in stream order is enough.
_PLAN_STREAMS: dict[int, list[int]] = {}


def make_stream_pair(lib, dev_index: int, n: int = 2) -> list[int]:
    """n (two) new kosmos_stream_create streams on device dev_index (none left behind on failure)."""
    import torch

    made: list[int] = []
    with torch.cuda.device(dev_index):
        for _ in range(n):
            h = ctypes.c_void_p()
            if lib.kosmos_stream_create(ctypes.byref(h)) != 0:
                from .. import kernels

                why = kernels.last_error(lib)
                for m in made:
                    lib.kosmos_stream_destroy(ctypes.c_void_p(m))
                raise RuntimeError(f"kosmos_stream_create failed: {why}")
            made.append(h.value)
    return made


def plan_streams(lib, dev_index: int, n: int = 2) -> list[int]:
    """The CE plans' [copy stream, flag stream] handles on device dev_index (made on first use);
    n = 3 adds gemm-rs's push stream (device -> host copies, beside the host -> device ones)."""
    have = _PLAN_STREAMS.get(dev_index, [])
    if len(have) < n:  # stored only once made (make_stream_pair leaves nothing behind on failure)
        have = _PLAN_STREAMS[dev_index] = have + make_stream_pair(lib, dev_index, n - len(have))
    return have[:n]


class WatchdogError(RuntimeError):
    """A spin-wait in a kosmos kernel timed out (missing peer, protocol bug)."""


class KosmosImpl:
    name = "kosmos"
    # op gemm (world 1) is the builder role alone: the Hopper wgmma/TMA builder's standalone
    # persistent kernel (kernels/sm90_gemm.py), measured against cuBLAS by sweeps/builder.yaml.
    # op moe: the expert layer's forward kernel, impls/kosmos_moe.py (skipped when not built in);
    # moe-bwd / moe-step: the backward kernel, impls/kosmos_moe_bwd.py (world 1, local, host)
    ops = ("ag-gemm", "gemm-rs", "gemm", "moe", "ag-gemm-dgrad", "gemm-rs-dgrad", "ag-wgrad", "layer", "moe-bwd",
           "moe-step")
    fabrics = ("local", "host", "nvlink")

    def available(self, backend: str) -> tuple[bool, str]:
        if backend != "gpu":
            return False, f"kosmos kernels run on backend=gpu (backend={backend}; the simulator models them)"
        try:
            import torch
        except ImportError:
            return False, "torch is not installed"
        if not torch.cuda.is_available():
            return False, "no CUDA device visible"
        if getattr(torch.version, "hip", None):
            return False, "no HIP build of the kosmos kernels yet"
        major, _ = torch.cuda.get_device_capability()
        if major < 9:
            return False, f"kosmos kernels are built for sm_90a (this GPU is sm_{major}x)"
        from .. import kernels

        if kernels.find_lib(kernels.detect_arch()) is None and shutil.which("nvcc") is None:
            return False, "no prebuilt kosmos library matches the sources and nvcc is not on PATH to build it"
        return True, ""

    def unsupported(self, point: Point) -> str | None:
        why = common_unsupported(self, point)
        if why:
            return why
        if point.op in ("moe", "moe-bwd", "moe-step") and (point.policy or "self") != "self":
            return f"kosmos moe: the MoE kernels self-schedule only (policy {point.policy} is not built in them)"
        if point.op in ("moe-bwd", "moe-step"):
            return _moe_unsupported(point, "kosmos_moe_bwd", "prepare_moe_bwd", "unsupported_moe_bwd")
        if point.op in DGRAD_OPS:  # the forward kernel, B_r read transposed: the sm90 builder only
            fwd = _forward_point(point)
            why = self.unsupported(fwd)
            if why is None and KosmosConfig.from_point(fwd).builder not in (None, "sm90"):
                why = f"{point.op}: B_r read transposed needs the sm90 builder (TMA), not {KosmosConfig.from_point(fwd).builder}"
            return why
        if point.dtype != "bf16":
            return f"kosmos kernels are bf16 only (dtype={point.dtype})"
        try:
            cfg = KosmosConfig.from_point(point)
        except ValueError as e:
            return str(e)
        if point.op == "moe":
            return _moe_unsupported(point)
        if point.op == "gemm":
            from ..kernels import sm90_gemm

            ok, why = sm90_gemm.available()
            if not ok:
                return why
            if cfg.gemm_kernel == "standalone":
                return sm90_gemm.validate_shape(point.M, point.N, point.K)
            return kb.validate(point.M, point.N, point.K, 1)
        if point.op == "ag-wgrad":  # A read transposed: the sm90 builder's TMA only (library kosmos_ag_sm90_at)
            if cfg.builder not in (None, "sm90"):
                return f"ag-wgrad: At read transposed needs the sm90 builder (TMA), not {cfg.builder}"
            if cfg.wgrad_group and cfg.wgrad_items != "band":
                return "ag-wgrad wgrad_group: bands per group of wgrad_items=band only (wgrad_items=tile)"
            cfg = cfg.replace(builder="sm90")
        if cfg.builder == "sm90":
            why = kb.validate(point.M, point.N, point.K, point.world, op=point.op)
            if why:
                return why
            if cfg.mover_bulk:
                return "builder sm90: no mover_bulk path (no shared memory beside the builder)"
        why = S.validate(point.op, point.M, point.N, point.K, point.world, chunk=cfg.chunk)
        if why:
            return why
        pol = cfg.policy
        if cfg.mover == "ce":
            if point.fabric != "host":
                return f"mover ce: copy-engine movers are host-fabric only (fabric={point.fabric})"
            if point.op == "gemm-rs" and (cfg.builder == "mma" or kb.validate(point.M, point.N, point.K, point.world,
                                                                             op=point.op)):
                return "mover ce: gemm-rs copy-engine movers need the sm90 builder (its kernel frees blocked pushes)"
            if pol != "self":
                return f"mover ce: the copy engine does every move, so WG role policies do not apply (policy={pol})"
        kind, k = parse_policy(pol)
        if kind == "fixed":
            wgs = _guess_wgs_per_rank(point)
            if wgs is not None and k >= wgs:
                return f"policy {pol}: k={k} leaves no builder among {wgs} WGs per rank"
        return None

    def prepare(self, point: Point, ctx, inputs, **kw) -> "KosmosRunner":
        if point.op == "moe":  # by name: the module is branch moek's (absent: _moe_unsupported says so)
            return importlib.import_module(f"{__package__}.kosmos_moe").prepare_moe(point, ctx, inputs, **kw)
        if point.op in ("moe-bwd", "moe-step"):
            return importlib.import_module(f"{__package__}.kosmos_moe_bwd").prepare_moe_bwd(point, ctx, inputs, **kw)
        if point.op == "gemm":
            return _prepare_gemm(point, ctx, inputs, **kw)
        if point.op in DGRAD_OPS:
            return KosmosRunner(_forward_point(point), ctx, inputs, b_transposed=True, **kw)
        return KosmosRunner(point, ctx, inputs, **kw)


def _moe_unsupported(point: Point, module: str = "kosmos_moe", prepare: str = "prepare_moe",
                     check: str = "unsupported_moe") -> str | None:
    """ops moe / moe-bwd / moe-step: the kernel's module (impls/kosmos_moe.py with prepare_moe;
    impls/kosmos_moe_bwd.py with prepare_moe_bwd) must be part of this build; its own check
    (`unsupported_moe(point)` / `unsupported_moe_bwd(point)`), when it has one, says which points it runs."""
    try:
        mod = importlib.import_module(f"{__package__}.{module}")
    except ImportError as e:
        return f"the kosmos moe kernel is not in this build (kosmos_bench.impls.{module}: {e})"
    if not hasattr(mod, prepare):
        return f"the kosmos moe kernel is not in this build (kosmos_bench.impls.{module} has no {prepare})"
    fn = getattr(mod, check, None)
    return fn(point) if fn is not None else None


# The backward dgrad ops: the forward kernels (same schedule, protocol, movers) with B_r read
# transposed in place (ops/backward.py; library kosmos_ag_sm90_bt).
DGRAD_OPS = ("ag-gemm-dgrad", "gemm-rs-dgrad")


def _forward_point(point: Point) -> Point:
    from ..ops import get_op

    return point.replace(op=get_op(point.op).base)


def _prepare_gemm(point: Point, ctx, inputs, *, gemm_kernel: str | None = None, **kw):
    """op gemm (world 1): 'fused' (default) runs the KOSMOS AG+GEMM kernel with the sm90
    builder at world 1 — the same persistent kernel, claims, flags and exit protocol, with no
    communication items; 'standalone' (the configuration's ``gemm_kernel``, or gemm_kernel=)
    the builder's own persistent GEMM (kernels/sm90_gemm.py), which isolates the builder from
    the protocol."""
    import torch

    cfg = kw.pop("config", None) or KosmosConfig.from_point(point)
    if gemm_kernel is not None:
        cfg = cfg.replace(gemm_kernel=gemm_kernel)
    if cfg.gemm_kernel == "fused":
        fused = point.replace(op="ag-gemm", fabric="local", builder="sm90", policy="self", mover=None)
        r = KosmosRunner(fused, ctx, inputs, config=cfg.replace(builder="sm90", policy="self", mover=None), **kw)
        r.info["gemm_kernel"] = "fused ag-gemm sm90, world 1"
        return r
    from ..kernels import sm90_gemm
    from .base import FnRunner

    A, B = inputs.A[ctx.rank], inputs.B[ctx.rank]
    out = torch.empty((point.M, point.N), dtype=A.dtype, device=ctx.device)
    return FnRunner(lambda: sm90_gemm.gemm(A, B, out=out), {ctx.rank: out},
                    info={"builder": "sm90", "gemm_kernel": "standalone sm90 persistent GEMM"})


def _guess_wgs_per_rank(point: Point) -> int | None:
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        sms = torch.cuda.get_device_properties(0).multi_processor_count
    except Exception:  # noqa: BLE001
        return None
    return sms // point.world if point.fabric == "local" else sms


def _out_tensor(out: dict, r: int, shape: tuple[int, int], dt):
    """out[r] as C_r (``out=``: the layer step's packed weight gradient): checked, not copied."""
    t = out.get(r)
    if t is None or tuple(t.shape) != tuple(shape) or t.dtype != dt or not t.is_contiguous() or t.data_ptr() % 16:
        what = None if t is None else (tuple(t.shape), t.dtype, t.is_contiguous(), t.data_ptr() % 16)
        raise ValueError(f"out[{r}]: expected a contiguous 16-byte aligned {dt} tensor of {shape}, got {what}")
    return t


def wgrad_group_rows(sched: S.RankSchedule) -> int:
    """Params.wgrad_group_rows of a schedule: K rows per band group of ag-wgrad band items (the
    kernel's k range of an AGW_BAND item: [kpart, kpart + min(rows, K/W - kpart))), 0 without them."""
    if sched.op != "ag-wgrad" or S.wgrad_tiles(sched):
        return 0
    return int(sched.meta["group_rows"])


def carry_floats(sched: S.RankSchedule) -> int:
    """fp32 elements of one rank's band-item carry (RankArgs.carry): one BM x BN builder tile per C_r
    tile, in the math warps' fragment order (csrc/ag_gemm_sm90.cu carry_step), partial tiles padded."""
    return int(sched.meta["m_tiles"] * sched.meta["n_tiles"] * sched.BM * sched.BN)


def _i32(dev, a: np.ndarray):
    import torch

    a = np.ascontiguousarray(a, dtype=np.int32)
    if a.size == 0:
        a = np.zeros(1, dtype=np.int32)
    return torch.from_numpy(a.copy()).to(dev)


class KosmosRunner:
    """Buffers, schedules and launch parameters of one point (see the module docstring)."""

    def __init__(self, point: Point, ctx, inputs, **kw):
        # what close() releases, set first so that a failed set-up releases what it made
        self.closed, self.outputs = False, {}
        self._keep: list = []  # tensors whose pointers the kernel holds
        self._mapped: list[int] = []  # kosmos_alloc_mapped host pointers
        self.sm90_handle = None
        self.sm90_rs = False  # the sm90 handle is a GEMM+RS one (kosmos_sm90_rs_*)
        self.ahead_blocks = None  # sm90 builder: the lookahead claim (configuration ahead_blocks)
        self.ce_plan = None  # C handle (kosmos_ce_plan_create) when the copy engine moves
        self.ce_push_plan = None  # gemm-rs: the device -> host pushes (waits on builder counters)
        try:
            self._setup(point, ctx, inputs, **kw)
        except BaseException:
            self.close()
            raise

    def _setup(self, point: Point, ctx, inputs, *, config: KosmosConfig | None = None, num_wgs: int | None = None,
               timeout_s: float | None = None, debug_skip_rank: int | None = None,
               trace_cap: int = DEFAULT_TRACE_CAP, max_inflight: int | None = None, mover_bulk: bool | None = None,
               mover: str | None = None, builder: str | None = None, ce_slices: int | str | tuple | None = None,
               b_transposed: bool = False, out: dict | None = None):
        import torch

        from .. import kernels
        from ..kernels import abi, ag_sm90

        cfg = config or KosmosConfig.from_point(point)
        over = dict(max_inflight=max_inflight, mover_bulk=mover_bulk, mover=mover, builder=builder,
                    ce_slices=ce_slices)
        cfg = cfg.replace(**{k: v for k, v in over.items() if v is not None})
        self.config = cfg
        self.point, self.ctx = point, ctx
        self.dev = ctx.device
        self.lib = kernels.load()
        # 'mma': the main library's kernels. 'sm90' (ag-gemm; the default on sm_90 when the shape
        # suits TMA): the Hopper builder kernel of kernels/ag_sm90.py; same buffers, schedule
        # arrays and protocol.
        self.builder = kb.builder_choice(cfg.builder, point.op, (point.M, point.N, point.K, point.world),
                                         torch.cuda.get_device_capability(self.dev), cfg.mover_bulk)
        self.sm90 = None
        self.sm90_rs = point.op == "gemm-rs"  # sm90: the GEMM+RS kernel (kosmos_sm90_rs_*), else AG+GEMM
        a_transposed = point.op == "ag-wgrad"  # the AG kernel of the A-transposed library (op ag-wgrad)
        if a_transposed and self.builder != "sm90":
            raise ValueError(f"ag-wgrad: At read transposed needs the sm90 builder (builder={self.builder})")
        if self.builder == "sm90":
            why = kb.validate(point.M, point.N, point.K, point.world, op=point.op)
            if why:
                raise ValueError(why)
            if cfg.mover_bulk:
                raise ValueError("builder='sm90' has no mover_bulk path (no shared memory beside the builder)")
            self.sm90 = ag_sm90.load(b_transposed=b_transposed, a_transposed=a_transposed)
        elif b_transposed:
            raise ValueError(f"B_r read transposed needs the sm90 builder (builder={self.builder})")
        if b_transposed:  # B_r must be the transposed view of a contiguous W_r (ops/backward.py)
            for b in inputs.B.values():
                if b.dim() != 2 or not b.t().is_contiguous():
                    raise ValueError(f"b_transposed: B_r {tuple(b.shape)} is not a transposed view of a contiguous tensor")
        self.b_transposed = b_transposed
        self.mover_bulk = cfg.mover_bulk
        self.abi = abi
        op, W, M, N, K = point.op, point.world, point.M, point.N, point.K
        fabric = point.fabric
        self.fabric = fabric
        self.op_code = abi.OP_CODES[op]
        # 'sm': WGs move (the KOSMOS design); 'ce' (host fabric, ag-gemm): the copy engine moves
        # each band (cudaMemcpyAsync on a side stream) and releases its flag with a stream
        # memory operation; every WG builds. Copy-engine movers + sm90 builders: the last remote
        # group arrives in K-slices that the builders stream (Params.k_stream; ce_plan.py); the
        # mma builder has no slice wait: it always gets whole bands. kosmos.plan (below, once the
        # CTA count is known) resolves slices, merging and groups as the simulator does.
        # mover auto (None): the faster mover for this fabric, op and builder (kb.mover_choice)
        self.mover = kb.mover_choice(cfg.mover, op, fabric, self.builder, cfg.policy, W)
        cfg = self.config = cfg.replace(mover=self.mover)
        if self.mover == "ce" and (fabric != "host" or (op == "gemm-rs" and self.builder != "sm90")):
            raise ValueError("mover='ce' is implemented on the host fabric only (gemm-rs: with the sm90 builder)")
        self.spin_ns = cfg.spin_ns
        self.calls = 0  # completed launches since the last reset (epoch of the next = calls + 1)
        dev_index = self.dev.index if self.dev.index is not None else torch.cuda.current_device()
        self.dev_index = dev_index
        with torch.cuda.device(dev_index):
            mx = ctypes.c_int(0)
            if self.sm90 is not None:
                fn = "kosmos_sm90_rs_max_wgs" if self.sm90_rs else "kosmos_sm90_ag_max_wgs"
                self._call(getattr(self.sm90, fn)(dev_index, ctypes.byref(mx)), fn)
            else:
                self._call(self.lib.kosmos_max_wgs(self.op_code, dev_index, ctypes.byref(mx)), "kosmos_max_wgs")
        G = min(int(num_wgs or mx.value), mx.value)
        ranks = list(range(W)) if fabric == "local" else [ctx.rank if fabric == "nvlink" else 0]
        if fabric == "local":
            starts = S.wg_starts(G, W)
        else:
            starts = np.array([0, G], dtype=np.int32)
        self.ranks, self.grid, self.starts = ranks, G, starts
        sizes = np.diff(starts)
        self.plan = make_plan(point, cfg, {r: int(sizes[i]) for i, r in enumerate(ranks)}, builder=self.builder)
        self.ce = self.plan.resolved
        self.k_stream = self.ce.k_stream
        self.scheds = [self.plan.scheds[r] for r in ranks]
        if op == "ag-wgrad" and self.scheds[0].meta["band_rows"] % kb.BK:  # the kernel waits per band of k-blocks
            raise ValueError(f"ag-wgrad: bands of {self.scheds[0].meta['band_rows']} rows are not whole k-blocks of {kb.BK}")
        self.wgrad_group_rows = wgrad_group_rows(self.scheds[0])  # Params.wgrad_group_rows (0: no band items)
        dt = torch.bfloat16
        m_loc = M // W
        nf = self.scheds[0].flags.num_flags

        # ---- state, error record, trace ----
        n_exec = len(ranks)
        self.state = torch.zeros(4 + abi.NUM_CTR * n_exec, dtype=torch.int32, device=self.dev)
        host, devp = ctypes.c_void_p(), ctypes.c_void_p()
        self._call(self.lib.kosmos_alloc_mapped(ctypes.sizeof(abi.ErrorRecord), ctypes.byref(host), ctypes.byref(devp)),
                   "kosmos_alloc_mapped")
        self._mapped.append(host.value)
        self.err = abi.ErrorRecord.from_address(host.value)
        self.err_dev = devp.value
        self.err_seen = int(self.err.count)
        self.trace_cap = int(trace_cap)
        self.trace_buf = None
        self.trace_count = None

        # ---- buffers per fabric ----
        flags: dict[int, object] = {}
        scratch_flags = None
        self.symm = None
        if fabric == "nvlink":
            sym_ptrs, off_data = self._symmetric(op, W, M, N, K, nf)
            for p in range(W):
                flags[p] = sym_ptrs[p]
        else:
            for r in ranks:
                t = torch.zeros(nf, dtype=torch.int32, device=self.dev)
                self._keep.append(t)
                flags[r] = t.data_ptr()
            if fabric == "host":
                scratch_flags = torch.zeros(nf, dtype=torch.int32, device=self.dev)
                self._keep.append(scratch_flags)
                for p in range(W):
                    flags.setdefault(p, scratch_flags.data_ptr())
        self.flag_tensors = [t for t in self._keep]  # zeroed after an abort

        self.outputs: dict[int, torch.Tensor] = {}
        self.gathered: dict[int, torch.Tensor] = {}
        A, B = inputs.A, inputs.B
        # The kernel reads the shards through raw pointers: the runner owns them as long as it lives
        # (a caller that drops its inputs would have their memory handed to the next allocation:
        # right on the first call, garbage after, as the band watchdog tests saw on 2026-12-05).
        self._keep += [t for r in ranks for t in (A.get(r), B.get(r)) if t is not None]
        per_rank: dict[int, dict] = {}
        if op in S.AG_OPS:
            n_loc = N // W
            # the gathered operand (rows by rank): A (M x K), ag-wgrad At (K x M)
            g_rows, g_cols = (K, M) if op == "ag-wgrad" else (M, K)
            s_rows = g_rows // W
            peer_A = {}
            if fabric == "local":
                peer_A = {p: A[p].data_ptr() for p in range(W)}
            elif fabric == "host":  # the same pinned pages as the baselines and copy-alone
                from . import nccl as nccl_impls

                shards = nccl_impls.host_peers(point, ctx, inputs).shards
                peer_A[0] = A[0].data_ptr()
                self._host_A = {p: shards[p] for p in range(1, W)}
                for p in range(1, W):
                    self._keep.append(shards[p])
                    peer_A[p] = self._dev_ptr(shards[p])
            else:
                for p in range(W):
                    peer_A[p] = sym_ptrs[p] + off_data
                mine = self.symm_buf[off_data:off_data + s_rows * g_cols * 2].view(dt).view(s_rows, g_cols)
                mine.copy_(A[ctx.rank])
                torch.cuda.synchronize(self.dev)
                self._barrier()
            for r in ranks:
                C = _out_tensor(out, r, (M, n_loc), dt) if out else torch.empty(M, n_loc, dtype=dt, device=self.dev)
                work = torch.empty(g_rows, g_cols, dtype=dt, device=self.dev)
                self._keep += [C, work]
                self.outputs[r] = C
                self.gathered[r] = work  # peers' bands after a call (own band: read from A_r, not here)
                if self.mover == "ce":
                    self._ce_plan(work, flags[r], s_rows, g_cols)
                per_rank[r] = dict(A=A[r].data_ptr(), B=B[r].data_ptr(), C=C.data_ptr(), work=work.data_ptr(),
                                   peer_A=[peer_A.get(p, 0) for p in range(W)], carry=0)
                if self.wgrad_group_rows:  # band items: the fp32 carry, one builder tile per C_r tile
                    carry = torch.empty(carry_floats(self.scheds[0]), dtype=torch.float32, device=self.dev)
                    self._keep.append(carry)
                    per_rank[r]["carry"] = carry.data_ptr()
        else:
            slot_bytes = m_loc * N * 2
            recv = {}
            if fabric == "local":
                for r in ranks:
                    recv[r] = torch.empty(W * m_loc, N, dtype=dt, device=self.dev)
                    self._keep.append(recv[r])
            for r in ranks:
                Cr = torch.empty(m_loc, N, dtype=dt, device=self.dev)
                work = torch.empty(M, N, dtype=dt, device=self.dev)
                self._keep += [Cr, work]
                self.outputs[r] = Cr
                d = dict(A=A[r].data_ptr(), B=B[r].data_ptr(), C=Cr.data_ptr(), work=work.data_ptr(),
                         push_dst=[0] * W, slot=[0] * W, proxy_src=[0] * W)
                if W == 1:  # a sum of one partial: build into C_r, no reduce pass (the builder at world 1)
                    d["slot"][0] = Cr.data_ptr()
                    per_rank[r] = d
                    continue
                if fabric == "local":
                    for q in range(W):
                        d["push_dst"][q] = recv[q].data_ptr() + r * slot_bytes
                        d["slot"][q] = recv[r].data_ptr() + q * slot_bytes
                elif fabric == "host":
                    own = torch.empty(W * m_loc, N, dtype=dt, device=self.dev)
                    self._keep.append(own)
                    send = torch.empty(max(1, W - 1) * m_loc, N, dtype=dt).pin_memory()
                    self._keep.append(send)
                    send_dev = self._dev_ptr(send)
                    for q in range(W):
                        d["slot"][q] = own.data_ptr() + q * slot_bytes
                        if q != r:
                            d["push_dst"][q] = send_dev + (q - 1) * slot_bytes
                    self._rs_send, self._rs_proxy_host = send, {}
                    for s in range(1, W):  # peers' static contributions to band 0
                        part = (A[s][:m_loc].float() @ B[s].float()).to(dt)
                        d["proxy_src"][s], self._rs_proxy_host[s] = self._pinned(part, host=True)
                        del part
                    if self.mover == "ce":
                        self._rs_ce_plans(work, flags[r], d, m_loc, N)
                else:
                    for q in range(W):
                        d["push_dst"][q] = sym_ptrs[q] + off_data + r * slot_bytes
                        d["slot"][q] = sym_ptrs[r] + off_data + q * slot_bytes
                per_rank[r] = d

        # ---- rank args ----
        ra_arr = (abi.RankArgs * n_exec)()
        self.rank_arrays: list[dict] = [{} for _ in range(n_exec)]
        state_ptr = self.state.data_ptr()
        for i, (r, sch) in enumerate(zip(ranks, self.scheds)):
            a = ra_arr[i]
            arrs = sch.arrays()
            if self.mover == "ce" and op == "gemm-rs":  # ce_plan.build_rs: builder counters, proxy copies' flags
                rs = self.plan.rs_ce
                arrs["flag_mult"] = arrs["flag_mult"].copy()
                for f, m in rs.flag_mult.items():
                    arrs["flag_mult"][f] = m
                bi = arrs["builder_items"].reshape(-1, S.ITEM_STRIDE).copy()
                col = bi[:, S.F["rel_flag"]]
                bi[:, S.F["rel_flag"]] = [  # the builders of a push add to its counter
                    rs.built_alias.get(int(f), int(f)) for f in col]
                arrs["builder_items"] = bi.reshape(-1)
                arrs["deps"] = np.array([rs.arrival_alias.get(int(f), int(f)) for f in arrs["deps"]], dtype=np.int32)
            if op == "gemm-rs" and W == 1:  # nothing reads the partials' flags: no release (fence) per tile
                bi = arrs["builder_items"].reshape(-1, S.ITEM_STRIDE).copy()
                bi[:, S.F["rel_flag"]] = -1
                arrs["builder_items"] = bi.reshape(-1)
            for q, name in enumerate(("builder", "mover", "reduce")):
                queue = arrs[f"{name}_queue"]
                if q == S.Q_MOVE and self.mover == "ce":  # the copy engine moves; every WG builds
                    queue = queue[:0]
                if q == S.Q_REDUCE and W == 1:  # the builders write C_r itself (its one slot), released by none
                    queue = queue[:0]
                ti, tq = _i32(self.dev, arrs[f"{name}_items"]), _i32(self.dev, np.ascontiguousarray(queue))
                self._keep += [ti, tq]
                a.items[q], a.queue[q] = ti.data_ptr(), tq.data_ptr()
                a.count[q] = len(queue)
            if self.mover == "ce" and op in S.AG_OPS:  # band flags count the copy engine's releases (ce_plan.build)
                arrs = ce_rank_arrays(self.plan, arrs)  # a copy's bands wait on the one flag it releases
            for name in ("deps", "peer_flags", "flag_mult"):
                t = _i32(self.dev, arrs[name])
                self._keep.append(t)
                self.rank_arrays[i][name] = t  # what the kernel reads (tests edit flag_mult: a flag never ready)
                setattr(a, name, t.data_ptr())
            a.ctr = state_ptr + 4 * (4 + abi.NUM_CTR * i)
            d = per_rank[r]
            a.A, a.B, a.C, a.work = d["A"], d["B"], d["C"], d["work"]
            a.carry = d.get("carry") or None
            for p in range(W):
                a.flags[p] = flags[p]
                if op in S.AG_OPS:
                    a.peer_A[p] = d["peer_A"][p] or None
                else:
                    a.push_dst[p] = d["push_dst"][p] or None
                    a.slot[p] = d["slot"][p] or None
                    a.proxy_src[p] = d["proxy_src"][p] or None
            a.rank = r
            a.wg_begin, a.wg_end = int(starts[i]), int(starts[i + 1])
            a.num_mover_wgs = int(sch.num_movers or 0)
            a.max_inflight_movers = int(sch.max_inflight)
            a.num_peer_flags = len(sch.peer_flags)
            a.skip = 1 if (debug_skip_rank is not None and r == debug_skip_rank) else 0
        self._ra_arr = ra_arr
        raw = np.frombuffer(bytes(ra_arr), dtype=np.uint8)
        self.rank_args = torch.from_numpy(raw.copy()).to(self.dev)
        if self.sm90 is not None and self.sm90_rs:  # TMA descriptors over A_r and B_r of every executed rank
            self.sm90_handle = self.sm90.kosmos_sm90_rs_create()
            if not self.sm90_handle:
                raise MemoryError("kosmos_sm90_rs_create failed")
            for i, r in enumerate(ranks):
                d = per_rank[r]
                ptrs = [d["work"], d["C"]] + [x for x in d["slot"] + d["push_dst"] + d["proxy_src"] if x]
                if any(int(x) % 16 for x in ptrs):
                    raise ValueError("builder sm90 gemm-rs: staging, slots, pushes and C_r must be 16-byte aligned")
                self._sm90_set_rank(i, d["A"], d["work"], d["B"], d["C"])
        elif self.sm90 is not None:  # TMA descriptors over A_r, the gathered buffer and B_r of every executed rank
            self.sm90_handle = self.sm90.kosmos_sm90_ag_create()
            if not self.sm90_handle:
                raise MemoryError("kosmos_sm90_ag_create failed")
            self.ahead_blocks = cfg.ahead_blocks
            self._call(self.sm90.kosmos_sm90_ag_set_ahead(ctypes.c_void_p(self.sm90_handle), self.ahead_blocks),
                       "kosmos_sm90_ag_set_ahead")
            for i, r in enumerate(ranks):
                d = per_rank[r]
                self._sm90_set_rank(i, d["A"], d["work"], d["B"], d["C"])

        if timeout_s is None:  # shared-GPU mode: peers are time-sliced processes (sharing.py)
            timeout_s = sharing.SHARED_GPU_TIMEOUT_S if getattr(ctx, "shared_gpu", False) else DEFAULT_TIMEOUT_S
        self.timeout_ns = int(timeout_s * 1e9)
        self.params = self._params(trace=False)
        k = self.scheds[0].num_movers
        self.info = {"num_movers": k, "num_wgs": int(G), "wgs_per_rank": int(sizes.min()), "mover": self.mover,
                     "builder": self.builder, "ce_copies": int(getattr(self, "ce_copies", 0)),
                     "ce_releases": len(getattr(self, "ce_entries", ())), **plan_info(self.plan, self.scheds[0]),
                     "max_inflight_movers": int(ra_arr[0].max_inflight_movers), "ahead_blocks": self.ahead_blocks,
                     "kosmos_policy": cfg.policy, "trace_dropped": 0}
        if fabric == "nvlink":
            self.info.update(peer_memory=self.peer_memory, peer_memory_why=self.peer_memory_why or None,
                             watchdog_s=timeout_s)
        torch.cuda.synchronize(self.dev)

    # ---- helpers ----
    def _call(self, rc: int, what: str) -> None:
        if rc != 0:
            from .. import kernels

            if what.startswith("kosmos_sm90"):
                from ..kernels import ag_sm90

                raise RuntimeError(f"{what} failed ({rc}): {ag_sm90.last_error(self.sm90)}")
            raise RuntimeError(f"{what} failed ({rc}): {kernels.last_error(self.lib)}")

    def _sm90_set_rank(self, i: int, A: int, work: int, B: int, C: int) -> None:
        p = self.point
        P = ctypes.c_void_p
        if self.sm90_rs:
            self._call(self.sm90.kosmos_sm90_rs_set_rank(P(self.sm90_handle), i, P(A), P(B), p.M, p.N, p.K, p.world),
                       "kosmos_sm90_rs_set_rank")
            return
        self._call(self.sm90.kosmos_sm90_ag_set_rank(P(self.sm90_handle), i, P(A), P(work), P(B), P(C), p.M, p.N,
                                                     p.K, p.world), "kosmos_sm90_ag_set_rank")

    def _dev_ptr(self, t) -> int:
        out = ctypes.c_void_p()
        self._call(self.lib.kosmos_host_device_ptr(ctypes.c_void_p(t.data_ptr()), ctypes.byref(out)),
                   "kosmos_host_device_ptr")
        return int(out.value)

    def _pinned(self, t, host: bool = False):
        """t copied to pinned host memory: its device pointer (and, host=True, the host tensor)."""
        h = t.detach().to("cpu").contiguous().pin_memory()
        self._keep.append(h)
        return (self._dev_ptr(h), h) if host else self._dev_ptr(h)

    def _barrier(self) -> None:
        import torch.distributed as dist

        if self.ctx.group is not None:
            dist.barrier(group=self.ctx.group)

    def _symmetric(self, op, W, M, N, K, nf):
        """This rank's peer-visible allocation (flags, then data) and every rank's address of it.

        Two ways, tried in this order; the first that works in EVERY rank is used and
        ``info['peer_memory']`` says which ('symm' | 'cuda-ipc'), ``info['peer_memory_why']`` why
        the first was not usable (exception text of each rank that failed):

        1. torch symmetric memory: ``symm.empty`` + ``symm.rendezvous`` over ctx.group (NCCL or,
           in shared-GPU mode, gloo with TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1);
        2. CUDA IPC: a plain caching-allocator tensor, its handle (torch.multiprocessing's
           ``reduce_tensor``: cudaIpcGetMemHandle + offset) all-gathered over ctx.group as an
           object, opened by each peer (``rebuild_cuda_tensor``: cudaIpcOpenMemHandle).

        The outcome of 1 is agreed on (all_gather_object of each rank's error) before anyone uses
        it; a failure is remembered for the process (_SYMM_REFUSED) so later points go to 2 at once.
        """
        global _SYMM_REFUSED
        import torch
        import torch.distributed as dist

        if self.ctx.group is None:
            raise RuntimeError("nvlink fabric needs a process group (ctx.group)")
        m_loc = M // W
        off_data = (nf * 4 + 255) // 256 * 256
        data = {"ag-gemm": m_loc * K * 2, "ag-wgrad": (K // W) * M * 2}.get(op, W * m_loc * N * 2)
        nbytes = off_data + data
        group = self.ctx.group
        why = _SYMM_REFUSED
        if why is None:
            hdl = buf = None
            err = None
            try:
                import torch.distributed._symmetric_memory as symm

                buf = symm.empty(nbytes, dtype=torch.uint8, device=self.dev)
                buf.zero_()
                hdl = symm.rendezvous(buf, getattr(group, "group_name", group))
                ptrs = [int(p) for p in hdl.buffer_ptrs]
                if len(ptrs) != W or any(p == 0 for p in ptrs):
                    raise RuntimeError(f"rendezvous gave {len(ptrs)} buffer pointers {ptrs} for world {W}")
                torch.cuda.synchronize(self.dev)
            except Exception as e:  # noqa: BLE001 - recorded, agreed on, then the IPC path
                err = f"rank {self.ctx.rank}: {type(e).__name__}: {' '.join(str(e).split())[:400]}"
            errs = [None] * W
            dist.all_gather_object(errs, err, group=group)
            bad = [e for e in errs if e]
            if not bad:
                self._barrier()
                self.symm, self.symm_buf = hdl, buf
                self._keep.append(buf)
                self.peer_memory, self.peer_memory_why = "symm", ""
                return ptrs, off_data
            del hdl, buf
            why = _SYMM_REFUSED = "torch symmetric memory unusable: " + " | ".join(bad)
        # ---- CUDA IPC handles over the group ----
        from torch.multiprocessing.reductions import reduce_tensor

        buf = torch.zeros(nbytes, dtype=torch.uint8, device=self.dev)
        torch.cuda.synchronize(self.dev)
        me = self.ctx.rank
        # one share per consumer (torch counts the consumers of a share to know when to free)
        mine = [None if q == me else reduce_tensor(buf) for q in range(W)]
        shared = [None] * W
        dist.all_gather_object(shared, mine, group=group)
        ptrs, err = [], None
        for p in range(W):
            if p == me:
                ptrs.append(int(buf.data_ptr()))
                continue
            rebuild, args = shared[p][me]
            try:
                t = rebuild(*args)
            except Exception as e:  # noqa: BLE001 - agreed on below, so that no rank waits forever
                err = err or f"rank {me} could not open rank {p}'s buffer: {type(e).__name__}: {e}"
                continue
            self._keep.append(t)
            ptrs.append(int(t.data_ptr()))
        torch.cuda.synchronize(self.dev)
        errs = [None] * W
        dist.all_gather_object(errs, err, group=group)
        if any(errs):
            raise RuntimeError(f"CUDA IPC failed ({' | '.join(e for e in errs if e)}); before that, {why}")
        self._barrier()
        self.symm, self.symm_buf = None, buf
        self._keep.append(buf)
        self.peer_memory, self.peer_memory_why = "cuda-ipc", why
        return ptrs, off_data

    def _params(self, trace: bool):
        abi = self.abi
        p = abi.Params()
        p.ranks = self.rank_args.data_ptr()
        p.state = self.state.data_ptr()
        p.err = self.err_dev
        if trace:
            p.trace = self.trace_buf.data_ptr()
            p.trace_count = self.trace_count.data_ptr()
            p.trace_cap = self.trace_cap
        p.timeout_ns = self.timeout_ns
        p.op = self.op_code
        p.num_ranks = len(self.ranks)
        p.world = self.point.world
        p.M, p.N, p.K = self.point.M, self.point.N, self.point.K
        p.sys_scope = 1 if self.fabric == "nvlink" else 0
        p.static_peers = 1 if self.fabric == "host" else 0
        p.grid = self.grid
        p.mover_bulk = 1 if self.mover_bulk else 0
        p.k_stream = 1 if self.k_stream else 0
        p.spin_ns = self.spin_ns
        p.wgrad_group_rows = self.wgrad_group_rows
        return p

    def _ce_plan(self, work, flag_base: int, s_rows: int, row_elems: int) -> None:
        """Copy-engine movers: kosmos_bench/ce_plan.py's entries as addresses (copies of the
        pinned shard rows, A_p or ag-wgrad's At_p (``s_rows`` rows of ``row_elems``), into the
        gathered buffer, 2-D for K-slices; flag addresses). ag-wgrad's bands are whole row blocks of
        At_p (its plan has no K-slices), in the ring order its tiles read K."""
        import torch

        # one release per copy: a copy's bands share its first band's flag (ce_plan.share_flags)
        entries = self.plan.ce_shared
        pitch = row_elems * 2
        cols = {n: [] for n in ("dst", "src", "width", "height", "pitch", "flag")}
        for e in entries:
            copy = e.rows > 0
            cols["dst"].append(work[e.peer * s_rows + e.row0, e.col0:].data_ptr() if copy else 0)
            cols["src"].append(self._host_A[e.peer][e.row0, e.col0:].data_ptr() if copy else 0)
            cols["width"].append(e.cols * 2 if copy else 0)
            cols["height"].append(e.rows)
            cols["pitch"].append(pitch)
            cols["flag"].append(flag_base + 4 * e.flag)
        self.ce_entries, self.ce_work = entries, work
        self.ce_copies = sum(1 for e in entries if e.rows)
        copies = [i for i, e in enumerate(entries) if e.rows]
        if not copies:
            return
        # Entries enqueued before the kernel launch: the first copy (the rest after the launch).
        head = copies[1] if len(copies) > 1 else len(entries)
        # copies on the first, flag releases on the second of the process's plan streams, not
        # torch's pool (plan_streams says why)
        handles = plan_streams(self.lib, self.dev_index)
        self.ce_streams = [torch.cuda.ExternalStream(h, device=self.dev) for h in handles]
        self.ce_cols = [np.ascontiguousarray(np.array(cols[n], dtype=np.uint64)) for n in cols]
        self.ce_mult = np.array([e.mult for e in entries], dtype=np.uint32)
        self.ce_back = np.array([e.back for e in entries], dtype=np.uint32)  # a test holds one release back
        self.ce_head = head
        # The last copy's releases on the copy stream: the flag stream's release landed 9-18 us
        # after the last byte (an event hop); inline, the tail after the last byte is 5-13 us
        # shorter on 70b FC1 / QKV (issue4-h200-20261203/probes/tail_probe-*).
        self.ce_inline_from = copies[-1]
        self._ce_commit()

    def _ce_commit(self) -> None:
        """(Re)create the C plan from ce_cols / ce_mult / ce_back (copied in)."""
        u64, u32 = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
        if self.ce_plan:
            self.lib.kosmos_ce_plan_destroy(self.ce_plan)
            self.ce_plan = None
        h = self.lib.kosmos_ce_plan_create(ctypes.c_void_p(self.ce_streams[0].cuda_stream),
                                           ctypes.c_void_p(self.ce_streams[1].cuda_stream), len(self.ce_mult),
                                           *(a.ctypes.data_as(u64) for a in self.ce_cols),
                                           self.ce_mult.ctypes.data_as(u32), self.ce_back.ctypes.data_as(u32),
                                           self.ce_head, self.ce_inline_from)
        if not h:
            from .. import kernels

            raise RuntimeError(f"kosmos_ce_plan_create failed: {kernels.last_error(self.lib)}")
        self.ce_plan = h

    def _rs_ce_plans(self, work, flag_base: int, d: dict, m_loc: int, N: int) -> None:
        """gemm-rs copy-engine movers (ce_plan.build_rs): the peers' contributions host -> device
        on the plan's copy stream, each releasing its arrival flag (the ag-gemm plan's machinery),
        and the pushes device -> host on a third stream, each after a stream wait on its builder
        counter, so both PCIe directions run at once and no SM moves."""
        import torch

        rs = self.plan.rs_ce
        row = N * 2
        handles = plan_streams(self.lib, self.dev_index, 3)
        self.ce_streams = [torch.cuda.ExternalStream(h, device=self.dev) for h in handles]
        pr = rs.proxies
        self.ce_entries = pr
        self.ce_cols = [np.ascontiguousarray(np.array(c, dtype=np.uint64)) for c in (
            [int(d["slot"][e.peer]) + e.row0 * row for e in pr],
            [self._rs_proxy_host[e.peer].data_ptr() + e.row0 * row for e in pr],
            [row] * len(pr), [e.rows for e in pr], [row] * len(pr), [flag_base + 4 * e.flag for e in pr])]
        self.ce_mult = np.array([e.mult for e in pr], dtype=np.uint32)
        self.ce_back = np.array([e.back for e in pr], dtype=np.uint32)
        self.ce_head = 1 if len(pr) > 1 else len(pr)
        self.ce_inline_from = len(pr) - 1
        self._ce_commit()
        pu = rs.pushes
        send = self._rs_send.data_ptr()
        cols = [np.ascontiguousarray(np.array(c, dtype=np.uint64)) for c in (
            [send + ((e.dest - 1) * m_loc + e.row0) * row for e in pu],  # host fabric: rank 0, slot d-1
            [work.data_ptr() + (e.dest * m_loc + e.row0) * row for e in pu],
            [row] * len(pu), [e.rows for e in pu], [row] * len(pu), [0] * len(pu))]
        zeros = np.zeros(len(pu), dtype=np.uint32)
        u64, u32 = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
        push_stream = ctypes.c_void_p(self.ce_streams[2].cuda_stream)
        h = self.lib.kosmos_ce_plan_create(push_stream, push_stream, len(pu), *(a.ctypes.data_as(u64) for a in cols),
                                           zeros.ctypes.data_as(u32), zeros.ctypes.data_as(u32), 0, len(pu))
        if not h:
            from .. import kernels

            raise RuntimeError(f"kosmos_ce_plan_create (pushes) failed: {kernels.last_error(self.lib)}")
        self.ce_push_plan = h
        waits = np.array([flag_base + 4 * e.wait for e in pu], dtype=np.uint64)
        tiles = np.array([e.tiles for e in pu], dtype=np.uint32)
        self._call(self.lib.kosmos_ce_plan_set_waits(h, len(pu), waits.ctypes.data_as(u64), tiles.ctypes.data_as(u32)),
                   "kosmos_ce_plan_set_waits")
        self.ce_copies = len(pr) + len(pu)

    def _launch(self, params) -> None:
        import torch

        main = torch.cuda.current_stream(self.dev).cuda_stream
        epoch = self.calls + 1
        ctx = contextlib.nullcontext() if torch.cuda.current_device() == self.dev_index else \
            torch.cuda.device(self.dev_index)
        with ctx:
            # The first copy goes in before the kernel launch and the rest after it:
            # enqueueing a whole plan from Python used to delay the first band by ~100 us.
            if self.ce_plan:
                self._call(self.lib.kosmos_ce_plan_begin(self.ce_plan, main, epoch), "kosmos_ce_plan_begin")
            if self.ce_push_plan:  # its streams wait for what precedes the kernel; all of it after the launch
                self._call(self.lib.kosmos_ce_plan_begin(self.ce_push_plan, main, epoch), "kosmos_ce_plan_begin")
            if self.sm90 is not None:
                fn = "kosmos_sm90_rs_launch" if self.sm90_rs else "kosmos_sm90_ag_launch"
                self._call(getattr(self.sm90, fn)(self.sm90_handle, ctypes.byref(params), main), fn)
            else:
                self._call(self.lib.kosmos_launch(ctypes.byref(params), main), "kosmos_launch")
            if self.ce_plan:
                self._call(self.lib.kosmos_ce_plan_end(self.ce_plan, main, epoch), "kosmos_ce_plan_end")
            if self.ce_push_plan:  # last: its waits on the kernel queue behind everything the kernel needs
                self._call(self.lib.kosmos_ce_plan_end(self.ce_push_plan, main, epoch), "kosmos_ce_plan_end")
        self.calls += 1

    def run_ce_plan_alone(self, epoch: int = 1) -> None:
        """The copy-engine plan of one call without the kernel (timing its copies apart from it).
        Its flag releases make the next kernel call of this runner wrong: use a spare runner."""
        import torch

        main = torch.cuda.current_stream(self.dev).cuda_stream
        if self.ce_push_plan:
            raise RuntimeError("gemm-rs copy-engine pushes wait on the kernel's builders: no plan without it")
        self._call(self.lib.kosmos_ce_plan_begin(self.ce_plan, main, epoch), "kosmos_ce_plan_begin")
        self._call(self.lib.kosmos_ce_plan_end(self.ce_plan, main, epoch), "kosmos_ce_plan_end")

    def _raise_if_timed_out(self) -> None:
        import torch

        if self.closed:
            raise RuntimeError("kosmos runner used after close()")
        e = self.err
        if int(e.count) == self.err_seen:
            return
        torch.cuda.synchronize(self.dev)
        self.err_seen = int(e.count)
        qn = self.abi.QUEUE_NAMES[e.queue] if 0 <= e.queue < 4 else str(e.queue)
        msg = (f"kosmos watchdog: rank {e.rank} WG {e.wg} waited {e.waited_ns / 1e6:.1f} ms on flag {e.flag} "
               f"of rank {e.flag_rank} (expected >= {e.expected}, saw {e.seen}) for {qn} item {e.item} "
               f"in call {e.epoch} [{self.point.op}, fabric={self.fabric}, world={self.point.world}]")
        if self.fabric != "nvlink":  # fresh protocol state: the next call starts at epoch 1
            for t in self.flag_tensors:
                if t.dtype == torch.int32:
                    t.zero_()
            self.state.zero_()
            self.calls = 0
            torch.cuda.synchronize(self.dev)
        raise WatchdogError(msg)

    def set_debug_skip(self, rank: int | None) -> None:
        """Test hook: make emulated rank `rank` never signal (None: everyone works)."""
        import torch

        for i, r in enumerate(self.ranks):
            self._ra_arr[i].skip = 1 if (rank is not None and r == rank) else 0
        raw = np.frombuffer(bytes(self._ra_arr), dtype=np.uint8)
        self.rank_args.copy_(torch.from_numpy(raw.copy()))
        torch.cuda.synchronize(self.dev)

    def rebind(self, A, B, C) -> None:
        """Point the (single executed) rank at new operands/output (torch custom ops).

        A, B: this rank's shards (layouts of Point); C: output tensor (out_shape), bf16,
        contiguous. ag-gemm / ag-wgrad on nvlink copy A (At_r) into the symmetric buffer (stream-ordered).
        """
        import torch

        if len(self.ranks) != 1:
            raise RuntimeError("rebind is for fabrics with one executed rank (nvlink, host)")
        a = self._ra_arr[0]
        if self.point.op in S.AG_OPS and self.fabric == "nvlink":
            rows, cols = A.shape
            off = int(a.peer_A[self.ranks[0]]) - int(self.symm_buf.data_ptr())
            self.symm_buf[off:off + rows * cols * 2].view(torch.bfloat16).view(rows, cols).copy_(A)
        else:
            a.A = A.data_ptr()
        a.B, a.C = B.data_ptr(), C.data_ptr()
        if self.sm90 is not None:  # the TMA descriptors hold the operand addresses
            self._sm90_set_rank(0, int(a.A), int(a.work), int(a.B), int(a.C))
        raw = torch.from_numpy(np.frombuffer(bytes(self._ra_arr), dtype=np.uint8).copy())
        self.rank_args.copy_(raw.pin_memory(), non_blocking=True)
        self.outputs = {self.ranks[0]: C}

    # ---- Runner interface ----
    def run(self) -> None:
        """One call (asynchronous). Raises WatchdogError if an earlier call timed out."""
        self._raise_if_timed_out()
        self._launch(self.params)

    def check(self) -> None:
        """Synchronize and raise WatchdogError if any call so far timed out."""
        import torch

        torch.cuda.synchronize(self.dev)
        self._raise_if_timed_out()

    def run_traced(self):
        """Run one call with role tracing; returns a DataFrame (rank, wg, sm, role, item, t0_ns, t1_ns, lane)."""
        import torch

        if self.trace_buf is None:
            self.trace_buf = torch.empty(self.grid * self.trace_cap * self.abi.TRACE_RECORD_BYTES, dtype=torch.uint8,
                                         device=self.dev)
            self.trace_count = torch.zeros(self.grid, dtype=torch.int32, device=self.dev)
        self._raise_if_timed_out()
        self.trace_count.zero_()
        self._launch(self._params(trace=True))
        self.check()
        # each WG's rank: the ranks' WGs are contiguous in the grid (self.starts)
        ranks = np.repeat(np.asarray(self.ranks, dtype=np.int64), np.diff(self.starts))
        df, self.info["trace_dropped"] = decode_launch(self.trace_buf.cpu().numpy().tobytes(), self.trace_count.cpu().numpy(),
                                                       self.grid, self.trace_cap, rank=ranks,
                                                       role_codes=dict(enumerate(S.ROLE_NAMES)))
        return df

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            import torch

            torch.cuda.synchronize(self.dev)
        except Exception:  # noqa: BLE001
            pass
        for h in self._mapped:
            self.lib.kosmos_free_mapped(ctypes.c_void_p(h))
        self._mapped.clear()
        if self.sm90_handle:
            fn = "kosmos_sm90_rs_destroy" if self.sm90_rs else "kosmos_sm90_ag_destroy"
            getattr(self.sm90, fn)(ctypes.c_void_p(self.sm90_handle))
            self.sm90_handle = None
        for name in ("ce_plan", "ce_push_plan"):
            if getattr(self, name):
                self.lib.kosmos_ce_plan_destroy(getattr(self, name))
                setattr(self, name, None)
        self._keep.clear()
        self.outputs = {}


IMPLS = [KosmosImpl()]
