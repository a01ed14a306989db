#!/usr/bin/env python3
"""Error model of the tensor-core MLA kernel (kernels/cuda/attention.cu,
mla_tc_kernel) against exact attention, for the bound of the GPU test
(tests/gpu/test_ops.c, MLA_TC_BOUND).

    /usr/bin/python3 bench/kernels/mla_tc_error_model.py [SEED]
    /usr/bin/python3 bench/kernels/mla_tc_error_model.py --emulate

The kernel's rounding, step by step: q and every cached row (576 floats:
latent c, then the roped key) rounded to bf16 (round to nearest even);
scores = scale * q.k with exact products and fp32 sums, per tile of 64 keys;
online softmax in fp32 with p = bf16(exp(s - running max)); the running sum
adds the rounded p; O = alpha O + p V in fp32 (V = the first 512 floats of
the rounded rows); out = O / l. Inputs as the GPU test draws them: q_lat,
q_pe and the cache uniform in [-1, 1), scale 1/sqrt(192). Prints
max |err| / max |out| per head count and context (numpy only).

--emulate checks the kernel's ldmatrix / mma index math instead: every
lane's row addresses as mla_tc_kernel computes them, the registers that
ldmatrix (.trans) gives each lane and the m16n8k16 fragment layouts as the
PTX ISA defines them, on a random tile; the scores and the output must equal
Q K^T and P V."""
import sys

import numpy as np

C, DK, KT = 512, 576, 64


def bf16(x):
    """float32 -> nearest bf16 (ties to even), kept as float32"""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def kernel(q, K, scale):
    """q (H, 576), K (n, 576) float32 -> out (H, 512) as the kernel rounds"""
    qb = bf16(q).astype(np.float64)
    Kb = bf16(K)
    H = q.shape[0]
    m = np.full(H, -np.inf, np.float32)
    l = np.zeros(H, np.float32)
    acc = np.zeros((H, C), np.float32)
    for j0 in range(0, K.shape[0], KT):
        kt = Kb[j0:j0 + KT]
        s = (qb @ kt.astype(np.float64).T).astype(np.float32) * np.float32(scale)
        mn = np.maximum(m, s.max(1))
        p = bf16(np.exp(s - mn[:, None]))
        al = np.where(m == -np.inf, 0, np.exp(m - mn)).astype(np.float32)
        l = l * al + p.sum(1, dtype=np.float32)
        acc = acc * al[:, None] + (p.astype(np.float64) @ kt[:, :C].astype(np.float64)).astype(np.float32)
        m = mn
    return acc / l[:, None]


def exact(q, K, scale):
    s = (q.astype(np.float64) @ K.astype(np.float64).T) * scale
    p = np.exp(s - s.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return p @ K[:, :C].astype(np.float64)


KP, PP = DK + 8, KT + 8  # shared-memory pitches (bf16 elements) of the kernel


def ldsm(mem, addr, trans=False):
    """ldmatrix.x4: addr[l] = (row, col) of the row that lane l points at
    (lanes 8i..8i+7: matrix i); lane l gets (row l/4, cols 2(l%4), +1) of
    each matrix, or with .trans (rows 2(l%4), +1, col l/4)"""
    out = [[None] * 4 for _ in range(32)]
    for i in range(4):
        M = np.array([mem[addr[8 * i + r][0], addr[8 * i + r][1]:addr[8 * i + r][1] + 8]
                      for r in range(8)])
        for l in range(32):
            g, t = l // 4, l % 4
            out[l][i] = (M[2 * t, g], M[2 * t + 1, g]) if trans else (M[g, 2 * t], M[g, 2 * t + 1])
    return out


def mma(d, a, b0, b1):
    """m16n8k16: a0 (g, 2t..), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..);
    b0 (k 2t.., n g), b1 (k 2t+8.., n g); d0..d3 (g, 2t), (g, 2t+1), (g+8, ..)"""
    A, B = np.zeros((16, 16)), np.zeros((16, 8))
    for l in range(32):
        g, t = l // 4, l % 4
        A[g, 2 * t:2 * t + 2], A[g + 8, 2 * t:2 * t + 2] = a[l][0], a[l][1]
        A[g, 2 * t + 8:2 * t + 10], A[g + 8, 2 * t + 8:2 * t + 10] = a[l][2], a[l][3]
        B[2 * t:2 * t + 2, g], B[2 * t + 8:2 * t + 10, g] = b0[l], b1[l]
    D = A @ B
    for l in range(32):
        g, t = l // 4, l % 4
        d[l][0] += D[g, 2 * t]
        d[l][1] += D[g, 2 * t + 1]
        d[l][2] += D[g + 8, 2 * t]
        d[l][3] += D[g + 8, 2 * t + 1]


def emulate():
    rng = np.random.default_rng(0)
    ks = np.zeros((KT, KP))
    ks[:, :DK] = rng.standard_normal((KT, DK))
    qs = np.zeros((16, KP))
    qs[:, :DK] = rng.standard_normal((16, DK))
    ps = np.zeros((16, PP))
    ps[:, :KT] = rng.standard_normal((16, KT))
    S, O = np.zeros((16, KT)), np.zeros((16, C))
    for warp in range(8):
        # scores: keys 8 warp .. 8 warp + 7, k0 in steps of 32 (two mmas)
        d = [[0.0] * 4 for _ in range(32)]
        for k0 in range(0, DK, 32):
            a0 = ldsm(qs, [(l % 16, k0 + (l // 16) * 8) for l in range(32)])
            a1 = ldsm(qs, [(l % 16, k0 + 16 + (l // 16) * 8) for l in range(32)])
            b = ldsm(ks, [(warp * 8 + l % 8, k0 + (l // 8) * 8) for l in range(32)])
            mma(d, a0, [x[0] for x in b], [x[1] for x in b])
            mma(d, a1, [x[2] for x in b], [x[3] for x in b])
        for l in range(32):
            g, tq = l // 4, l % 4
            c = warp * 8 + 2 * tq
            S[g, c], S[g, c + 1], S[g + 8, c], S[g + 8, c + 1] = d[l]
        # P V: output columns 64 warp .., 8 n-tiles (acc[i])
        acc = [[[0.0] * 4 for _ in range(32)] for _ in range(8)]
        for k0 in range(0, KT, 16):
            pf = ldsm(ps, [(l % 16, k0 + (l // 16) * 8) for l in range(32)])
            for n2 in range(4):
                b = ldsm(ks, [(k0 + l % 16, warp * 64 + (l // 16) * 8 + n2 * 16) for l in range(32)],
                         trans=True)
                mma(acc[2 * n2], pf, [x[0] for x in b], [x[1] for x in b])
                mma(acc[2 * n2 + 1], pf, [x[2] for x in b], [x[3] for x in b])
        for i in range(8):
            for k in range(4):
                for l in range(32):
                    g, tq = l // 4, l % 4
                    O[g + (k >> 1) * 8, warp * 64 + i * 8 + 2 * tq + (k & 1)] = acc[i][l][k]
    es = np.abs(S - qs[:, :DK] @ ks[:, :DK].T).max()
    eo = np.abs(O - ps[:, :KT] @ ks[:, :C]).max()
    print("scores: max |diff| %.3g; output: max |diff| %.3g" % (es, eo))
    return 0 if es < 1e-9 and eo < 1e-9 else 1


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--emulate":
        sys.exit(emulate())
    rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
    scale = 1 / np.sqrt(192)
    for H in (16, 128):
        for n in (1, 2, 4, 33, 64, 300, 4100):
            errs = []
            for _ in range(3):
                outs, refs = [], []
                for _ in range(4):  # tokens of one check: one max |out| over all
                    q = rng.uniform(-1, 1, (H, DK)).astype(np.float32)
                    K = rng.uniform(-1, 1, (n, DK)).astype(np.float32)
                    outs.append(kernel(q, K, scale))
                    refs.append(exact(q, K, scale))
                o, r = np.array(outs), np.array(refs)
                errs.append(np.abs(o - r).max() / np.abs(r).max())
            print("H=%-3d keys=%-5d max|err|/max|out| = %.3g (runs %s)"
                  % (H, n, max(errs), ", ".join("%.3g" % e for e in errs)), flush=True)


if __name__ == "__main__":
    main()
