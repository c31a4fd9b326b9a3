/*
 * asm/x86_64/argmax_avx512.S -- greedy sampling: index of the first maximum, AVX-512F (16 lanes, 64
 * elements per iteration in four independent sets).
 *
 * The algorithm of argmax_avx2.S with zmm registers and opmasks; the result is the same (exact: only
 * comparisons).  The last 1..15 elements are loaded under an opmask (masked-off lanes do not fault).
 * Only zmm0-15 are used, so nothing is left in zmm16-31.
 */
#include "asm.S"

#define KB_OFF          0               /* int32 0, 1, ..., 63: lane j of set k is element 16k + j */
#define KB_NINF         256             /* -inf                                     0xFF800000    */
#define KB_64           260             /* int32 64                                               */
#define KB_16           264             /* int32 16                                               */

const argmax_avx512, 6
        .irp    i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
        .long   \i
        .endr
        .irp    i, 32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60,61,62,63
        .long   \i
        .endr
        .long   0xFF800000, 64, 16
endconst

/*
 * argmax_step_avx512 v, m, idx, k
 *   One vector v (already loaded) into set (m, idx): lanes where v > m (GT_OQ) take v and the position
 *   zmm8.  Then zmm\v = v - v (+0.0 for finite, NaN otherwise).  Clobbers k\k.
 */
        .macro  argmax_step_avx512 v, m, idx, k
        vcmpps      $0x1e, %zmm\m, %zmm\v, %k\k     // v > m
        vmaxps      %zmm\m, %zmm\v, %zmm\m          // m = (v > m) ? v : m
        vmovdqa32   %zmm8, %zmm\idx{%k\k}           // idx = (v > m) ? pos : idx
        vsubps      %zmm\v, %zmm\v, %zmm\v          // v - v
        .endm

/*
 * size_t gpt2asm_argmax_f32_avx512(const float *x, size_t n);
 *
 *   the smallest i with x[i] == max x (numpy.argmax), or SIZE_MAX if some x[i] is NaN or +-inf
 *   (or n == 0).  n < 2^31.
 *
 * Registers: zmm0-3 running max of sets 0-3, zmm4-7 their positions, zmm8 the current position
 * (broadcast), zmm9 its increment, zmm10 the OR of every v - v, zmm11-14 loads; k1-k4 compare masks.
 */
function gpt2asm_argmax_f32_avx512
        testq       %rsi, %rsi
        jz          9f
        movrel      %r11, argmax_avx512
        vbroadcastss KB_NINF(%r11), %zmm0
        vmovaps     %zmm0, %zmm1
        vmovaps     %zmm0, %zmm2
        vmovaps     %zmm0, %zmm3
        vclear  vpxord, zmm, 4, 5, 6, 7, 8, 10
        vpbroadcastd KB_64(%r11), %zmm9
        whole_loop  %rsi, %r8, 64, 2f                   // n64, i = 0
1:
        vmovups        (%rdi,%rax,4), %zmm11
        vmovups      64(%rdi,%rax,4), %zmm12
        vmovups     128(%rdi,%rax,4), %zmm13
        vmovups     192(%rdi,%rax,4), %zmm14
        argmax_step_avx512 11, 0, 4, 1
        argmax_step_avx512 12, 1, 5, 2
        argmax_step_avx512 13, 2, 6, 3
        argmax_step_avx512 14, 3, 7, 4
        vpternlogd  $0xfe, %zmm12, %zmm11, %zmm10   // acc |= (v0 - v0) | (v1 - v1)
        vpternlogd  $0xfe, %zmm14, %zmm13, %zmm10   //      | (v2 - v2) | (v3 - v3)
        vpaddd      %zmm9, %zmm8, %zmm8             // pos += 64
        addq        $64, %rax
        cmpq        %r8, %rax
        jb          1b
2:                                                  // whole vectors left: into set 0
        vpbroadcastd KB_16(%r11), %zmm9
        movq        %rsi, %r8
        andq        $-16, %r8                       // n16
        cmpq        %r8, %rax
        jae         4f
3:
        vmovups     (%rdi,%rax,4), %zmm11
        argmax_step_avx512 11, 0, 4, 1
        vpord       %zmm11, %zmm10, %zmm10
        vpaddd      %zmm9, %zmm8, %zmm8             // pos += 16
        addq        $16, %rax
        cmpq        %r8, %rax
        jb          3b
4:                                                  // 1..15 left: masked, into set 0
        movq        %rsi, %rcx
        subq        %rax, %rcx
        jz          5f
        movl        $1, %edx
        shll        %cl, %edx
        decl        %edx
        kmovw       %edx, %k2                       // the first r lanes
        vmovups     (%rdi,%rax,4), %zmm11{%k2}{z}   // the others read as +0.0
        vcmpps      $0x1e, %zmm0, %zmm11, %k1{%k2}  // v > m, in a lane of x
        vmovaps     %zmm11, %zmm0{%k1}
        vmovdqa32   %zmm8, %zmm4{%k1}
        vsubps      %zmm11, %zmm11, %zmm11          // +0.0 in the masked-off lanes
        vpord       %zmm11, %zmm10, %zmm10
5:                                                  // reduce
        vptestmd    %zmm10, %zmm10, %k1
        kortestw    %k1, %k1
        jnz         8f                              // some v - v was not +0.0: NaN or inf
        vpaddd      KB_OFF+0(%r11), %zmm4, %zmm4    // element indices
        vpaddd      KB_OFF+64(%r11), %zmm5, %zmm5
        vpaddd      KB_OFF+128(%r11), %zmm6, %zmm6
        vpaddd      KB_OFF+192(%r11), %zmm7, %zmm7
        vmaxps      %zmm1, %zmm0, %zmm11            // the maximum (no NaN left: any order)
        vmaxps      %zmm3, %zmm2, %zmm12
        vmaxps      %zmm12, %zmm11, %zmm11
        vextractf64x4 $1, %zmm11, %ymm12
        vmaxps      %ymm12, %ymm11, %ymm11
        vhfold  vmaxps, 11, 12, ext=vextractf128, shuf=vpermilps
        vbroadcastss %xmm11, %zmm11                 // m
        vpternlogd  $0xff, %zmm12, %zmm12, %zmm12   // UINT32_MAX
        vcmpps      $0, %zmm11, %zmm0, %k1          // lanes holding m (-0.0 == +0.0)
        vpminud     %zmm4, %zmm12, %zmm12{%k1}      //   the smallest of their indices
        vcmpps      $0, %zmm11, %zmm1, %k2
        vpminud     %zmm5, %zmm12, %zmm12{%k2}
        vcmpps      $0, %zmm11, %zmm2, %k3
        vpminud     %zmm6, %zmm12, %zmm12{%k3}
        vcmpps      $0, %zmm11, %zmm3, %k4
        vpminud     %zmm7, %zmm12, %zmm12{%k4}
        vextracti64x4 $1, %zmm12, %ymm13
        vpminud     %ymm13, %ymm12, %ymm12
        vhfold  vpminud, 12, 13
        vmovd       %xmm12, %eax                    // zero-extended into rax
        vzeroupper
        ret
8:
        vzeroupper
9:
        movq        $-1, %rax                       // SIZE_MAX
        ret
endfunc
