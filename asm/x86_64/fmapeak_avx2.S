/*
 * asm/x86_64/fmapeak_avx2.S -- FMA throughput probe (not a model kernel).
 *
 * The compute baseline of `make bench`, as readbw_avx2.S is its memory baseline: a batched prefill
 * computes every (token, output) as an exact fp32 FMA chain, so its best time is its FMA count over
 * this peak.  12 independent chains of 8 lanes, register operands only: 12 chains cover the FMA latency
 * of 2 pipes x 4 (Zen 4) or x 4-5 (Intel) cycles, so the loop runs at the core's FMA issue rate.
 */
#include "asm.S"

/*
 * float gpt2asm_fmapeak_f32_avx2(size_t n);
 *
 *   n iterations of 12 vfmadd231ps (96 fp32 FMAs, 192 flop each): acc_c = fma(1.0f, 1.0f, acc_c) for
 *   the 12 chains c, from acc_c = +0.0; returns lane 0 of chain 0, = (float)n (exact for n <= 2^24).
 *
 *   rdi  iterations left       ymm0-11  the 12 chains       ymm12  1.0f
 */
function gpt2asm_fmapeak_f32_avx2
        vzero   0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11
        movl    $0x3f800000, %eax               // 1.0f
        vmovd   %eax, %xmm12
        vbroadcastss %xmm12, %ymm12
        testq   %rdi, %rdi
        jz      2f
        .p2align 4
1:
        vfmadd231ps %ymm12, %ymm12, %ymm0
        vfmadd231ps %ymm12, %ymm12, %ymm1
        vfmadd231ps %ymm12, %ymm12, %ymm2
        vfmadd231ps %ymm12, %ymm12, %ymm3
        vfmadd231ps %ymm12, %ymm12, %ymm4
        vfmadd231ps %ymm12, %ymm12, %ymm5
        vfmadd231ps %ymm12, %ymm12, %ymm6
        vfmadd231ps %ymm12, %ymm12, %ymm7
        vfmadd231ps %ymm12, %ymm12, %ymm8
        vfmadd231ps %ymm12, %ymm12, %ymm9
        vfmadd231ps %ymm12, %ymm12, %ymm10
        vfmadd231ps %ymm12, %ymm12, %ymm11
        decq    %rdi
        jnz     1b
2:
        vzeroupper                              // xmm0 lane 0 = chain 0 = n: the return value
        ret
endfunc
