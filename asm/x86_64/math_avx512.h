/*
 * asm/x86_64/math_avx512.h -- shared AVX-512F building blocks of the elementwise kernels
 * (norm_avx512.S, act_avx512.S, attn_avx512.S): the constant table, the canonical expf_c sequence,
 * the canonical 16-lane horizontal sum / max trees, tail opmasks and the whole softmax.
 *
 * Only AVX-512F instructions (plus the AVX2/FMA ones every AVX-512 CPU has): no DQ (vxorps/vandps on
 * zmm, vextractf32x8), no BW, no VL.  Tails use opmask registers: a masked-off lane of a load or store
 * does not access memory (fault suppression), so nothing outside the arrays is read or written.
 *
 * This file is the twin of math_avx2.h: the same operations in the same order with the same operand
 * roles, on one zmm (16 lanes = the whole hsum16 lane set) instead of two ymm.  Constants are 4-byte
 * scalars used through embedded broadcasts ({1to16}).
 * Register arguments are register NUMBERS (zmm\n / ymm\n / xmm\n).
 */
#ifndef GPT2ASM_X86_MATH_AVX512_H
#define GPT2ASM_X86_MATH_AVX512_H

#define KZ_MIN          ( 0*4)          /* -104.0f                  0xC2D00000 */
#define KZ_MAX          ( 1*4)          /*   89.0f                  0x42B20000 */
#define KZ_LOG2E        ( 2*4)          /* 1.44269504f              0x3FB8AA3B */
#define KZ_NLN2HI       ( 3*4)          /* -0.693359375f            0xBF318000 */
#define KZ_LN2LO        ( 4*4)          /* 2.12194440e-4f           0x395E8083 */
#define KZ_P0           ( 5*4)          /* 1.9875691500e-4f         0x39506967 */
#define KZ_P1           ( 6*4)          /* 1.3981999507e-3f         0x3AB743CE */
#define KZ_P2           ( 7*4)          /* 8.3334519073e-3f         0x3C088908 */
#define KZ_P3           ( 8*4)          /* 4.1665795894e-2f         0x3D2AA9C1 */
#define KZ_P4           ( 9*4)          /* 1.6666665459e-1f         0x3E2AAAAA */
#define KZ_P5           (10*4)          /* 5.0000001201e-1f         0x3F000000 */
#define KZ_ONE          (11*4)          /* 1.0f                     0x3F800000 */
#define KZ_BIAS         (12*4)          /* int32 127 (exponent bias)           */
#define KZ_EIGHTH       (13*4)          /* 0.125f = 1/sqrt(64)      0x3E000000 */
#define KZ_NINF         (14*4)          /* -inf                     0xFF800000 */
#define KZ_EPS          (15*4)          /* 1e-5f                    0x3727C5AC */
#define KZ_GC           (16*4)          /* 0.044715f                0x3D372713 */
#define KZ_GM           (17*4)          /* -1.59576912f             0xBFCC422A */
#define KZ_KMASK        (18*4)          /* uint16 (1 << r) - 1 for r = 0..16    */

const math_avx512, 6
        .long   0xC2D00000, 0x42B20000, 0x3FB8AA3B, 0xBF318000
        .long   0x395E8083, 0x39506967, 0x3AB743CE, 0x3C088908
        .long   0x3D2AA9C1, 0x3E2AAAAA, 0x3F000000, 0x3F800000
        .long   127,        0x3E000000, 0xFF800000, 0x3727C5AC
        .long   0x3D372713, 0xBFCC422A
        .short  0x0000, 0x0001, 0x0003, 0x0007, 0x000F, 0x001F, 0x003F, 0x007F, 0x00FF
        .short  0x01FF, 0x03FF, 0x07FF, 0x0FFF, 0x1FFF, 0x3FFF, 0x7FFF, 0xFFFF
endconst

/*
 * tail_kmask_avx512 k, r, base
 *   %k\k = (1 << r) - 1: the lanes j < r of a 16-lane tail; r a GPR holding 0..16 (preserved).
 */
        .macro  tail_kmask_avx512 k, r, base
        kmovw       KZ_KMASK(\base,\r,2), %k\k
        .endm

/*
 * hsum16_avx512 z, t
 *   The canonical hsum16 pairwise tree of the 16 lane sums in zmm\z (z, t < 16): for w in 8, 4, 2, 1:
 *   s[j] = s[j] + s[j + w].  Result in xmm\z lane 0 (the rest of zmm\z is junk).  Clobbers zmm\t.
 */
        .macro  hsum16_avx512 z, t
        vextractf64x4 $1, %zmm\z, %ymm\t
        vaddps      %ymm\t, %ymm\z, %ymm\z          // w = 8: s[j] + s[j+8]
        vextractf128 $1, %ymm\z, %xmm\t
        vaddps      %xmm\t, %xmm\z, %xmm\z          // w = 4
        vmovhlps    %xmm\z, %xmm\z, %xmm\t
        vaddps      %xmm\t, %xmm\z, %xmm\z          // w = 2
        vmovshdup   %xmm\z, %xmm\t
        vaddss      %xmm\t, %xmm\z, %xmm\z          // w = 1
        .endm

/*
 * hmax16_avx512 z, t
 *   The same tree with m[j] = (m[j] > m[j+w]) ? m[j] : m[j+w].
 */
        .macro  hmax16_avx512 z, t
        vextractf64x4 $1, %zmm\z, %ymm\t
        vmaxps      %ymm\t, %ymm\z, %ymm\z
        vextractf128 $1, %ymm\z, %xmm\t
        vmaxps      %xmm\t, %xmm\z, %xmm\z
        vmovhlps    %xmm\z, %xmm\z, %xmm\t
        vmaxps      %xmm\t, %xmm\z, %xmm\z
        vmovshdup   %xmm\z, %xmm\t
        vmaxss      %xmm\t, %xmm\z, %xmm\z
        .endm

/*
 * expf_c_avx512 y, x, t, n, r2, a, lo, hi, base
 *   zmm\y = expf_c(zmm\x), 16 lanes; the sequence of expf_c_avx2 (math_avx2.h, docs/kernels.md).
 *   zmm\lo = -104.0f, zmm\hi = 89.0f in every lane; \base = math_avx512.
 *   y may equal x; t may equal x; y, t, n, r2, a otherwise distinct.  Clobbers t, n, r2, a.
 */
        .macro  expf_c_avx512 y, x, t, n, r2, a, lo, hi, base
        vmaxps      %zmm\x, %zmm\lo, %zmm\t                 // max(-104, x): NaN x -> x
        vminps      %zmm\t, %zmm\hi, %zmm\t                 // xc = min(89, .)
        vmulps      KZ_LOG2E(\base){1to16}, %zmm\t, %zmm\n  // xc * log2e
        vrndscaleps $0, %zmm\n, %zmm\n                      // n = roundeven(.)
        vfmadd231ps KZ_NLN2HI(\base){1to16}, %zmm\n, %zmm\t // r = fma(n, -0.693359375, xc)
        vfmadd231ps KZ_LN2LO(\base){1to16}, %zmm\n, %zmm\t  // r = fma(n, 2.1219444e-4, r)
        vmulps      %zmm\t, %zmm\t, %zmm\r2                 // r2 = r * r
        vbroadcastss KZ_P0(\base), %zmm\y                   // p = P0
        vfmadd213ps KZ_P1(\base){1to16}, %zmm\t, %zmm\y     // p = fma(p, r, P1)
        vfmadd213ps KZ_P2(\base){1to16}, %zmm\t, %zmm\y     // p = fma(p, r, P2)
        vfmadd213ps KZ_P3(\base){1to16}, %zmm\t, %zmm\y     // p = fma(p, r, P3)
        vfmadd213ps KZ_P4(\base){1to16}, %zmm\t, %zmm\y     // p = fma(p, r, P4)
        vfmadd213ps KZ_P5(\base){1to16}, %zmm\t, %zmm\y     // p = fma(p, r, P5)
        vfmadd213ps %zmm\t, %zmm\r2, %zmm\y                 // p = fma(p, r2, r)
        vaddps      KZ_ONE(\base){1to16}, %zmm\y, %zmm\y    // p = p + 1
        vcvtps2dq   %zmm\n, %zmm\n                          // k = (int)n
        vpsrad      $1, %zmm\n, %zmm\a                      // a = k >> 1
        vpsubd      %zmm\a, %zmm\n, %zmm\n                  // b = k - a
        vpaddd      KZ_BIAS(\base){1to16}, %zmm\a, %zmm\a
        vpaddd      KZ_BIAS(\base){1to16}, %zmm\n, %zmm\n
        vpslld      $23, %zmm\a, %zmm\a                     // 2^a
        vpslld      $23, %zmm\n, %zmm\n                     // 2^b
        vmulps      %zmm\a, %zmm\y, %zmm\y                  // p * 2^a
        vmulps      %zmm\n, %zmm\y, %zmm\y                  // (p * 2^a) * 2^b
        .endm

/*
 * softmax_avx512 x, y, n, base, i, n16, t
 *   y[0..n) = softmax(x[0..n)), n >= 1, y may equal x; the order of docs/kernels.md (see softmax_avx2).
 *   GPRs: \x, \y, \n, \base (= math_avx512) preserved; \i, \n16, \t clobbered.
 *   Clobbers zmm0-13 and k1.  Uses local labels 80-89.
 */
        .macro  softmax_avx512 x, y, n, base, i, n16, t
        movq        \n, \n16
        andq        $-16, \n16                      // n16 = n & ~15
        movq        \n, \t
        subq        \n16, \t
        tail_kmask_avx512 1, \t, \base              // k1 = tail lanes
        vbroadcastss KZ_NINF(\base), %zmm0          // m
        loop16      \i, \n16, 80, 81
        vmovups     (\x,\i,4), %zmm2
        vmaxps      %zmm0, %zmm2, %zmm0             // m = (x > m) ? x : m
        loop16_end  \i, \n16, \n, 80, 81, 82
        vmovups     (\x,\i,4), %zmm2{%k1}{z}
        vmaxps      %zmm0, %zmm2, %zmm0{%k1}        // lanes past the end keep m
82:
        hmax16_avx512 0, 2
        vbroadcastss %xmm0, %zmm13                  // m

        vbroadcastss KZ_MIN(\base), %zmm11
        vbroadcastss KZ_MAX(\base), %zmm12
        vpxord      %zmm0, %zmm0, %zmm0             // s
        loop16      \i, \n16, 83, 84
        vmovups     (\x,\i,4), %zmm2
        vsubps      %zmm13, %zmm2, %zmm2            // x - m
        expf_c_avx512 4, 2, 2, 5, 6, 7, 11, 12, \base
        vmovups     %zmm4, (\y,\i,4)
        vaddps      %zmm4, %zmm0, %zmm0             // s = s + e
        loop16_end  \i, \n16, \n, 83, 84, 85
        vmovups     (\x,\i,4), %zmm2{%k1}{z}
        vsubps      %zmm13, %zmm2, %zmm2
        expf_c_avx512 4, 2, 2, 5, 6, 7, 11, 12, \base
        vmovups     %zmm4, (\y,\i,4){%k1}
        vaddps      %zmm4, %zmm0, %zmm0{%k1}        // lanes past the end add nothing
85:
        hsum16_avx512 0, 2
        vbroadcastss %xmm0, %zmm13                  // s

        loop16      \i, \n16, 86, 87
        vmovups     (\y,\i,4), %zmm2
        vdivps      %zmm13, %zmm2, %zmm2            // y = e / s
        vmovups     %zmm2, (\y,\i,4)
        loop16_end  \i, \n16, \n, 86, 87, 88
        vmovups     (\y,\i,4), %zmm2{%k1}{z}
        vdivps      %zmm13, %zmm2, %zmm2
        vmovups     %zmm2, (\y,\i,4){%k1}
88:
        .endm

#endif /* GPT2ASM_X86_MATH_AVX512_H */
