/*
 * asm/x86_64/matvec_q0.h -- the driver of the q8_0 / q4_0 (and q6_k: mv_q0's trec / halves) decode
 * kernels, shared by matvec_q0_avx2.S and matvec_q0_avx512.S: argument set-up, the per-call table of
 * block corrections, the tile loop and the block loop; the including file supplies the ISA's macros
 *     q0_consts   rbx = its constant block           q0_zero    zero the tile's 64 fp32 sums
 *     \blk        one record (64 outputs x 32 inputs: the int32 sums, then acc = fma((float)s, t, acc))
 *     q0_store    y = acc + b (or acc when b is NULL) for the tile's 64 outputs, from rcx / r8
 *     q0_exit     return;   Q0_SPILL: bytes of fp32 sums kept in memory (0: none), at r12
 *
 * The block correction (docs/kernels.md "q8_0 / q4_0", "x86-64"): kernels whose dot instruction needs an unsigned
 * operand and that feed it a biased one (q4_0's nibbles u = w + 8; VNNI q8_0's w ^ 0x80 = w + 128) get
 * sum_i u_i * xq_i = s + c * sum_i xq_i with c = 8 or 128; the driver stores -c * sum(xq of block b)
 * (exact int32) for every block once per call in an aligned stack table, and the block macro starts
 * its int32 sums from it.  (vpsadbw of xq ^ 0x80 against zero: sum(xq + 128) over 8 bytes a qword.)
 *
 * Registers (the block macros use only these and vector registers):
 *     rdi  w: the current record           rsi  xq                  rdx  xd
 *     rcx  b (+64*tile) or NULL            r8   y (+64*tile)        r9   nb = n_in / 32
 *     r10  tiles left                      r11  block index b       rax  xq + 32*b
 *     rbx  constants                       r12  the spilled sums (scratch before the tiles)
 *     rbp  frame (rsp: the table, then Q0_SPILL bytes, each 64-byte aligned)
 */
#ifndef GPT2ASM_X86_MATVEC_Q0_H
#define GPT2ASM_X86_MATVEC_Q0_H

        /* the whole kernel: \rec record bytes (the block step), \csh = log2(c) of the correction (0: none);
           q6_k (\trec = 1680, \halves = 1): a tile is nb * \trec bytes (its super-records' headers
           included: the block macro widens the d's and steps rdi over a header at every 8th block), and
           the table has two entries per block, -c * sum(xq) over each half of 16 inputs, at 8b and 8b + 4
           (\csh0 >= 0: c = 2^csh0 for the first half) */
        .macro  mv_q0 rec, csh, blk, trec=0, halves=0, csh0=-1
        .if \trec
        .set    MV_TREC\@, \trec
        .else
        .set    MV_TREC\@, \rec
        .endif
        movq    8(%rsp), %r10                   // tile_begin
        movq    16(%rsp), %rax                  // tile_end
        pushq   %rbp
        movq    %rsp, %rbp
        pushq   %rbx
        pushq   %r12
        subq    %r10, %rax                      // tiles
        jbe     .Lret\@
        shrq    $5, %r9                         // nb
        movq    %r10, %r11
        shlq    $8, %r11                        // 64 floats of y / b per tile
        addq    %r11, %r8
        testq   %rcx, %rcx
        jz      1f
        addq    %r11, %rcx
1:
        imulq   %r9, %r10
        imulq   $MV_TREC\@, %r10, %r10
        addq    %r10, %rdi                      // w += tile_begin * nb records
        movq    %rax, %r10
        q0_consts
        .if Q0_SPILL
        subq    $Q0_SPILL, %rsp                 // the spilled fp32 sums, 64-byte aligned, above the table
        andq    $-64, %rsp
        .endif
        .if \csh
        leaq    63(,%r9,4*(1+\halves)), %rax
        andq    $-64, %rax
        subq    %rax, %rsp                      // the table: nb int32 (halves: 2 nb), 64-byte aligned
        andq    $-64, %rsp
        vpbroadcastd Q0_K80(%rbx), %ymm1
        vpxor   %xmm0, %xmm0, %xmm0
        movq    %rsi, %rax
        xorl    %r11d, %r11d
2:
        cmpq    %r9, %r11
        jae     3f
        vpxor   (%rax), %ymm1, %ymm2            // xq + 128 (unsigned)
        vpsadbw %ymm0, %ymm2, %ymm2             // 4 qwords: sums of 8
        .if \halves
        vextracti128 $1, %ymm2, %xmm3
        vpshufd $0x4e, %xmm2, %xmm4
        vpaddq  %xmm4, %xmm2, %xmm2             // sum(xq + 128) of inputs 0-15
        vpshufd $0x4e, %xmm3, %xmm4
        vpaddq  %xmm4, %xmm3, %xmm3             // of inputs 16-31
        vmovd   %xmm2, %r12d
        negl    %r12d
        addl    $2048, %r12d                    // -sum(xq of the half)
        .if \csh0 >= 0
        shll    $\csh0, %r12d
        .else
        shll    $\csh, %r12d
        .endif
        movl    %r12d, (%rsp,%r11,8)
        vmovd   %xmm3, %r12d
        negl    %r12d
        addl    $2048, %r12d
        shll    $\csh, %r12d
        movl    %r12d, 4(%rsp,%r11,8)
        .else
        vhfold  vpaddq, 2, 3, qw=1
        vmovd   %xmm2, %r12d                    // sum(xq) + 4096
        negl    %r12d
        addl    $4096, %r12d                    // -sum(xq)
        shll    $\csh, %r12d                    // -c * sum(xq)
        movl    %r12d, (%rsp,%r11,4)
        .endif
        addq    $32, %rax
        incq    %r11
        jmp     2b
3:
        .endif
        .if Q0_SPILL
        movq    %rsp, %r12                      // r12 = the spilled sums (above the table)
        .if \csh
        leaq    63(,%r9,4*(1+\halves)), %rax
        andq    $-64, %rax
        addq    %rax, %r12
        .endif
        .endif
        .p2align 4
.Ltile\@:
        q0_zero
        movq    %rsi, %rax
        xorl    %r11d, %r11d
        testq   %r9, %r9
        jz      .Lstore\@
        .p2align 4
.Lblock\@:
        \blk
        addq    $\rec, %rdi
        addq    $32, %rax
        incq    %r11
        cmpq    %r9, %r11
        jb      .Lblock\@
.Lstore\@:
        q0_store
        addq    $256, %r8
        testq   %rcx, %rcx
        jz      4f
        addq    $256, %rcx
4:
        decq    %r10
        jnz     .Ltile\@
.Lret\@:
        movq    -16(%rbp), %r12
        movq    -8(%rbp), %rbx
        movq    %rbp, %rsp
        popq    %rbp
        q0_exit
        .endm

#endif
