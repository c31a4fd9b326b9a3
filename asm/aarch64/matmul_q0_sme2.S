/*
 * asm/aarch64/matmul_q0_sme2.S -- q8_0 / q4_0 batched prefill products with SME int8 outer products:
 * gpt2asm_matmul_{q8_0,q4_0}_sme2.  docs/kernels.md "q8_0 / q4_0" is the contract, tests/q0ref.py its numpy model;
 * every (token, output) gets the bits of gpt2asm_matvec_<kind>_{neon,dotprod,sme2} on that token's row:
 *     acc = +0.0;  for b in order:  s = exact int32 block sum;  t = xd[b] * dw;  acc = fma((float)s, t, acc)
 *     y = acc + bias (one fadd, acc first; y = acc without a bias)
 *
 * How (V = SVL / 32: the lanes of a .s vector and the side of a ZA .s tile):
 *   `smopa za0.s, p2/m, p1/m, z0.b, z1.b` adds to ZA0[i][j] the dot of the 4 bytes of lane i of z0 with
 *   the 4 bytes of lane j of z1: z1 = one group g of a record for V consecutive outputs (exactly the
 *   layout: 4 consecutive inputs per output, V outputs = SVL_B bytes), z0 = the same group of V tokens.
 *   A pass is V tokens x V outputs (one chunk c of the tile: outputs cV .. cV+V-1): for each block, the
 *   tokens' 32 bytes of xq are loaded as rows of ZA2 (ZA3 holds words 4-7 at SVL 128), whose vertical
 *   slice g is group g of every token (`mova z0.s, p0/m, za2v.s[w13, g]`); 8 smopa give the block's exact
 *   int32 sums in ZA0; then per token row: the sums (`mova` out), `scvtf` (exact), t = xd[b] * dw (`ld1rw`
 *   of the token's xd[b] times the chunk's `fcvt`-widened binary16 scales), `fmla` into the row's fp32
 *   accumulators, which live in ZA1 (`mova` out and back: acc = fma(s, t, acc), one rounding).  After the
 *   last block: acc + b (`fadd`), stored per token row.
 *   q4_0: the nibbles are decoded to signed weights in registers (`and #0x0f` / `lsr #4`, then `sub #8`).
 *   A last block of nv < V tokens loads only nv rows and its smopa are predicated to nv rows (p2); only
 *   those rows are read out and stored.
 *
 * Streaming mode: smstart / smstop inside the call (ZA dead on entry and exit); d8-d15 saved.  Only
 * instructions legal in streaming mode without FEAT_SME_FA64 (SVE contiguous and load-replicate loads,
 * ZA slice loads / moves, smopa, SVE integer and fp arithmetic); no Advanced SIMD.  SVL 128, 256, 512
 * bits; a larger one executes `brk #0x5e2`.
 *
 * Registers (streaming):
 *     x0 w   x1 xq   x2 ldq   x3 xd   x4 ldd (bytes)   x5 b or 0   x6 y   x7 ldy (bytes)
 *     x8 n_tokens   x9 nb   x10 tile   x11 tile_end   w12 ZA2/3 row (token)   w13 ZA2 column base
 *     w14 ZA0/1 row (token)   x15 scratch   x16 the tile's first record   x17 record cursor
 *     x19 c SVL_B (the chunk's byte offset in a group)   x20 t0   x21 nv   x22 blocks left   x23 SVL_B
 *     x24 scratch address   x25 xq of token t0 at the block   x26 xd of token t0 at the block
 *     x27 4 (64 tile + c V): the chunk's byte offset in a row of b / y   x28 scratch
 *     z0 tokens' group   z1 weights   z2 q4: high nibbles   z8-z11 row scratch   z12 the chunk's dw
 *     p0 all .s   p1 all .b   p2 the block's tokens (.b, 4 nv)   p3 the words of a block row
 */
#include "asm.S"

        .arch_extension sme2

#define REC_Q8 2176
#define REC_Q4 1152

        /* q4_0: P of group g < 4 at x24: low nibbles group g (tokens from \zl, slice \sl), high nibbles
         * group g + 4 (tokens from \zh, slice \sh) */
        .macro  grp4 zl, sl, zh, sh
        ld1b    {z1.b}, p1/z, [x24]
        add     x24, x24, #256
        lsr     z2.b, z1.b, #4
        and     z1.b, z1.b, #0x0f
        sub     z1.b, z1.b, #8                          // signed weights, exact
        sub     z2.b, z2.b, #8
        mova    z0.s, p0/m, za\zl\()v.s[w13, \sl]
        smopa   za0.s, p2/m, p1/m, z0.b, z1.b
        mova    z0.s, p0/m, za\zh\()v.s[w15, \sh]
        smopa   za0.s, p2/m, p1/m, z0.b, z2.b
        .endm

        /* q8_0: group g (tokens from slice \sl of ZA\za's vertical slices at w13), weights at x24 */
        .macro  grp8 za, sl
        mova    z0.s, p0/m, za\za\()v.s[w13, \sl]       // group g of the tokens, lane t = token t0 + t
        ld1b    {z1.b}, p1/z, [x24]                     // group g of the chunk's V outputs
        add     x24, x24, #256
        smopa   za0.s, p2/m, p1/m, z0.b, z1.b
        .endm

        .macro  matmul_q0_sme2 kind, rec
function gpt2asm_matmul_\kind\()_sme2, export=1
        ldp     x8, x9, [sp]                            // n_tokens, n_in
        ldp     x10, x11, [sp, #16]                     // tile_begin, tile_end
        cmp     x10, x11
        b.hs    99f
        cbz     x8, 99f
        lsr     x9, x9, #5                              // nb
        cbz     x9, 99f
        sub     sp, sp, #160
        callee_x19_x28 stp, 0
        callee_d8_d15 stp, 80                           // smstart / smstop zero v8-v15
        lsl     x4, x4, #2                              // ldd, ldy: floats -> bytes
        lsl     x7, x7, #2
        mov     x15, #\rec
        mul     x16, x10, x9
        madd    x16, x16, x15, x0                       // the first record of tile tile_begin
        rdsvl   x23, #1                                 // SVL_B (legal outside streaming mode)
        cmp     x23, #16
        b.lo    98f
        cmp     x23, #64
        b.hi    98f
        smstart
        ptrue   p0.s
        ptrue   p1.b
        lsr     x15, x23, #2                            // V
        mov     x28, #8
        cmp     x15, x28
        csel    x15, x15, x28, lo                       // words of a block row a slice holds: min(V, 8)
        whilelo p3.s, xzr, x15
1:                                                      // ---- for each tile
        mov     x19, #0                                 // chunk c: byte offset c SVL_B
2:                                                      // ---- for each chunk of V outputs
        lsl     x27, x10, #8
        add     x27, x27, x19                           // 4 (64 tile + c V) = 256 tile + c SVL_B
        mov     x20, #0                                 // t0
3:                                                      // ---- for each block of V tokens
        sub     x21, x8, x20
        lsr     x15, x23, #2
        cmp     x21, x15
        csel    x21, x21, x15, lo                       // nv = min(V, n_tokens - t0)
        lsl     x15, x21, #2
        whilelo p2.b, xzr, x15                          // the nv token rows' bytes
        zero    {za1.s}                                 // acc = +0.0
        mov     x17, x16                                // record cursor
        madd    x25, x20, x2, x1                        // xq row t0
        madd    x26, x20, x4, x3                        // xd row t0
        mov     x22, x9
4:                                                      // ---- for each block, in input order
        mov     w12, #0                                 // the tokens' 32 bytes -> rows of ZA2 (/ ZA3)
        mov     x24, x25
5:
        ld1w    {za2h.s[w12, 0]}, p3/z, [x24]
        cmp     x23, #16
        b.ne    6f
        add     x28, x24, #16
        ld1w    {za3h.s[w12, 0]}, p3/z, [x28]           // SVL 128: words 4-7
6:
        add     x24, x24, x2
        add     w12, w12, #1
        cmp     x12, x21
        b.lo    5b
        zero    {za0.s}
        add     x24, x17, #128
        add     x24, x24, x19                           // group 0 of the chunk
        mov     w13, #0
        .ifc \kind, q8_0
        grp8    2, 0
        grp8    2, 1
        grp8    2, 2
        grp8    2, 3
        cmp     x23, #16
        b.eq    7f
        mov     w13, #4
        grp8    2, 0
        grp8    2, 1
        grp8    2, 2
        grp8    2, 3
        b       8f
7:
        grp8    3, 0
        grp8    3, 1
        grp8    3, 2
        grp8    3, 3
        .else
        cmp     x23, #16
        b.eq    7f
        mov     w15, #4
        grp4    2, 0, 2, 0
        grp4    2, 1, 2, 1
        grp4    2, 2, 2, 2
        grp4    2, 3, 2, 3
        b       8f
7:
        mov     w15, #0
        grp4    2, 0, 3, 0
        grp4    2, 1, 3, 1
        grp4    2, 2, 3, 2
        grp4    2, 3, 3, 3
        .endif
8:
        add     x24, x17, x19, lsr #1                   // the chunk's V binary16 scales
        ld1h    {z12.s}, p0/z, [x24]
        fcvt    z12.s, p0/m, z12.h                      // dw, exact
        mov     w14, #0
        mov     x24, x26                                // &xd[t0][b]
9:                                                      // per token row of the block
        mova    z8.s, p0/m, za0h.s[w14, 0]              // s
        mova    z9.s, p0/m, za1h.s[w14, 0]              // acc
        ld1rw   {z10.s}, p0/z, [x24]                    // xd[t][b]
        add     x24, x24, x4
        scvtf   z8.s, p0/m, z8.s                        // exact
        fmul    z10.s, z10.s, z12.s                     // t = xd[b] * dw
        fmla    z9.s, p0/m, z8.s, z10.s                 // acc = fma(s, t, acc)
        mova    za1h.s[w14, 0], p0/m, z9.s
        add     w14, w14, #1
        cmp     x14, x21
        b.lo    9b
        add     x25, x25, #32                           // the next block
        add     x26, x26, #4
        add     x17, x17, #\rec
        subs    x22, x22, #1
        b.ne    4b
        mov     w14, #0                                 // y rows = acc (+ b)
        madd    x24, x20, x7, x6
        add     x24, x24, x27                           // &y[t0][64 tile + c V]
        cbz     x5, 10f
        add     x28, x5, x27
        ld1w    {z11.s}, p0/z, [x28]                    // b of the chunk
10:
        mova    z9.s, p0/m, za1h.s[w14, 0]
        cbz     x5, 11f
        fadd    z9.s, z9.s, z11.s                       // acc + b
11:
        st1w    {z9.s}, p0, [x24]
        add     x24, x24, x7
        add     w14, w14, #1
        cmp     x14, x21
        b.lo    10b
        lsr     x15, x23, #2
        add     x20, x20, x15                           // the next block of tokens
        cmp     x20, x8
        b.lo    3b
        add     x19, x19, x23                           // the next chunk
        cmp     x19, #256
        b.lo    2b
        mov     x15, #\rec                              // the next tile
        madd    x16, x9, x15, x16
        add     x10, x10, #1
        cmp     x10, x11
        b.lo    1b
        smstop
        callee_d8_d15 ldp, 80
        callee_x19_x28 ldp, 0
        add     sp, sp, #160
99:
        ret
98:
        brk     #0x5e2                                  // SVL outside 128..512 bits (Python uses NEON)
endfunc
        .endm

/*
 * void gpt2asm_matmul_q8_0_sme2(const uint8_t *w, const int8_t *xq, size_t ldq, const float *xd,
 *                               size_t ldd, const float *b, float *y, size_t ldy, size_t n_tokens,
 *                               size_t n_in, size_t tile_begin, size_t tile_end);
 * void gpt2asm_matmul_q4_0_sme2(the same);
 *   as gpt2asm_matmul_<kind>_neon (docs/kernels.md "q8_0 / q4_0").
 */
        matmul_q0_sme2 q8_0, REC_Q8
        matmul_q0_sme2 q4_0, REC_Q4
