/*
 * asm/aarch64/math_neon.h -- shared NEON building blocks of the AArch64 kernels (matvec_neon.S,
 * norm_neon.S, act_neon.S, attn_neon.S): the constant table, the canonical expf_c sequence, the
 * canonical 16-lane horizontal sum / max trees, the matvec row step, stack frames and the tails.
 *
 * Include it once per kernel file, after asm.S.  It emits the constant block `math_neon` into that
 * object (each object has its own file-local copy) and defines only macros otherwise.
 *
 * Register arguments of the macros are register NUMBERS: `5` names v5 (v5.4s, q5, s5 as the
 * instruction needs) or x5 / w5 for a GPR argument, as each macro documents.
 *
 * The operation sequences are those of docs/kernels.md and of the x86 twins (math_avx2.h,
 * math_avx512.h), so every output is bit-identical to the x86 kernels.  Where AArch64 and x86 differ:
 *   - vmaxps/vminps return their second source when either is NaN; fmax/fmin return the (quieted) NaN.
 *     For expf's clamp `min(max(x, -104), 89)` (x the second source on x86) both keep a NaN x, so
 *     fmax/fmin give the same result.  softmax's max `(a > b) ? a : b` is fcmgt + bit/bif, exactly
 *     (NaN skipped, and the same zero sign as x86: (+0 > -0) is false).
 *   - vcvtps2dq of NaN gives INT_MIN, fcvtzs gives 0: only for a NaN n, whose p is already NaN, so y
 *     is NaN either way.
 *   - Operand order of the adds and FMAs follows x86 wherever AArch64 allows it; NaN payloads are not
 *     part of the contract (AArch64 propagates the first NaN operand of each operation by its own
 *     rules: FMLA checks the addend first).  expf and GELU of a single NaN still keep its payload.
 *   - FPCR must be the default (round to nearest, FZ = 0, DN = 0, AH = 0, AHP = 0): Linux, macOS start
 *     every thread so; the kernels do not change it.
 *
 * Register conventions of the expf block (act_neon.S, attn_neon.S via softmax):
 *   v24 = -104.0    v25 = 89.0      v26 = { log2e, -ln2hi, ln2lo, P0 }
 *   v27 = P1        v28 = P2        v29 = P3        v30 = P4        v31 = 1.0f (also the int bits
 *   0x3F800000 = 127 << 23)         v23 = { 0.044715, -1.59576912, 1e-5, 0.125 } (GELU only)
 *   P5 = 0.5f exactly (5.0000001201e-1f rounds to 0x3F000000) comes from `fmov #0.5`.
 */
#ifndef GPT2ASM_AARCH64_MATH_NEON_H
#define GPT2ASM_AARCH64_MATH_NEON_H

/* constant table offsets (bytes from math_neon) */
#define KN_MIN          0               /* -104.0f  x4                0xC2D00000 */
#define KN_MAX          16              /*   89.0f  x4                0x42B20000 */
#define KN_C0           32              /* log2e 0x3FB8AA3B, -0.693359375 0xBF318000,
                                           2.12194440e-4 0x395E8083, P0 1.9875691500e-4 0x39506967 */
#define KN_P1           48              /* 1.3981999507e-3f x4        0x3AB743CE */
#define KN_P2           64              /* 8.3334519073e-3f x4        0x3C088908 */
#define KN_P3           80              /* 4.1665795894e-2f x4        0x3D2AA9C1 */
#define KN_P4           96              /* 1.6666665459e-1f x4        0x3E2AAAAA */
#define KN_ONE          112             /* 1.0f x4                    0x3F800000 */
#define KN_C2           128             /* 0.044715 0x3D372713, -1.59576912 0xBFCC422A,
                                           1e-5 0x3727C5AC, 0.125 0x3E000000 */
#define KN_NINF         144             /* -inf x4                    0xFF800000 */
#define KN_MASK         160             /* int32 { -1 x 16, 0 x 16 }: lanes < r of a 16-lane tail
                                           start at KN_MASK + 64 - 4*r                            */
#define KN_EPS          (KN_C2 + 8)     /* scalar 1e-5f */

        .macro  vec4n   bits
        .rept   4
        .long   \bits
        .endr
        .endm

const math_neon, align=6
        vec4n   0xC2D00000                              // KN_MIN   -104.0
        vec4n   0x42B20000                              // KN_MAX   89.0
        .long   0x3FB8AA3B, 0xBF318000, 0x395E8083, 0x39506967  // KN_C0
        vec4n   0x3AB743CE                              // KN_P1
        vec4n   0x3C088908                              // KN_P2
        vec4n   0x3D2AA9C1                              // KN_P3
        vec4n   0x3E2AAAAA                              // KN_P4
        vec4n   0x3F800000                              // KN_ONE
        .long   0x3D372713, 0xBFCC422A, 0x3727C5AC, 0x3E000000  // KN_C2
        vec4n   0xFF800000                              // KN_NINF
        .rept   16                                      // KN_MASK
        .long   -1
        .endr
        .rept   16
        .long   0
        .endr
endconst

/* ---------------------------------------------------------------------------------------------- */
/* stack frames                                                                                    */

/*
 * frame_push extra / frame_pop extra
 *   Save d8-d15 (AAPCS64: the low halves of v8-v15 are callee-saved) and reserve \extra bytes (a
 *   multiple of 16) of workspace at [sp + 64, sp + 64 + extra): the tail buffers.
 */
        .macro  frame_push extra=0
        stp     d8, d9, [sp, #-(64 + \extra)]!
        stp     d10, d11, [sp, #16]
        stp     d12, d13, [sp, #32]
        stp     d14, d15, [sp, #48]
        .endm

        .macro  frame_pop extra=0
        ldp     d10, d11, [sp, #16]
        ldp     d12, d13, [sp, #32]
        ldp     d14, d15, [sp, #48]
        ldp     d8, d9, [sp], #(64 + \extra)
        .endm

/* ---------------------------------------------------------------------------------------------- */
/* tails: the last n mod 16 elements go through a 64-byte stack buffer, so the 16-lane block code    */
/* runs unchanged on them and nothing outside the caller's arrays is read or written.               */

/*
 * copy_words dst, src, cnt, t
 *   Copy x\cnt (>= 1) 32-bit words from [x\src] to [x\dst] as integers (bit-exact, no FP
 *   canonicalisation).  Advances x\src and x\dst, leaves x\cnt = 0, clobbers w\t.  Local label 97.
 */
        .macro  copy_words dst, src, cnt, t
97:
        ldr     w\t, [x\src], #4
        str     w\t, [x\dst], #4
        subs    x\cnt, x\cnt, #1
        b.ne    97b
        .endm

/*
 * fill_buf off, v
 *   The 64-byte buffer at sp + \off = four copies of q\v.
 */
        .macro  fill_buf off, v
        stp     q\v, q\v, [sp, #\off]
        stp     q\v, q\v, [sp, #\off + 32]
        .endm

/*
 * zero_buf off
 *   The 64-byte buffer at sp + \off = +0.0 (all bits zero).
 */
        .macro  zero_buf off
        stp     xzr, xzr, [sp, #\off]
        stp     xzr, xzr, [sp, #\off + 16]
        stp     xzr, xzr, [sp, #\off + 32]
        stp     xzr, xzr, [sp, #\off + 48]
        .endm

/*
 * tail_in off, src, r, d, c, k, t
 *   Copy x\r (1..15) floats from [x\src] into the buffer at sp + \off (its other lanes keep what
 *   the caller put there).  x\src, x\r unchanged; clobbers x\d, x\c, x\k, w\t.
 */
        .macro  tail_in off, src, r, d, c, k, t
        add     x\d, sp, #\off
        mov     x\c, x\src
        mov     x\k, x\r
        copy_words \d, \c, \k, \t
        .endm

/*
 * tail_out off, dst, r, s, c, k, t
 *   Copy x\r (1..15) floats from the buffer at sp + \off to [x\dst]; x\dst, x\r unchanged;
 *   clobbers x\s, x\c, x\k, w\t.
 */
        .macro  tail_out off, dst, r, s, c, k, t
        add     x\s, sp, #\off
        mov     x\c, x\dst
        mov     x\k, x\r
        copy_words \c, \s, \k, \t
        .endm

/*
 * tail_mask base, r, a, d, t
 *   v\a .. v\d (four consecutive registers) = lane masks of a 16-lane tail of x\r (1..15)
 *   elements: lane j all-ones iff j < r (from the KN_MASK table of math_neon at x\base).  Clobbers x\t.
 */
        .macro  tail_mask base, r, a, d, t
        add     x\t, x\base, #(KN_MASK + 64)
        sub     x\t, x\t, x\r, lsl #2
        ld1     {v\a\().4s - v\d\().4s}, [x\t]
        .endm

/* ---------------------------------------------------------------------------------------------- */
/* reductions                                                                                      */

/*
 * hsum16 s0, s1, s2, s3, t
 *   The canonical hsum16 pairwise tree of 16 lane sums held as v\s0 = s[0..3], v\s1 = s[4..7],
 *   v\s2 = s[8..11], v\s3 = s[12..15]: for w in 8, 4, 2, 1: s[j] = s[j] + s[j + w] (j < w).
 *   Result in s\s0 (lane 0 of v\s0; the other lanes are junk).  Clobbers v\s1, v\t.
 */
        .macro  hsum16 s0, s1, s2, s3, t
        fadd    v\s0\().4s, v\s0\().4s, v\s2\().4s      // w = 8: s[j] + s[j+8]
        fadd    v\s1\().4s, v\s1\().4s, v\s3\().4s
        fadd    v\s0\().4s, v\s0\().4s, v\s1\().4s      // w = 4: s[j] + s[j+4]
        ext     v\t\().16b, v\s0\().16b, v\s0\().16b, #8
        fadd    v\s0\().2s, v\s0\().2s, v\t\().2s       // w = 2: s[j] + s[j+2]
        faddp   s\s0, v\s0\().2s                        // w = 1: s[0] + s[1]
        .endm

/*
 * max_step m, x, t
 *   v\m = (v\x > v\m) ? v\x : v\m  per lane (vmaxps with x as the first source: a NaN x is skipped,
 *   and +0 does not replace -0).  Clobbers v\t.
 */
        .macro  max_step m, x, t
        fcmgt   v\t\().4s, v\x\().4s, v\m\().4s
        bit     v\m\().16b, v\x\().16b, v\t\().16b
        .endm

/*
 * hmax16 m0, m1, m2, m3, t
 *   The hsum16 tree with m[j] = (m[j] > m[j+w]) ? m[j] : m[j+w].  Result in lane 0 of v\m0.
 *   Clobbers v\m1, v\m2, v\t.
 */
        .macro  gt_or m, o, t                           // v\m = (v\m > v\o) ? v\m : v\o
        fcmgt   v\t\().4s, v\m\().4s, v\o\().4s
        bif     v\m\().16b, v\o\().16b, v\t\().16b
        .endm

        .macro  hmax16 m0, m1, m2, m3, t
        gt_or   \m0, \m2, \t                            // w = 8
        gt_or   \m1, \m3, \t
        gt_or   \m0, \m1, \t                            // w = 4
        ext     v\m2\().16b, v\m0\().16b, v\m0\().16b, #8
        gt_or   \m0, \m2, \t                            // w = 2
        ext     v\m2\().16b, v\m0\().16b, v\m0\().16b, #4
        gt_or   \m0, \m2, \t                            // w = 1
        .endm

/* ---------------------------------------------------------------------------------------------- */
/* expf                                                                                            */

/*
 * load_expf_consts base
 *   v24-v31 = the expf constants (see the top of this file) from math_neon at x\base.
 */
        .macro  load_expf_consts base
        ld1     {v24.4s - v27.4s}, [x\base]
        add     x\base, x\base, #64
        ld1     {v28.4s - v31.4s}, [x\base]
        sub     x\base, x\base, #64
        .endm

/*
 * expf_c y, x, n, r2, t
 *   v\y = expf_c(v\x), the canonical sequence of docs/kernels.md, 4 lanes:
 *
 *     xc = min(max(x, -104), 89)        NaN x stays NaN (fmax/fmin return it, quieted)
 *     n  = roundeven(xc * log2e)        frintn
 *     r  = fma(n, -ln2hi, xc);  r = fma(n, ln2lo, r);  r2 = r * r
 *     p  = fma(P0, r, P1); p = fma(p, r, P2..P5); p = fma(p, r2, r); p = p + 1
 *     k  = (int)n; a = k >> 1; b = k - a;  y = (p * 2^a) * 2^b     2^a = bits (a << 23) + (127 << 23)
 *
 *   Needs v24-v31 = load_expf_consts.  v\x is destroyed (it ends as r + p r2); y, x, n, r2, t
 *   distinct.  Clobbers n, r2, t.
 */
        .macro  expf_c y, x, n, r2, t
        fmax    v\x\().4s, v\x\().4s, v24.4s            // max(x, -104): NaN x -> x
        fmin    v\x\().4s, v\x\().4s, v25.4s            // xc = min(., 89)
        fmul    v\n\().4s, v\x\().4s, v26.s[0]          // xc * log2e
        frintn  v\n\().4s, v\n\().4s                    // n = roundeven(.)
        fmla    v\x\().4s, v\n\().4s, v26.s[1]          // r = fma(n, -0.693359375, xc)
        fmla    v\x\().4s, v\n\().4s, v26.s[2]          // r = fma(n, 2.1219444e-4, r)
        fmul    v\r2\().4s, v\x\().4s, v\x\().4s        // r2 = r * r
        mov     v\y\().16b, v27.16b
        fmla    v\y\().4s, v\x\().4s, v26.s[3]          // p = fma(P0, r, P1)
        mov     v\t\().16b, v28.16b
        fmla    v\t\().4s, v\y\().4s, v\x\().4s         // p = fma(p, r, P2)
        mov     v\y\().16b, v29.16b
        fmla    v\y\().4s, v\t\().4s, v\x\().4s         // p = fma(p, r, P3)
        mov     v\t\().16b, v30.16b
        fmla    v\t\().4s, v\y\().4s, v\x\().4s         // p = fma(p, r, P4)
        fmov    v\y\().4s, #0.5
        fmla    v\y\().4s, v\t\().4s, v\x\().4s         // p = fma(p, r, P5)
        fmla    v\x\().4s, v\y\().4s, v\r2\().4s        // p = fma(p, r2, r)
        fadd    v\y\().4s, v\x\().4s, v31.4s            // p = p + 1
        fcvtzs  v\n\().4s, v\n\().4s                    // k = (int)n (n is integral)
        sshr    v\t\().4s, v\n\().4s, #1                // a = k >> 1
        sub     v\n\().4s, v\n\().4s, v\t\().4s         // b = k - a
        shl     v\t\().4s, v\t\().4s, #23
        shl     v\n\().4s, v\n\().4s, #23
        add     v\t\().4s, v\t\().4s, v31.4s            // 2^a = bits (a + 127) << 23
        add     v\n\().4s, v\n\().4s, v31.4s            // 2^b
        fmul    v\y\().4s, v\y\().4s, v\t\().4s         // p * 2^a
        fmul    v\y\().4s, v\y\().4s, v\n\().4s         // (p * 2^a) * 2^b
        .endm

/* ---------------------------------------------------------------------------------------------- */
/* matvec row (matvec_neon.S, and p.V in attn_neon.S)                                              */

/*
 * row_f32 p, x, lane
 *   One fp32 row of 64 weights at [x\p] (advanced by 256): acc v16-v31 (outputs 4k .. 4k+3 in
 *   v16+k) = fma(w[4k .. 4k+3], v\x.s[lane], acc).  Weights go through v4-v15.
 */
        .macro  row_f32 p, x, lane
        ld1     {v4.4s - v7.4s}, [x\p], #64
        ld1     {v8.4s - v11.4s}, [x\p], #64
        fmla    v16.4s, v4.4s, v\x\().s[\lane]
        fmla    v17.4s, v5.4s, v\x\().s[\lane]
        fmla    v18.4s, v6.4s, v\x\().s[\lane]
        fmla    v19.4s, v7.4s, v\x\().s[\lane]
        ld1     {v12.4s - v15.4s}, [x\p], #64
        fmla    v20.4s, v8.4s, v\x\().s[\lane]
        fmla    v21.4s, v9.4s, v\x\().s[\lane]
        fmla    v22.4s, v10.4s, v\x\().s[\lane]
        fmla    v23.4s, v11.4s, v\x\().s[\lane]
        ld1     {v4.4s - v7.4s}, [x\p], #64
        fmla    v24.4s, v12.4s, v\x\().s[\lane]
        fmla    v25.4s, v13.4s, v\x\().s[\lane]
        fmla    v26.4s, v14.4s, v\x\().s[\lane]
        fmla    v27.4s, v15.4s, v\x\().s[\lane]
        fmla    v28.4s, v4.4s, v\x\().s[\lane]
        fmla    v29.4s, v5.4s, v\x\().s[\lane]
        fmla    v30.4s, v6.4s, v\x\().s[\lane]
        fmla    v31.4s, v7.4s, v\x\().s[\lane]
        .endm

/*
 * half_f16 s0, s1, s2, s3, a0, a1, a2, a3, a4, a5, a6, a7, x, lane
 *   32 halves in v\s0-v\s3 widened exactly (fcvtl into v\sk: its elements 0-3, fcvtl2 into v8+k:
 *   4-7), then acc v\a0-v\a7 (outputs in order) = fma(widened, v\x.s[lane], acc).  Uses v8-v11.
 */
        .macro  half_f16 s0, s1, s2, s3, a0, a1, a2, a3, a4, a5, a6, a7, x, lane
        fcvtl2  v8.4s, v\s0\().8h
        fcvtl   v\s0\().4s, v\s0\().4h
        fcvtl2  v9.4s, v\s1\().8h
        fcvtl   v\s1\().4s, v\s1\().4h
        fcvtl2  v10.4s, v\s2\().8h
        fcvtl   v\s2\().4s, v\s2\().4h
        fcvtl2  v11.4s, v\s3\().8h
        fcvtl   v\s3\().4s, v\s3\().4h
        fmla    v\a0\().4s, v\s0\().4s, v\x\().s[\lane]
        fmla    v\a1\().4s, v8.4s, v\x\().s[\lane]
        fmla    v\a2\().4s, v\s1\().4s, v\x\().s[\lane]
        fmla    v\a3\().4s, v9.4s, v\x\().s[\lane]
        fmla    v\a4\().4s, v\s2\().4s, v\x\().s[\lane]
        fmla    v\a5\().4s, v10.4s, v\x\().s[\lane]
        fmla    v\a6\().4s, v\s3\().4s, v\x\().s[\lane]
        fmla    v\a7\().4s, v11.4s, v\x\().s[\lane]
        .endm

/*
 * row_f16 p, x, lane
 *   One fp16 row of 64 halves at [x\p] (advanced by 128), widened exactly (fcvtl / fcvtl2), then the
 *   FMAs of row_f32: acc v16-v31 = fma((float)w[4k .. 4k+3], v\x.s[lane], acc).  Through v4-v15.
 */
        .macro  row_f16 p, x, lane
        ld1     {v4.8h - v7.8h}, [x\p], #64             // outputs 0-31
        ld1     {v12.8h - v15.8h}, [x\p], #64           // outputs 32-63
        half_f16 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23, \x, \lane
        half_f16 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31, \x, \lane
        .endm

/*
 * zero_acc
 *   v16-v31 = +0.0 (the 64 accumulators of a tile, acc = +0.0)
 */
        .macro  zero_acc
        movi    v16.16b, #0
        movi    v17.16b, #0
        movi    v18.16b, #0
        movi    v19.16b, #0
        movi    v20.16b, #0
        movi    v21.16b, #0
        movi    v22.16b, #0
        movi    v23.16b, #0
        movi    v24.16b, #0
        movi    v25.16b, #0
        movi    v26.16b, #0
        movi    v27.16b, #0
        movi    v28.16b, #0
        movi    v29.16b, #0
        movi    v30.16b, #0
        movi    v31.16b, #0
        .endm

/*
 * store_acc y
 *   [x\y] = v16-v31 (64 floats), x\y advanced by 256.
 */
        .macro  store_acc y
        st1     {v16.4s - v19.4s}, [x\y], #64
        st1     {v20.4s - v23.4s}, [x\y], #64
        st1     {v24.4s - v27.4s}, [x\y], #64
        st1     {v28.4s - v31.4s}, [x\y], #64
        .endm

/* ---------------------------------------------------------------------------------------------- */
/* softmax (act_neon.S, attn_neon.S)                                                               */

/*
 * softmax_neon x, y, n, base, c, p, q, i, t1, t2, t3, buf
 *   y[0..n) = softmax(x[0..n)), n >= 1, y may equal x; the order of docs/kernels.md:
 *     m = hmax16(x)  (lanes start at -inf, m_l = (x_i > m_l) ? x_i : m_l, NaN skipped)
 *     e_i = expf_c(x_i - m) -> y;  s = hsum16(e);  y_i = e_i / s
 *   GPR numbers: x\x, x\y, x\n, x\base (= math_neon) are preserved; x\c, x\p, x\q, x\i, x\t1, x\t2,
 *   x\t3 are clobbered.  \buf: offset from sp of a 64-byte tail buffer.  Clobbers v0-v18, v24-v31.
 *   The tail (n mod 16 elements) is copied once into the buffer (pads -inf) and stays there: pass 2
 *   reads x's tail from it (not yet overwritten when y == x) and leaves e's tail in it (pads masked to
 *   +0.0, so they add nothing), which pass 3 divides.  Local labels 80-88.
 */
        .macro  softmax_neon x, y, n, base, c, p, q, i, t1, t2, t3, buf
        /* pass 1: m = hmax16(x) */
        ldr     q4, [x\base, #KN_NINF]                  // m lanes 0-3 = -inf
        mov     v5.16b, v4.16b                          // 4-7
        mov     v6.16b, v4.16b                          // 8-11
        mov     v7.16b, v4.16b                          // 12-15
        mov     x\p, x\x
        lsr     x\c, x\n, #4
        cbz     x\c, 81f
80:
        ld1     {v0.4s - v3.4s}, [x\p], #64
        max_step 4, 0, 8                                // m = (x > m) ? x : m
        max_step 5, 1, 9
        max_step 6, 2, 10
        max_step 7, 3, 11
        subs    x\c, x\c, #1
        b.ne    80b
81:
        ands    x\i, x\n, #15                           // r = n mod 16
        b.eq    82f
        ldr     q0, [x\base, #KN_NINF]
        fill_buf \buf, 0                                // lanes past the end: -inf (no effect)
        tail_in \buf, \p, \i, \t1, \t2, \c, \t3
        add     x\t1, sp, #\buf
        ld1     {v0.4s - v3.4s}, [x\t1]
        max_step 4, 0, 8
        max_step 5, 1, 9
        max_step 6, 2, 10
        max_step 7, 3, 11
82:
        hmax16  4, 5, 6, 7, 8
        dup     v16.4s, v4.s[0]                         // m

        /* pass 2: e = expf_c(x - m) -> y, s = sum e */
        load_expf_consts \base
        movi    v4.16b, #0                              // s lanes 0-15 = +0.0
        movi    v5.16b, #0
        movi    v6.16b, #0
        movi    v7.16b, #0
        mov     x\p, x\x
        mov     x\q, x\y
        lsr     x\c, x\n, #4
        cbz     x\c, 84f
83:
        ld1     {v0.4s - v3.4s}, [x\p], #64
        fsub    v0.4s, v0.4s, v16.4s                    // x - m
        fsub    v1.4s, v1.4s, v16.4s
        fsub    v2.4s, v2.4s, v16.4s
        fsub    v3.4s, v3.4s, v16.4s
        expf_c  8, 0, 12, 13, 14
        expf_c  9, 1, 15, 17, 18
        expf_c  10, 2, 12, 13, 14
        expf_c  11, 3, 15, 17, 18
        st1     {v8.4s - v11.4s}, [x\q], #64
        fadd    v4.4s, v4.4s, v8.4s                     // s = s + e
        fadd    v5.4s, v5.4s, v9.4s
        fadd    v6.4s, v6.4s, v10.4s
        fadd    v7.4s, v7.4s, v11.4s
        subs    x\c, x\c, #1
        b.ne    83b
84:
        cbz     x\i, 85f
        add     x\t1, sp, #\buf
        ld1     {v0.4s - v3.4s}, [x\t1]                 // x's tail, from pass 1
        fsub    v0.4s, v0.4s, v16.4s
        fsub    v1.4s, v1.4s, v16.4s
        fsub    v2.4s, v2.4s, v16.4s
        fsub    v3.4s, v3.4s, v16.4s
        expf_c  8, 0, 12, 13, 14
        expf_c  9, 1, 15, 17, 18
        expf_c  10, 2, 12, 13, 14
        expf_c  11, 3, 15, 17, 18
        tail_mask \base, \i, 0, 3, \t1
        and     v8.16b, v8.16b, v0.16b                  // lanes past the end add +0.0
        and     v9.16b, v9.16b, v1.16b
        and     v10.16b, v10.16b, v2.16b
        and     v11.16b, v11.16b, v3.16b
        fadd    v4.4s, v4.4s, v8.4s
        fadd    v5.4s, v5.4s, v9.4s
        fadd    v6.4s, v6.4s, v10.4s
        fadd    v7.4s, v7.4s, v11.4s
        add     x\t1, sp, #\buf
        st1     {v8.4s - v11.4s}, [x\t1]
        tail_out \buf, \q, \i, \t1, \t2, \c, \t3
85:
        hsum16  4, 5, 6, 7, 8
        dup     v17.4s, v4.s[0]                         // s

        /* pass 3: y = e / s */
        mov     x\q, x\y
        lsr     x\c, x\n, #4
        cbz     x\c, 87f
86:
        ld1     {v0.4s - v3.4s}, [x\q]
        fdiv    v0.4s, v0.4s, v17.4s
        fdiv    v1.4s, v1.4s, v17.4s
        fdiv    v2.4s, v2.4s, v17.4s
        fdiv    v3.4s, v3.4s, v17.4s
        st1     {v0.4s - v3.4s}, [x\q], #64
        subs    x\c, x\c, #1
        b.ne    86b
87:
        cbz     x\i, 88f
        add     x\t1, sp, #\buf
        ld1     {v0.4s - v3.4s}, [x\t1]                 // e's tail, from pass 2
        fdiv    v0.4s, v0.4s, v17.4s
        fdiv    v1.4s, v1.4s, v17.4s
        fdiv    v2.4s, v2.4s, v17.4s
        fdiv    v3.4s, v3.4s, v17.4s
        st1     {v0.4s - v3.4s}, [x\t1]
        tail_out \buf, \q, \i, \t1, \t2, \c, \t3
88:
        .endm

#endif /* GPT2ASM_AARCH64_MATH_NEON_H */
