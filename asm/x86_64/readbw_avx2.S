/*
 * asm/x86_64/readbw_avx2.S -- streaming-read bandwidth probe (not a model kernel).
 *
 * The benchmark baseline for the matvec kernels (tests/test_kernels_matvec.py --bench, `make bench`):
 * the fastest one core can pull a buffer through the load ports, with the same access pattern as a
 * weight tile (one forward stream, 256 bytes per iteration, 32-byte loads) and next to no arithmetic.
 */
#include "asm.S"

/*
 * float gpt2asm_readbw_f32_avx2(const float *p, size_t n);
 *
 *   returns a sum of p[0 .. n-1] (in an unspecified order: the result only keeps the loads alive).
 *   n is a multiple of 64 (n = 0 returns 0); p is 32-byte aligned (64 in practice).
 *
 *   rdi  p cursor      rsi  blocks of 64 floats left      ymm0-7  8 independent sums
 */
function gpt2asm_readbw_f32_avx2
        vzero   0, 1, 2, 3, 4, 5, 6, 7
        shrq    $6, %rsi                        // blocks of 64 floats (256 bytes)
        jz      2f
        .p2align 4
1:
        vmemop  vaddps, %rdi, 0, 32, ymm, 0,1,2,3,4,5,6,7
        addq    $256, %rdi
        decq    %rsi
        jnz     1b
2:
        vaddps  %ymm1, %ymm0, %ymm0             // fold the 8 sums to one float
        vaddps  %ymm3, %ymm2, %ymm2
        vaddps  %ymm5, %ymm4, %ymm4
        vaddps  %ymm7, %ymm6, %ymm6
        vaddps  %ymm2, %ymm0, %ymm0
        vaddps  %ymm6, %ymm4, %ymm4
        vaddps  %ymm4, %ymm0, %ymm0
        vextractf128 $1, %ymm0, %xmm1
        vaddps  %xmm1, %xmm0, %xmm0
        vmovhlps %xmm0, %xmm0, %xmm1
        vaddps  %xmm1, %xmm0, %xmm0
        vmovshdup %xmm0, %xmm1
        vaddss  %xmm1, %xmm0, %xmm0             // return value in xmm0
        vzeroupper
        ret
endfunc
