/*
 * asm/x86_64/matmul_body.h -- the driver of the batched matmul kernels, shared by matmul_avx2.S and
 * matmul_avx512.S: argument set-up, the tile loop, the K-chunks of each tile and the blocks of 6 tokens
 * (then 1..5); the ISA's own `mm_block dt, mt` computes the tile's outputs for one block of tokens.
 *
 * Before including it, a kernel file defines DT_F32 / DT_F16, the macros mm_block and mm_exit
 * (the register clean-up and ret), MM_PF_TOK (0, or: a call of at most this many tokens prefetches, see
 * matmul_avx2.S; then mm_block takes a third argument: 1 in a chunk's first block, the one that prefetches,
 * and the symbols MM_PF_MIN (calls of fewer tokens do not prefetch) and MM_PF_NEXT are set: if nonzero,
 * the chunk's later blocks run with the argument 2, prefetching the next chunk from rbp on), and sets
 * (per weight type, before expanding matmul_body) ROWB (bytes per weight row), RB (its log2), KCMAX
 * (rows per chunk at most) and MM_B8: 1 if mm_block takes blocks of 8 tokens (taken first; then a call of
 * 8 ..  MM_PF_TOK tokens uses chunks of KCB8 rows).  See matmul_avx2.S for the blocking and the register use.
 */
#ifndef GPT2ASM_X86_MATMUL_BODY_H
#define GPT2ASM_X86_MATMUL_BODY_H

        /* stack frame (after the 6 pushes): */
        .set    NTOK, 0                         // n_tokens
        .set    XCH, 8                          // X + k0 (the current chunk of rows' first input)
        .set    YT, 16                          // y + 64*tile
        .set    KFIRST, 24                      // 1 if the chunk starts at row 0
        .set    KLAST, 32                       // 1 if the chunk ends at row n_in
        .set    NIN, 40                         // n_in
        .set    K0, 48                          // first row of the chunk
        .set    WT, 56                          // the current tile
        .set    X0, 64                          // X
        .set    KCE, 72                         // rows per chunk: ceil(n_in / ceil(n_in / KCMAX))
        .set    PFB, 80                         // the next block of tokens prefetches: 1 (first block), 2 (later)
        .set    FRAME, 88

        /* one block of \mt tokens: with MM_PF_TOK, the variant that prefetches while PFB is set (then
         * cleared: only the first block of a chunk prefetches) */
        .macro  mm_blk dt, mt
#if MM_PF_TOK
        cmpq    $0, PFB(%rsp)
        je      .Lnopf\@
        .if MM_PF_NEXT
        cmpq    $1, PFB(%rsp)
        jne     .Lnext\@
        mm_block \dt, \mt, 1
        movq    $2, PFB(%rsp)                   // the chunk's later blocks prefetch the next chunk
        jmp     .Lpfd\@
.Lnext\@:
        mm_block \dt, \mt, 2
        .else
        mm_block \dt, \mt, 1
        movq    $0, PFB(%rsp)
        .endif
        jmp     .Lpfd\@
.Lnopf\@:
        mm_block \dt, \mt, 0
.Lpfd\@:
#else
        mm_block \dt, \mt
#endif
        .endm

        /* the whole kernel; \dt selects the weight type */
        .macro  matmul_body dt
        push_callee
        subq    $FRAME, %rsp
        /* (w, x, ldx, b, y, ldy, | n_tokens, n_in, tile_begin, tile_end) */
        .set    ARG, FRAME+56
        shlq    $2, %rdx                        // ldx in bytes
        shlq    $2, %r9                         // ldy in bytes
        movq    ARG(%rsp), %r13                 // n_tokens
        movq    ARG+8(%rsp), %r12               // n_in
        movq    ARG+16(%rsp), %r10              // tile_begin
        movq    ARG+24(%rsp), %r15              // tile_end
        subq    %r10, %r15                      // tiles
        jbe     .Lret\@
        testq   %r13, %r13
        jz      .Lret\@
        movq    %r13, NTOK(%rsp)
        movq    %r12, NIN(%rsp)
        movq    %rdx, %r11                      // (div uses rdx)
        movl    $KCMAX, %ebx
        .if MM_B8 && MM_PF_TOK >= 8
        leaq    -8(%r13), %rax
        cmpq    $MM_PF_TOK-8, %rax
        ja      1f
        movl    $KCB8, %ebx                     // a small call with a block of 8: short chunks
1:
        .endif
        leaq    -1(%r12,%rbx), %rax
        xorl    %edx, %edx
        divq    %rbx                            // chunks = ceil(n_in / KC)
        movq    %rax, %rbx
        leaq    -1(%r12,%rbx), %rax
        xorl    %edx, %edx
        divq    %rbx                            // rows per chunk = ceil(n_in / chunks)
        movq    %rax, KCE(%rsp)
        movq    %r11, %rdx
        movq    %rsi, X0(%rsp)
        movq    %r10, %r11
        shlq    $8, %r11                        // 256 bytes of y / b per tile
        addq    %r11, %r8
        movq    %r8, YT(%rsp)                   // y + 64*tile_begin
        testq   %rcx, %rcx
        jz      1f
        addq    %r11, %rcx
1:
        imulq   %r12, %r10
        shlq    $RB, %r10                       // tile_begin * n_in rows of ROWB bytes
        addq    %r10, %rdi
        .p2align 4
.Ltile\@:
        movq    %rdi, WT(%rsp)
        movq    $0, K0(%rsp)
.Lchunk\@:                                      // rows k0 .. k0+kc-1 of the tile, kc <= KC
        movq    NIN(%rsp), %r12
        movq    K0(%rsp), %rax
        subq    %rax, %r12                      // rows left
        xorl    %ebx, %ebx
        cmpq    KCE(%rsp), %r12
        jbe     2f
        movq    KCE(%rsp), %r12                 // kc
        jmp     3f
2:
        movl    $1, %ebx                        // the last chunk
3:
        movq    %rbx, KLAST(%rsp)
        xorl    %ebx, %ebx
        testq   %rax, %rax
        sete    %bl
        movq    %rbx, KFIRST(%rsp)
        movq    %rax, %r10
        shlq    $RB, %r10
        movq    WT(%rsp), %rdi
        addq    %r10, %rdi                      // row k0 of the tile
        leaq    (,%rax,4), %r10
        addq    X0(%rsp), %r10
        movq    %r10, XCH(%rsp)                 // input k0 of token 0
        movq    XCH(%rsp), %rsi
        movq    YT(%rsp), %r8
        movq    NTOK(%rsp), %r13
#if MM_PF_TOK
        movq    %r12, %rbp
        shlq    $RB, %rbp
        addq    %rdi, %rbp                      // the prefetch cursor: the next chunk (or tile)
        xorl    %eax, %eax
        cmpq    $MM_PF_TOK, %r13
        setbe   %al
        .if MM_PF_MIN > 1
        xorl    %r10d, %r10d
        cmpq    $MM_PF_MIN, %r13
        cmovb   %r10, %rax                      // fewer than MM_PF_MIN tokens: no prefetch either
        .endif
        movq    %rax, PFB(%rsp)                 // a small call: its first block of tokens prefetches
#endif
        .if MM_B8
        cmpq    $8, %r13
        jb      .Lb6\@
        .p2align 4
.Lblock8\@:                                     // blocks of 8 tokens (the ISA's mm_block 8)
        mm_blk  \dt, 8
        leaq    (%rsi,%rdx,8), %rsi             // X += 8 rows
        leaq    (%r8,%r9,8), %r8                // y += 8 rows
        subq    $8, %r13
        cmpq    $8, %r13
        jae     .Lblock8\@
.Lb6\@:
        .endif
        cmpq    $6, %r13
        jb      .Ltail\@
        .p2align 4
.Lblock\@:                                      // blocks of 6 tokens
        mm_blk  \dt, 6
        leaq    (%rdx,%rdx,2), %r10
        leaq    (%rsi,%r10,2), %rsi             // X += 6 rows
        leaq    (%r9,%r9,2), %r10
        leaq    (%r8,%r10,2), %r8               // y += 6 rows
        subq    $6, %r13
        cmpq    $6, %r13
        jae     .Lblock\@
.Ltail\@:                                       // 0 .. 5 tokens left
        cmpq    $3, %r13
        je      .Lt3\@
        ja      .Lt45\@
        cmpq    $1, %r13
        je      .Lt1\@
        jb      .Lnextk\@
        mm_blk  \dt, 2
        jmp     .Lnextk\@
.Lt1\@:
        mm_blk  \dt, 1
        jmp     .Lnextk\@
.Lt3\@:
        mm_blk  \dt, 3
        jmp     .Lnextk\@
.Lt45\@:
        cmpq    $4, %r13
        jne     .Lt5\@
        mm_blk  \dt, 4
        jmp     .Lnextk\@
.Lt5\@:
        mm_blk  \dt, 5
.Lnextk\@:
        addq    %r12, K0(%rsp)
        cmpq    $0, KLAST(%rsp)
        je      .Lchunk\@
        movq    NIN(%rsp), %r10
        shlq    $RB, %r10
        movq    WT(%rsp), %rdi
        addq    %r10, %rdi                      // next tile
        addq    $256, YT(%rsp)
        testq   %rcx, %rcx
        jz      4f
        addq    $256, %rcx
4:
        decq    %r15
        jnz     .Ltile\@
.Lret\@:
        addq    $FRAME, %rsp
        pop_callee
        mm_exit
        .endm

#endif
