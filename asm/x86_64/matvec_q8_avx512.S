/*
 * asm/x86_64/matvec_q8_avx512.S -- tiled matrix-vector product with int8 weights, AVX-512F.
 *
 * Same contract and the same per-output operation sequence as matvec_q8_avx2.S (docs/kernels.md,
 * gpt2asm_matvec_q8): per output o = 64t + j
 *     acc = +0.0;  for i in 0 .. n_in-1:  acc = fma((float)w[t][i][j], x[i], acc);
 *     p = acc * scale[o];   y[o] = p + b[o]        (y[o] = p when b is NULL)
 * so the outputs are bit-identical to the AVX2 variant.
 *
 * As in matvec_avx512.S the tiles are taken two at a time (8 FMA chains in zmm0-7, each x[i]
 * broadcast once for both tiles, two forward streams n_in rows apart), an odd last tile alone on
 * zmm0-3.  Each 64-byte row of a tile is widened in registers: vpmovsxbd zmm, m128 (16 bytes -> 16
 * int32, AVX-512F) and vcvtdq2ps (exact), then the FMA.  The row loop is unrolled by 4.  Only
 * AVX-512F instructions, only zmm0-15 (the final vzeroupper leaves no dirty upper state).
 *
 * Registers:
 *     rdi  current row of tile t       rax  the same row of tile t+1
 *     rsi  scale (+64*tile_begin)      rdx  x (argument)       rcx  b (+64*tile_begin) or NULL
 *     r8   y (+64*tile_begin)          r9   n_in               r10  x cursor     r11  row counter
 *     rbx  tiles left (saved)
 *     zmm0-3  tile t sums      zmm4-7  tile t+1 sums     zmm8-11  x[i] broadcasts
 *     zmm12-15  widened weights
 */
#include "asm.S"
#include "rows4.h"

        /* one int8 row of \nt tiles (64 bytes each, tile t at \off(%rdi), tile t+1 at \off(%rax)) */
        .macro  row_q8 off, xb, nt
        vwidenfma4  i8, zmm, %rdi, \off+0, 16, \xb, 0, 1, 2, 3
        .if \nt == 2
        vwidenfma4  i8, zmm, %rax, \off+0, 16, \xb, 4, 5, 6, 7
        .endif
        .endm

        /* past \rows rows: rdi (and rax) by 64 bytes a row, the x cursor r10 by 4; again while --r11 */
        .macro  next_rows nt, rows, again
        addq    $64*\rows, %rdi
        .if \nt == 2
        addq    $64*\rows, %rax
        .endif
        addq    $4*\rows, %r10
        decq    %r11
        jnz     \again
        .endm

        /* all n_in rows of \nt tiles from rdi (and rax); leaves rdi (rax) past the last row */
        .macro  tile_rows nt
        .if \nt == 2
        vclear  vpxord, zmm, 4, 5, 6, 7
        .endif
        vclear  vpxord, zmm, 0, 1, 2, 3         // acc = +0.0
        rows4   %rdx, %r9, zmm
        row_q8  0,   %zmm8,  \nt
        row_q8  64,  %zmm9,  \nt
        row_q8  128, %zmm10, \nt
        row_q8  192, %zmm11, \nt
        next_rows \nt, 4, 2b
3:
        movq    %r9, %r11
        andq    $3, %r11                        // n_in % 4 rows left
        jz      5f
4:
        vbroadcastss  0(%r10), %zmm8
        row_q8  0, %zmm8, \nt
        next_rows \nt, 1, 4b
5:
        .endm

        /* p = acc * scale; y = p + b (or p) for \nt tiles; advance scale, b, y past them */
        .macro  store_acc nt
        vmemop  vmulps, %rsi, 0, 64, zmm, 0,1,2,3
        .if \nt == 2
        vmemop  vmulps, %rsi, 256, 64, zmm, 4,5,6,7
        .endif
        addq    $256*\nt, %rsi
        testq   %rcx, %rcx
        jz      8f
        vmemop  vaddps, %rcx, 0, 64, zmm, 0,1,2,3
        .if \nt == 2
        vmemop  vaddps, %rcx, 256, 64, zmm, 4,5,6,7
        .endif
        addq    $256*\nt, %rcx
8:
        vstore  %r8, 0, 64, zmm, 0,1,2,3
        .if \nt == 2
        vstore  %r8, 256, 64, zmm, 4,5,6,7
        .endif
        addq    $256*\nt, %r8
        .endm

/*
 * void gpt2asm_matvec_q8_avx512(const int8_t *w, const float *scale, const float *x, const float *b,
 *                               float *y, size_t n_in, size_t tile_begin, size_t tile_end);
 *
 *   for t in tile_begin .. tile_end-1, j in 0..63, o = 64t + j:
 *       acc = +0.0;  for i in 0 .. n_in-1:  acc = fma((float)w[t][i][j], x[i], acc)
 *       p = acc * scale[o];  y[o] = b ? p + b[o] : p
 *   w: [n_tiles][n_in][64] int8, 64-byte aligned.  scale, x, b, y: any alignment.
 */
function gpt2asm_matvec_q8_avx512
        pushq   %rbx
        movq    16(%rsp), %r10                  // tile_begin
        movq    24(%rsp), %rbx                  // tile_end
        subq    %r10, %rbx                      // tiles
        jbe     9f
        movq    %r10, %r11
        shlq    $8, %r11                        // 256 bytes of scale / b / y per tile
        addq    %r11, %rsi
        addq    %r11, %r8
        testq   %rcx, %rcx
        jz      6f
        addq    %r11, %rcx                      // b += 64 * tile_begin (only if non-NULL)
6:
        imulq   %r9, %r10
        shlq    $6, %r10
        addq    %r10, %rdi                      // w += tile_begin * n_in * 64
        cmpq    $2, %rbx
        jb      7f
        .p2align 4
1:                                              // tiles t, t+1
        movq    %r9, %rax
        shlq    $6, %rax
        addq    %rdi, %rax                      // row 0 of tile t+1
        tile_rows 2
        movq    %rax, %rdi                      // rax is at tile t+2 now
        store_acc 2
        subq    $2, %rbx
        cmpq    $2, %rbx
        jae     1b
7:
        testq   %rbx, %rbx
        jz      9f
        tile_rows 1                             // the odd last tile
        store_acc 1
9:
        popq    %rbx
        vzeroupper
        ret
endfunc
