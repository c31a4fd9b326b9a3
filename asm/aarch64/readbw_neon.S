/*
 * asm/aarch64/readbw_neon.S -- streaming-read bandwidth probe (not a model kernel).
 *
 * The benchmark baseline of `make bench` on Arm, as asm/x86_64/readbw_avx2.S is on x86-64: the fastest
 * one core can pull a buffer through the load ports, with the access pattern of a weight tile (one
 * forward stream, 256 bytes per iteration) and next to no arithmetic.
 */
#include "asm.S"

/*
 * float gpt2asm_readbw_f32_neon(const float *p, size_t n);
 *
 *   returns a sum of p[0 .. n-1] (in an unspecified order: the result only keeps the loads alive).
 *   n is a multiple of 64 (n = 0 returns 0); p is 16-byte aligned (64 in practice).
 *
 *   x0  p cursor       x1  blocks of 64 floats left       v0-v7  8 independent sums   v16-v31 loads
 */
function gpt2asm_readbw_f32_neon, export=1
        movi    v0.4s, #0
        movi    v1.4s, #0
        movi    v2.4s, #0
        movi    v3.4s, #0
        movi    v4.4s, #0
        movi    v5.4s, #0
        movi    v6.4s, #0
        movi    v7.4s, #0
        lsr     x1, x1, #6                      // blocks of 64 floats (256 bytes)
        cbz     x1, 2f
1:
        ld1     {v16.4s, v17.4s, v18.4s, v19.4s}, [x0], #64
        ld1     {v20.4s, v21.4s, v22.4s, v23.4s}, [x0], #64
        ld1     {v24.4s, v25.4s, v26.4s, v27.4s}, [x0], #64
        ld1     {v28.4s, v29.4s, v30.4s, v31.4s}, [x0], #64
        fadd    v0.4s, v0.4s, v16.4s
        fadd    v1.4s, v1.4s, v17.4s
        fadd    v2.4s, v2.4s, v18.4s
        fadd    v3.4s, v3.4s, v19.4s
        fadd    v4.4s, v4.4s, v20.4s
        fadd    v5.4s, v5.4s, v21.4s
        fadd    v6.4s, v6.4s, v22.4s
        fadd    v7.4s, v7.4s, v23.4s
        fadd    v0.4s, v0.4s, v24.4s
        fadd    v1.4s, v1.4s, v25.4s
        fadd    v2.4s, v2.4s, v26.4s
        fadd    v3.4s, v3.4s, v27.4s
        fadd    v4.4s, v4.4s, v28.4s
        fadd    v5.4s, v5.4s, v29.4s
        fadd    v6.4s, v6.4s, v30.4s
        fadd    v7.4s, v7.4s, v31.4s
        subs    x1, x1, #1
        b.ne    1b
2:
        fadd    v0.4s, v0.4s, v1.4s             // fold the 8 sums to one float
        fadd    v2.4s, v2.4s, v3.4s
        fadd    v4.4s, v4.4s, v5.4s
        fadd    v6.4s, v6.4s, v7.4s
        fadd    v0.4s, v0.4s, v2.4s
        fadd    v4.4s, v4.4s, v6.4s
        fadd    v0.4s, v0.4s, v4.4s
        faddp   v0.4s, v0.4s, v0.4s
        faddp   s0, v0.2s                       // return value in s0
        ret
endfunc
