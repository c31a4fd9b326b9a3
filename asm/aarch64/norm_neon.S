/*
 * asm/aarch64/norm_neon.S -- LayerNorm, AArch64 Advanced SIMD.
 *
 * Three streaming passes over x (sum, centred sum of squares, normalise); the 16 lane sums of the
 * canonical hsum16 live in four q registers (lanes 0-3, 4-7, 8-11, 12-15).  The tail (n mod 16
 * elements) of x is copied once into a zero-padded stack buffer, and g, b in the last pass, so
 * nothing outside the arrays is read or written.
 */
#include "asm.S"
#include "math_neon.h"

#define XB      0                                       /* x tail buffer: sp + 0 */
#define GB      64                                      /* g tail buffer */
#define BB      128                                     /* b tail buffer */

/*
 * void gpt2asm_layernorm_f32_neon(const float *x, const float *g, const float *b, float *y,
 *                                 size_t n);
 *
 *   sum  = hsum16(x);                 mean = sum / (float)n
 *   q    = hsum16 of fma(d_i, d_i, .) with d_i = x_i - mean (+0.0 past the end)
 *   var  = q / (float)n;              rstd = 1 / sqrt(var + 1e-5f)
 *   y[i] = fma((x[i] - mean) * rstd, g[i], b[i])                (n >= 1, y may equal x)
 *
 * Registers: x0 x, x1 g, x2 b, x3 y, x4 n; x5 n mod 16; x6 blocks; x7-x8, x10-x13 cursors/temps;
 * x9 math_neon.  v16-v19 lane sums, v20 mean, v21 rstd, v0-v7 data, v22 (float)n.
 */
function gpt2asm_layernorm_f32_neon, export=1
        sub     sp, sp, #192
        movrel  x9, math_neon
        and     x5, x4, #15                             // r = n mod 16
        lsr     x6, x4, #4                              // 16-element blocks

        /* pass 1: sum */
        movi    v16.16b, #0
        movi    v17.16b, #0
        movi    v18.16b, #0
        movi    v19.16b, #0
        mov     x7, x0
        mov     x8, x6
        cbz     x8, 2f
1:
        ld1     {v0.4s - v3.4s}, [x7], #64
        fadd    v16.4s, v16.4s, v0.4s                   // s = s + x
        fadd    v17.4s, v17.4s, v1.4s
        fadd    v18.4s, v18.4s, v2.4s
        fadd    v19.4s, v19.4s, v3.4s
        subs    x8, x8, #1
        b.ne    1b
2:
        cbz     x5, 3f
        zero_buf XB                                     // +0.0 past the end
        tail_in XB, 7, 5, 10, 11, 12, 13
        ld1     {v0.4s - v3.4s}, [sp]
        fadd    v16.4s, v16.4s, v0.4s
        fadd    v17.4s, v17.4s, v1.4s
        fadd    v18.4s, v18.4s, v2.4s
        fadd    v19.4s, v19.4s, v3.4s
3:
        hsum16  16, 17, 18, 19, 0
        scvtf   s22, x4                                 // (float)n
        fdiv    s16, s16, s22                           // mean = sum / n
        dup     v20.4s, v16.s[0]

        /* pass 2: centred sum of squares */
        movi    v16.16b, #0
        movi    v17.16b, #0
        movi    v18.16b, #0
        movi    v19.16b, #0
        mov     x7, x0
        mov     x8, x6
        cbz     x8, 5f
4:
        ld1     {v0.4s - v3.4s}, [x7], #64
        fsub    v0.4s, v0.4s, v20.4s                    // d = x - mean
        fsub    v1.4s, v1.4s, v20.4s
        fsub    v2.4s, v2.4s, v20.4s
        fsub    v3.4s, v3.4s, v20.4s
        fmla    v16.4s, v0.4s, v0.4s                    // q = fma(d, d, q)
        fmla    v17.4s, v1.4s, v1.4s
        fmla    v18.4s, v2.4s, v2.4s
        fmla    v19.4s, v3.4s, v3.4s
        subs    x8, x8, #1
        b.ne    4b
5:
        cbz     x5, 6f
        ld1     {v0.4s - v3.4s}, [sp]                   // x's tail, from pass 1
        fsub    v0.4s, v0.4s, v20.4s
        fsub    v1.4s, v1.4s, v20.4s
        fsub    v2.4s, v2.4s, v20.4s
        fsub    v3.4s, v3.4s, v20.4s
        tail_mask 9, 5, 4, 7, 10
        and     v0.16b, v0.16b, v4.16b                  // d = +0.0 past the end
        and     v1.16b, v1.16b, v5.16b
        and     v2.16b, v2.16b, v6.16b
        and     v3.16b, v3.16b, v7.16b
        fmla    v16.4s, v0.4s, v0.4s
        fmla    v17.4s, v1.4s, v1.4s
        fmla    v18.4s, v2.4s, v2.4s
        fmla    v19.4s, v3.4s, v3.4s
6:
        hsum16  16, 17, 18, 19, 0
        fdiv    s16, s16, s22                           // var = q / n
        ldr     s1, [x9, #KN_EPS]
        fadd    s16, s16, s1                            // var + 1e-5
        fsqrt   s16, s16                                // sqrt
        fmov    s1, #1.0
        fdiv    s1, s1, s16                             // rstd = 1 / sqrt(var + eps)
        dup     v21.4s, v1.s[0]

        /* pass 3: y = fma((x - mean) * rstd, g, b) */
        mov     x7, x0
        mov     x10, x1
        mov     x11, x2
        mov     x12, x3
        mov     x8, x6
        cbz     x8, 8f
7:
        ld1     {v0.4s - v3.4s}, [x7], #64
        ld1     {v4.4s - v7.4s}, [x10], #64             // g
        ld1     {v16.4s - v19.4s}, [x11], #64           // b
        fsub    v0.4s, v0.4s, v20.4s                    // x - mean
        fsub    v1.4s, v1.4s, v20.4s
        fsub    v2.4s, v2.4s, v20.4s
        fsub    v3.4s, v3.4s, v20.4s
        fmul    v0.4s, v0.4s, v21.4s                    // (x - mean) * rstd
        fmul    v1.4s, v1.4s, v21.4s
        fmul    v2.4s, v2.4s, v21.4s
        fmul    v3.4s, v3.4s, v21.4s
        fmla    v16.4s, v0.4s, v4.4s                    // fma(., g, b)
        fmla    v17.4s, v1.4s, v5.4s
        fmla    v18.4s, v2.4s, v6.4s
        fmla    v19.4s, v3.4s, v7.4s
        st1     {v16.4s - v19.4s}, [x12], #64
        subs    x8, x8, #1
        b.ne    7b
8:
        cbz     x5, 9f
        tail_in GB, 10, 5, 13, 14, 15, 16
        tail_in BB, 11, 5, 13, 14, 15, 16
        ld1     {v0.4s - v3.4s}, [sp]                   // x's tail, from pass 1 (y may be x)
        add     x13, sp, #GB
        ld1     {v4.4s - v7.4s}, [x13]
        add     x13, sp, #BB
        ld1     {v16.4s - v19.4s}, [x13]
        fsub    v0.4s, v0.4s, v20.4s
        fsub    v1.4s, v1.4s, v20.4s
        fsub    v2.4s, v2.4s, v20.4s
        fsub    v3.4s, v3.4s, v20.4s
        fmul    v0.4s, v0.4s, v21.4s
        fmul    v1.4s, v1.4s, v21.4s
        fmul    v2.4s, v2.4s, v21.4s
        fmul    v3.4s, v3.4s, v21.4s
        fmla    v16.4s, v0.4s, v4.4s
        fmla    v17.4s, v1.4s, v5.4s
        fmla    v18.4s, v2.4s, v6.4s
        fmla    v19.4s, v3.4s, v7.4s
        st1     {v16.4s - v19.4s}, [sp]
        tail_out XB, 12, 5, 13, 14, 15, 16
9:
        add     sp, sp, #192
        ret
endfunc
