/*
 * asm/aarch64/quant_neon.S -- the run-time activation quantizer of the q8_0 / q4_0 kernels, AArch64
 * Advanced SIMD (base ARMv8.0).  docs/kernels.md "q8_0 / q4_0" is the contract, tests/q0ref.py its numpy model.
 *
 * One block of 32 inputs per iteration, branch-free:
 *     ld1 x 8 quads;  bic of the sign bits;  smax tree + smaxv  (the bits as int32: NaN > +inf > finite)
 *     d = fdiv(amax, 127.0f);  id = fdiv(1.0f, d), replaced by +0.0 (fcsel) unless the bits of d lie in
 *     [0x00800000, 0x7f7fffff] (d normal and finite; d >= 0 or a NaN with the sign cleared, so the
 *     unsigned compare of the bits decides);  p = fmul(x, id);  q = fcvtns(p) (ties to even).
 *     With id = 0 every p is +-0 or NaN (inf * 0, NaN * 0) and fcvtns gives 0 for both, which is the
 *     contract's q = 0.  |p| <= 127.00002 so q is in [-127, 127]: the 32-bit results are narrowed by
 *     uzp1 (taking the low half of each lane: exact here, no saturation needed).
 */
#include "asm.S"

/*
 * void gpt2asm_quantize_q8_0_neon(const float *x, int8_t *xq, float *xd, size_t n_in);
 *
 *   for each block b < n_in / 32 of x[32b .. 32b+31]:
 *       amax = max_i (bits(x_i) & 0x7fffffff) as int32, as a float
 *       d = amax / 127.0f;  id = (FLT_MIN <= d <= FLT_MAX) ? 1.0f / d : 0.0f
 *       xq[32b + i] = id == 0 ? 0 : roundeven(x_i * id);   xd[b] = d
 *   n_in % 32 == 0 (n_in = 0 does nothing).  x, xq, xd: any alignment.
 */
function gpt2asm_quantize_q8_0_neon, export=1
        lsr     x3, x3, #5                              // blocks
        cbz     x3, 9f
        mov     w9, #0x42fe0000                         // 127.0f
        fmov    s30, w9
        fmov    s31, #1.0
        movi    v29.2d, #0                              // +0.0
        mov     w10, #0x00800000                        // FLT_MIN's bits
        mov     w11, #0x7f7fffff                        // FLT_MAX's bits
        sub     w11, w11, w10                           // the width of the normal-finite window
1:
        ld1     {v0.4s - v3.4s}, [x0], #64              // x[32b .. 32b+15]
        ld1     {v4.4s - v7.4s}, [x0], #64              // x[32b+16 .. 32b+31]
        mov     v16.16b, v0.16b
        mov     v17.16b, v1.16b
        mov     v18.16b, v2.16b
        mov     v19.16b, v3.16b
        mov     v20.16b, v4.16b
        mov     v21.16b, v5.16b
        mov     v22.16b, v6.16b
        mov     v23.16b, v7.16b
        bic     v16.4s, #0x80, lsl #24                  // |x| as bits
        bic     v17.4s, #0x80, lsl #24
        bic     v18.4s, #0x80, lsl #24
        bic     v19.4s, #0x80, lsl #24
        bic     v20.4s, #0x80, lsl #24
        bic     v21.4s, #0x80, lsl #24
        bic     v22.4s, #0x80, lsl #24
        bic     v23.4s, #0x80, lsl #24
        smax    v16.4s, v16.4s, v17.4s                  // non-negative int32: signed max = unsigned
        smax    v18.4s, v18.4s, v19.4s
        smax    v20.4s, v20.4s, v21.4s
        smax    v22.4s, v22.4s, v23.4s
        smax    v16.4s, v16.4s, v18.4s
        smax    v20.4s, v20.4s, v22.4s
        smax    v16.4s, v16.4s, v20.4s
        smaxv   s16, v16.4s                             // amax (bits)
        fdiv    s17, s16, s30                           // d = amax / 127
        fmov    w9, s17
        sub     w9, w9, w10
        cmp     w9, w11                                 // bits(d) - FLT_MIN's in [0, window]?
        fdiv    s18, s31, s17                           // 1 / d
        fcsel   s18, s18, s29, ls                       // id = normal finite d ? 1 / d : +0.0
        str     s17, [x2], #4                           // xd[b] = d
        fmul    v0.4s, v0.4s, v18.s[0]                  // p = x * id
        fmul    v1.4s, v1.4s, v18.s[0]
        fmul    v2.4s, v2.4s, v18.s[0]
        fmul    v3.4s, v3.4s, v18.s[0]
        fmul    v4.4s, v4.4s, v18.s[0]
        fmul    v5.4s, v5.4s, v18.s[0]
        fmul    v6.4s, v6.4s, v18.s[0]
        fmul    v7.4s, v7.4s, v18.s[0]
        fcvtns  v0.4s, v0.4s                            // nearest, ties to even; NaN -> 0
        fcvtns  v1.4s, v1.4s
        fcvtns  v2.4s, v2.4s
        fcvtns  v3.4s, v3.4s
        fcvtns  v4.4s, v4.4s
        fcvtns  v5.4s, v5.4s
        fcvtns  v6.4s, v6.4s
        fcvtns  v7.4s, v7.4s
        uzp1    v0.8h, v0.8h, v1.8h                     // low halves: exact, |q| <= 127
        uzp1    v2.8h, v2.8h, v3.8h
        uzp1    v4.8h, v4.8h, v5.8h
        uzp1    v6.8h, v6.8h, v7.8h
        uzp1    v0.16b, v0.16b, v2.16b                  // q[0 .. 15]
        uzp1    v4.16b, v4.16b, v6.16b                  // q[16 .. 31]
        st1     {v0.16b}, [x1], #16
        st1     {v4.16b}, [x1], #16
        subs    x3, x3, #1
        b.ne    1b
9:
        ret
endfunc
