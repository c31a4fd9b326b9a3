/*
 * asm/x86_64/argmax_avx2.S -- greedy sampling: index of the first maximum, AVX2 (8 lanes, 32 elements
 * per iteration in four independent sets).
 *
 * Comparisons only (no rounding anywhere), so the result is exact and identical on every ISA
 * (docs/kernels.md, gpt2asm_argmax_f32).  Nothing outside x[0..n) is read: the last 1..7 elements
 * are loaded with vmaskmovps (masked-off lanes do not fault).
 */
#include "asm.S"

#define KA_OFF          0               /* int32 0, 1, ..., 31: lane j of set k is element 8k + j */
#define KA_MASK         128             /* int32 { -1 x 8, 0 x 8 }: the first r lanes at 32 - 4r  */
#define KA_NINF         192             /* -inf                                     0xFF800000   */
#define KA_32           196             /* int32 32                                              */
#define KA_8            200             /* int32 8                                               */

const argmax_avx2, 6
        .irp    i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
        .long   \i
        .endr
        .rept   8
        .long   -1
        .endr
        .rept   8
        .long   0
        .endr
        .long   0xFF800000, 32, 8
endconst

/*
 * argmax_step_avx2 v, m, idx
 *   One vector v (already loaded) into set (m, idx): lanes where v > m (GT_OQ: a NaN never wins, -0.0
 *   and +0.0 are equal) take v and the position ymm8 (broadcast of the first element's index of the
 *   vector; the lane offset is implicit in the set).  Then ymm\v = v - v (+0.0 for finite, NaN
 *   otherwise), for the caller to OR into the non-finite accumulator.  Clobbers ymm15.
 */
        .macro  argmax_step_avx2 v, m, idx
        vcmpps      $0x1e, %ymm\m, %ymm\v, %ymm15   // v > m
        vmaxps      %ymm\m, %ymm\v, %ymm\m          // m = (v > m) ? v : m
        vblendvps   %ymm15, %ymm8, %ymm\idx, %ymm\idx   // idx = (v > m) ? pos : idx
        vsubps      %ymm\v, %ymm\v, %ymm\v          // v - v
        .endm

/*
 * size_t gpt2asm_argmax_f32_avx2(const float *x, size_t n);
 *
 *   the smallest i with x[i] == max x (numpy.argmax), or SIZE_MAX if some x[i] is NaN or +-inf
 *   (or n == 0).  n < 2^31.
 *
 * Registers: ymm0-3 running max of sets 0-3, ymm4-7 their positions (int32; set k lane j holds the
 * element position + 8k + j), ymm8 the current position (broadcast), ymm9 its increment, ymm10 the OR
 * of every v - v, ymm11-14 loads, ymm15 compare masks.
 */
function gpt2asm_argmax_f32_avx2
        testq       %rsi, %rsi
        jz          9f
        movrel      %r11, argmax_avx2
        vbroadcastss KA_NINF(%r11), %ymm0
        vmovaps     %ymm0, %ymm1
        vmovaps     %ymm0, %ymm2
        vmovaps     %ymm0, %ymm3
        vclear  vpxor, ymm, 4, 5, 6, 7, 8, 10
        vpbroadcastd KA_32(%r11), %ymm9
        whole_loop  %rsi, %r8, 32, 2f                   // n32, i = 0
1:
        vmovups       (%rdi,%rax,4), %ymm11
        vmovups     32(%rdi,%rax,4), %ymm12
        vmovups     64(%rdi,%rax,4), %ymm13
        vmovups     96(%rdi,%rax,4), %ymm14
        argmax_step_avx2 11, 0, 4
        argmax_step_avx2 12, 1, 5
        argmax_step_avx2 13, 2, 6
        argmax_step_avx2 14, 3, 7
        vorps       %ymm12, %ymm11, %ymm11
        vorps       %ymm14, %ymm13, %ymm13
        vorps       %ymm13, %ymm11, %ymm11
        vorps       %ymm11, %ymm10, %ymm10
        vpaddd      %ymm9, %ymm8, %ymm8             // pos += 32
        addq        $32, %rax
        cmpq        %r8, %rax
        jb          1b
2:                                                  // whole vectors left: into set 0
        vpbroadcastd KA_8(%r11), %ymm9
        movq        %rsi, %r8
        andq        $-8, %r8                        // n8
        cmpq        %r8, %rax
        jae         4f
3:
        vmovups     (%rdi,%rax,4), %ymm11
        argmax_step_avx2 11, 0, 4
        vorps       %ymm11, %ymm10, %ymm10
        vpaddd      %ymm9, %ymm8, %ymm8             // pos += 8
        addq        $8, %rax
        cmpq        %r8, %rax
        jb          3b
4:                                                  // 1..7 left: masked, into set 0
        movq        %rsi, %rcx
        subq        %rax, %rcx
        jz          5f
        negq        %rcx
        vmovdqu     KA_MASK+32(%r11,%rcx,4), %ymm12 // the first r lanes
        vmaskmovps  (%rdi,%rax,4), %ymm12, %ymm11   // the others read as +0.0
        vcmpps      $0x1e, %ymm0, %ymm11, %ymm15    // v > m
        vandps      %ymm12, %ymm15, %ymm15          //   ... in a lane of x
        vblendvps   %ymm15, %ymm11, %ymm0, %ymm0
        vblendvps   %ymm15, %ymm8, %ymm4, %ymm4
        vsubps      %ymm11, %ymm11, %ymm11          // +0.0 in the masked-off lanes
        vorps       %ymm11, %ymm10, %ymm10
5:                                                  // reduce
        vptest      %ymm10, %ymm10
        jnz         8f                              // some v - v was not +0.0: NaN or inf
        vpaddd      KA_OFF+0(%r11), %ymm4, %ymm4    // element indices
        vpaddd      KA_OFF+32(%r11), %ymm5, %ymm5
        vpaddd      KA_OFF+64(%r11), %ymm6, %ymm6
        vpaddd      KA_OFF+96(%r11), %ymm7, %ymm7
        vmaxps      %ymm1, %ymm0, %ymm11            // the maximum (no NaN left: any order)
        vmaxps      %ymm3, %ymm2, %ymm12
        vmaxps      %ymm12, %ymm11, %ymm11
        vhfold  vmaxps, 11, 12, ext=vextractf128, shuf=vpermilps
        vbroadcastss %xmm11, %ymm11                 // m
        vpcmpeqd    %ymm13, %ymm13, %ymm13          // UINT32_MAX
        vcmpps      $0, %ymm11, %ymm0, %ymm15       // lanes holding m (-0.0 == +0.0)
        vblendvps   %ymm15, %ymm4, %ymm13, %ymm0    //   their index, else UINT32_MAX
        vcmpps      $0, %ymm11, %ymm1, %ymm15
        vblendvps   %ymm15, %ymm5, %ymm13, %ymm1
        vcmpps      $0, %ymm11, %ymm2, %ymm15
        vblendvps   %ymm15, %ymm6, %ymm13, %ymm2
        vcmpps      $0, %ymm11, %ymm3, %ymm15
        vblendvps   %ymm15, %ymm7, %ymm13, %ymm3
        vpminud     %ymm1, %ymm0, %ymm0             // the smallest index
        vpminud     %ymm3, %ymm2, %ymm2
        vpminud     %ymm2, %ymm0, %ymm0
        vhfold  vpminud, 0, 1
        vmovd       %xmm0, %eax                     // zero-extended into rax
        vzeroupper
        ret
8:
        vzeroupper
9:
        movq        $-1, %rax                       // SIZE_MAX
        ret
endfunc
