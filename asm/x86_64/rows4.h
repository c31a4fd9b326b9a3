/*
 * asm/x86_64/rows4.h -- the head of the f32 / f16 matrix-vector kernels' row loop (matvec_avx2.S,
 * matvec_avx512.S): the rows of a tile go by blocks of 4, in input
 * order, each block's 4 inputs x[r .. r+3] broadcast once.
 *
 *     rows4 x, n, v   r10 = \x (the x cursor), r11 = \n / 4 (blocks of 4 rows; none: on to 3f); then at
 *                     label 2 (the block loop, closed by rows4_next) %\v 8 .. 11 =
 *                     x[0], x[1], x[2], x[3] of the block (\v: ymm or zmm)
 *     rows4_next n, v  the block loop's end: x cursor on, back to 2 while blocks are left; then at 3 r11 =
 *                     \n % 4 rows left (none: on to 5f), and at label 4 (the row loop, closed by the caller
 *                     with `jnz 4b`) %\v 8 = the row's input
 */
#ifndef GPT2ASM_X86_ROWS4_H
#define GPT2ASM_X86_ROWS4_H

        .macro  rows4 x, n, v
        movq    \x, %r10                        // x cursor
        movq    \n, %r11
        shrq    $2, %r11                        // n_in / 4 blocks of 4 rows
        jz      3f
        .p2align 4
2:                                              // 4 rows, in input order
        vbroadcastss  0(%r10), %\v\()8
        vbroadcastss  4(%r10), %\v\()9
        vbroadcastss  8(%r10), %\v\()10
        vbroadcastss 12(%r10), %\v\()11
        .endm

        .macro  rows4_next n, v
        addq    $16, %r10
        decq    %r11
        jnz     2b
3:
        movq    \n, %r11
        andq    $3, %r11                        // n_in % 4 rows left
        jz      5f
4:
        vbroadcastss  0(%r10), %\v\()8
        .endm

#endif
