/*
 * asm/x86_64/fmapeak_avx512.S -- FMA throughput probe, AVX-512F (not a model kernel).
 *
 * fmapeak_avx2.S with zmm registers: the compute baseline of `make bench`'s avx512 rows, so that each
 * kernel family's prefill is measured against its own FMA peak (a core whose 512-bit FMA is full width
 * does twice the AVX2 rate; one that splits it into two 256-bit halves does the same).  12 independent
 * chains of 16 lanes, register operands only: 12 chains cover the FMA latency of 2 pipes x 4 cycles,
 * so the loop runs at the core's 512-bit FMA issue rate.  Only zmm0-12 are used, so nothing is left in
 * zmm16-31 and vzeroupper leaves a clean state.
 */
#include "asm.S"

/*
 * float gpt2asm_fmapeak_f32_avx512(size_t n);
 *
 *   n iterations of 12 vfmadd231ps zmm (192 fp32 FMAs, 384 flop each): acc_c = fma(1.0f, 1.0f, acc_c)
 *   for the 12 chains c, from acc_c = +0.0; returns lane 0 of chain 0, = (float)n (exact for n <= 2^24).
 *
 *   rdi  iterations left       zmm0-11  the 12 chains       zmm12  1.0f
 */
function gpt2asm_fmapeak_f32_avx512
        vpxord  %zmm0, %zmm0, %zmm0
        vpxord  %zmm1, %zmm1, %zmm1
        vpxord  %zmm2, %zmm2, %zmm2
        vpxord  %zmm3, %zmm3, %zmm3
        vpxord  %zmm4, %zmm4, %zmm4
        vpxord  %zmm5, %zmm5, %zmm5
        vpxord  %zmm6, %zmm6, %zmm6
        vpxord  %zmm7, %zmm7, %zmm7
        vpxord  %zmm8, %zmm8, %zmm8
        vpxord  %zmm9, %zmm9, %zmm9
        vpxord  %zmm10, %zmm10, %zmm10
        vpxord  %zmm11, %zmm11, %zmm11
        movl    $0x3f800000, %eax               // 1.0f
        vpbroadcastd %eax, %zmm12
        testq   %rdi, %rdi
        jz      2f
        .p2align 4
1:
        vfmadd231ps %zmm12, %zmm12, %zmm0
        vfmadd231ps %zmm12, %zmm12, %zmm1
        vfmadd231ps %zmm12, %zmm12, %zmm2
        vfmadd231ps %zmm12, %zmm12, %zmm3
        vfmadd231ps %zmm12, %zmm12, %zmm4
        vfmadd231ps %zmm12, %zmm12, %zmm5
        vfmadd231ps %zmm12, %zmm12, %zmm6
        vfmadd231ps %zmm12, %zmm12, %zmm7
        vfmadd231ps %zmm12, %zmm12, %zmm8
        vfmadd231ps %zmm12, %zmm12, %zmm9
        vfmadd231ps %zmm12, %zmm12, %zmm10
        vfmadd231ps %zmm12, %zmm12, %zmm11
        decq    %rdi
        jnz     1b
2:
        vzeroupper                              // xmm0 lane 0 = chain 0 = n: the return value
        ret
endfunc
