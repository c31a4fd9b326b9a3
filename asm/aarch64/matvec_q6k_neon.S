/*
 * asm/aarch64/matvec_q6k_neon.S -- the q6_k (llama.cpp Q6_K) matrix-vector product (decode: the LM head of
 * q4_0 models), AArch64 base ARMv8.0 Advanced SIMD: gpt2asm_matvec_q6_k_neon.  docs/kernels.md "q6_k" is
 * the contract, tests/q0ref.py (tile_q6k, matvec_q6k) its numpy model; the tile body (integer path,
 * decoding, fp32 step, registers) is asm/aarch64/q6k_neon.h, run here for one token.
 *
 * Per output o (64 per tile), the tile's super-records streamed once, front to back:
 *     acc = +0.0
 *     for b in 0 .. nb-1:
 *         S0 = sum_{i<16} q[o][32b+i] xq[32b+i],  S1 = sum_{16<=i<32} ...       exact int32 (any order)
 *         s  = sc[o][2b] * S0 + sc[o][2b+1] * S1                                  mul, mla (exact)
 *         t  = xd[b] * d[o][b/8]                  fmul (xd first); d = fcvtl of the binary16
 *         acc = fma((float)s, t, acc)             scvtf (exact), fmla
 *     y[o] = acc + b[o]                           fadd (acc first); y[o] = acc without a bias
 *
 * Registers beyond q6k_neon.h's: x0 w   x1 xq   x2 xd   x3 b (+64 tile_begin) or NULL   x4 y (+64 tile_begin)
 *     x5 n_in   x6 tile_begin   x7 tiles left   x8 nsb = n_in / 256   x9 scratch.  v8-v15 are not used
 *     (one token), so only x19-x28 are saved; the fp32 sums take 256 bytes of stack at sp + ACC6.
 */
#include "asm.S"

#define ACC6 80                 /* x19-x28 at [sp, 0 .. 80), then 64 fp32 sums */
#include "q6k_neon.h"

/*
 * void gpt2asm_matvec_q6_k_neon(const uint8_t *w, const int8_t *xq, const float *xd, const float *b, float *y,
 *                               size_t n_in, size_t tile_begin, size_t tile_end);
 *
 *   y[o] for 64 tile_begin <= o < 64 tile_end by the sequence above; n_in % 256 == 0; w: the tiled
 *   super-records (docs/kernels.md "q6_k"), 64-byte aligned; xq[n_in] (any int8), xd[n_in / 32], b (NULL or
 *   absolute outputs), y: any alignment.  Reads only the super-records of tiles tile_begin .. tile_end-1.
 */
function gpt2asm_matvec_q6_k_neon, export=1
        subs    x7, x7, x6                              // tiles = tile_end - tile_begin ...
        b.ls    9f                                      // ... nothing when tile_end <= tile_begin
        lsr     x8, x5, #8                              // nsb
        cbz     x8, 9f                                  // (n_in < 256: no valid matrix; nothing)
        sub     sp, sp, #(ACC6 + 256)
        callee_x19_x28 stp, 0
        lsl     x9, x6, #8                              // 64 floats = 256 bytes per tile
        add     x4, x4, x9                              // y += 64 tile_begin
        cbz     x3, 1f
        add     x3, x3, x9                              // b += 64 tile_begin (only if non-NULL)
1:
        mul     x9, x6, x8                              // tile_begin * nsb super-records
        mov     x19, #SUPER6
        madd    x19, x9, x19, x0                        // the first super-record of tile tile_begin
        movi    v16.16b, #0x30
        movi    v17.16b, #0x3f
2:                                                      // for each tile
        mov     x23, x1                                 // xq cursor
        mov     x25, x2                                 // xd cursor
        mov     x20, x8
        q6k_tile 1
        add     x13, sp, #ACC6
        mov     x14, #16
        cbz     x3, 8f
3:                                                      // y = acc + b
        ldr     q0, [x13], #16
        ld1     {v1.4s}, [x3], #16
        fadd    v0.4s, v0.4s, v1.4s
        st1     {v0.4s}, [x4], #16
        subs    x14, x14, #1
        b.ne    3b
        b       1f
8:                                                      // y = acc
        ldr     q0, [x13], #16
        st1     {v0.4s}, [x4], #16
        subs    x14, x14, #1
        b.ne    8b
1:
        subs    x7, x7, #1
        b.ne    2b
        callee_x19_x28 ldp, 0
        add     sp, sp, #(ACC6 + 256)
9:
        ret
endfunc
