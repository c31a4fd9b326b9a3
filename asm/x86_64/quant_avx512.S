/*
 * asm/x86_64/quant_avx512.S -- the run-time activation quantizer of the q8_0 / q4_0 kernels, AVX-512F.
 *
 * The sequence of quant_avx2.S (docs/kernels.md "q8_0 / q4_0", "Activations"), two zmm per block of 32 inputs:
 *     amax = max of (bits(x_i) & 0x7fffffff) as int32    vpandd + vpmaxsd, then a 256/128/64/32-bit tree
 *     d    = amax / 127.0f (vdivss);  xd[b] = d
 *     d not normal or not finite -> xq = 0;  else id = 1.0f / d (vdivss), q_i = vcvtps2dq(x_i * id)
 *     (MXCSR default: ties to even), narrowed by vpmovsdb (|q| <= 127: no saturation) straight to xq.
 * Only zmm0-5 are used, so vzeroupper leaves no dirty upper state.
 *
 * Registers:  rdi x   rsi xq   rdx xd   rcx blocks left   rax constants   r8/r9 scalar tests
 */
#include "asm.S"

const q0_quant_avx512, 4
        .long   0x7fffffff                              // |x| mask
        .long   0x42fe0000                              // +4: 127.0f
        .long   0x3f800000                              // +8: 1.0f
        .long   0
endconst

/*
 * void gpt2asm_quantize_q8_0_avx512(const float *x, int8_t *xq, float *xd, size_t n_in);
 *   n_in % 32 == 0; x, xq, xd any alignment.  Reads x[0 .. n_in), writes xq[0 .. n_in), xd[0 .. n_in/32).
 */
function gpt2asm_quantize_q8_0_avx512
        shrq    $5, %rcx                                // blocks
        jz      9f
        movrel  %rax, q0_quant_avx512
1:
        vmovups   0(%rdi), %zmm0
        vmovups  64(%rdi), %zmm1
        vpandd  0(%rax){1to16}, %zmm0, %zmm2            // bits & 0x7fffffff
        vpandd  0(%rax){1to16}, %zmm1, %zmm3
        vpmaxsd %zmm3, %zmm2, %zmm2
        vextracti64x4 $1, %zmm2, %ymm3
        vpmaxsd %ymm3, %ymm2, %ymm2
        vhfold  vpmaxsd, 2, 3                           // amax
        vdivss  4(%rax), %xmm2, %xmm3                   // d = amax / 127
        vmovss  %xmm3, (%rdx)
        vmovd   %xmm3, %r8d
        leal    -0x800000(%r8), %r9d
        cmpl    $0x7f000000, %r9d
        jae     3f                                      // d zero, subnormal, inf or NaN: q = 0
        vmovss  8(%rax), %xmm4
        vdivss  %xmm3, %xmm4, %xmm4                     // id = 1 / d
        vbroadcastss %xmm4, %zmm4
        vmulps  %zmm4, %zmm0, %zmm0                     // x * id
        vmulps  %zmm4, %zmm1, %zmm1
        vcvtps2dq %zmm0, %zmm0                          // to nearest, ties to even
        vcvtps2dq %zmm1, %zmm1
        vpmovsdb %zmm0, (%rsi)
        vpmovsdb %zmm1, 16(%rsi)
        jmp     4f
3:
        vpxor   %xmm0, %xmm0, %xmm0
        vmovdqu %ymm0, (%rsi)
4:
        subq    $-128, %rdi
        addq    $32, %rsi
        addq    $4, %rdx
        decq    %rcx
        jnz     1b
        vzeroupper
9:
        ret
endfunc
