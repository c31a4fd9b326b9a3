/*
 * asm/x86_64/norm_avx2.S -- LayerNorm, AVX2 + FMA.
 *
 * Three streaming passes over x (sum, centred sum of squares, normalise); the 16 lane sums of the
 * canonical hsum16 live in two ymm registers (lanes 0-7, 8-15).  Tails use vmaskmovps.
 */
#include "asm.S"
#include "math_avx2.h"

/*
 * void gpt2asm_layernorm_f32_avx2(const float *x, const float *g, const float *b, float *y,
 *                                 size_t n);
 *
 *   sum  = hsum16(x);                 mean = sum / (float)n
 *   q    = hsum16 of fma(d_i, d_i, .) with d_i = x_i - mean (+0.0 past the end)
 *   var  = q / (float)n;              rstd = 1 / sqrt(var + 1e-5f)
 *   y[i] = fma((x[i] - mean) * rstd, g[i], b[i])                (n >= 1, y may equal x)
 */
function gpt2asm_layernorm_f32_avx2
        movrel      %r11, math_avx2
        movq        %r8, %r9
        andq        $-16, %r9                       // n16
        movq        %r8, %r10
        subq        %r9, %r10                       // n mod 16
        tail_masks_avx2 14, 15, %r10, %r11          // ymm14:ymm15 = tail lanes

        /* pass 1: sum */
        vxorps      %ymm0, %ymm0, %ymm0             // s lanes 0-7
        vxorps      %ymm1, %ymm1, %ymm1             // s lanes 8-15
        xorl        %eax, %eax
        testq       %r9, %r9
        jz          2f
1:
        vaddps        (%rdi,%rax,4), %ymm0, %ymm0   // s = s + x
        vaddps      32(%rdi,%rax,4), %ymm1, %ymm1
        addq        $16, %rax
        cmpq        %r9, %rax
        jb          1b
2:
        cmpq        %r8, %r9
        je          3f
        vmaskmovps    (%rdi,%rax,4), %ymm14, %ymm2  // +0.0 past the end
        tail_load_hi %r10, 15, 3, 32(%rdi,%rax,4)
        vaddps      %ymm2, %ymm0, %ymm0
        vaddps      %ymm3, %ymm1, %ymm1
3:
        hsum16_avx2 0, 1, 2
        vxorps      %xmm3, %xmm3, %xmm3
        vcvtsi2ssq  %r8, %xmm3, %xmm3               // (float)n
        vdivss      %xmm3, %xmm0, %xmm0             // mean = sum / n
        vbroadcastss %xmm0, %ymm12

        /* pass 2: centred sum of squares */
        vxorps      %ymm0, %ymm0, %ymm0
        vxorps      %ymm1, %ymm1, %ymm1
        xorl        %eax, %eax
        testq       %r9, %r9
        jz          5f
4:
        vmovups       (%rdi,%rax,4), %ymm4
        vmovups     32(%rdi,%rax,4), %ymm5
        vsubps      %ymm12, %ymm4, %ymm4            // d = x - mean
        vsubps      %ymm12, %ymm5, %ymm5
        vfmadd231ps %ymm4, %ymm4, %ymm0             // q = fma(d, d, q)
        vfmadd231ps %ymm5, %ymm5, %ymm1
        addq        $16, %rax
        cmpq        %r9, %rax
        jb          4b
5:
        cmpq        %r8, %r9
        je          6f
        vmaskmovps    (%rdi,%rax,4), %ymm14, %ymm4
        tail_load_hi %r10, 15, 5, 32(%rdi,%rax,4)
        vsubps      %ymm12, %ymm4, %ymm4
        vsubps      %ymm12, %ymm5, %ymm5
        vandps      %ymm14, %ymm4, %ymm4            // d = +0.0 past the end
        vandps      %ymm15, %ymm5, %ymm5
        vfmadd231ps %ymm4, %ymm4, %ymm0
        vfmadd231ps %ymm5, %ymm5, %ymm1
6:
        hsum16_avx2 0, 1, 2
        vdivss      %xmm3, %xmm0, %xmm0             // var = q / n
        vaddss      KV_EPS(%r11), %xmm0, %xmm0      // var + 1e-5
        vsqrtss     %xmm0, %xmm0, %xmm0             // sqrt
        vmovss      KV_ONE(%r11), %xmm1
        vdivss      %xmm0, %xmm1, %xmm1             // rstd = 1 / sqrt(var + eps)
        vbroadcastss %xmm1, %ymm13

        /* pass 3: y = fma((x - mean) * rstd, g, b) */
        xorl        %eax, %eax
        testq       %r9, %r9
        jz          8f
7:
        vmovups       (%rdi,%rax,4), %ymm4
        vmovups     32(%rdi,%rax,4), %ymm5
        vsubps      %ymm12, %ymm4, %ymm4            // x - mean
        vsubps      %ymm12, %ymm5, %ymm5
        vmulps      %ymm13, %ymm4, %ymm4            // (x - mean) * rstd
        vmulps      %ymm13, %ymm5, %ymm5
        vmovups       (%rsi,%rax,4), %ymm6
        vmovups     32(%rsi,%rax,4), %ymm7
        vfmadd213ps   (%rdx,%rax,4), %ymm6, %ymm4   // fma(., g, b)
        vfmadd213ps 32(%rdx,%rax,4), %ymm7, %ymm5
        vmovups     %ymm4,   (%rcx,%rax,4)
        vmovups     %ymm5, 32(%rcx,%rax,4)
        addq        $16, %rax
        cmpq        %r9, %rax
        jb          7b
8:
        cmpq        %r8, %r9
        je          9f
        vmaskmovps    (%rdi,%rax,4), %ymm14, %ymm4
        tail_load_hi %r10, 15, 5, 32(%rdi,%rax,4)
        vsubps      %ymm12, %ymm4, %ymm4
        vsubps      %ymm12, %ymm5, %ymm5
        vmulps      %ymm13, %ymm4, %ymm4
        vmulps      %ymm13, %ymm5, %ymm5
        vmaskmovps    (%rsi,%rax,4), %ymm14, %ymm6
        tail_load_hi %r10, 15, 7, 32(%rsi,%rax,4)
        vmaskmovps    (%rdx,%rax,4), %ymm14, %ymm8
        tail_load_hi %r10, 15, 9, 32(%rdx,%rax,4)
        vfmadd213ps %ymm8, %ymm6, %ymm4
        vfmadd213ps %ymm9, %ymm7, %ymm5
        vmaskmovps  %ymm4, %ymm14,   (%rcx,%rax,4)
        tail_store_hi %r10, 5, 15, 32(%rcx,%rax,4)
9:
        vzeroupper
        ret
endfunc
