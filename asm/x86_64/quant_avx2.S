/*
 * asm/x86_64/quant_avx2.S -- the run-time activation quantizer of the q8_0 / q4_0 kernels, AVX2.
 *
 * docs/kernels.md "q8_0 / q4_0", "Activations" (numpy model: tests/q0ref.py, quantize_act).  One block of 32
 * inputs per iteration, scalar decisions per block:
 *     amax = max of (bits(x_i) & 0x7fffffff) as int32    vpand + vpmaxsd, then a 128/64/32-bit tree
 *     d    = amax / 127.0f                               vdivss (one correctly rounded division)
 *     if bits(d) - 0x00800000 >= 0x7f000000 (unsigned):  d not normal or not finite ->
 *         xq[32b .. 32b+31] = 0                          (id = 0; a NaN/inf x never reaches vcvtps2dq)
 *     else  id = 1.0f / d  (vdivss);  q_i = vcvtps2dq(x_i * id)   (MXCSR default: to nearest, ties even)
 *           packed int32 -> int16 -> int8 (vpackssdw, vpacksswb: no saturation, |q| <= 127), lanes
 *           put back in order by one vpermd
 *     xd[b] = d
 * The same sequence as quant_avx512.S (and the Arm kernels): identical xq and xd bits.
 *
 * Registers:  rdi x   rsi xq   rdx xd   rcx blocks left   r8/r9 scalar tests
 *             ymm0-3 the block's x (then products, ints)   ymm4-7 |x| and the max tree
 *             ymm13 127.0f   ymm14 the vpermd order   ymm15 0x7fffffff   xmm12 1.0f
 */
#include "asm.S"

const q0_quant_avx2, 5
        .long   0, 4, 1, 5, 2, 6, 3, 7                  // vpermd order after the two packs
        .long   0x7fffffff                              // +32: |x| mask
        .long   0x42fe0000                              // +36: 127.0f
        .long   0x3f800000                              // +40: 1.0f
endconst

/*
 * void gpt2asm_quantize_q8_0_avx2(const float *x, int8_t *xq, float *xd, size_t n_in);
 *   n_in % 32 == 0; x, xq, xd any alignment.  Reads x[0 .. n_in), writes xq[0 .. n_in), xd[0 .. n_in/32).
 */
function gpt2asm_quantize_q8_0_avx2
        shrq    $5, %rcx                                // blocks
        jz      9f
        movrel  %rax, q0_quant_avx2
        vmovdqu 0(%rax), %ymm14
        vbroadcastss 32(%rax), %ymm15
        vmovss  36(%rax), %xmm13
        vmovss  40(%rax), %xmm12
1:
        vmovups   0(%rdi), %ymm0
        vmovups  32(%rdi), %ymm1
        vmovups  64(%rdi), %ymm2
        vmovups  96(%rdi), %ymm3
        vpand   %ymm15, %ymm0, %ymm4                    // bits & 0x7fffffff (>= 0: signed max = unsigned)
        vpand   %ymm15, %ymm1, %ymm5
        vpand   %ymm15, %ymm2, %ymm6
        vpand   %ymm15, %ymm3, %ymm7
        vpmaxsd %ymm5, %ymm4, %ymm4
        vpmaxsd %ymm7, %ymm6, %ymm6
        vpmaxsd %ymm6, %ymm4, %ymm4
        vhfold  vpmaxsd, 4, 5                           // amax (as a float: NaN > inf > finite)
        vdivss  %xmm13, %xmm4, %xmm5                    // d = amax / 127
        vmovss  %xmm5, (%rdx)
        vmovd   %xmm5, %r8d
        leal    -0x800000(%r8), %r9d
        cmpl    $0x7f000000, %r9d
        jae     3f                                      // d zero, subnormal, inf or NaN: q = 0
        vdivss  %xmm5, %xmm12, %xmm6                    // id = 1 / d
        vbroadcastss %xmm6, %ymm6
        vmulps  %ymm6, %ymm0, %ymm0                     // x * id
        vmulps  %ymm6, %ymm1, %ymm1
        vmulps  %ymm6, %ymm2, %ymm2
        vmulps  %ymm6, %ymm3, %ymm3
        vcvtps2dq %ymm0, %ymm0                          // to nearest, ties to even
        vcvtps2dq %ymm1, %ymm1
        vcvtps2dq %ymm2, %ymm2
        vcvtps2dq %ymm3, %ymm3
        vpackssdw %ymm1, %ymm0, %ymm0
        vpackssdw %ymm3, %ymm2, %ymm2
        vpacksswb %ymm2, %ymm0, %ymm0
        vpermd  %ymm0, %ymm14, %ymm0
        vmovdqu %ymm0, (%rsi)
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
