"""The split kernel's index maps (cuda_canon_split.cuh), checked on the CPU.

Transcribes the kernel's maps -- the decode's (row, lane, step) slots, the x
copies' columns, the compute slots' reads, the level-16 exchange and the pair
slots of shared memory -- and runs them over exact small integers, so a lane,
column, token or row mixed up shows as a wrong sum or a failed assertion:
every product pairs a weight and an x of the same column, every sum holds one
lane, level 16 joins lanes l and l + 16, level 8 lanes l and l + 8, and the
logits equal X @ W.T at tiles cut by the row and token ends. What it cannot
show: the pipeline's buffers and barriers (races) and the float order's bits,
which only a GPU run of cuda_canon_wide.cu checks.

    python bench/experiments/cuda_canon_split_maps.py      # ~10 s
"""
import numpy as np

rng = np.random.default_rng(1)


def split_lane(cl: int, p: int) -> int:
    """The canonical lane of pass p's lane slot cl: 0-7 and 16-23, then 8-15 and 24-31."""
    return (cl & 7) + 16 * (cl >> 3) + 8 * p


def run(TC: int, rows: int, cols: int, t: int) -> None:
    """One launch of the TC-token tile over a rows x cols weight and t tokens."""
    TG = TC // 8; RG = 16 // TG; RC = 16 * RG; LJ = RC // 16; R, T = 16, 8
    WR = 16 * 8 + 4; XT = 16 * 8 + 16
    W = rng.integers(-3, 4, size=(rows, cols)).astype(np.int64)
    X = rng.integers(-3, 4, size=(t, cols)).astype(np.int64)
    units = cols // 256; groups = (rows + RC - 1) // RC
    Y = np.full((t, rows), 10**9, dtype=object)
    for g in range(groups):
        ps = {}
        for p in range(2):
            # acc[(tid, r, k)] = (the lanes summed into it, the sum)
            acc = {}
            for u in range(units):
                ws = np.zeros(RC * WR, dtype=object); xs = np.zeros(TC * XT, dtype=object)
                for tid in range(256):   # decode
                    drow = tid // (16 // LJ); dcl = tid % (16 // LJ) * LJ
                    row = min(g * RC + drow, rows - 1); lane0 = split_lane(dcl, p)
                    for i in range(LJ):
                        lane = lane0 + i
                        for s in range(8):
                            col = u * 256 + 32 * s + lane
                            ws[drow * WR + (dcl + i) * 8 + s] = (int(W[row, col]), lane, col)
                for tid in range(256):   # stage_x
                    for n in range(TC // 8):
                        e = tid + 256 * n; q = e & 3; s = (e >> 2) & 7; tok = e >> 5
                        col = u * 256 + 32 * s + 8 * p + 4 * q + 8 * (q >> 1)
                        for c in range(4):
                            xs[tok * XT + 16 * s + 4 * q + c] = (int(X[tok, col + c]) if tok < t else 0, col + c)
                for tid in range(256):   # compute
                    warp, hl = tid >> 5, tid & 31
                    cl = hl & 15; tg = 2 * (warp % (TG // 2)) + (hl >> 4); rg = warp // (TG // 2)
                    for h in range(2):
                        for r in range(R):
                            for k in range(T):
                                for s in range(4):
                                    wv = ws[(rg * R + r) * WR + cl * 8 + 4 * h + s]
                                    xv = xs[(tg + TG * k) * XT + cl + 16 * (4 * h + s)]
                                    assert wv[2] == xv[1], (wv, xv)          # same column
                                    key = (tid, r, k)
                                    lanes, total = acc.get(key, (set(), 0))
                                    acc[key] = (lanes | {wv[1]}, total + wv[0] * xv[0])
            # pass end: level 16 exchange
            for tid in range(256):
                warp, hl = tid >> 5, tid & 31
                cl = hl & 15; tg = 2 * (warp % (TG // 2)) + (hl >> 4); rg = warp // (TG // 2)
                partner = (tid & ~31) | (hl ^ 8)
                low = cl < 8; c = cl & 7
                for i in range(R * T // 2):
                    half = R * T // 2
                    ra, ka, rb, kb = i // T, i % T, (i + half) // T, (i + half) % T
                    r, k = (ra, ka) if low else (rb, kb)
                    mine = acc[(tid, r, k)]; other = acc[(partner, r, k)]
                    assert len(mine[0]) == 1 and len(other[0]) == 1
                    lm, lo = next(iter(mine[0])), next(iter(other[0]))
                    assert {lm, lo} == {c + 8 * p, c + 8 * p + 16}, (lm, lo, c, p)
                    idx = ((tg + TG * k) * RC + rg * R + r) * 8 + c
                    v = mine[1] + other[1]
                    if p == 0:
                        ps[idx] = ({lm, lo}, v)
                    else:
                        l0, v0 = ps[idx]
                        assert l0 == {c, c + 16}, l0
                        ps[idx] = (l0 | {lm, lo}, v0 + v)
        for pi in range(RC * TC):
            vals = [ps[8 * pi + c] for c in range(8)]
            for c in range(8):
                assert vals[c][0] == {c, c + 8, c + 16, c + 24}
            row = g * RC + pi % RC; tok = pi // RC
            if row < rows and tok < t:
                Y[tok, row] = sum(v for _, v in vals)
    want = X @ W.T
    assert (Y == want).all(), "mismatch"
    print("ok", TC, rows, cols, t)


if __name__ == "__main__":
    # rows and tokens that end inside a tile, one and two units a row
    for TC, rows, cols, t in ((16, 130, 512, 11), (32, 70, 256, 32), (64, 40, 512, 37), (64, 33, 256, 64)):
        run(TC, rows, cols, t)
