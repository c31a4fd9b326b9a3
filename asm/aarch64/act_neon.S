/*
 * asm/aarch64/act_neon.S -- expf, GELU and softmax, AArch64 Advanced SIMD (16 elements per block).
 *
 * The operation sequences are defined in docs/kernels.md (expf_c, hsum16, hmax16); the shared
 * pieces live in math_neon.h (the AArch64 twin of math_avx2.h), so the outputs are bit-identical to
 * gpt2asm_*_f32_avx2 / _avx512.  Tails (n mod 16 elements) are copied through a 64-byte stack buffer
 * with integer loads and stores, so nothing outside x[0..n) / y[0..n) is read or written.
 */
#include "asm.S"
#include "math_neon.h"

#define TB      64                                      /* tail buffer: sp + 64 (after d8-d15) */

/*
 * void gpt2asm_expf_f32_neon(const float *x, float *y, size_t n);
 *
 *   y[i] = expf_c(x[i])                                         (y may equal x)
 */
function gpt2asm_expf_f32_neon, export=1
        frame_push 64
        movrel  x9, math_neon
        load_expf_consts 9
        lsr     x10, x2, #4                             // 16-element blocks
        cbz     x10, 2f
1:
        ld1     {v0.4s - v3.4s}, [x0], #64
        expf_c  4, 0, 8, 9, 10
        expf_c  5, 1, 11, 12, 13
        expf_c  6, 2, 14, 15, 16
        expf_c  7, 3, 17, 18, 19
        st1     {v4.4s - v7.4s}, [x1], #64
        subs    x10, x10, #1
        b.ne    1b
2:
        ands    x11, x2, #15
        b.eq    3f
        zero_buf TB
        tail_in TB, 0, 11, 12, 13, 14, 15
        add     x12, sp, #TB
        ld1     {v0.4s - v3.4s}, [x12]
        expf_c  4, 0, 8, 9, 10
        expf_c  5, 1, 11, 12, 13
        expf_c  6, 2, 14, 15, 16
        expf_c  7, 3, 17, 18, 19
        st1     {v4.4s - v7.4s}, [x12]
        tail_out TB, 1, 11, 12, 13, 14, 15
3:
        frame_pop 64
        ret
endfunc

/*
 * gelu_neon y, x, w, n, r2, t
 *   v\y = GPT-2 GELU of v\x (v\x preserved, y distinct):
 *     t = (x * x) * x;  v = fma(0.044715f, t, x);  w = v * -1.59576912f;  e = expf_c(w)
 *     y = x / (1.0f + e)
 *   Needs v24-v31 (load_expf_consts) and v23 = KN_C2.  Clobbers w, n, r2, t.
 */
        .macro  gelu_neon y, x, w, n, r2, t
        fmul    v\t\().4s, v\x\().4s, v\x\().4s         // x * x
        fmul    v\t\().4s, v\t\().4s, v\x\().4s         // t = (x * x) * x
        mov     v\w\().16b, v\x\().16b
        fmla    v\w\().4s, v\t\().4s, v23.s[0]          // v = fma(0.044715, t, x)
        fmul    v\w\().4s, v\w\().4s, v23.s[1]          // w = v * -1.59576912
        expf_c  \y, \w, \n, \r2, \t                     // e
        fadd    v\y\().4s, v\y\().4s, v31.4s            // 1 + e
        fdiv    v\y\().4s, v\x\().4s, v\y\().4s         // y = x / (1 + e)
        .endm

/*
 * void gpt2asm_gelu_f32_neon(const float *x, float *y, size_t n);
 *
 *   y[i] = x[i] / (1 + exp(-2 sqrt(2/pi) (x[i] + 0.044715 x[i]^3)))  (= 0.5 x (1 + tanh(...)))
 *                                                               (y may equal x)
 */
function gpt2asm_gelu_f32_neon, export=1
        frame_push 64
        movrel  x9, math_neon
        load_expf_consts 9
        ldr     q23, [x9, #KN_C2]
        lsr     x10, x2, #4
        cbz     x10, 2f
1:
        ld1     {v0.4s - v3.4s}, [x0], #64
        gelu_neon 4, 0, 8, 9, 10, 11
        gelu_neon 5, 1, 12, 13, 14, 15
        gelu_neon 6, 2, 16, 17, 18, 19
        gelu_neon 7, 3, 8, 9, 10, 11
        st1     {v4.4s - v7.4s}, [x1], #64
        subs    x10, x10, #1
        b.ne    1b
2:
        ands    x11, x2, #15
        b.eq    3f
        zero_buf TB
        tail_in TB, 0, 11, 12, 13, 14, 15
        add     x12, sp, #TB
        ld1     {v0.4s - v3.4s}, [x12]
        gelu_neon 4, 0, 8, 9, 10, 11
        gelu_neon 5, 1, 12, 13, 14, 15
        gelu_neon 6, 2, 16, 17, 18, 19
        gelu_neon 7, 3, 8, 9, 10, 11
        st1     {v4.4s - v7.4s}, [x12]
        tail_out TB, 1, 11, 12, 13, 14, 15
3:
        frame_pop 64
        ret
endfunc

/*
 * void gpt2asm_softmax_f32_neon(const float *x, float *y, size_t n);
 *
 *   m = hmax16(x);  e_i = expf_c(x_i - m) (into y);  s = hsum16(e);  y_i = e_i / s   (n >= 1,
 *                                                               y may equal x)
 */
function gpt2asm_softmax_f32_neon, export=1
        frame_push 64
        movrel  x9, math_neon
        softmax_neon 0, 1, 2, 9, 10, 11, 12, 13, 14, 15, 16, TB
        frame_pop 64
        ret
endfunc
