/*
 * asm/x86_64/act_avx512.S -- expf, GELU and softmax, AVX-512F (16 lanes).
 *
 * Instruction-for-instruction the sequences of act_avx2.S on zmm registers (see math_avx512.h), so
 * every output is bit-identical to the AVX2 variant.  Tails use opmasks.
 */
#include "asm.S"
#include "math_avx512.h"

/*
 * eltwise_avx512 op, x1, y0, y1
 *   The body of an elementwise kernel y[i] = f(x[i]) (rdi x, rsi y, rdx n; y may equal x), 32 elements per
 *   iteration: x in zmm0 and zmm\x1, `\op 0` and `\op 1` compute f of each into zmm\y0 and zmm\y1 (with
 *   zmm14 = -104, zmm15 = 89, %r11 = math_avx512); then 16 more with `\op 0`, the last 1..15 under k1.
 */
        .macro  eltwise_avx512 op, x1, y0, y1
        movrel      %r11, math_avx512
        vbroadcastss KZ_MIN(%r11), %zmm14
        vbroadcastss KZ_MAX(%r11), %zmm15
        whole_loop  %rdx, %r8, 32, 2f                   // n32, i = 0
1:
        vmovups       (%rdi,%rax,4), %zmm0
        vmovups     64(%rdi,%rax,4), %zmm\x1
        \op         0
        \op         1
        vmovups     %zmm\y0,   (%rsi,%rax,4)
        vmovups     %zmm\y1, 64(%rsi,%rax,4)
        addq        $32, %rax
        cmpq        %r8, %rax
        jb          1b
2:
        movq        %rdx, %rcx
        subq        %rax, %rcx                      // 0..31 left
        jz          4f
        cmpq        $16, %rcx
        jb          3f
        vmovups     (%rdi,%rax,4), %zmm0
        \op         0
        vmovups     %zmm\y0, (%rsi,%rax,4)
        addq        $16, %rax
        subq        $16, %rcx
        jz          4f
3:
        tail_kmask_avx512 1, %rcx, %r11
        vmovups     (%rdi,%rax,4), %zmm0{%k1}{z}
        \op         0
        vmovups     %zmm\y0, (%rsi,%rax,4){%k1}
4:
        vzeroupper
        ret
        .endm

        /* expf_c of zmm0 into zmm2 (k = 0), of zmm1 into zmm6 (k = 1) */
        .macro  expf_half_avx512 k
        .if \k == 0
        expf_c_avx512 2, 0, 0, 3, 4, 5, 14, 15, %r11
        .else
        expf_c_avx512 6, 1, 1, 7, 8, 9, 14, 15, %r11
        .endif
        .endm

/*
 * void gpt2asm_expf_f32_avx512(const float *x, float *y, size_t n);
 *
 *   y[i] = expf_c(x[i])                                         (y may equal x)
 */
function gpt2asm_expf_f32_avx512
        eltwise_avx512 expf_half_avx512, 1, 2, 6
endfunc

/*
 * gelu_avx512 y, x, t, n, r2, a, e
 *   zmm\y = GPT-2 GELU of zmm\x (the sequence of gelu_avx2):
 *     t = (x * x) * x;  v = fma(0.044715f, t, x);  w = v * -1.59576912f;  e = expf_c(w)
 *     y = x / (1.0f + e)
 *   Needs zmm14 = -104, zmm15 = 89, %r11 = math_avx512.  y may equal e.  Clobbers t, n, r2, a, e.
 */
        .macro  gelu_avx512 y, x, t, n, r2, a, e
        vmulps      %zmm\x, %zmm\x, %zmm\t                  // x * x
        vmulps      %zmm\x, %zmm\t, %zmm\t                  // t = (x * x) * x
        vfmadd132ps KZ_GC(%r11){1to16}, %zmm\x, %zmm\t      // v = fma(0.044715, t, x)
        vmulps      KZ_GM(%r11){1to16}, %zmm\t, %zmm\t      // w = v * -1.59576912
        expf_c_avx512 \e, \t, \t, \n, \r2, \a, 14, 15, %r11
        vaddps      KZ_ONE(%r11){1to16}, %zmm\e, %zmm\e     // 1 + e
        vdivps      %zmm\e, %zmm\x, %zmm\y                  // y = x / (1 + e)
        .endm

        /* gelu of zmm0 into zmm5 (k = 0), of zmm6 into zmm11 (k = 1) */
        .macro  gelu_half_avx512 k
        .if \k == 0
        gelu_avx512 5,  0, 1, 2, 3,  4,  5
        .else
        gelu_avx512 11, 6, 7, 8, 9, 10, 11
        .endif
        .endm

/*
 * void gpt2asm_gelu_f32_avx512(const float *x, float *y, size_t n);
 *
 *   y[i] = x[i] / (1 + exp(-2 sqrt(2/pi) (x[i] + 0.044715 x[i]^3)))  (y may equal x)
 */
function gpt2asm_gelu_f32_avx512
        eltwise_avx512 gelu_half_avx512, 6, 5, 11
endfunc

/*
 * void gpt2asm_softmax_f32_avx512(const float *x, float *y, size_t n);
 *
 *   m = hmax16(x);  e_i = expf_c(x_i - m) (into y);  s = hsum16(e);  y_i = e_i / s   (n >= 1,
 *                                                               y may equal x)
 */
function gpt2asm_softmax_f32_avx512
        movrel      %r11, math_avx512
        softmax_avx512 %rdi, %rsi, %rdx, %r11, %rax, %r8, %rcx
        vzeroupper
        ret
endfunc
