/*
 * asm/aarch64/fmapeak_neon.S -- FMA throughput probe (not a model kernel).
 *
 * The compute baseline of `make bench` on Arm, as asm/x86_64/fmapeak_avx2.S is on x86-64: 16 independent
 * chains of 4 lanes, register operands only, enough to cover the FMA latency of 4 pipes x 4 cycles
 * (Neoverse V1/V2), so the loop runs at the core's NEON FMA issue rate.
 */
#include "asm.S"

/*
 * float gpt2asm_fmapeak_f32_neon(size_t n);
 *
 *   n iterations of 16 fmla (64 fp32 FMAs, 128 flop each): acc_c = fma(1.0f, 1.0f, acc_c) for the 16
 *   chains c, from acc_c = +0.0; returns lane 0 of chain 0, = (float)n (exact for n <= 2^24).
 *
 *   x0  iterations left        v16-v31  the 16 chains (v8-v15 are callee-saved)        v1  1.0f
 */
function gpt2asm_fmapeak_f32_neon, export=1
        movi    v16.4s, #0
        movi    v17.4s, #0
        movi    v18.4s, #0
        movi    v19.4s, #0
        movi    v20.4s, #0
        movi    v21.4s, #0
        movi    v22.4s, #0
        movi    v23.4s, #0
        movi    v24.4s, #0
        movi    v25.4s, #0
        movi    v26.4s, #0
        movi    v27.4s, #0
        movi    v28.4s, #0
        movi    v29.4s, #0
        movi    v30.4s, #0
        movi    v31.4s, #0
        fmov    v1.4s, #1.0
        cbz     x0, 2f
1:
        fmla    v16.4s, v1.4s, v1.4s
        fmla    v17.4s, v1.4s, v1.4s
        fmla    v18.4s, v1.4s, v1.4s
        fmla    v19.4s, v1.4s, v1.4s
        fmla    v20.4s, v1.4s, v1.4s
        fmla    v21.4s, v1.4s, v1.4s
        fmla    v22.4s, v1.4s, v1.4s
        fmla    v23.4s, v1.4s, v1.4s
        fmla    v24.4s, v1.4s, v1.4s
        fmla    v25.4s, v1.4s, v1.4s
        fmla    v26.4s, v1.4s, v1.4s
        fmla    v27.4s, v1.4s, v1.4s
        fmla    v28.4s, v1.4s, v1.4s
        fmla    v29.4s, v1.4s, v1.4s
        fmla    v30.4s, v1.4s, v1.4s
        fmla    v31.4s, v1.4s, v1.4s
        subs    x0, x0, #1
        b.ne    1b
2:
        mov     v0.16b, v16.16b                 // s0 = lane 0 of chain 0 = n: the return value
        ret
endfunc
