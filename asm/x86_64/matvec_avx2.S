/*
 * asm/x86_64/matvec_avx2.S -- tiled matrix-vector product, AVX2 + FMA (+ F16C for the fp16 weights).
 *
 * The weights are tiled [n_tiles][n_in][64] (docs/kernels.md, gpt2asm_matvec_f32): one tile is the
 * 64 outputs 64t .. 64t+63, stored input-major, so a tile is one contiguous stream of n_in rows of
 * 64 weights.  The 64 sums of a tile live in ymm0-ymm7 for the whole stream; x[i] is broadcast once
 * per row and multiplied into the 8 accumulators with memory-operand FMAs.  8 independent FMA chains
 * cover the FMA latency (4 cycles x 2 pipes); the kernel is bound by the memory bandwidth, not by the
 * arithmetic.  The row loop is unrolled by 4 to keep the loop overhead out of the way.
 *
 * Per output o = 64t + j the operation sequence is exactly the contract's:
 *     acc = +0.0;  for i in 0 .. n_in-1:  acc = fma(w[t][i][j], x[i], acc);
 *     y[o] = acc + b[o]        (y[o] = acc when b is NULL)
 * and it is the same in matvec_avx512.S, so both variants give bit-identical outputs.
 *
 * Registers (both functions):
 *     rdi  w: current weight row          rsi  x (argument)        rdx  b (+64*tile_begin) or NULL
 *     rcx  y (+64*tile_begin)             r8   n_in                r9   tiles left
 *     r10  x cursor                       r11  row counter
 *     ymm0-7  the 64 accumulators         ymm8-11 x[i] broadcasts  ymm12-15 widened fp16 weights
 */
#include "asm.S"
#include "rows4.h"

/* Prefetch distance in bytes ahead of the row being read (0 disables the software prefetch).  The
 * hardware prefetchers already follow the single forward stream of the tiles (consecutive tiles are
 * contiguous); measured on Zen 4, prefetcht0 of every line 1, 2 or 4 KiB ahead cost 3-20 % of the
 * bandwidth (and unrolling by 8 rows instead of 4 gained nothing), so it is off.  Kept as a knob
 * (-DMATVEC_PF_DIST=4096) for other microarchitectures. */
#ifndef MATVEC_PF_DIST
#  define MATVEC_PF_DIST 0
#endif

/* ---------------------------------------------------------------------------------------------- */
/* shared pieces                                                                                   */

        /* common prologue: tile range -> r9 = tile count, rdi/rdx/rcx advanced to tile_begin.
         * Jumps to \done when the range is empty. */
        .macro  matvec_setup    rowbytes, done
        movq    8(%rsp), %rax                   // tile_end
        subq    %r9, %rax                       // n tiles
        jbe     \done                           // tile_end <= tile_begin: nothing to do
        movq    %r9, %r10
        shlq    $8, %r10                        // 64 floats = 256 bytes of b / y per tile
        addq    %r10, %rcx                      // y += 64 * tile_begin
        testq   %rdx, %rdx
        jz      6f
        addq    %r10, %rdx                      // b += 64 * tile_begin (only if non-NULL)
6:
        movq    %r8, %r10
        imulq   %r9, %r10                       // tile_begin * n_in rows
        shlq    $\rowbytes, %r10                // ... * bytes per row
        addq    %r10, %rdi                      // w += tile_begin * n_in * rowbytes
        movq    %rax, %r9                       // tiles left
        .endm

        /* zero the 8 accumulators (acc = +0.0) */
        .macro  zero_acc
        vzero   0, 1, 2, 3, 4, 5, 6, 7
        .endm

        /* y[0..63] = acc + b[0..63]  (or = acc when b is NULL); then advance b and y by one tile */
        .macro  store_tile
        testq   %rdx, %rdx
        jz      8f
        vmemop  vaddps, %rdx, 0, 32, ymm, 0,1,2,3,4,5,6,7
        addq    $256, %rdx
8:
        vstore  %rcx, 0, 32, ymm, 0,1,2,3,4,5,6,7
        addq    $256, %rcx
        .endm

        /* one fp32 row: acc[k] = fma(w[row][8k .. 8k+7], xb, acc[k]); row at \off(%rdi) */
        .macro  row_f32 off, xb
#if MATVEC_PF_DIST
        prefetcht0 MATVEC_PF_DIST+\off(%rdi)
        prefetcht0 MATVEC_PF_DIST+\off+64(%rdi)
        prefetcht0 MATVEC_PF_DIST+\off+128(%rdi)
        prefetcht0 MATVEC_PF_DIST+\off+192(%rdi)
#endif
        vmemop3 vfmadd231ps, \xb, %rdi, \off+0, 32, ymm, 0,1,2,3,4,5,6,7
        .endm

        /* one fp16 row (128 bytes): widen 8 halves at a time exactly, then the same FMAs */
        .macro  row_f16 off, xb
#if MATVEC_PF_DIST
        prefetcht0 MATVEC_PF_DIST+\off(%rdi)
        prefetcht0 MATVEC_PF_DIST+\off+64(%rdi)
#endif
        vwidenfma4  f16, ymm, %rdi, \off+0, 16, \xb, 0, 1, 2, 3
        vwidenfma4  f16, ymm, %rdi, \off+64, 16, \xb, 4, 5, 6, 7
        .endm

        /* the whole kernel body for one weight type: \row is row_f32 or row_f16, \rs the row size in
         * bytes (256 or 128) and \rb its log2 */
        .macro  matvec_body row, rs, rb
        matvec_setup \rb, 9f
        .p2align 4
1:                                              // for each tile
        zero_acc
        rows4   %rsi, %r8, ymm
        \row    0*\rs, %ymm8
        \row    1*\rs, %ymm9
        \row    2*\rs, %ymm10
        \row    3*\rs, %ymm11
        addq    $4*\rs, %rdi
        rows4_next %r8, ymm
        \row    0, %ymm8
        addq    $\rs, %rdi
        addq    $4, %r10
        decq    %r11
        jnz     4b
5:                                              // rdi now points at the next tile
        store_tile
        decq    %r9
        jnz     1b
9:
        vzeroupper
        ret
        .endm

/* ---------------------------------------------------------------------------------------------- */

/*
 * void gpt2asm_matvec_f32_avx2(const float *w, const float *x, const float *b, float *y,
 *                              size_t n_in, size_t tile_begin, size_t tile_end);
 *
 *   for t in tile_begin .. tile_end-1, j in 0..63, o = 64t + j:
 *       acc = +0.0;  for i in 0 .. n_in-1:  acc = fma(w[t][i][j], x[i], acc)
 *       y[o] = b ? acc + b[o] : acc
 *   w: [n_tiles][n_in][64] floats, 64-byte aligned.  x, b, y: any alignment.
 */
function gpt2asm_matvec_f32_avx2
        matvec_body row_f32, 256, 8
endfunc

/*
 * void gpt2asm_matvec_f16_avx2(const uint16_t *w, const float *x, const float *b, float *y,
 *                              size_t n_in, size_t tile_begin, size_t tile_end);
 *
 *   as gpt2asm_matvec_f32_avx2 with w[t][i][j] binary16, widened exactly (vcvtph2ps) before the FMA:
 *       acc = fma((float)w[t][i][j], x[i], acc)
 *   w: [n_tiles][n_in][64] halves (128 bytes per row), 64-byte aligned.
 */
function gpt2asm_matvec_f16_avx2
        matvec_body row_f16, 128, 7
endfunc
