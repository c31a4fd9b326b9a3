/*
 * asm/x86_64/norm_avx512.S -- LayerNorm, AVX-512F.
 *
 * The sequence of norm_avx2.S with the 16 lane sums of hsum16 in one zmm; tails use opmask k1.
 */
#include "asm.S"
#include "math_avx512.h"

/*
 * void gpt2asm_layernorm_f32_avx512(const float *x, const float *g, const float *b, float *y,
 *                                   size_t n);
 *
 *   sum  = hsum16(x);                 mean = sum / (float)n
 *   q    = hsum16 of fma(d_i, d_i, .) with d_i = x_i - mean (+0.0 past the end)
 *   var  = q / (float)n;              rstd = 1 / sqrt(var + 1e-5f)
 *   y[i] = fma((x[i] - mean) * rstd, g[i], b[i])                (n >= 1, y may equal x)
 */
function gpt2asm_layernorm_f32_avx512
        movrel      %r11, math_avx512
        movq        %r8, %r9
        andq        $-16, %r9                       // n16
        movq        %r8, %r10
        subq        %r9, %r10                       // n mod 16
        tail_kmask_avx512 1, %r10, %r11             // k1 = tail lanes

        /* pass 1: sum */
        vpxord      %zmm0, %zmm0, %zmm0             // s
        xorl        %eax, %eax
        testq       %r9, %r9
        jz          2f
1:
        vaddps      (%rdi,%rax,4), %zmm0, %zmm0     // s = s + x
        addq        $16, %rax
        cmpq        %r9, %rax
        jb          1b
2:
        cmpq        %r8, %r9
        je          3f
        vmovups     (%rdi,%rax,4), %zmm2{%k1}{z}    // +0.0 past the end
        vaddps      %zmm2, %zmm0, %zmm0
3:
        hsum16_avx512 0, 2
        vxorps      %xmm3, %xmm3, %xmm3
        vcvtsi2ssq  %r8, %xmm3, %xmm3               // (float)n
        vdivss      %xmm3, %xmm0, %xmm0             // mean = sum / n
        vbroadcastss %xmm0, %zmm12

        /* pass 2: centred sum of squares */
        vpxord      %zmm0, %zmm0, %zmm0             // q
        xorl        %eax, %eax
        testq       %r9, %r9
        jz          5f
4:
        vmovups     (%rdi,%rax,4), %zmm4
        vsubps      %zmm12, %zmm4, %zmm4            // d = x - mean
        vfmadd231ps %zmm4, %zmm4, %zmm0             // q = fma(d, d, q)
        addq        $16, %rax
        cmpq        %r9, %rax
        jb          4b
5:
        cmpq        %r8, %r9
        je          6f
        vmovups     (%rdi,%rax,4), %zmm4{%k1}{z}
        vsubps      %zmm12, %zmm4, %zmm4{%k1}{z}    // d = +0.0 past the end
        vfmadd231ps %zmm4, %zmm4, %zmm0
6:
        hsum16_avx512 0, 2
        vdivss      %xmm3, %xmm0, %xmm0             // var = q / n
        vaddss      KZ_EPS(%r11), %xmm0, %xmm0      // var + 1e-5
        vsqrtss     %xmm0, %xmm0, %xmm0             // sqrt
        vmovss      KZ_ONE(%r11), %xmm1
        vdivss      %xmm0, %xmm1, %xmm1             // rstd = 1 / sqrt(var + eps)
        vbroadcastss %xmm1, %zmm13

        /* pass 3: y = fma((x - mean) * rstd, g, b), 32 per step */
        movq        %r8, %r10
        andq        $-32, %r10                      // n32
        xorl        %eax, %eax
        testq       %r10, %r10
        jz          8f
7:
        vmovups       (%rdi,%rax,4), %zmm4
        vmovups     64(%rdi,%rax,4), %zmm5
        vsubps      %zmm12, %zmm4, %zmm4            // x - mean
        vsubps      %zmm12, %zmm5, %zmm5
        vmulps      %zmm13, %zmm4, %zmm4            // (x - mean) * rstd
        vmulps      %zmm13, %zmm5, %zmm5
        vmovups       (%rsi,%rax,4), %zmm6
        vmovups     64(%rsi,%rax,4), %zmm7
        vfmadd213ps   (%rdx,%rax,4), %zmm6, %zmm4   // fma(., g, b)
        vfmadd213ps 64(%rdx,%rax,4), %zmm7, %zmm5
        vmovups     %zmm4,   (%rcx,%rax,4)
        vmovups     %zmm5, 64(%rcx,%rax,4)
        addq        $32, %rax
        cmpq        %r10, %rax
        jb          7b
8:
        cmpq        %r9, %rax                       // one more full vector?
        jae         9f
        vmovups     (%rdi,%rax,4), %zmm4
        vsubps      %zmm12, %zmm4, %zmm4
        vmulps      %zmm13, %zmm4, %zmm4
        vmovups     (%rsi,%rax,4), %zmm6
        vfmadd213ps (%rdx,%rax,4), %zmm6, %zmm4
        vmovups     %zmm4, (%rcx,%rax,4)
        addq        $16, %rax
9:
        cmpq        %r8, %r9
        je          10f
        vmovups     (%rdi,%rax,4), %zmm4{%k1}{z}
        vsubps      %zmm12, %zmm4, %zmm4
        vmulps      %zmm13, %zmm4, %zmm4
        vmovups     (%rsi,%rax,4), %zmm6{%k1}{z}
        vmovups     (%rdx,%rax,4), %zmm8{%k1}{z}
        vfmadd213ps %zmm8, %zmm6, %zmm4
        vmovups     %zmm4, (%rcx,%rax,4){%k1}
10:
        vzeroupper
        ret
endfunc
