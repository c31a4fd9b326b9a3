/*
 * asm/x86_64/matvec_avx512.S -- tiled matrix-vector product, AVX-512F.
 *
 * Same contract and the same per-output operation sequence as matvec_avx2.S (docs/kernels.md,
 * gpt2asm_matvec_f32): per output o = 64t + j
 *     acc = +0.0;  for i in 0 .. n_in-1:  acc = fma(w[t][i][j], x[i], acc);
 *     y[o] = acc + b[o]        (y[o] = acc when b is NULL)
 * so the outputs are bit-identical to the AVX2 variant.
 *
 * One tile's 64 sums are only 4 zmm, i.e. 4 dependent FMA chains: too few to cover the FMA latency
 * on a core with two 512-bit FMA pipes.  So the tiles are taken two at a time (tiles t and t+1,
 * 8 chains in zmm0-7, each x[i] broadcast once for both); the two tiles are two forward streams
 * n_in rows apart.  An odd last tile runs alone on zmm0-3.  The row loop is unrolled by 4.
 * Only AVX-512F instructions are used, and only zmm0-15 (nothing is left in zmm16-31, so the final
 * vzeroupper leaves no dirty upper state behind).
 *
 * Registers (both functions):
 *     rdi  w: current row of tile t                         rax  the same row of tile t+1
 *     rsi  x (argument)        rdx  b (+64*tile_begin) or NULL        rcx  y (+64*tile_begin)
 *     r8   n_in                r9   tiles left       r10  x cursor     r11  row counter
 *     zmm0-3  tile t sums      zmm4-7  tile t+1 sums     zmm8-11  x[i] broadcasts
 *     zmm12-15  widened fp16 weights
 */
#include "asm.S"
#include "rows4.h"

/* ---------------------------------------------------------------------------------------------- */
/* shared pieces                                                                                   */

        /* common prologue: r9 = tile count, rdi/rdx/rcx advanced to tile_begin.
         * Jumps to \done when the range is empty.  \rb: log2 of the row size in bytes. */
        .macro  matvec_setup    rb, done
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
        shlq    $\rb, %r10                      // ... * bytes per row
        addq    %r10, %rdi                      // w += tile_begin * n_in * row
        movq    %rax, %r9                       // tiles left
        .endm

        /* acc = +0.0 for \nt tiles (1 or 2) */
        .macro  zero_acc nt
        vclear  vpxord, zmm, 0, 1, 2, 3
        .if \nt == 2
        vclear  vpxord, zmm, 4, 5, 6, 7
        .endif
        .endm

        /* y[64k .. 64k+63] = acc + b[...] (or = acc when b is NULL) for the \nt tiles, then advance
         * b and y past them */
        .macro  store_acc nt
        testq   %rdx, %rdx
        jz      8f
        vmemop  vaddps, %rdx, 0, 64, zmm, 0,1,2,3
        .if \nt == 2
        vmemop  vaddps, %rdx, 256, 64, zmm, 4,5,6,7
        .endif
        addq    $256*\nt, %rdx
8:
        vstore  %rcx, 0, 64, zmm, 0,1,2,3
        .if \nt == 2
        vstore  %rcx, 256, 64, zmm, 4,5,6,7
        .endif
        addq    $256*\nt, %rcx
        .endm

        /* one fp32 row of \nt tiles: acc[k] = fma(w[t][row][16k .. 16k+15], xb, acc[k]);
         * tile t's row at \off(%rdi), tile t+1's at \off(%rax) */
        .macro  row_f32 off, xb, nt
        vmemop3 vfmadd231ps, \xb, %rdi, \off+0, 64, zmm, 0,1,2,3
        .if \nt == 2
        vmemop3 vfmadd231ps, \xb, %rax, \off+0, 64, zmm, 4,5,6,7
        .endif
        .endm

        /* one fp16 row (128 bytes per tile): widen 16 halves at a time exactly, then the same FMAs */
        .macro  row_f16 off, xb, nt
        vwidenfma4  f16, zmm, %rdi, \off+0, 32, \xb, 0, 1, 2, 3
        .if \nt == 2
        vwidenfma4  f16, zmm, %rax, \off+0, 32, \xb, 4, 5, 6, 7
        .endif
        .endm

        /* all n_in rows of \nt tiles starting at rdi (and rax) (\row: row_f32 / row_f16, \rs: row
         * bytes); leaves rdi (rax) just past the last row of tile t (t+1), the sums in zmm0-7 */
        .macro  tile_rows row, rs, nt
        rows4   %rsi, %r8, zmm
        \row    0*\rs, %zmm8,  \nt
        \row    1*\rs, %zmm9,  \nt
        \row    2*\rs, %zmm10, \nt
        \row    3*\rs, %zmm11, \nt
        addq    $4*\rs, %rdi
        .if \nt == 2
        addq    $4*\rs, %rax
        .endif
        rows4_next %r8, zmm
        \row    0, %zmm8, \nt
        addq    $\rs, %rdi
        .if \nt == 2
        addq    $\rs, %rax
        .endif
        addq    $4, %r10
        decq    %r11
        jnz     4b
5:
        .endm

        /* the whole kernel for one weight type (\rb = log2 \rs) */
        .macro  matvec_body row, rs, rb
        matvec_setup \rb, 9f
        cmpq    $2, %r9
        jb      7f
        .p2align 4
1:                                              // tiles t, t+1
        zero_acc 2
        movq    %r8, %rax
        shlq    $\rb, %rax                      // tile size = n_in * row
        addq    %rdi, %rax                      // row 0 of tile t+1
        tile_rows \row, \rs, 2
        movq    %rax, %rdi                      // rax is at tile t+2 now
        store_acc 2
        subq    $2, %r9
        cmpq    $2, %r9
        jae     1b
7:
        testq   %r9, %r9
        jz      9f
        zero_acc 1                              // the odd last tile
        tile_rows \row, \rs, 1
        store_acc 1
9:
        vzeroupper
        ret
        .endm

/* ---------------------------------------------------------------------------------------------- */

/*
 * void gpt2asm_matvec_f32_avx512(const float *w, const float *x, const float *b, float *y,
 *                                size_t n_in, size_t tile_begin, size_t tile_end);
 *
 *   for t in tile_begin .. tile_end-1, j in 0..63, o = 64t + j:
 *       acc = +0.0;  for i in 0 .. n_in-1:  acc = fma(w[t][i][j], x[i], acc)
 *       y[o] = b ? acc + b[o] : acc
 *   w: [n_tiles][n_in][64] floats, 64-byte aligned.  x, b, y: any alignment.
 */
function gpt2asm_matvec_f32_avx512
        matvec_body row_f32, 256, 8
endfunc

/*
 * void gpt2asm_matvec_f16_avx512(const uint16_t *w, const float *x, const float *b, float *y,
 *                                size_t n_in, size_t tile_begin, size_t tile_end);
 *
 *   as gpt2asm_matvec_f32_avx512 with w[t][i][j] binary16, widened exactly (vcvtph2ps) before the FMA:
 *       acc = fma((float)w[t][i][j], x[i], acc)
 *   w: [n_tiles][n_in][64] halves (128 bytes per row), 64-byte aligned.
 */
function gpt2asm_matvec_f16_avx512
        matvec_body row_f16, 128, 7
endfunc
