/*
 * asm/x86_64/act_avx2.S -- expf, GELU and softmax, AVX2 + FMA (8 lanes, 16 elements per iteration).
 *
 * The operation sequences are defined in docs/kernels.md (expf_c, hsum16, hmax16); the shared
 * pieces live in math_avx2.h so that this file, attn_avx2.S and the AVX-512 twins cannot drift.
 * Tails (n mod 16 elements) use vmaskmovps with masks built from the remaining count: nothing outside
 * x[0..n) / y[0..n) is read or written.
 */
#include "asm.S"
#include "math_avx2.h"

/*
 * eltwise_avx2 op, x1, y0, y1
 *   The body of an elementwise kernel y[i] = f(x[i]) (rdi x, rsi y, rdx n; y may equal x), 16 elements per
 *   iteration: x in ymm0 and ymm\x1, `\op 0` and `\op 1` compute f of each into ymm\y0 and ymm\y1 (with
 *   ymm14 = -104, ymm15 = 89, %r11 = math_avx2); the last 1..15 elements under masks (ymm12, ymm13).
 */
        .macro  eltwise_avx2 op, x1, y0, y1
        movrel      %r11, math_avx2
        vmovaps     KV_MIN(%r11), %ymm14
        vmovaps     KV_MAX(%r11), %ymm15
        whole_loop  %rdx, %r8, 16, 2f                   // n16, i = 0
1:
        vmovups       (%rdi,%rax,4), %ymm0
        vmovups     32(%rdi,%rax,4), %ymm\x1
        \op         0
        \op         1
        vmovups     %ymm\y0,   (%rsi,%rax,4)
        vmovups     %ymm\y1, 32(%rsi,%rax,4)
        addq        $16, %rax
        cmpq        %r8, %rax
        jb          1b
2:
        cmpq        %rdx, %r8
        je          3f
        movq        %rdx, %rcx
        subq        %r8, %rcx
        tail_masks_avx2 12, 13, %rcx, %r11
        vmaskmovps    (%rdi,%rax,4), %ymm12, %ymm0
        tail_load_hi %rcx, 13, \x1, 32(%rdi,%rax,4)
        \op         0
        \op         1
        vmaskmovps  %ymm\y0, %ymm12,   (%rsi,%rax,4)
        tail_store_hi %rcx, \y1, 13, 32(%rsi,%rax,4)
3:
        vzeroupper
        ret
        .endm

        /* expf_c of ymm0 into ymm2 (k = 0), of ymm1 into ymm6 (k = 1) */
        .macro  expf_half_avx2 k
        .if \k == 0
        expf_c_avx2 2, 0, 0, 3, 4, 5, 14, 15, %r11
        .else
        expf_c_avx2 6, 1, 1, 7, 8, 9, 14, 15, %r11
        .endif
        .endm

/*
 * void gpt2asm_expf_f32_avx2(const float *x, float *y, size_t n);
 *
 *   y[i] = expf_c(x[i])                                         (y may equal x)
 */
function gpt2asm_expf_f32_avx2
        eltwise_avx2 expf_half_avx2, 1, 2, 6
endfunc

/*
 * gelu_avx2 y, x, t, n, r2, a, e
 *   ymm\y = GPT-2 GELU of ymm\x:
 *     t = (x * x) * x;  v = fma(0.044715f, t, x);  w = v * -1.59576912f;  e = expf_c(w)
 *     y = x / (1.0f + e)
 *   Needs ymm14 = -104, ymm15 = 89, %r11 = math_avx2.  y may equal e.  Clobbers t, n, r2, a, e.
 */
        .macro  gelu_avx2 y, x, t, n, r2, a, e
        vmulps      %ymm\x, %ymm\x, %ymm\t          // x * x
        vmulps      %ymm\x, %ymm\t, %ymm\t          // t = (x * x) * x
        vfmadd132ps KV_GC(%r11), %ymm\x, %ymm\t     // v = fma(0.044715, t, x)
        vmulps      KV_GM(%r11), %ymm\t, %ymm\t     // w = v * -1.59576912
        expf_c_avx2 \e, \t, \t, \n, \r2, \a, 14, 15, %r11
        vaddps      KV_ONE(%r11), %ymm\e, %ymm\e    // 1 + e
        vdivps      %ymm\e, %ymm\x, %ymm\y          // y = x / (1 + e)
        .endm

        /* gelu of ymm0 into ymm5 (k = 0), of ymm6 into ymm11 (k = 1) */
        .macro  gelu_half_avx2 k
        .if \k == 0
        gelu_avx2   5,  0, 1, 2, 3,  4,  5
        .else
        gelu_avx2   11, 6, 7, 8, 9, 10, 11
        .endif
        .endm

/*
 * void gpt2asm_gelu_f32_avx2(const float *x, float *y, size_t n);
 *
 *   y[i] = x[i] / (1 + exp(-2 sqrt(2/pi) (x[i] + 0.044715 x[i]^3)))  (= 0.5 x (1 + tanh(...)))
 *                                                               (y may equal x)
 */
function gpt2asm_gelu_f32_avx2
        eltwise_avx2 gelu_half_avx2, 6, 5, 11
endfunc

/*
 * void gpt2asm_softmax_f32_avx2(const float *x, float *y, size_t n);
 *
 *   m = hmax16(x);  e_i = expf_c(x_i - m) (into y);  s = hsum16(e);  y_i = e_i / s   (n >= 1,
 *                                                               y may equal x)
 */
function gpt2asm_softmax_f32_avx2
        movrel      %r11, math_avx2
        softmax_avx2 %rdi, %rsi, %rdx, %r11, %rax, %r8, %rcx
        vzeroupper
        ret
endfunc
