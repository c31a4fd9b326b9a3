/*
 * asm/x86_64/math_avx2.h -- shared AVX2 building blocks of the elementwise kernels
 * (norm_avx2.S, act_avx2.S, attn_avx2.S): the constant table, the canonical expf_c sequence,
 * the canonical 16-lane horizontal sum / max trees, tail masks and the whole softmax.
 *
 * Include it once per kernel file, after asm.S.  It emits the constant block `math_avx2` into that
 * object (each object has its own copy; the labels are local) and defines only macros otherwise.
 *
 * Register arguments of the macros are register NUMBERS (ymm\n, xmm\n), so one argument can name
 * both the ymm and the xmm view of a register.  Every macro documents what it clobbers.
 *
 * The operation sequences are the ones docs/kernels.md defines; the AVX-512 twins in math_avx512.h
 * must stay instruction-for-instruction the same sequence (same operand roles, so even NaN payloads
 * agree).
 */
#ifndef GPT2ASM_X86_MATH_AVX2_H
#define GPT2ASM_X86_MATH_AVX2_H

/* constant table: one 32-byte vector (8 equal lanes) per constant, then the tail mask table */
#define KV_MIN          ( 0*32)         /* -104.0f                  0xC2D00000 */
#define KV_MAX          ( 1*32)         /*   89.0f                  0x42B20000 */
#define KV_LOG2E        ( 2*32)         /* 1.44269504f              0x3FB8AA3B */
#define KV_NLN2HI       ( 3*32)         /* -0.693359375f            0xBF318000 */
#define KV_LN2LO        ( 4*32)         /* 2.12194440e-4f           0x395E8083 */
#define KV_P0           ( 5*32)         /* 1.9875691500e-4f         0x39506967 */
#define KV_P1           ( 6*32)         /* 1.3981999507e-3f         0x3AB743CE */
#define KV_P2           ( 7*32)         /* 8.3334519073e-3f         0x3C088908 */
#define KV_P3           ( 8*32)         /* 4.1665795894e-2f         0x3D2AA9C1 */
#define KV_P4           ( 9*32)         /* 1.6666665459e-1f         0x3E2AAAAA */
#define KV_P5           (10*32)         /* 5.0000001201e-1f         0x3F000000 */
#define KV_ONE          (11*32)         /* 1.0f                     0x3F800000 */
#define KV_BIAS         (12*32)         /* int32 127 (exponent bias)           */
#define KV_EIGHTH       (13*32)         /* 0.125f = 1/sqrt(64)      0x3E000000 */
#define KV_NINF         (14*32)         /* -inf                     0xFF800000 */
#define KV_EPS          (15*32)         /* 1e-5f                    0x3727C5AC */
#define KV_GC           (16*32)         /* 0.044715f                0x3D372713 */
#define KV_GM           (17*32)         /* -1.59576912f             0xBFCC422A */
#define KV_MASK         (18*32)         /* int32 { -1 x 16, 0 x 16 }           */

        .macro  vec8 bits
        .rept   8
        .long   \bits
        .endr
        .endm

const math_avx2, 6
        vec8    0xC2D00000
        vec8    0x42B20000
        vec8    0x3FB8AA3B
        vec8    0xBF318000
        vec8    0x395E8083
        vec8    0x39506967
        vec8    0x3AB743CE
        vec8    0x3C088908
        vec8    0x3D2AA9C1
        vec8    0x3E2AAAAA
        vec8    0x3F000000
        vec8    0x3F800000
        vec8    127
        vec8    0x3E000000
        vec8    0xFF800000
        vec8    0x3727C5AC
        vec8    0x3D372713
        vec8    0xBFCC422A
        .rept   16
        .long   -1
        .endr
        .rept   16
        .long   0
        .endr
endconst

/*
 * tail_masks_avx2 lo, hi, r, base
 *   ymm\lo, ymm\hi = lane masks of a 16-lane tail of r (0..16, a GPR) elements: lane j of (lo:hi) is
 *   all-ones iff j < r (mask lane j = table[16 - r + j]).  Leaves \r = -r, as the two macros below
 *   expect it.
 *
 * tail_load_hi r, mask, dst, mem / tail_store_hi r, src, mask, mem
 *   vmaskmovps of lanes 8-15 of such a tail, skipped (no memory access at all; a load gives +0.0)
 *   when r <= 8: those 32 bytes then lie wholly past the end of the array, and AMD documents the
 *   fault behaviour of masked-off vmaskmovps elements as implementation dependent.  Lanes 0-7 always
 *   contain at least one element of the array.  Local label 79.
 */
        .macro  tail_masks_avx2 lo, hi, r, base
        negq        \r
        vmovdqu     KV_MASK+64(\base,\r,4), %ymm\lo
        vmovdqu     KV_MASK+96(\base,\r,4), %ymm\hi
        .endm

        .macro  tail_load_hi r, mask, dst, mem:vararg
        vxorps      %ymm\dst, %ymm\dst, %ymm\dst
        cmpq        $-8, \r
        jge         79f
        vmaskmovps  \mem, %ymm\mask, %ymm\dst
79:
        .endm

        .macro  tail_store_hi r, src, mask, mem:vararg
        cmpq        $-8, \r
        jge         79f
        vmaskmovps  %ymm\src, %ymm\mask, \mem
79:
        .endm

/*
 * hsum16_avx2 lo, hi, t
 *   The canonical hsum16 pairwise tree of the 16 lane sums s[0..7] = ymm\lo, s[8..15] = ymm\hi:
 *   for w in 8, 4, 2, 1: s[j] = s[j] + s[j + w] (j < w).  Result in xmm\lo lane 0 (the other lanes of
 *   ymm\lo are junk).  Clobbers ymm\t.
 */
        .macro  hsum16_avx2 lo, hi, t
        vaddps      %ymm\hi, %ymm\lo, %ymm\lo       // w = 8: s[j] + s[j+8]
        vextractf128 $1, %ymm\lo, %xmm\t
        vaddps      %xmm\t, %xmm\lo, %xmm\lo        // w = 4: s[j] + s[j+4]
        vmovhlps    %xmm\lo, %xmm\lo, %xmm\t
        vaddps      %xmm\t, %xmm\lo, %xmm\lo        // w = 2: s[j] + s[j+2]
        vmovshdup   %xmm\lo, %xmm\t
        vaddss      %xmm\t, %xmm\lo, %xmm\lo        // w = 1: s[0] + s[1]
        .endm

/*
 * hmax16_avx2 lo, hi, t
 *   The same tree with m[j] = (m[j] > m[j+w]) ? m[j] : m[j+w] (vmaxps, m[j] the first source).
 */
        .macro  hmax16_avx2 lo, hi, t
        vmaxps      %ymm\hi, %ymm\lo, %ymm\lo
        vextractf128 $1, %ymm\lo, %xmm\t
        vmaxps      %xmm\t, %xmm\lo, %xmm\lo
        vmovhlps    %xmm\lo, %xmm\lo, %xmm\t
        vmaxps      %xmm\t, %xmm\lo, %xmm\lo
        vmovshdup   %xmm\lo, %xmm\t
        vmaxss      %xmm\t, %xmm\lo, %xmm\lo
        .endm

/*
 * expf_c_avx2 y, x, t, n, r2, a, lo, hi, base
 *   ymm\y = expf_c(ymm\x), the canonical sequence of docs/kernels.md, 8 lanes:
 *
 *     xc = min(max(x, -104), 89)        x is the second source of vmaxps, so NaN stays NaN
 *     n  = roundeven(xc * log2e)
 *     r  = fma(n, -ln2hi, xc);  r = fma(n, ln2lo, r);  r2 = r * r
 *     p  = fma(P0, r, P1); p = fma(p, r, P2..P5); p = fma(p, r2, r); p = p + 1
 *     k  = (int)n; a = k >> 1; b = k - a;  y = (p * 2^a) * 2^b
 *
 *   ymm\lo = -104.0f and ymm\hi = 89.0f in every lane (loaded once by the caller); \base = math_avx2.
 *   y may equal x; t may equal x; y, t, n, r2, a otherwise distinct.  Clobbers t, n, r2, a.
 */
        .macro  expf_c_avx2 y, x, t, n, r2, a, lo, hi, base
        vmaxps      %ymm\x, %ymm\lo, %ymm\t         // max(-104, x): NaN x -> x
        vminps      %ymm\t, %ymm\hi, %ymm\t         // xc = min(89, .)
        vmulps      KV_LOG2E(\base), %ymm\t, %ymm\n // xc * log2e
        vroundps    $0, %ymm\n, %ymm\n              // n = roundeven(.)
        vfmadd231ps KV_NLN2HI(\base), %ymm\n, %ymm\t    // r = fma(n, -0.693359375, xc)
        vfmadd231ps KV_LN2LO(\base), %ymm\n, %ymm\t     // r = fma(n, 2.1219444e-4, r)
        vmulps      %ymm\t, %ymm\t, %ymm\r2         // r2 = r * r
        vmovaps     KV_P0(\base), %ymm\y            // p = P0
        vfmadd213ps KV_P1(\base), %ymm\t, %ymm\y    // p = fma(p, r, P1)
        vfmadd213ps KV_P2(\base), %ymm\t, %ymm\y    // p = fma(p, r, P2)
        vfmadd213ps KV_P3(\base), %ymm\t, %ymm\y    // p = fma(p, r, P3)
        vfmadd213ps KV_P4(\base), %ymm\t, %ymm\y    // p = fma(p, r, P4)
        vfmadd213ps KV_P5(\base), %ymm\t, %ymm\y    // p = fma(p, r, P5)
        vfmadd213ps %ymm\t, %ymm\r2, %ymm\y         // p = fma(p, r2, r)
        vaddps      KV_ONE(\base), %ymm\y, %ymm\y   // p = p + 1
        vcvtps2dq   %ymm\n, %ymm\n                  // k = (int)n (n is integral)
        vpsrad      $1, %ymm\n, %ymm\a              // a = k >> 1
        vpsubd      %ymm\a, %ymm\n, %ymm\n          // b = k - a
        vpaddd      KV_BIAS(\base), %ymm\a, %ymm\a
        vpaddd      KV_BIAS(\base), %ymm\n, %ymm\n
        vpslld      $23, %ymm\a, %ymm\a             // 2^a
        vpslld      $23, %ymm\n, %ymm\n             // 2^b
        vmulps      %ymm\a, %ymm\y, %ymm\y          // p * 2^a
        vmulps      %ymm\n, %ymm\y, %ymm\y          // (p * 2^a) * 2^b
        .endm

/*
 * softmax_avx2 x, y, n, base, i, n16, t
 *   y[0..n) = softmax(x[0..n)), n >= 1, y may equal x; the order of docs/kernels.md:
 *     m = hmax16(x)  (lanes start at -inf, m_l = (x_i > m_l) ? x_i : m_l, NaN skipped)
 *     e_i = expf_c(x_i - m) -> y;  s = hsum16(e);  y_i = e_i / s
 *   GPRs: \x, \y, \n, \base (= math_avx2) are preserved; \i, \n16, \t are clobbered.
 *   Clobbers ymm0-15.  Uses local labels 80-89.
 */
        .macro  softmax_avx2 x, y, n, base, i, n16, t
        movq        \n, \n16
        andq        $-16, \n16                      // n16 = n & ~15
        vmovaps     KV_NINF(\base), %ymm0           // m lanes 0-7
        vmovaps     %ymm0, %ymm1                    // m lanes 8-15
        loop16      \i, \n16, 80, 81
        vmovups       (\x,\i,4), %ymm2
        vmovups     32(\x,\i,4), %ymm3
        vmaxps      %ymm0, %ymm2, %ymm0             // m = (x > m) ? x : m
        vmaxps      %ymm1, %ymm3, %ymm1
        loop16_end  \i, \n16, \n, 80, 81, 82
        movq        \n, \t
        subq        \n16, \t
        tail_masks_avx2 14, 15, \t, \base
        vmovaps     KV_NINF(\base), %ymm4
        vmaskmovps    (\x,\i,4), %ymm14, %ymm2
        tail_load_hi \t, 15, 3, 32(\x,\i,4)
        vblendvps   %ymm14, %ymm2, %ymm4, %ymm2     // lanes past the end: -inf
        vblendvps   %ymm15, %ymm3, %ymm4, %ymm3
        vmaxps      %ymm0, %ymm2, %ymm0
        vmaxps      %ymm1, %ymm3, %ymm1
82:
        hmax16_avx2 0, 1, 2
        vbroadcastss %xmm0, %ymm13                  // m

        vmovaps     KV_MIN(\base), %ymm11
        vmovaps     KV_MAX(\base), %ymm12
        vxorps      %ymm0, %ymm0, %ymm0             // s lanes 0-7
        vxorps      %ymm1, %ymm1, %ymm1             // s lanes 8-15
        loop16      \i, \n16, 83, 84
        vmovups       (\x,\i,4), %ymm2
        vmovups     32(\x,\i,4), %ymm3
        vsubps      %ymm13, %ymm2, %ymm2            // x - m
        vsubps      %ymm13, %ymm3, %ymm3
        expf_c_avx2 4, 2, 2, 5, 6, 7, 11, 12, \base
        expf_c_avx2 8, 3, 3, 9, 10, 14, 11, 12, \base
        vmovups     %ymm4,   (\y,\i,4)
        vmovups     %ymm8, 32(\y,\i,4)
        vaddps      %ymm4, %ymm0, %ymm0             // s = s + e
        vaddps      %ymm8, %ymm1, %ymm1
        loop16_end  \i, \n16, \n, 83, 84, 85
        movq        \n, \t
        subq        \n16, \t
        tail_masks_avx2 14, 15, \t, \base
        vmaskmovps    (\x,\i,4), %ymm14, %ymm2
        tail_load_hi \t, 15, 3, 32(\x,\i,4)
        vsubps      %ymm13, %ymm2, %ymm2
        vsubps      %ymm13, %ymm3, %ymm3
        expf_c_avx2 4, 2, 2, 5, 6, 7, 11, 12, \base
        expf_c_avx2 8, 3, 3, 9, 10, 13, 11, 12, \base
        vmaskmovps  %ymm4, %ymm14,   (\y,\i,4)
        tail_store_hi \t, 8, 15, 32(\y,\i,4)
        vandps      %ymm14, %ymm4, %ymm4            // lanes past the end add +0.0
        vandps      %ymm15, %ymm8, %ymm8
        vaddps      %ymm4, %ymm0, %ymm0
        vaddps      %ymm8, %ymm1, %ymm1
85:
        hsum16_avx2 0, 1, 2
        vbroadcastss %xmm0, %ymm13                  // s

        loop16      \i, \n16, 86, 87
        vmovups       (\y,\i,4), %ymm2
        vmovups     32(\y,\i,4), %ymm3
        vdivps      %ymm13, %ymm2, %ymm2            // y = e / s
        vdivps      %ymm13, %ymm3, %ymm3
        vmovups     %ymm2,   (\y,\i,4)
        vmovups     %ymm3, 32(\y,\i,4)
        loop16_end  \i, \n16, \n, 86, 87, 88
        vmaskmovps    (\y,\i,4), %ymm14, %ymm2
        tail_load_hi \t, 15, 3, 32(\y,\i,4)
        vdivps      %ymm13, %ymm2, %ymm2
        vdivps      %ymm13, %ymm3, %ymm3
        vmaskmovps  %ymm2, %ymm14,   (\y,\i,4)
        tail_store_hi \t, 3, 15, 32(\y,\i,4)
88:
        .endm

#endif /* GPT2ASM_X86_MATH_AVX2_H */
