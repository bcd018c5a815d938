"""Vocabulary-parallel heads: a head split by LM-head rows over several shards
(``Head.load(..., shard=(rank, world), group=...)``), and the exact
cross-shard reductions its methods run when it is sharded (docs/numerics.md,
"Sharded heads").

Shard ``rank`` of ``world`` computes the rows ``[floor(rank*V/world),
floor((rank+1)*V/world))``; its ``head(x)`` returns those logits alone. Its
``argmax``, ``topk``, ``logsumexp``, ``log_softmax``, ``score`` and ``sample``
return what the unsharded head returns, bit for bit: each shard reduces its
own logits and the shards exchange only small summaries (top-k candidates,
the canonical logsumexp's tile pairs and the < 2,048 logits of a tile cut by a
shard boundary, chosen tokens' logits and rank counts, race winners), never
the logits. Every shard must call the same method with the same arguments
(the SPMD rule of every collective).

The exchange is one operation, ``all_gather`` of a byte array in rank order,
behind the :class:`Collective` protocol, with two implementations:
:class:`LocalGroup` (all shards in one process, one thread each: tests, and
a process driving several GPUs) and torch.distributed process groups
(``group=``; gloo for CPU heads, NCCL for CUDA heads), wrapped by
:class:`TorchCollective`.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, NamedTuple, Optional, Protocol, Sequence, TypeVar, runtime_checkable

import numpy as np

from . import _core, _device, _sampling
from ._sampling import Sample

TILE = 2048  # kLseTile (src/cpp/muser/logsumexp.h): the canonical logsumexp's tile of token ids
_NEG_INF = np.float32(-np.inf)
# Most top_p candidates one shard sends for one row; a cut needing more raises (with top_k bounding it, never).
MAX_TOP_P_CANDIDATES = 1 << 16

T = TypeVar("T")


@runtime_checkable
class Collective(Protocol):
    """What a sharded head needs from its group: its ``rank``, the ``world`` size, and
    ``all_gather(array)``: every rank's 1-D uint8 array (all of one length), in rank order."""

    rank: int
    world: int

    def all_gather(self, array: np.ndarray) -> list[np.ndarray]: ...


class _Solo:
    """The collective of an unsharded world of one: the gather is the array itself."""

    rank = 0
    world = 1

    def all_gather(self, array: np.ndarray) -> list[np.ndarray]:
        return [array]


class LocalGroup:
    """All ``world`` shards in one process: each shard's head is called from its own
    thread (:meth:`run`), and ``all_gather`` meets the threads at a barrier.

    >>> group = muser.shard.LocalGroup(2)
    >>> heads = [muser.Head.load(path, shard=(r, 2), group=group) for r in range(2)]
    >>> ids = group.run(heads, lambda h: h.argmax(x))  # one result per rank, all equal
    """

    def __init__(self, world: int, *, timeout: float = 300.0):
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise ValueError(f"world must be an int >= 1, got {world!r}")
        self.world = world
        self._barrier = threading.Barrier(world, timeout=timeout)
        self._slots: list[Optional[np.ndarray]] = [None] * world

    def member(self, rank: int) -> "_LocalMember":
        """The collective of shard ``rank``."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank must be in [0, {self.world}), got {rank}")
        return _LocalMember(self, rank)

    def _gather(self, rank: int, array: np.ndarray) -> list[np.ndarray]:
        self._slots[rank] = np.array(array, copy=True)
        self._barrier.wait()
        out = [s for s in self._slots if s is not None]
        lengths = {a.shape for a in out}
        self._barrier.wait()  # every rank has read the slots before any writes again
        if len(out) != self.world or len(lengths) != 1:
            raise ValueError(f"all_gather needs one array of one shape from every rank, got shapes {lengths}")
        return out

    def run(self, heads: Sequence[Any], fn: Callable[[Any], T]) -> list[T]:
        """``fn(heads[r])`` for every rank at once, each in its own thread (``heads[r]`` is
        shard r's): the results in rank order. The first exception is raised, after the
        other threads were released (the barrier is broken, then reset)."""
        if len(heads) != self.world:
            raise ValueError(f"run needs one head per rank ({self.world}), got {len(heads)}")
        results: list[Any] = [None] * self.world
        errors: list[Optional[BaseException]] = [None] * self.world

        def body(r: int) -> None:
            try:
                results[r] = fn(heads[r])
            except BaseException as e:  # noqa: BLE001 -- re-raised in the caller's thread
                errors[r] = e
                self._barrier.abort()  # the others stop waiting for this rank

        threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(self.world)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        self._barrier.reset()
        first = next((e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)),
                     next((e for e in errors if e is not None), None))
        if first is not None:
            raise first
        return results


class _LocalMember:
    def __init__(self, group: LocalGroup, rank: int):
        self.group, self.rank, self.world = group, rank, group.world

    def all_gather(self, array: np.ndarray) -> list[np.ndarray]:
        return self.group._gather(self.rank, array)


class TorchCollective:
    """A torch.distributed process group as a :class:`Collective`: all_gather of a uint8 tensor
    on the head's GPU for NCCL, on the CPU for other backends (gloo)."""

    def __init__(self, group: Any, device: str):
        import torch
        import torch.distributed as dist

        self._torch, self._dist, self._group = torch, dist, group
        self.rank = int(dist.get_rank(group))
        self.world = int(dist.get_world_size(group))
        backend = str(dist.get_backend(group)).lower()
        if "nccl" in backend:
            if not device.startswith("cuda"):
                raise ValueError(f"an NCCL group exchanges CUDA tensors; this head runs on {device!r} "
                                 "(use a gloo group for CPU heads)")
            ordinal = int(device.split(":")[1]) if ":" in device else torch.cuda.current_device()
            self._device = torch.device("cuda", ordinal)
        else:
            self._device = torch.device("cpu")

    def all_gather(self, array: np.ndarray) -> list[np.ndarray]:
        torch = self._torch
        x = torch.from_numpy(np.ascontiguousarray(array)).to(self._device)
        if self._device.type == "cuda":  # one buffer, one copy back
            out = torch.empty(self.world * x.numel(), dtype=x.dtype, device=self._device)
            self._dist.all_gather_into_tensor(out, x, group=self._group)
            return list(out.cpu().numpy().reshape(self.world, -1))
        parts = [torch.empty_like(x) for _ in range(self.world)]  # gloo has no all_gather_into_tensor
        self._dist.all_gather(parts, x, group=self._group)
        return [p.numpy() for p in parts]


def _torch_group_or_none(group: Any) -> Any:
    """``group`` when it is a torch.distributed process group (or None with torch.distributed
    initialized: its default group); else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not dist.is_available():
        return None
    if group is None:
        return dist.group.WORLD if dist.is_initialized() else None
    pg = getattr(dist, "ProcessGroup", None)
    return group if pg is not None and isinstance(group, pg) else None


def collective_for(group: Any, rank: int, world: int, device: str) -> Optional[Collective]:
    """The collective shard ``(rank, world)`` of a head on ``device`` exchanges through: ``group``
    a :class:`LocalGroup`, a torch.distributed process group, any :class:`Collective`, or None
    (torch.distributed's default group when it is initialized; else none, and only a world of
    one reduces). Raises ValueError when the group's size or rank is not the shard's."""
    if group is None and world == 1:  # a world of one exchanges nothing, whatever torch.distributed runs
        return _Solo()
    if isinstance(group, LocalGroup):
        if group.world != world:
            raise ValueError(f"shard world is {world} but the LocalGroup has {group.world} ranks")
        return group.member(rank)
    torch_group = _torch_group_or_none(group)
    if torch_group is not None:
        coll: Any = TorchCollective(torch_group, device)
    elif group is None:
        return None
    elif isinstance(group, Collective):
        coll = group
    else:
        raise TypeError("group must be a muser.shard.LocalGroup, a torch.distributed process group, "
                        f"or an object with rank, world and all_gather(array); got {type(group).__name__}")
    if int(coll.world) != world:
        raise ValueError(f"shard world is {world} but the group has {coll.world} ranks")
    if int(coll.rank) != rank:
        raise ValueError(f"shard rank is {rank} but this process is rank {coll.rank} of the group")
    return coll


class Layout(NamedTuple):
    """Where every shard's rows lie, and how the canonical logsumexp's tiles fall on them."""

    vocab: int
    world: int
    rank: int
    starts: tuple[int, ...]  # world + 1 boundaries: shard r holds [starts[r], starts[r+1])
    whole: tuple[tuple[int, int], ...]  # per rank: the tiles [ja, jb) lying wholly in its rows
    straddling: tuple[int, ...]  # the tiles cut by a shard boundary, in order

    @property
    def start(self) -> int:
        return self.starts[self.rank]

    @property
    def stop(self) -> int:
        return self.starts[self.rank + 1]

    def pieces(self, r: int) -> tuple[tuple[int, int], ...]:
        """Rank r's rows outside its whole tiles (global id ranges): the parts of cut tiles it holds."""
        s, e = self.starts[r], self.starts[r + 1]
        ja, jb = self.whole[r]
        if ja >= jb:
            return ((s, e),)
        lo, hi = ja * TILE, min(jb * TILE, self.vocab)
        return tuple(p for p in ((s, lo), (hi, e)) if p[0] < p[1])

    def piece_count(self, r: int) -> int:
        return sum(b - a for a, b in self.pieces(r))


def make_layout(vocab: int, rank: int, world: int) -> Layout:
    starts = [int(_core.shard_rows(vocab, r, world)[0]) for r in range(world)] + [vocab]
    tiles = -(-vocab // TILE)
    whole = []
    owner = [-1] * tiles
    for r in range(world):
        s, e = starts[r], starts[r + 1]
        ja = -(-s // TILE)
        jb = tiles if e == vocab else e // TILE
        whole.append((ja, max(ja, jb)))
        for j in range(ja, jb):
            owner[j] = r
    straddling = tuple(j for j in range(tiles) if owner[j] < 0)
    return Layout(vocab, world, rank, tuple(starts), tuple(whole), straddling)


# ---- the exchange: several 2-D arrays per rank in one all_gather of bytes ----
def _exchange(coll: Collective, parts: Sequence[np.ndarray], capacity: int) -> list[list[np.ndarray]]:
    """Every rank's ``parts`` (the same count and dtypes on every rank; 2-D shapes may differ), in rank
    order, through one all_gather. ``capacity``: the most payload bytes any rank sends (all ranks
    pass the same value); a header of (rows, cols) per part tells the shapes."""
    header = np.array([d for p in parts for d in p.shape], np.int64)
    payload = b"".join(np.ascontiguousarray(p).tobytes() for p in parts)
    if len(payload) > capacity:
        raise AssertionError(f"internal: {len(payload)} bytes exceed the exchange's capacity {capacity}")
    msg = np.zeros(header.nbytes + capacity, np.uint8)
    msg[:header.nbytes] = np.frombuffer(header.tobytes(), np.uint8)
    msg[header.nbytes:header.nbytes + len(payload)] = np.frombuffer(payload, np.uint8)
    out = []
    for m in coll.all_gather(msg):
        shapes = np.frombuffer(m[:header.nbytes].tobytes(), np.int64).reshape(-1, 2)
        pos, got = header.nbytes, []
        for p, (a, b) in zip(parts, shapes):
            n = int(a) * int(b) * p.dtype.itemsize
            got.append(np.frombuffer(m[pos:pos + n].tobytes(), p.dtype).reshape(int(a), int(b)))
            pos += n
        out.append(got)
    return out


def _bytes(parts: Sequence[tuple[int, int, Any]]) -> int:
    return sum(int(a) * int(b) * np.dtype(d).itemsize for a, b, d in parts)


# ---- the canonical logsumexp across shards ----
def _lse_parts(layout: Layout, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """This shard's share of the canonical logsumexp of rows ``values`` [t, n]: the pairs of its
    whole tiles [t, 2 * tiles] and its logits in cut tiles [t, pieces]."""
    s = layout.start
    ja, jb = layout.whole[layout.rank]
    lo, hi = ja * TILE - s, min(jb * TILE, layout.vocab) - s
    t = values.shape[0]
    pairs = (_core.lse_tile_pairs(values, lo, hi - lo) if jb > ja else np.zeros((t, 0, 2), np.float32))
    pieces = [values[:, a - s:b - s] for a, b in layout.pieces(layout.rank)]
    cut = np.concatenate(pieces, axis=1) if pieces else np.zeros((t, 0), np.float32)
    return np.ascontiguousarray(pairs.reshape(t, -1)), np.ascontiguousarray(cut, dtype=np.float32)


def _lse_capacity(layout: Layout, t: int) -> int:
    return max(_bytes([(t, 2 * (jb - ja), np.float32), (t, layout.piece_count(r), np.float32)])
               for r, (ja, jb) in enumerate(layout.whole))


def _lse_merge(layout: Layout, got: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's ``_lse_parts`` (rank order) joined as the unsharded reduction joins them:
    ``(pairs [t, 2], lse [t])``, the bits of one device's canonical logsumexp."""
    t = got[0][0].shape[0]
    tiles = -(-layout.vocab // TILE)
    all_pairs = np.zeros((t, tiles, 2), np.float32)
    for r, (ja, jb) in enumerate(layout.whole):
        all_pairs[:, ja:jb] = got[r][0].reshape(t, jb - ja, 2)
    if layout.straddling:
        # the cut tiles' ids are exactly the ranks' pieces, in rank (= id) order
        stream = np.ascontiguousarray(np.concatenate([g[1] for g in got], axis=1))
        ids = np.concatenate([np.arange(a, b) for r in range(layout.world) for a, b in layout.pieces(r)])
        for j in layout.straddling:
            col0 = int(np.searchsorted(ids, j * TILE))
            n = min(TILE, layout.vocab - j * TILE)
            all_pairs[:, j] = _core.lse_tile_pairs(stream, col0, n)[:, 0]
    pairs, lse = _core.lse_tree_pairs(np.ascontiguousarray(all_pairs))
    return np.asarray(pairs, np.float32), np.asarray(lse, np.float32)


def lse_pairs(coll: Collective, layout: Layout, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The canonical logsumexp pair and value of each row whose shards hold ``values`` [t, n]."""
    got = _exchange(coll, _lse_parts(layout, values), _lse_capacity(layout, values.shape[0]))
    return _lse_merge(layout, [(g[0], g[1]) for g in got])


# ---- ranking ----
def topk_keys(values: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The 64-bit order key of every (logit, id) (src/cpp/muser/topk_key.h): larger is better;
    NaN below every number, -0 on +0, ties to the lower id."""
    v = np.where(values == 0, np.float32(0), values).astype(np.float32)
    b = v.view(np.uint32).astype(np.uint64)
    b = np.where(b & 0x80000000, ~b & 0xFFFFFFFF, b | 0x80000000)
    low = np.uint64(0xFFFFFFFF) - ids.astype(np.uint64)
    return np.where(np.isnan(values), low, (b << np.uint64(32)) | low)


def _merge_topk(vals: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best of candidate columns (id < 0: none), best first."""
    keys = np.where(ids >= 0, topk_keys(vals, np.maximum(ids, 0)), np.uint64(0))
    order = np.argsort(keys, axis=1, kind="stable")[:, ::-1][:, :k]
    return np.take_along_axis(vals, order, 1), np.take_along_axis(ids, order, 1)


def _coll(head: Any) -> Collective:
    coll = head._collective
    if coll is None:
        w = head.shard[1]
        raise ValueError(f"this head is shard {head.shard[0]} of {w}: its reductions need the other shards; "
                         "load it with group= (a muser.shard.LocalGroup or a torch.distributed process group)")
    return coll


def local_topk(head: Any, hidden: Any, k: int, check_finite: bool) -> tuple[np.ndarray, np.ndarray, bool]:
    """This shard's k best (``min(k, rows)``, padded with id -1), in global ids: ``(ids, vals, single)``."""
    layout = head._layout
    n = layout.stop - layout.start
    kk = min(k, n)
    got_ids: Any
    got_vals: Any
    if head._ranks_on_device:
        got_ids, got_vals, single = _device.topk(head, hidden, kk, check_finite)
    else:
        logits, single = head._host_logits(hidden, check_finite)
        got_ids, got_vals = _core.topk_rows(logits, kk)
    ids = np.asarray(got_ids, np.int64).reshape(-1, kk) + layout.start
    vals = np.asarray(got_vals, np.float32).reshape(-1, kk)
    if kk < k:
        pad = k - kk
        ids = np.concatenate([ids, np.full((ids.shape[0], pad), -1, np.int64)], axis=1)
        vals = np.concatenate([vals, np.full((vals.shape[0], pad), np.nan, np.float32)], axis=1)
    return ids, vals, single


def topk(head: Any, hidden: Any, k: int, logprobs: bool, check_finite: bool
         ) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray], bool]:
    """The unsharded head's top-k ``(vals [t, k], ids [t, k], logprobs or None, single)``: each
    shard's k best are gathered (O(t k)) and ranked by the one key order."""
    coll, layout = _coll(head), head._layout
    if logprobs:
        logits, single = head._host_logits(hidden, check_finite)
        t = logits.shape[0]
        kk = min(k, logits.shape[1])
        got_ids, got_vals = _core.topk_rows(logits, kk)
        ids = np.asarray(got_ids, np.int64).reshape(t, kk) + layout.start
        vals = np.asarray(got_vals, np.float32).reshape(t, kk)
        ids = np.pad(ids, ((0, 0), (0, k - kk)), constant_values=-1)
        vals = np.pad(vals, ((0, 0), (0, k - kk)), constant_values=np.nan)
        pairs, cut = _lse_parts(layout, logits)
        cap = _lse_capacity(layout, t) + _bytes([(t, k, np.float32), (t, k, np.int64)])
        got = _exchange(coll, [pairs, cut, vals, ids], cap)
        lse: Optional[np.ndarray] = _lse_merge(layout, [(g[0], g[1]) for g in got])[1]
    else:
        ids, vals, single = local_topk(head, hidden, k, check_finite)
        t = ids.shape[0]
        got = _exchange(coll, [vals, ids], _bytes([(t, k, np.float32), (t, k, np.int64)]))
        lse = None
    all_vals = np.concatenate([g[-2] for g in got], axis=1)
    all_ids = np.concatenate([g[-1] for g in got], axis=1)
    vals, ids = _merge_topk(all_vals, all_ids, k)
    lps = None if lse is None else (vals - lse[:, None]).astype(np.float32)
    return vals, ids, lps, single


def argmax(head: Any, hidden: Any, check_finite: bool) -> Any:
    vals, ids, _, single = topk(head, hidden, 1, False, check_finite)
    return int(ids[0, 0]) if single else ids[:, 0].copy()


# ---- score / logsumexp / log_softmax ----
def _count_ahead(logits: np.ndarray, start: int, targets: np.ndarray, toks: np.ndarray) -> np.ndarray:
    """Per (row, q): the ids of this shard ranking ahead of token toks[row, q] with logit
    targets[row, q] (ranks_ahead in muser/logsumexp.h)."""
    t, m = targets.shape
    gid = np.arange(start, start + logits.shape[1], dtype=np.int64)
    nan = np.isnan(logits)
    out = np.zeros((t, m), np.int64)
    for r in range(t):
        row, rnan = logits[r], nan[r]
        not_nan = int((~rnan).sum())
        for q in range(m):
            v, tok = targets[r, q], toks[r, q]
            below = gid < tok
            if np.isnan(v):
                out[r, q] = not_nan + int((rnan & below).sum())
            else:
                out[r, q] = int((row > v).sum()) + int(((row == v) & below).sum())
    return out


def reduce(head: Any, hidden: Any, grid: np.ndarray, check_finite: bool
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The unsharded vocabulary reduction for ids ``grid`` [t, m] (global ids):
    ``(values [t, m], ranks [t, m], lse [t])``, in two exchanges."""
    coll, layout = _coll(head), head._layout
    V = layout.vocab
    if grid.size and (grid.min() < 0 or grid.max() >= V):
        bad = int(grid[(grid < 0) | (grid >= V)][0])
        raise ValueError(f"token id {bad} is outside [0, {V})")
    logits, _ = head._host_logits(hidden, check_finite)
    t, m = grid.shape
    s, e = layout.start, layout.stop
    mine = (grid >= s) & (grid < e)
    own = np.where(mine, logits[np.arange(t)[:, None], np.clip(grid - s, 0, e - s - 1)], np.float32(0))
    own = own.astype(np.float32)
    pairs, cut = _lse_parts(layout, logits)
    got = _exchange(coll, [pairs, cut, own], _lse_capacity(layout, t) + _bytes([(t, m, np.float32)]))
    _, lse = _lse_merge(layout, [(g[0], g[1]) for g in got])
    owner = np.searchsorted(np.asarray(layout.starts[1:]), grid, side="right")
    vals = np.zeros((t, m), np.float32)
    for r in range(layout.world):
        vals = np.where(owner == r, got[r][2], vals)
    if m == 0:  # the logsumexp alone
        return vals, np.zeros((t, 0), np.int64), lse
    ahead = _count_ahead(logits, s, vals, grid)
    counts = _exchange(coll, [ahead], _bytes([(t, m, np.int64)]))
    ranks = 1 + np.sum([c[0] for c in counts], axis=0)
    return vals, ranks.astype(np.int64), lse


def log_softmax(head: Any, hidden: Any, out: Optional[np.ndarray], check_finite: bool) -> np.ndarray:
    """The local columns of the unsharded log-softmax: local logits - the row's global logsumexp."""
    coll, layout = _coll(head), head._layout
    logits, single = head._host_logits(hidden, check_finite)
    _, lse = lse_pairs(coll, layout, logits)
    result = (logits - lse[:, None]).astype(np.float32)
    if out is not None:
        out.reshape(result.shape)[...] = result
        return out
    return result[0] if single else result


# ---- sample ----
def _any(coll: Collective, flags: np.ndarray) -> np.ndarray:
    got = _exchange(coll, [flags.astype(np.int64).reshape(-1, 1)], _bytes([(flags.size, 1, np.int64)]))
    return np.any(np.concatenate([g[0] for g in got], axis=1) != 0, axis=1)


def _kept_order(z: np.ndarray, start: int, K: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row, this shard's first K kept tokens in the kept-set order (z desc, id asc):
    ``(z [t, K], ids [t, K] (-1: none), count [t])``."""
    t, n = z.shape
    zs = np.full((t, K), _NEG_INF, np.float32)
    ids = np.full((t, K), -1, np.int64)
    count = (z != _NEG_INF).sum(axis=1)
    for r in range(t):
        keep = np.flatnonzero(z[r] != _NEG_INF)
        if keep.size > K:
            part = np.argpartition(-z[r, keep], K - 1)[:K]
            thr = z[r, keep[part]].min()  # ties at the threshold: the lowest ids first
            keep = np.concatenate([keep[z[r, keep] > thr], keep[z[r, keep] == thr]])
        order = keep[np.lexsort((keep, -z[r, keep]))][:K]
        zs[r, :order.size] = z[r, order]
        ids[r, :order.size] = order + start
    return zs, ids, count


def _merged_order(got: Sequence[Sequence[np.ndarray]], r: int) -> tuple[np.ndarray, np.ndarray]:
    """Row r of every rank's candidates, merged into the kept-set order."""
    zs = np.concatenate([g[0][r] for g in got])
    ids = np.concatenate([g[1][r] for g in got])
    ok = ids >= 0
    zs, ids = zs[ok], ids[ok]
    order = np.lexsort((ids, -zs))
    return zs[order], ids[order]


def _drop_after(z: np.ndarray, start: int, r: int, z_cut: float, id_cut: int) -> None:
    """Drops (to -inf) row r's tokens after (z_cut, id_cut) in the kept-set order."""
    gid = np.arange(start, start + z.shape[1])
    after = (z[r] < z_cut) | ((z[r] == z_cut) & (gid > id_cut))
    z[r, after] = _NEG_INF


def _nonfinite_error(row: int, token: int, x: float, bias: Optional[np.ndarray]) -> Exception:
    from .errors import NonFiniteError

    what = f"row {row}, token {token}: logit {x:f}"
    if bias is not None:
        what += f" + logit_bias {float(bias[token]):f}"
    return NonFiniteError(what + " is not finite after logit_bias and temperature; sample needs finite logits "
                                 "(a -inf logit is allowed: probability 0)")


def sample(head: Any, hidden: Any, p: "_sampling._Params", positions: Any, check_finite: bool) -> Sample:
    """The unsharded head's draw (docs/numerics.md, "Sampling"; "Sharded heads"): each step
    of muser/sample.h on the shards, with the global quantities it needs exchanged."""
    coll, layout = _coll(head), head._layout
    s, e = layout.start, layout.stop
    x, single = head._host_logits(hidden, check_finite)
    t, n = x.shape
    pos = _sampling.check_positions(positions, t, single)
    bias = None if p.bias is None else np.ascontiguousarray(p.bias[s:e])
    allowed = None if p.allowed is None else np.ascontiguousarray(p.allowed[s:e])
    z, status, top, z_is_x, dropped = _core.sample_processed_rows(x, bias, allowed, p.temperature)
    z = np.array(z, np.float32)
    status, top = np.asarray(status, np.int64), np.asarray(top, np.int64)
    rows = np.arange(t)
    at = np.clip(top, 0, n - 1)
    info_f = np.stack([np.where(top >= 0, z[rows, at], _NEG_INF), np.where(top >= 0, x[rows, at], 0)], 1)
    info_i = np.stack([status, np.where(top >= 0, top + s, -1), np.asarray(z_is_x, np.int64),
                       np.asarray(dropped, np.int64)], 1)
    pairs, cut = _lse_parts(layout, x)
    cap = _lse_capacity(layout, t) + _bytes([(t, 2, np.float32), (t, 4, np.int64)])
    got = _exchange(coll, [pairs, cut, info_f.astype(np.float32), info_i], cap)
    _, lse = _lse_merge(layout, [(g[0], g[1]) for g in got])
    # the row's step-1 outcome: the first bad token (lowest rank), or the first largest z
    m = np.empty(t, np.float32)
    x_top = np.empty(t, np.float32)
    g_top = np.empty(t, np.int64)
    g_z_is_x = np.ones(t, bool)
    g_dropped = np.zeros(t, bool)
    for r in range(t):
        best = -1
        for rank, g in enumerate(got):
            st, tok = int(g[3][r, 0]), int(g[3][r, 1])
            g_z_is_x[r] &= bool(g[3][r, 2])
            g_dropped[r] |= bool(g[3][r, 3])
            if st == 1:  # kSampleNonFinite: the first one in id order is the row's
                raise _nonfinite_error(r, tok, float(g[2][r, 1]), p.bias)
            if st == 0 and (best < 0 or g[2][r, 0] > m[r]):
                best, m[r], x_top[r], g_top[r] = rank, g[2][r, 0], g[2][r, 1], tok
        if best < 0:
            raise ValueError(f"row {r}: no token is left to sample (every allowed logit is -inf)")
    f32 = np.float32
    if p.temperature == 0.0:  # greedy: the kept set is the top token alone
        d = (x_top - lse).astype(f32)
        mass = np.asarray(_core.canon_exp_nonpos(np.minimum(d, f32(0))), f32)
        return _result(single, g_top, d, np.zeros(t, f32), mass)
    # the kept set: top_k, top_p, min_p, each over the previous one's survivors
    by_rank = p.top_k > 0 or p.top_p < 1.0
    top_k_list: Optional[list[tuple[np.ndarray, np.ndarray]]] = None
    local_drop = np.zeros(t, bool)
    count = np.zeros(t, np.int64)
    if by_rank:
        counts = _exchange(coll, [(z != _NEG_INF).sum(axis=1).astype(np.int64).reshape(t, 1)],
                           _bytes([(t, 1, np.int64)]))
        count = np.sum([c[0][:, 0] for c in counts], axis=0)
    if p.top_k > 0 and np.any(p.top_k < count):
        cand = _kept_order(z, s, p.top_k)
        got = _exchange(coll, cand[:2], _bytes([(t, p.top_k, np.float32), (t, p.top_k, np.int64)]))
        top_k_list = []
        for r in range(t):
            zs, ids = _merged_order(got, r)
            if p.top_k < count[r]:
                zs, ids = zs[:p.top_k], ids[:p.top_k]
                _drop_after(z, s, r, zs[-1], int(ids[-1]))
                g_dropped[r] = True
                count[r] = p.top_k
                top_k_list.append((zs, ids))
            else:
                top_k_list.append(None)  # type: ignore[arg-type]
    if p.top_p < 1.0:
        # the kept set's mass: each shard's integer sum against the row's top z m, added exactly
        local = np.asarray(_core.sample_top_p_mass_rows(np.ascontiguousarray(z), np.ascontiguousarray(m, f32)))
        got = _exchange(coll, [local.view(np.int64).reshape(t, 1)], _bytes([(t, 1, np.int64)]))
        top_p_mass = [sum(int(g[0][r, 0]) for g in got) for r in range(t)]
        cuts = _top_p_cuts(coll, z, s, m, top_p_mass, p.top_p, count, top_k_list)
        for r in range(t):
            cut_at = cuts[r]
            if cut_at is not None:
                _drop_after(z, s, r, *cut_at)
                g_dropped[r] = True
    if p.min_p > 0.0:
        for r in range(t):
            keep = z[r] != _NEG_INF
            w = np.asarray(_core.canon_exp_nonpos(np.ascontiguousarray((z[r] - m[r]).astype(f32))), f32)
            drop = keep & (w < f32(p.min_p))
            z[r, drop] = _NEG_INF
            local_drop[r] = bool(drop.any())
        g_dropped |= _any(coll, local_drop)
    if np.all(g_z_is_x & ~g_dropped):
        kept_lse = lse
    else:
        _, z_lse = lse_pairs(coll, layout, z)
        kept_lse = np.where(g_z_is_x & ~g_dropped, lse, z_lse).astype(f32)
    # the race: each shard's winner, then the best of them (race_beats is a total order)
    zmax = z.max(axis=1) if n else np.full(t, _NEG_INF)
    local_top = np.where(zmax != _NEG_INF, np.argmax(z, axis=1), -1).astype(np.int64)
    keys, toks = _core.sample_race_rows(z, s, m, p.seed, pos, local_top)
    keys, toks = np.asarray(keys, f32), np.asarray(toks, np.int64)
    ok = toks >= 0
    li = np.clip(toks - s, 0, n - 1)
    win_f = np.stack([keys, np.where(ok, z[rows, li], 0), np.where(ok, x[rows, li], 0)], 1).astype(f32)
    raw = np.where(z == _NEG_INF, _NEG_INF, x).astype(f32)
    need_raw = bool(np.any(g_dropped))
    parts = [win_f, toks.reshape(t, 1)]
    cap = _bytes([(t, 3, f32), (t, 1, np.int64)])
    if need_raw:
        rp, rc = _lse_parts(layout, raw)
        parts += [rp, rc]
        cap += _lse_capacity(layout, t)
    got = _exchange(coll, parts, cap)
    token = np.full(t, -1, np.int64)
    z_win = np.zeros(t, f32)
    x_win = np.zeros(t, f32)
    for r in range(t):
        bk = f32(0)
        for g in got:
            k, tok = g[0][r, 0], int(g[1][r, 0])
            if tok >= 0 and (token[r] < 0 or k > bk or (k == bk and tok < token[r])):
                bk, token[r], z_win[r], x_win[r] = k, tok, g[0][r, 1], g[0][r, 2]
    plp = (z_win - kept_lse).astype(f32)
    raw_lse = lse
    if need_raw:
        _, rl = _lse_merge(layout, [(g[2], g[3]) for g in got])
        raw_lse = np.where(g_dropped, rl, lse).astype(f32)
    d = (raw_lse - lse).astype(f32)
    mass = np.asarray(_core.canon_exp_nonpos(np.ascontiguousarray(np.minimum(d, f32(0)))), f32)
    return _result(single, token, (x_win - lse).astype(f32), plp, mass)


def _top_p_cuts(coll: Collective, z: np.ndarray, start: int, m: np.ndarray, mass: list[int], top_p: float,
                count: np.ndarray, top_k_list: Optional[list]) -> list[Optional[tuple[float, int]]]:
    """Per row, the last kept token (z, id) of top_p's cut, or None when the cut keeps all.

    The cut is the shortest prefix of the kept-set order whose fixed-point mass reaches
    ceil(top_p * mass) (muser/sample.h's sample_top_p_target; m: the row's top z).
    After a top_k cut the whole order is the gathered top_k list. Otherwise each shard sends its
    first K kept tokens; the merged list is the true order down to the largest of the last keys
    of the shards that had more (every unsent token ranks after it); K doubles until the cut lies
    in that certified prefix (MAX_TOP_P_CANDIDATES at most, else ValueError)."""
    t = z.shape[0]
    f32 = np.float32
    result: list[Optional[tuple[float, int]]] = [None] * t
    pending = []
    for r in range(t):
        if top_k_list is not None and top_k_list[r] is not None:
            zs, ids = top_k_list[r]
            c = int(_core.sample_top_p_cut(np.ascontiguousarray(zs), float(m[r]), mass[r], float(f32(top_p))))
            if 0 <= c < count[r]:
                result[r] = (float(zs[c - 1]), int(ids[c - 1]))
        else:
            pending.append(r)
    K = 64
    while True:  # every rank runs the same rounds: `pending` is the same everywhere
        if not pending:
            return result
        zs_l, ids_l, cnt_l = _kept_order(z, start, K)
        got = _exchange(coll, [zs_l, ids_l, cnt_l.reshape(t, 1).astype(np.int64)],
                        _bytes([(t, K, f32), (t, K, np.int64), (t, 1, np.int64)]))
        still = []
        for r in pending:
            zs, ids = _merged_order(got, r)
            bound = None  # the last sent key of a shard that had more
            for g in got:
                if int(g[2][r, 0]) > K:
                    key = topk_keys(g[0][r, K - 1:K], g[1][r, K - 1:K])[0]
                    bound = key if bound is None or key > bound else bound
            certified = len(zs) if bound is None else int((topk_keys(zs, ids) >= bound).sum())
            c = int(_core.sample_top_p_cut(np.ascontiguousarray(zs[:certified]), float(m[r]), mass[r],
                                           float(f32(top_p))))
            if c >= 0:
                if c < count[r]:
                    result[r] = (float(zs[c - 1]), int(ids[c - 1]))
            elif bound is not None:
                still.append(r)
        pending = still
        if pending and K >= MAX_TOP_P_CANDIDATES:
            raise ValueError(f"sharded top_p: the cut of row {pending[0]} lies beyond the first "
                             f"{MAX_TOP_P_CANDIDATES} tokens of a shard (a flat distribution); pass top_k "
                             f"(at most {MAX_TOP_P_CANDIDATES}) to bound the kept set, or sample unsharded")
        K *= 2


def _result(single: bool, tokens: np.ndarray, lp: np.ndarray, plp: np.ndarray, mass: np.ndarray) -> Sample:
    if single:
        return Sample(int(tokens[0]), float(lp[0]), float(plp[0]), float(mass[0]))
    return Sample(tokens, lp.astype(np.float32), plp.astype(np.float32), mass.astype(np.float32))
