#!/usr/bin/env python3
"""Models of moe_ffn's tensor-core path (kernels/cuda/moe.cu, "grouped GEMM on
tensor cores"), for checking it without a GPU. numpy only.

    bench/kernels/moe_tc_model.py emulate   # index math, lane by lane
    bench/kernels/moe_tc_model.py error     # bf16 rounding against fp32

emulate: runs the kernels' loads (cp.async with zero-fill, the XOR swizzle),
ldmatrix x4 fragments, mma m16n8k16 (the PTX fragment layouts of A, B and C),
epilogues, the device tile list and the persistent block walk, with float64
values, then the combine, and compares with a float64 reference (hot experts
over several row tiles, experts with no rows, an expert-parallel bank, K and
column tails). Any index slip gives O(1) errors; a pass is < 1e-12.

error: the op with x and SiLU(g) * u rounded to bf16 (round to nearest even)
against float64, on the GPU test's distributions (weights U(-0.3, 0.3) in
bf16, x U(-1, 1), routing weights U(0.05, 1)): max |err| / max |out| and the
rms relative error, the basis of the test's 1e-2 bound."""
import sys

import numpy as np

# ---- emulation ------------------------------------------------------------
#
# PTX layouts used: ldmatrix .x4 reads matrix i from the row addresses of
# lanes 8i .. 8i+7 and gives lane l row l // 4, elements 2(l % 4) and +1 of
# each; mma m16n8k16 with g = l // 4, t = l % 4: A a0 (g, 2t), a1 (g+8, 2t),
# a2 (g, 2t+8), a3 (g+8, 2t+8); B b0 (k = 2t, n = g), b1 (k = 2t+8, n = g);
# C c0, c1 (g, 2t and 2t+1), c2, c3 (g+8, same). Names follow moe.cu.

BM, BK, BROWS, S = 64, 32, 128, 4  # MOE_TC_BM, _BK, _BROWS, _STAGES


def swz(r, c):
    """moe_tc_swz: element offset of 16-byte chunk c of row r in a stage"""
    return r * BK + ((c ^ ((r >> 1) & 3)) << 3)


def gemm(GU, out, a, sorted_, top_k, off, tile_off, tile_e, E, N, K, taba, tabb, grid):
    BN = BROWS // 2 if GU else BROWS
    ncol = (N + BN - 1) // BN; nk = (K + BK - 1) // BK
    total = tile_off[E] * ncol
    for blk in range(grid):
        L = blk
        while L < total:
            rt = L // ncol; e = tile_e[rt]; t0 = tile_off[e]; nrt = tile_off[e + 1] - t0
            local = L - t0 * ncol; ct = local // nrt; r = local % nrt
            row0 = off[e] + r * BM; col0 = ct * BN; rows = min(BM, off[e + 1] - row0)
            sa = np.full((S, BM * BK), np.nan); sb = np.full((S, BROWS * BK), np.nan)
            def load(s, kt):
                for tid in range(128):
                    ck = tid % 4; k = kt * BK + ck * 8; kin = k < K
                    for i in range(2):
                        rr = tid // 4 + 32 * i; ok = kin and rr < rows
                        if ok:
                            ar = sorted_[row0 + rr] // top_k if GU else row0 + rr
                            sa[s, swz(rr, ck):swz(rr, ck) + 8] = a[ar, k:k + 8]
                        else:
                            sa[s, swz(rr, ck):swz(rr, ck) + 8] = 0
                    j0 = col0 + tid // 4; jhi = j0 if GU else j0 + 64
                    for i in range(4):
                        j = (j0 if i < 2 else jhi) + 32 * (i % 2)
                        W = taba[e] if (i < 2 or not GU) else tabb[e]
                        ok = kin and j < N
                        d = swz(tid // 4 + 32 * i, ck)
                        sb[s, d:d + 8] = W[j, k:k + 8] if ok else 0
            acc = np.zeros((4, 32, 2, 8, 4))  # warp, lane, mi, j, q
            for s in range(S - 1):
                if s < nk: load(s, s)
            for kt in range(nk):
                if kt + S - 1 < nk: load((kt + S - 1) % S, kt + S - 1)
                As = sa[kt % S]; Bs = sb[kt % S]
                for warp in range(4):
                    wm, wn = warp // 2, warp % 2
                    for ks in range(BK // 16):
                        def ldsm(base, rowf, chunkf):
                            addr = [base + swz(rowf(l), chunkf(l)) for l in range(32)]
                            res = np.zeros((32, 4, 2))
                            for i in range(4):
                                for l in range(32):
                                    ad = addr[8 * i + l // 4]
                                    res[l, i] = base_arr[ad + 2 * (l % 4): ad + 2 * (l % 4) + 2]
                            return res
                        base_arr = As
                        af = [ldsm(0, lambda l, mi=mi: wm * 32 + mi * 16 + l % 16,
                                   lambda l: ks * 2 + l // 16) for mi in range(2)]
                        base_arr = Bs
                        for p in range(4):
                            rb = (wn * 32 + p * 16 if p < 2 else BROWS // 2 + wn * 32 + (p - 2) * 16) if GU else wn * 64 + p * 16
                            bf = ldsm(0, lambda l: rb + l % 8 + (l // 16) * 8, lambda l: ks * 2 + (l // 8) % 2)
                            for mi in range(2):
                                for jj, (b0, b1) in ((2 * p, (0, 1)), (2 * p + 1, (2, 3))):
                                    Am = np.zeros((16, 16)); Bm = np.zeros((16, 8))
                                    for l in range(32):
                                        g, t = l // 4, l % 4
                                        Am[g, 2*t:2*t+2] = af[mi][l, 0]; Am[g+8, 2*t:2*t+2] = af[mi][l, 1]
                                        Am[g, 2*t+8:2*t+10] = af[mi][l, 2]; Am[g+8, 2*t+8:2*t+10] = af[mi][l, 3]
                                        Bm[2*t:2*t+2, g] = bf[l, b0]; Bm[2*t+8:2*t+10, g] = bf[l, b1]
                                    C = Am @ Bm
                                    for l in range(32):
                                        g, t = l // 4, l % 4
                                        acc[warp, l, mi, jj] += [C[g, 2*t], C[g, 2*t+1], C[g+8, 2*t], C[g+8, 2*t+1]]
            for warp in range(4):
                wm, wn = warp // 2, warp % 2
                for l in range(32):
                    for mi in range(2):
                        for hh in range(2):
                            row = wm * 32 + mi * 16 + l // 4 + 8 * hh
                            if row >= rows: continue
                            if GU:
                                for j in range(4):
                                    col = col0 + wn * 32 + j * 8 + 2 * (l % 4)
                                    if col >= N: continue
                                    for q in range(2):
                                        gv = acc[warp, l, mi, j, 2*hh+q]; uv = acc[warp, l, mi, j+4, 2*hh+q]
                                        out[row0 + row, col + q] = gv / (1 + np.exp(-gv)) * uv
                            else:
                                for j in range(8):
                                    col = col0 + wn * 64 + j * 8 + 2 * (l % 4)
                                    if col >= N: continue
                                    out[row0 + row, col:col + 2] = acc[warp, l, mi, j, 2*hh:2*hh+2]
            L += grid


def emulate(seed, n, K, E, D, I, first, E_all, grid):
    rng = np.random.default_rng(seed)
    hot = first + rng.integers(E)
    ids = np.zeros((n, K), int)
    for t in range(n):
        ch = [hot] + list(rng.choice([x for x in range(E_all) if x != hot and x % 4 != 1], K - 1, replace=False))
        rng.shuffle(ch); ids[t] = ch
    Wg = rng.uniform(-1, 1, (E, I, D)); Wu = rng.uniform(-1, 1, (E, I, D)); Wd = rng.uniform(-1, 1, (E, D, I))
    x = rng.uniform(-1, 1, (n, D)); w = rng.uniform(.05, 1, (n, K))
    ref = np.zeros((n, D))
    for t in range(n):
        for j in range(K):
            e = ids[t, j] - first
            if 0 <= e < E:
                g = Wg[e] @ x[t]; u = Wu[e] @ x[t]
                ref[t] += w[t, j] * (Wd[e] @ (g / (1 + np.exp(-g)) * u))
    # sort (any order inside a segment: shuffled here)
    flat = ids.reshape(-1) - first; m = n * K
    cnt = np.array([(flat == e).sum() for e in range(E)])
    off = np.concatenate([[0], np.cumsum(cnt)])
    sorted_ = np.zeros(m, int); inv = -np.ones(m, int); fill = off[:-1].copy()
    for r in rng.permutation(m):
        e = flat[r]
        if 0 <= e < E:
            sorted_[fill[e]] = r; inv[r] = fill[e]; fill[e] += 1
    # tiles kernel
    tcnt = (cnt + BM - 1) // BM
    tile_off = np.concatenate([[0], np.cumsum(tcnt)])
    tile_e = np.full(m // BM + min(E, m), -1)
    for e in range(E):
        tile_e[tile_off[e]:tile_off[e + 1]] = e
    assert tile_off[E] <= m // BM + min(E, m)
    h = np.full((m, I), np.nan); y = np.full((m, D), np.nan)
    gemm(True, h, x, sorted_, K, off, tile_off, tile_e, E, I, D, Wg, Wu, grid)
    gemm(False, y, h, None, 1, off, tile_off, tile_e, E, D, I, Wd, None, grid)
    out = np.zeros((n, D))
    for t in range(n):
        for j in range(K):
            p = inv[t * K + j]
            if p >= 0: out[t] += w[t, j] * y[p]
    err = np.abs(out - ref).max() / np.abs(ref).max()
    print(f"n={n} K={K} E={E} D={D} I={I} first={first} grid={grid} rows/expert={list(cnt)} err={err:.2e}")
    assert np.isfinite(out).all() and err < 1e-12, err


# ---- error model ----------------------------------------------------------

def bf16(a):
    """round to nearest even bf16, kept in float32"""
    a = np.asarray(a, np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7fff + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def error_model(rng, n, E, K, D, I, hot):
    Wg = bf16(rng.uniform(-.3,.3,(E,I,D)).astype(np.float32))
    Wu = bf16(rng.uniform(-.3,.3,(E,I,D)).astype(np.float32))
    Wd = bf16(rng.uniform(-.3,.3,(E,D,I)).astype(np.float32))
    x = rng.uniform(-1,1,(n,D)).astype(np.float32)
    w = rng.uniform(.05,1,(n,K))
    ids = np.array([rng.choice(E, K, replace=False) for _ in range(n)])
    if hot: ids[:,0] = 0
    ref = np.zeros((n,D)); tc = np.zeros((n,D))
    xb = bf16(x).astype(np.float64); x64 = x.astype(np.float64)
    for e in range(E):
        t, j = np.nonzero(ids == e)
        if len(t) == 0: continue
        g = x64[t] @ Wg[e].T.astype(np.float64); u = x64[t] @ Wu[e].T.astype(np.float64)
        h = g/(1+np.exp(-g))*u
        ref[t] += w[t,j][:,None] * (h @ Wd[e].T.astype(np.float64))
        g = xb[t] @ Wg[e].T.astype(np.float64); u = xb[t] @ Wu[e].T.astype(np.float64)
        h = bf16((g/(1+np.exp(-g))*u).astype(np.float32)).astype(np.float64)
        tc[t] += w[t,j][:,None] * (h @ Wd[e].T.astype(np.float64))
    err = np.abs(tc-ref).max()/np.abs(ref).max()
    rms = np.sqrt(((tc-ref)**2).mean()/(ref**2).mean())
    print(f"n={n} E={E} K={K} D={D} I={I} maxerr/max|out|={err:.3e} rms rel={rms:.3e}")


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else "emulate"
    if what == "emulate":
        emulate(1, 70, 3, 4, 40, 24, 0, 4, 3)       # hot expert 70 rows: 2 row tiles; K and N tails
        emulate(2, 20, 2, 6, 136, 72, 2, 12, 5)     # expert-parallel bank, experts with no rows, BK tail 8
        emulate(3, 33, 2, 3, 264, 136, 0, 3, 1000)  # one block per tile and more; 3 column tiles for down
    elif what == "error":
        for seed in (1, 2):
            rng = np.random.default_rng(seed)
            error_model(rng, 48, 8, 6, 2048, 1408, 1)
            error_model(rng, 200, 16, 8, 520, 200, 1)
            error_model(rng, 300, 16, 6, 264, 136, 0)
            error_model(rng, 200, 16, 6, 64, 40, 0)
    else:
        sys.exit("usage: moe_tc_model.py emulate|error")


if __name__ == "__main__":
    main()
