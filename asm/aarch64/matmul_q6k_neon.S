/*
 * asm/aarch64/matmul_q6k_neon.S -- the q6_k (llama.cpp Q6_K) batched products (prefill: the LM head of q4_0
 * models), AArch64 base ARMv8.0 Advanced SIMD: gpt2asm_matmul_q6_k_neon.  docs/kernels.md "q6_k" is the
 * contract, tests/q0ref.py (tile_q6k, matvec_q6k) its numpy model: every (token, output) gets exactly the
 * operation sequence (and so the bits) of gpt2asm_matvec_q6_k_neon on that token's row:
 *     acc = +0.0;  for b in order:  s = sc0 S0 + sc1 S1 (exact int32);  t = xd[b] * d;  acc = fma((float)s, t, acc)
 *     y = acc + bias (fadd, acc first; y = acc without a bias)
 *
 * Register blocking: 2 tokens x the whole tile.  For each tile and each pair of tokens the tile's
 * super-records are streamed front to back (the body of asm/aarch64/q6k_neon.h with ntok = 2): each
 * output vector's weights are decoded once and dotted with both tokens' xq; the 2 x 64 fp32 sums live on
 * the stack.  A tile's super-records stay in cache between its token pairs.  An odd last token runs as a
 * pair with itself; only its first row is stored.
 *
 * Registers beyond q6k_neon.h's: x0 token A's xq row   x1 xq   x2 ldq (bytes)   x3 xd   x4 ldd (bytes)
 *     x5 b or NULL   x6 y   x7 ldy (bytes)   x8 n_tokens   x9 nsb   x10 tile   x11 tile_end
 *     x12 the tile's first super-record   x27 token A   x28 token A's xd row
 *     store: x13 sums cursor   x14 token B is real   x15 &y[A][64 tile]   x16 &b[64 tile]   x17 count
 */
#include "asm.S"

#define ACC6 144                /* x19-x28 at [sp, 0 .. 80), d8-d15 at [80, 144), then 2 x 64 fp32 sums */
#include "q6k_neon.h"

/*
 * void gpt2asm_matmul_q6_k_neon(const uint8_t *w, const int8_t *xq, size_t ldq, const float *xd, size_t ldd,
 *                               const float *b, float *y, size_t ldy, size_t n_tokens, size_t n_in,
 *                               size_t tile_begin, size_t tile_end);
 *
 *   for t < n_tokens and 64 tile_begin <= o < 64 tile_end: y[t ldy + o] = the matvec sequence on token
 *   t's row (xq[t ldq + i], xd[t ldd + b]).  n_in % 256 == 0; w: the tiled super-records, 64-byte aligned;
 *   xq (any int8), xd, b (NULL or absolute outputs), y: any alignment.  Reads only the super-records of
 *   tiles tile_begin .. tile_end-1 and the n_tokens rows; n_tokens = 0 or an empty tile range does nothing.
 */
function gpt2asm_matmul_q6_k_neon, export=1
        ldp     x8, x9, [sp]                            // n_tokens, n_in
        ldp     x10, x11, [sp, #16]                     // tile_begin, tile_end
        cmp     x10, x11
        b.hs    9f                                      // an empty tile range
        cbz     x8, 9f                                  // no tokens
        lsr     x9, x9, #8                              // nsb
        cbz     x9, 9f
        sub     sp, sp, #(ACC6 + 512)
        callee_x19_x28 stp, 0
        callee_d8_d15 stp, 80
        lsl     x4, x4, #2                              // ldd, ldy: floats -> bytes
        lsl     x7, x7, #2
        mov     x15, #SUPER6
        mul     x12, x10, x9
        madd    x12, x12, x15, x0                       // the first super-record of tile tile_begin
        movi    v16.16b, #0x30
        movi    v17.16b, #0x3f
1:                                                      // for each tile
        mov     x27, #0                                 // token A
        mov     x0, x1
        mov     x28, x3
2:                                                      // for each pair of tokens (A, B)
        add     x15, x27, #1
        cmp     x15, x8
        cset    x14, lo                                 // token B exists?
        mov     x23, x0                                 // token A's cursors
        mov     x25, x28
        mov     x24, x0                                 // token B's: A's row (an odd last token) ...
        mov     x26, x28
        cbz     x14, 3f
        add     x24, x0, x2                             // ... or the next row
        add     x26, x28, x4
3:
        mov     x19, x12
        mov     x20, x9
        q6k_tile 2
        add     x15, x27, #1                            // (x14 was the tile body's)
        cmp     x15, x8
        cset    x14, lo
        lsl     x16, x10, #8                            // 64 floats of a tile = 256 bytes
        add     x15, x6, x16
        madd    x15, x27, x7, x15                       // &y[A][64 tile]
        add     x16, x5, x16                            // &b[64 tile] (unused when b is NULL)
        add     x13, sp, #ACC6
        mov     x17, #16
4:                                                      // for each output vector: y = acc (+ b)
        ldp     q0, q1, [x13], #32                      // token A's, token B's
        cbz     x5, 5f
        ld1     {v2.4s}, [x16], #16
        fadd    v0.4s, v0.4s, v2.4s
        fadd    v1.4s, v1.4s, v2.4s
5:
        st1     {v0.4s}, [x15]
        cbz     x14, 6f
        str     q1, [x15, x7]
6:
        add     x15, x15, #16
        subs    x17, x17, #1
        b.ne    4b
        add     x27, x27, #2                            // the next pair of tokens
        add     x0, x0, x2, lsl #1
        add     x28, x28, x4, lsl #1
        cmp     x27, x8
        b.lo    2b
        mov     x12, x19                                // the next tile (the body left x19 there)
        add     x10, x10, #1
        cmp     x10, x11
        b.lo    1b
        callee_d8_d15 ldp, 80
        callee_x19_x28 ldp, 0
        add     sp, sp, #(ACC6 + 512)
9:
        ret
endfunc
