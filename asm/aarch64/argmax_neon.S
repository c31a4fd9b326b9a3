/*
 * asm/aarch64/argmax_neon.S -- greedy sampling: index of the first maximum, AArch64 Advanced SIMD
 * (4 lanes, 16 elements per iteration in four independent sets).
 *
 * The algorithm of asm/x86_64/argmax_avx2.S; the result is the same on every ISA (exact: comparisons
 * only).  The last 1..3 elements are loaded lane by lane (ld1 {v.s}[j]), so nothing outside x[0..n) is
 * read.  Uses v0-v7 and v16-v26 only (no callee-saved d8-d15), no stack, and never x18.
 */
#include "asm.S"

const argmax_neon, 4
        .long   0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15   // lane j of set k: 4k + j
        .long   -1, -1, -1, -1, 0, 0, 0, 0                             // the first r lanes at 16 - 4r
endconst

/*
 * size_t gpt2asm_argmax_f32_neon(const float *x, size_t n);
 *
 *   the smallest i with x[i] == max x (numpy.argmax), or SIZE_MAX if some x[i] is NaN or +-inf
 *   (or n == 0).  n < 2^31.
 *
 * Registers: v16-v19 running max of sets 0-3, v20-v23 their positions (uint32; set k lane j holds the
 * element position + 4k + j), v24 the current position (all lanes), v25 its increment, v26 the OR of
 * every v - v (+0.0 for finite v, NaN otherwise); v0-v3 loads, v4-v7 compare masks.
 *
 * Per vector: mask = fcmgt(v, m) (v > m: a NaN never wins, -0.0 and +0.0 are equal); m = fmax(m, v);
 * idx = bit(pos, mask).  fmax differs from (v > m) ? v : m only for NaN (then the result is SIZE_MAX
 * anyway) and for +-0 against -+0 (then it may hold the other zero, which compares the same), so m
 * always compares like the running maximum and idx is the first position of it.
 */
function gpt2asm_argmax_f32_neon, export=1
        cbz     x1, 9f
        mov     w9, #0xff800000                         // -inf
        dup     v16.4s, w9
        mov     v17.16b, v16.16b
        mov     v18.16b, v16.16b
        mov     v19.16b, v16.16b
        movi    v20.4s, #0
        movi    v21.4s, #0
        movi    v22.4s, #0
        movi    v23.4s, #0
        movi    v24.4s, #0
        movi    v25.4s, #16
        movi    v26.4s, #0
        lsr     x10, x1, #4                             // 16-element blocks
        cbz     x10, 2f
1:
        ld1     {v0.4s - v3.4s}, [x0], #64
        fcmgt   v4.4s, v0.4s, v16.4s
        fcmgt   v5.4s, v1.4s, v17.4s
        fcmgt   v6.4s, v2.4s, v18.4s
        fcmgt   v7.4s, v3.4s, v19.4s
        fmax    v16.4s, v16.4s, v0.4s
        fmax    v17.4s, v17.4s, v1.4s
        fmax    v18.4s, v18.4s, v2.4s
        fmax    v19.4s, v19.4s, v3.4s
        bit     v20.16b, v24.16b, v4.16b
        bit     v21.16b, v24.16b, v5.16b
        bit     v22.16b, v24.16b, v6.16b
        bit     v23.16b, v24.16b, v7.16b
        fsub    v0.4s, v0.4s, v0.4s
        fsub    v1.4s, v1.4s, v1.4s
        fsub    v2.4s, v2.4s, v2.4s
        fsub    v3.4s, v3.4s, v3.4s
        orr     v0.16b, v0.16b, v1.16b
        orr     v2.16b, v2.16b, v3.16b
        orr     v26.16b, v26.16b, v0.16b
        orr     v26.16b, v26.16b, v2.16b
        add     v24.4s, v24.4s, v25.4s                  // pos += 16
        subs    x10, x10, #1
        b.ne    1b
2:                                                      // whole vectors left (0..3): into set 0
        movi    v25.4s, #4
        ubfx    x10, x1, #2, #2
        cbz     x10, 4f
3:
        ld1     {v0.4s}, [x0], #16
        fcmgt   v4.4s, v0.4s, v16.4s
        fmax    v16.4s, v16.4s, v0.4s
        bit     v20.16b, v24.16b, v4.16b
        fsub    v0.4s, v0.4s, v0.4s
        orr     v26.16b, v26.16b, v0.16b
        add     v24.4s, v24.4s, v25.4s                  // pos += 4
        subs    x10, x10, #1
        b.ne    3b
4:                                                      // 1..3 left: lane by lane, into set 0
        movrel  x12, argmax_neon
        ands    x11, x1, #3
        b.eq    5f
        movi    v0.4s, #0                               // the other lanes: +0.0
        ld1     {v0.s}[0], [x0], #4
        cmp     x11, #2
        b.lo    6f
        ld1     {v0.s}[1], [x0], #4
        b.eq    6f
        ld1     {v0.s}[2], [x0]
6:
        sub     x13, x12, x11, lsl #2
        ldr     q5, [x13, #80]                          // the first r lanes (64 + 16 - 4r)
        fcmgt   v4.4s, v0.4s, v16.4s
        and     v4.16b, v4.16b, v5.16b                  // v > m, in a lane of x
        bit     v16.16b, v0.16b, v4.16b
        bit     v20.16b, v24.16b, v4.16b
        fsub    v0.4s, v0.4s, v0.4s                     // +0.0 in the other lanes
        orr     v26.16b, v26.16b, v0.16b
5:                                                      // reduce
        umaxv   s0, v26.4s
        fmov    w9, s0
        cbnz    w9, 9f                                  // some v - v was not +0.0: NaN or inf
        ld1     {v0.4s - v3.4s}, [x12]
        add     v20.4s, v20.4s, v0.4s                   // element indices
        add     v21.4s, v21.4s, v1.4s
        add     v22.4s, v22.4s, v2.4s
        add     v23.4s, v23.4s, v3.4s
        fmax    v0.4s, v16.4s, v17.4s                   // the maximum (no NaN left: any order)
        fmax    v1.4s, v18.4s, v19.4s
        fmax    v0.4s, v0.4s, v1.4s
        fmaxv   s0, v0.4s
        dup     v0.4s, v0.s[0]                          // m
        fcmeq   v4.4s, v16.4s, v0.4s                    // lanes holding m (-0.0 == +0.0)
        fcmeq   v5.4s, v17.4s, v0.4s
        fcmeq   v6.4s, v18.4s, v0.4s
        fcmeq   v7.4s, v19.4s, v0.4s
        orn     v4.16b, v20.16b, v4.16b                 //   their index, else UINT32_MAX
        orn     v5.16b, v21.16b, v5.16b
        orn     v6.16b, v22.16b, v6.16b
        orn     v7.16b, v23.16b, v7.16b
        umin    v4.4s, v4.4s, v5.4s                     // the smallest index
        umin    v6.4s, v6.4s, v7.4s
        umin    v4.4s, v4.4s, v6.4s
        uminv   s0, v4.4s
        fmov    w0, s0                                  // zero-extended into x0
        ret
9:
        mov     x0, #-1                                 // SIZE_MAX
        ret
endfunc
