/*
 * asm/aarch64/matmul_sme2.S -- batched (prefill) matrix-matrix products with SME2 outer products.
 *
 *   void gpt2asm_matmul_f32_sme2(const float *w, const float *x, size_t ldx, const float *b,
 *                                float *y, size_t ldy, size_t n_tokens, size_t n_in,
 *                                size_t tile_begin, size_t tile_end);
 *   void gpt2asm_matmul_f16_sme2(const uint16_t *w, const float *x, size_t ldx, const float *b,
 *                                float *y, size_t ldy, size_t n_tokens, size_t n_in,
 *                                size_t tile_begin, size_t tile_end);
 *
 *     Y[t][o] = sum_i W[o][i] * X[t][i] (+ b[o]),   for n_tokens tokens t and the outputs o of a tile range
 *
 * Same ABI, layout and per-(token, output) operation sequence as gpt2asm_matmul_{f32,f16}_{neon,avx2}
 * (docs/kernels.md, gpt2asm_matmul): with w tiled [n_tiles][n_in][64] (fp32, or binary16 widened
 * exactly)
 *     acc = +0.0;  for i in 0 .. n_in-1:  acc = fma((float)w[t][i][j], X[tok][i], acc)
 *     y = acc + b[o]                   (no b: y = acc)
 * so every row of Y has the bits of the matvec kernels on that row of X (NaN payloads aside, as for
 * gpt2asm_matvec_*_sme2).
 *
 * How (V = SVL / 32 floats a vector; ZA0-ZA3.s are V x V tiles):
 *   `fmopa za0.s, p2/m, p0/m, z0.s, z2.s` adds the outer product of z0 (token t's input i in lane t)
 *   and z2 (V consecutive weights of row i) into ZA0: ZA0[t][o] = fma(x[t][i], w[i][o], ZA0[t][o]),
 *   one rounding per element, in input order -- the contract's chain for V tokens x V outputs at once.
 *   A pass covers V tokens x 2V outputs (ZA0: outputs 0 .. V-1 of the pass, ZA1: V .. 2V-1), so a
 *   64-output tile takes 64 / 2V passes (SVL 512: 2, 256: 4, 128: 8), each over all n_in rows, for each
 *   block of V tokens.  X is row-major (token t's inputs contiguous), the outer product wants a column
 *   (input i of V tokens): each block of V inputs is transposed through ZA2 -- token t's V inputs are
 *   loaded into the vertical slice t of ZA2 (`ld1w {za2v.s[w12, 0]}`), then horizontal slice j of ZA2
 *   is input i0 + j of the block's tokens (`mova z0.s, p0/m, za2h.s[w13, 0]`).
 *   A last block of nv < V tokens loads only nv slices and its outer products are predicated to nv
 *   rows (p2), so rows of other tokens are neither read from X nor written in ZA; a last block of
 *   ni < V inputs loads ni elements a slice (p1) and runs ni rows.  binary16 weights: `ld1h {z.s}` puts
 *   each of V halves into the low half of a 32-bit lane, `fcvt z.s, p0/m, z.h` widens them exactly, in
 *   output order.
 *   After the sums are read out of ZA, per token row: the bias (`fadd`: + b, one rounding), then the row's 2V outputs are stored.
 * Weight traffic: each pass reads its 2V-wide column strip of the tile once per block of V tokens (from
 * L2 after the first block).  Not measured on hardware (qemu only here).
 *
 * Streaming mode: smstart / smstop around the work (ZA dead on entry and exit: no lazy-save protocol);
 * d8-d15, which they zero, are saved on the stack.  Only instructions legal in streaming mode without
 * FEAT_SME_FA64: SVE contiguous loads and stores, fcvt, fadd, whilelo, cntw, ZA loads,
 * mova, fmopa, zero.  SVL 128, 256 and 512 bits (RDSVL); a larger one executes `brk #0x5e2` (Python picks the sme2
 * family only for those three).
 * Memory: reads x[t*ldx + i] for t < n_tokens, i < n_in only, the range's tiles of w and its b
 * [64 tile_begin .. 64 tile_end); writes y[t*ldy + o] for t < n_tokens, 64 tile_begin <= o < 64 tile_end only.  Requires
 * n_in >= 1; n_tokens = 0 or an empty tile range returns at once.  No alignment required.
 *
 * Registers (streaming section):
 *     x0  w: the current tile          x1  X                         x2  ldx in bytes
 *     x3  b of the tile, or 0          x4  y of the tile             x5  ldy in bytes
 *     x6  n_tokens                     x7  n_in                      x8  tiles left
 *     x9  bytes of a weight tile       x10 bytes of a weight row     x12 w12: ZA2 column (token)
 *     x13 w13: ZA2 row (input)         x14 w14: ZA0/1 row (token)    x15 V
 *     x16 X / y cursor                 x19 the pass's byte offset in a weight row
 *     x20 the pass's byte offset in b, y rows                        x21 t0: first token of the block
 *     x22 X row of t0                  x23 y row of t0               x24 i0: first input of the block
 *     x25 weight cursor (row i0 + j, the pass's strip)               x26 nv: tokens in the block
 *     x27 ni: inputs in the block      x28 SVL in bytes
 *     z0  X[t0 ..][i]     z2, z3  the strip's 2V weights of row i     z4, z5  the pass's bias
 *     z6, z7  read-out    p0 all-true .s   p1 the block's inputs   p2 the block's tokens
 * x18 is never touched.
 */
#include "asm.S"

        .arch_extension sme2

        .macro  matmul_sme2 dt
        ldp     x8, x9, [sp]                    // tile_begin, tile_end (stack arguments)
        subs    x9, x9, x8                      // tiles in the range
        b.ls    99f                             // tile_end <= tile_begin: nothing to do
        cbz     x6, 99f                         // no tokens
        stp     x29, x30, [sp, #-160]!
        mov     x29, sp
        callee_x19_x28 stp, 16
        callee_d8_d15 stp, 96                   // smstart / smstop zero v8-v15
        lsl     x2, x2, #2                      // ldx, ldy: floats -> bytes
        lsl     x5, x5, #2
        lsl     x16, x8, #8                     // 64 floats = 256 bytes of b / y per tile
        add     x4, x4, x16                     // y += 64 * tile_begin
        cbz     x3, 1f
        add     x3, x3, x16                     // b += 64 * tile_begin (only if non-NULL)
1:
        mov     x10, #(\dt * 8)                 // bytes of a weight row: 256 (fp32), 128 (fp16)
        mul     x16, x7, x10                    // bytes of a tile: n_in rows
        madd    x0, x8, x16, x0                 // w += tile_begin * tile bytes
        mov     x8, x9                          // tiles left
        mov     x9, x16
        rdsvl   x28, #1                         // SVL in bytes (legal outside streaming mode)
        cmp     x28, #16
        b.lo    98f
        cmp     x28, #64
        b.hi    98f
        smstart                                 // streaming mode + ZA (Z, P and ZA now zero)
        ptrue   p0.s
        cntw    x15                             // V

2:                                              // ---- for each tile
        mov     x19, #0                         // pass offsets
        mov     x20, #0
3:                                              // ---- for each pass: outputs [x20/4, x20/4 + 2V)
        cbz     x3, 4f
        add     x16, x3, x20
        ld1w    {z4.s}, p0/z, [x16]             // the pass's bias
        ld1w    {z5.s}, p0/z, [x16, #1, mul vl]
4:
        mov     x21, #0                         // t0
        mov     x22, x1
        mov     x23, x4
5:                                              // ---- for each block of V tokens
        sub     x26, x6, x21
        cmp     x26, x15
        csel    x26, x26, x15, lo               // nv = min(V, n_tokens - t0)
        whilelo p2.s, xzr, x26
        zero    {za0.s, za1.s}                  // every sum starts at +0.0
        mov     x24, #0                         // i0
        add     x25, x0, x19                    // row 0 of the pass's strip
6:                                              // ---- for each block of V inputs
        sub     x27, x7, x24
        cmp     x27, x15
        csel    x27, x27, x15, lo               // ni = min(V, n_in - i0)
        whilelo p1.s, xzr, x27
        add     x16, x22, x24, lsl #2           // &X[t0][i0]
        mov     w12, #0
7:
        ld1w    {za2v.s[w12, 0]}, p1/z, [x16]   // X[t0 + t][i0 .. i0 + ni) -> column t of ZA2
        add     x16, x16, x2
        add     w12, w12, #1
        cmp     x12, x26
        b.lo    7b
        mov     w13, #0
8:                                              // input i = i0 + j, in order
        mova    z0.s, p0/m, za2h.s[w13, 0]      // X[t0 + t][i] in lane t (lanes t >= nv: not used)
        .if \dt == 32
        ld1w    {z2.s}, p0/z, [x25]             // w[i][strip 0 .. V)
        ld1w    {z3.s}, p0/z, [x25, #1, mul vl] // w[i][strip V .. 2V)
        .elseif \dt == 16
        ld1h    {z2.s}, p0/z, [x25]             // V halves, one in each 32-bit lane
        ld1h    {z3.s}, p0/z, [x25, #1, mul vl]
        fcvt    z2.s, p0/m, z2.h                // widened exactly
        fcvt    z3.s, p0/m, z3.h
        .endif
        add     x25, x25, x10
        fmopa   za0.s, p2/m, p0/m, z0.s, z2.s   // acc[t][o] = fma(x[t][i], w[i][o], acc[t][o])
        fmopa   za1.s, p2/m, p0/m, z0.s, z3.s
        add     w13, w13, #1
        cmp     x13, x27
        b.lo    8b
        add     x24, x24, x15
        cmp     x24, x7
        b.lo    6b
        add     x16, x23, x20                   // y row t0, the pass's outputs
        mov     w14, #0
9:                                              // read out the block's rows
        mova    z6.s, p0/m, za0h.s[w14, 0]
        mova    z7.s, p0/m, za1h.s[w14, 0]
        cbz     x3, 10f
        fadd    z6.s, z6.s, z4.s                // acc + b, one rounding
        fadd    z7.s, z7.s, z5.s
10:
        st1w    {z6.s}, p0, [x16]
        st1w    {z7.s}, p0, [x16, #1, mul vl]
        add     x16, x16, x5
        add     w14, w14, #1
        cmp     x14, x26
        b.lo    9b
        add     x21, x21, x15                   // next block of tokens
        madd    x22, x15, x2, x22
        madd    x23, x15, x5, x23
        cmp     x21, x6
        b.lo    5b
        .if \dt == 32
        add     x19, x19, x28, lsl #1           // next pass: 2V weights further in the row
        .else
        add     x19, x19, x28
        .endif
        add     x20, x20, x28, lsl #1           // ... and 2V floats of b / y
        cmp     x20, #256
        b.lo    3b
        add     x0, x0, x9                      // next tile
        add     x4, x4, #256
        cbz     x3, 11f
        add     x3, x3, #256
11:
        subs    x8, x8, #1
        b.ne    2b
        smstop
        callee_d8_d15 ldp, 96
        callee_x19_x28 ldp, 16
        ldp     x29, x30, [sp], #160
99:
        ret
98:
        brk     #0x5e2                          // SVL > 512 bits: not supported (Python uses NEON)
        .endm

function gpt2asm_matmul_f32_sme2, export=1
        matmul_sme2 32
endfunc

function gpt2asm_matmul_f16_sme2, export=1
        matmul_sme2 16
endfunc
