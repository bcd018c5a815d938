"""The ring kernel's synchronization (cuda_canon_ring.cuh) transcribed and run on the CPU.

Eight warps and the copy engine are modelled as steps a random scheduler interleaves:
every mbarrier wait, arrival and expect_tx of the kernel, bulk copies that land at a
random later step, and each warp's reads of a stage held open from its wait to its
arrival. What it checks, over many random interleavings and shapes (S = 2 and 3
stages, kTmaX on and off, CTAs of a few row groups):

- every read of a stage (a warp's unit k: all warps' decoded rows and x) sees unit k
  from its start to its end, and every decode reads the raw blocks of its own unit;
- no copy lands in, and no decode writes, a region another warp still reads;
- nothing deadlocks and every copy issued is waited on before the end.

Not the PTX's memory model nor the float bits: a GPU run of cuda_canon_wide.cu shows
those (its bits against the 4-row kernel at every launch).

    python3 bench/experiments/cuda_canon_ring_protocol.py [trials]
"""

from __future__ import annotations

import random
import sys

WARPS = 8
RAW_STAGES = 3


class Barrier:
    """An mbarrier: a phase completes when its arrivals and its transaction bytes are in."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.pending = count
        self.tx = 0
        self.phase = 0  # completed phases

    def arrive(self, tx: int = 0) -> None:
        self.tx += tx
        self.pending -= 1
        assert self.pending >= 0, "more arrivals than the count in one phase"
        self._maybe_complete()

    def complete_tx(self, n: int) -> None:
        self.tx -= n
        self._maybe_complete()

    def _maybe_complete(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def passed(self, parity: int) -> bool:
        # try_wait.parity p returns once the phase of parity p has completed: the
        # current (incomplete) phase's parity differs from p
        return (self.phase & 1) != parity


def run(stages: int, tma: bool, my_units: int, rng: random.Random) -> None:
    S, RS = stages, RAW_STAGES
    full = [Barrier(WARPS + 1 if tma else 2 * WARPS) for _ in range(S)]
    raw_full = [Barrier(1) for _ in range(RS)]
    # contents: which unit each region holds (None: nothing yet)
    rows = [[None] * WARPS for _ in range(S)]  # stage s, warp w's decoded rows
    xs = [[None] * WARPS for _ in range(S)]  # stage s, x slot of warp w (one slot with TMA)
    raw = [None] * RS
    readers = [dict() for _ in range(S)]  # stage -> {warp: unit} reads in progress
    in_flight = []  # copies: (kind, stage, slot, unit, barrier, bytes)

    def read_ok(w: int, k: int) -> None:
        s = k % S
        assert all(r == k for r in rows[s]), f"warp {w} reads unit {k}: rows hold {rows[s]}"
        slots = xs[s][:1] if tma else xs[s]
        assert all(x == k for x in slots), f"warp {w} reads unit {k}: x holds {slots}"

    def land(c) -> None:
        kind, s, slot, unit, bar, n = c
        if kind == "raw":
            raw[s] = unit
        else:
            assert not readers[s], f"x of unit {unit} lands in stage {s} while {readers[s]} read it"
            xs[s][slot] = unit
        bar.complete_tx(n)

    def issue_raw(k: int) -> None:
        if k >= my_units:
            return
        raw_full[k % RS].arrive(tx=2)  # expect_tx: two tile copies
        for _ in range(2):
            in_flight.append(("raw", k % RS, 0, k, raw_full[k % RS], 1))

    def issue_x(w: int, k: int) -> None:
        if k >= my_units:
            return
        s = k % S
        if tma:
            full[s].arrive(tx=1)
            in_flight.append(("x", s, 0, k, full[s], 1))
        else:
            full[s].arrive(tx=4)
            for _ in range(4):
                in_flight.append(("x", s, w, k, full[s], 1))

    def decode(w: int, k: int) -> None:
        if k < my_units:
            assert raw[k % RS] == k, f"warp {w} decodes unit {k} from raw blocks of {raw[k % RS]}"
        s = k % S
        for other, unit in readers[s].items():
            raise AssertionError(f"warp {w} writes unit {k} into stage {s} while warp {other} reads unit {unit}")
        rows[s][w] = k

    def warp(w: int):
        x_issuer = (w == 1) if tma else True
        if w == 0:
            for k in range(RS):
                issue_raw(k)
        yield
        if x_issuer:
            for k in range(S - 1):
                issue_x(w, k)
        yield
        while not raw_full[0].passed(0):
            yield
        decode(w, 0)
        full[0].arrive()
        for k in range(my_units):
            while not full[k % S].passed((k // S) & 1):
                yield
            read_ok(w, k)
            readers[k % S][w] = k
            if w == 0:
                issue_raw(k + RS)
            if x_issuer:
                issue_x(w, k + S - 1)
            yield
            kn = k + 1
            if kn < my_units:
                while not raw_full[kn % RS].passed((kn // RS) & 1):
                    yield
                assert raw[kn % RS] == kn, f"warp {w} loads unit {kn}'s raw blocks: the stage holds {raw[kn % RS]}"
            yield  # the FFMAs, interleaved with the decode of unit kn
            read_ok(w, k)
            del readers[k % S][w]
            if kn < my_units:
                decode(w, kn)
                full[kn % S].arrive()
            else:
                decode(w, kn)  # stale bytes into a stage nobody reads
            yield

    live = {w: warp(w) for w in range(WARPS)}
    idle = 0
    while live:
        if in_flight and rng.random() < 0.3:
            land(in_flight.pop(rng.randrange(len(in_flight))))
            idle = 0
            continue
        w = rng.choice(list(live))
        try:
            next(live[w])
        except StopIteration:
            del live[w]
        idle += 1
        assert idle < 100000, "deadlock: no warp moves and no copy is in flight"
    assert not in_flight, f"the CTA ends with {len(in_flight)} copies in flight"


def main() -> None:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    rng = random.Random(20261208)
    n = 0
    for stages in (2, 3):
        for tma in (False, True):
            for units_per_group, groups in ((26, 1), (26, 2), (3, 3), (1, 5)):
                for _ in range(trials):
                    run(stages, tma, units_per_group * groups, rng)
                    n += 1
    print(f"{n} interleavings: every read saw its unit, no write met a reader, no deadlock")


if __name__ == "__main__":
    main()
