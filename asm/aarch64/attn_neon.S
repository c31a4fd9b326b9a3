/*
 * asm/aarch64/attn_neon.S -- single-query causal self-attention over the KV cache, AArch64 Advanced
 * SIMD.
 *
 * Per head: scores, 4 positions per step (per position four q-register partial sums = the 16 lanes of
 * dot64, the w = 8 and w = 4 steps of the hsum16 tree as vector adds, then the w = 2 and w = 1 steps of
 * the 4 positions together: zip1/zip2 of 64-bit halves + fadd, then one faddp, which adds exactly
 * s[0] + s[1] of each position); softmax in scratch (the same macro as gpt2asm_softmax_f32_neon); then
 * p.V with the 64 outputs in v16-v31 and by-element FMAs, four p_t per ld1 (the matvec row step).
 * K and V rows are streamed once each.  The same code serves a float32 cache and a binary16 one
 * (gpt2asm_attention_f16_neon: each row widened exactly with fcvtl / fcvtl2 before its FMAs).
 */
#include "asm.S"
#include "math_neon.h"

#define TB      64                                      /* softmax tail buffer: sp + 64 */

/*
 * fma4 q0, q1, q2, q3, r0, r1, r2, r3
 *   acc v0-v3 = fma(v\q0 .. v\q3, v\r0 .. v\r3, acc): one c of dot64, q[16c .. 16c+15] (v16+4c ..)
 *   times row[16c .. 16c+15].
 */
        .macro  fma4 q0, q1, q2, q3, r0, r1, r2, r3
        fmla    v0.4s, v\q0\().4s, v\r0\().4s
        fmla    v1.4s, v\q1\().4s, v\r1\().4s
        fmla    v2.4s, v\q2\().4s, v\r2\().4s
        fmla    v3.4s, v\q3\().4s, v\r3\().4s
        .endm

/*
 * dotpos P, p
 *   v\P = lanes s[0..3] of dot64(q, row) after the w = 8 and w = 4 steps of the hsum16 tree, for the
 *   row of 64 floats at [x\p] (advanced by 256); q is in v16-v31 (q[0:4], q[4:8], ..., q[60:64]).
 *     acc[j] = +0.0;  acc[j] = fma(q[16c+j], row[16c+j], acc[j]) for c = 0..3   (v0: j < 4, .. v3)
 *   Clobbers v0-v11.
 */
        .macro  dotpos P, p
        movi    v0.16b, #0
        movi    v1.16b, #0
        movi    v2.16b, #0
        movi    v3.16b, #0
        ld1     {v4.4s - v7.4s}, [x\p], #64
        ld1     {v8.4s - v11.4s}, [x\p], #64
        fma4    16, 17, 18, 19, 4, 5, 6, 7              // c = 0
        ld1     {v4.4s - v7.4s}, [x\p], #64
        fma4    20, 21, 22, 23, 8, 9, 10, 11            // c = 1
        ld1     {v8.4s - v11.4s}, [x\p], #64
        fma4    24, 25, 26, 27, 4, 5, 6, 7              // c = 2
        fma4    28, 29, 30, 31, 8, 9, 10, 11            // c = 3
        fadd    v0.4s, v0.4s, v2.4s                     // w = 8
        fadd    v1.4s, v1.4s, v3.4s
        fadd    v\P\().4s, v0.4s, v1.4s                 // w = 4
        .endm

/*
 * widen4 lo, hi
 *   v8-v11 = the 16 halves of v\lo, v\hi (8 each) widened exactly: 0-3, 4-7 of v\lo, 0-3, 4-7 of v\hi.
 */
        .macro  widen4 lo, hi
        fcvtl   v8.4s, v\lo\().4h
        fcvtl2  v9.4s, v\lo\().8h
        fcvtl   v10.4s, v\hi\().4h
        fcvtl2  v11.4s, v\hi\().8h
        .endm

/*
 * dotpos16 P, p
 *   dotpos for a row of 64 halves at [x\p] (advanced by 128), each widened exactly before its FMA:
 *   the same operations on the same values.  Clobbers v0-v11.
 */
        .macro  dotpos16 P, p
        movi    v0.16b, #0
        movi    v1.16b, #0
        movi    v2.16b, #0
        movi    v3.16b, #0
        ld1     {v4.8h - v7.8h}, [x\p], #64             // row[0:32]
        widen4  4, 5
        fma4    16, 17, 18, 19, 8, 9, 10, 11            // c = 0
        widen4  6, 7
        ld1     {v4.8h - v7.8h}, [x\p], #64             // row[32:64]
        fma4    20, 21, 22, 23, 8, 9, 10, 11            // c = 1
        widen4  4, 5
        fma4    24, 25, 26, 27, 8, 9, 10, 11            // c = 2
        widen4  6, 7
        fma4    28, 29, 30, 31, 8, 9, 10, 11            // c = 3
        fadd    v0.4s, v0.4s, v2.4s                     // w = 8
        fadd    v1.4s, v1.4s, v3.4s
        fadd    v\P\().4s, v0.4s, v1.4s                 // w = 4
        .endm

/*
 * dot4 es, p0, p1, p2, p3
 *   v0 = { dot64(q, row_i) * 0.125f : i = 0..3 } for the rows of 64 elements of es bytes at [x\pi]
 *   (each advanced by 64 es; the pointers may be the same register).  Clobbers v0-v15.
 */
        .macro  dot4 es, p0, p1, p2, p3
        .if \es == 4
        dotpos  12, \p0
        dotpos  13, \p1
        dotpos  14, \p2
        dotpos  15, \p3
        .else
        dotpos16 12, \p0
        dotpos16 13, \p1
        dotpos16 14, \p2
        dotpos16 15, \p3
        .endif
        zip1    v0.2d, v12.2d, v13.2d                   // A0 A1 B0 B1
        zip2    v1.2d, v12.2d, v13.2d                   // A2 A3 B2 B3
        fadd    v0.4s, v0.4s, v1.4s                     // w = 2 (positions 0, 1)
        zip1    v2.2d, v14.2d, v15.2d
        zip2    v3.2d, v14.2d, v15.2d
        fadd    v2.4s, v2.4s, v3.4s                     // w = 2 (positions 2, 3)
        faddp   v0.4s, v0.4s, v2.4s                     // w = 1: s[0] + s[1] of each position
        fmov    v1.4s, #0.125
        fmul    v0.4s, v0.4s, v1.4s                     // * 0.125
        .endm

/*
 * void gpt2asm_attention_f32_neon(const float *q, const float *k, const float *v, float *out,
 *                                 float *scratch, size_t n_pos, size_t head_stride,
 *                                 size_t head_begin, size_t head_end);
 * void gpt2asm_attention_f16_neon(const float *q, const uint16_t *k, const uint16_t *v, float *out,
 *                                 float *scratch, size_t n_pos, size_t head_stride,
 *                                 size_t head_begin, size_t head_end);     (binary16 cache)
 *
 *   for h in [head_begin, head_end):
 *     s_t    = dot64(q_h, k_h[t]) * 0.125f                 t < n_pos   (k_h = k + h*head_stride)
 *     p      = softmax(s)                                  (in scratch, as gpt2asm_softmax_f32)
 *     out_h  = sum_t p_t v_h[t]   (o = +0.0; o = fma(p_t, v_h[t], o) for t = 0, 1, ...)
 *   scratch: roundup16(n_pos) floats; n_pos >= 1.
 *
 * Registers: x0 q, x1 k, x2 v, x3 out, x4 scratch, x5 n_pos, x6 head stride in bytes, x7 h,
 * x8 head_end (the 9th argument, on the stack), x9 k_h / temp, x10 v_h, x11-x17 cursors and temps.
 */
        .macro  attention_neon name, es, row
function \name, export=1
        ldr     x8, [sp]                                // head_end
        cmp     x7, x8
        b.hs    9f
        frame_push 64
        lsl     x6, x6, #(\es / 2)                      // head stride in bytes
1:
        add     x9, x0, x7, lsl #8
        ld1     {v16.4s - v19.4s}, [x9], #64            // q_h
        ld1     {v20.4s - v23.4s}, [x9], #64
        ld1     {v24.4s - v27.4s}, [x9], #64
        ld1     {v28.4s - v31.4s}, [x9]
        mul     x9, x7, x6
        add     x10, x2, x9                             // v_h
        add     x9, x1, x9                              // k_h

        /* scores, 4 positions per step */
        mov     x11, x4                                 // scratch cursor
        lsr     x12, x5, #2
        cbz     x12, 3f
2:
        dot4    \es, 9, 9, 9, 9
        st1     {v0.4s}, [x11], #16
        subs    x12, x12, #1
        b.ne    2b
3:
        ands    x13, x5, #3                             // 1..3 rows left: the missing ones repeat
        b.eq    4f                                      // the last row (no over-read); their scores
        add     x14, x9, #(64 * \es)                    // land in scratch[n_pos .. roundup4(n_pos))
        add     x15, x9, #(128 * \es)
        cmp     x13, #2
        csel    x14, x14, x9, hs                        // row 1: t+1 if 2 or 3 rows are left
        csel    x15, x15, x14, hi                       // row 2: t+2 if 3 rows are left
        mov     x16, x15                                // row 3: repeats
        dot4    \es, 9, 14, 15, 16
        st1     {v0.4s}, [x11]
4:
        /* p = softmax(s), in place */
        movrel  x17, math_neon
        softmax_neon 4, 4, 5, 17, 11, 12, 13, 14, 15, 16, 9, TB

        /* o = sum_t p_t v_t */
        zero_acc
        mov     x11, x4                                 // p cursor
        mov     x12, x10                                // v_h[t]
        lsr     x13, x5, #2
        cbz     x13, 6f
5:
        ld1     {v0.4s}, [x11], #16                     // p_t .. p_t+3
        \row   12, 0, 0                                // o = fma(p_t, v_t, o)
        \row   12, 0, 1
        \row   12, 0, 2
        \row   12, 0, 3
        subs    x13, x13, #1
        b.ne    5b
6:
        ands    x13, x5, #3
        b.eq    8f
7:
        ld1r    {v0.4s}, [x11], #4
        \row   12, 0, 0
        subs    x13, x13, #1
        b.ne    7b
8:
        add     x9, x3, x7, lsl #8                      // out_h
        store_acc 9
        add     x7, x7, #1
        cmp     x7, x8
        b.lo    1b
        frame_pop 64
9:
        ret
endfunc
        .endm

        attention_neon gpt2asm_attention_f32_neon, 4, row_f32
        attention_neon gpt2asm_attention_f16_neon, 2, row_f16
