/*
 * asm/x86_64/matmul_q0.h -- the driver of the q8_0 / q4_0 (and q6_k: mm_q0's q6 = 1) prefill
 * (matrix-matrix) kernels, shared by matmul_q0_avx2.S and matmul_q0_avx512.S.
 *
 * Blocking.  Tokens are taken in super-chunks whose activation panel fits MQ_PANEL bytes of stack; for
 * each super-chunk the driver first repacks every token's quantized row into the panel, by blocks of
 * TB tokens (the ISA's register block): for token block k and input block b, at panel + (k*nb + b)*PB,
 *     TB x 32 bytes xq[t][32b .. 32b+31]  |  TB x 4 bytes xd[t][b]  |  TB x 4 bytes -c * sum(xq[t] of b)
 * (PB = 40*TB; c = 8 or 128: the correction of a biased unsigned operand, as in matvec_q0.h), so that the
 * inner loop reaches every token's operands at constant offsets from one cursor.  Then, for each tile,
 * for each block of TB (or, last, 1..TB-1) tokens, for each vector-wide sub-tile of outputs (8 outputs
 * for ymm, 16 for zmm; NSUB per tile), the TB x sub-tile fp32 sums live in registers while the tile's
 * records stream by: per record, the sub-tile's bytes of each group are loaded (and made into the dot
 * operand: |w|, w ^ 0x80 or the nibbles) once and used by all TB tokens, then per token the contract's
 * t = xd[b] * dw, acc = fma((float)s, t, acc).  The sub-tiles of a record are disjoint bytes, so each
 * weight byte is loaded once per block of tokens (the tile's records stay in L2 between token blocks).
 * Every (token, output) gets exactly the matvec's sequence, hence its bits.
 *
 * Small token blocks (batched decode).  A last block of few tokens takes several sub-tiles per pass (a
 * wide pass, ns = MQ_NSW for m * MQ_NSW <= TB tokens, else MQ_NSW2 for <= 4): zmm 1-2 tokens the whole
 * record (one forward stream), zmm 3-4 tokens and ymm 1-3 tokens 2 sub-tiles; the integer sums run in
 * another order, the fp32 steps are the same.  And when a super-chunk has <= MQ_PF_TOK tokens, the first
 * token block of each tile prefetches the next tile into L2 (prefetcht1, r10) while its passes run,
 * except in whole-record passes (docs/notes.md "q0 matmul at small batches").
 *
 * The including file defines MQ_TB, MQ_VL (vector bytes) and the macros
 *     mq_consts (rbx = constants)   mq_zero mt   mq_blk mt (one record's sub-tile, mt tokens)   mq_store mt
 *     mq_exit
 * Registers in the inner loop: rdi record + VL*j (group data; also the sub-tile's y / b offset),
 * r12 record + VL/2*j (scales), rax panel cursor, r11 blocks left, rbx constants, r10 prefetch cursor;
 * mq_store: r13 y of token 0 + VL*j, r14 ldy in bytes, r15 b + VL*j or 0 (wide passes: rcx = 3 * ldy).
 */
#ifndef GPT2ASM_X86_MATMUL_Q0_H
#define GPT2ASM_X86_MATMUL_Q0_H

#ifndef MQ_PANEL
#  define MQ_PANEL 131072                       /* bytes of stack for the activation panel (at least one token block) */
#endif
        .set    MQ_PB, 40 * MQ_TB               // bytes of a panel block (q6_k: 48 * TB, set by mm_q0)
        .set    MQ_XD, 32 * MQ_TB               // offset of xd in a panel block
        .set    MQ_CO, 36 * MQ_TB               // offset of the corrections (q6_k: -32 * sum(xq) of inputs 0-15)
        .set    MQ_C1, 40 * MQ_TB               // q6_k: -32 * sum(xq) of inputs 16-31
        .set    MQ_CW, 44 * MQ_TB               // q6_k: the int16 pair (-sum(xq) of 0-15, -sum(xq) of 16-31)
        .set    MQ_Q6, 0                        // q6_k: set by mm_q0 for its expansion

        /* frame slots below rbp (after the 6 pushes: rbp, rbx, r12-r15) */
        .set    F_W, -56                        // w + tile_begin tiles
        .set    F_XQ, -64
        .set    F_LDQ, -72
        .set    F_XD, -80
        .set    F_LDD, -88                      // bytes
        .set    F_B, -96                        // b + 64*tile_begin, or 0
        .set    F_Y, -104                       // y + 64*tile_begin
        .set    F_LDY, -112                     // bytes
        .set    F_NTOK, -120                    // tokens left after this super-chunk's start
        .set    F_NB, -128
        .set    F_TILES, -136
        .set    F_TREC, -144                    // bytes of one tile's records
        .set    F_NTBMAX, -152                  // token blocks per super-chunk
        .set    F_NTC, -160                     // tokens in this super-chunk
        .set    F_TILE, -168                    // tile index (relative)
        .set    F_TBI, -176                     // token block index in the super-chunk
        .set    F_MT, -184                      // tokens in this token block
        .set    F_WT, -192                      // this tile's records
        .set    F_PNL, -200                     // panel of this token block
        .set    F_YT, -208                      // y of this token block's token 0, this tile
        .set    F_BT, -216                      // b of this tile or 0
        .set    F_PANEL, -224                   // the panel
        .set    F_SUB, -232                     // sub-tile counter
        .set    F_PF, -240                      // 1: this token block prefetches the next tile
        .set    F_SIZE, 256
        .set    MQ_SCR, 24                      // q6_k: 512 bytes of scratch at MQ_SCR(%rsp) in the block loop
                                                // (64-byte aligned, just above the 3 pushes)

#ifndef MQ_PFW
#  define MQ_PFW (MQ_NSW * MQ_VL < 256)         /* whether wide passes prefetch: not a whole-record pass */
#endif
#ifndef MQ_PFW2
#  define MQ_PFW2 1
#endif
        .set    MQ_PFW_, MQ_PFW
        .set    MQ_PFW2_, MQ_PFW2
#ifndef MQ_PF_TOK
#  define MQ_PF_TOK 32                          /* super-chunks of at most this many tokens prefetch */
#endif

        /* one sub-tile loop for \mt tokens (all NSUB sub-tiles of the tile, \ns per pass: 1, or MQ_NSW in
           a wide pass of 1-2 tokens).  \pf: each record step also prefetches (prefetcht1, into L2) the
           next \ppr lines of the next tile (r10 from F_WT + F_TREC on), so that the passes cover it */
        .macro  mq_tokens mt, rec, nsub, ns, pf
        .set    MQ_PPR\@, (MQ_TREC * \ns + 64 * \nsub - 1) / (64 * \nsub)   // lines per record step
        movq    $\nsub/\ns, F_SUB(%rbp)
        movq    F_WT(%rbp), %rdi
        movq    F_WT(%rbp), %r12
        .if MQ_Q6
        movq    F_WT(%rbp), %r9                 // q6_k: the super-record's d's + VL/2 * j (r12: its sc + VL/4 * j)
        .endif
        movq    F_YT(%rbp), %r13
        movq    F_BT(%rbp), %r15
        .if \pf
        movq    %rdi, %r10
        addq    F_TREC(%rbp), %r10
        .endif
1:
        movq    F_PNL(%rbp), %rax
        movq    F_NB(%rbp), %r11
        mq_zero \mt, \ns
        testq   %r11, %r11
        jz      3f
        pushq   %rdi
        pushq   %r12
        .if MQ_Q6
        pushq   %r9
        .endif
2:
        mq_blk  \mt, \ns
        .if \pf
        .set    MQ_PFO, 0
        .rept   MQ_PPR\@
        prefetcht1 MQ_PFO(%r10)
        .set    MQ_PFO, MQ_PFO + 64
        .endr
        addq    $64*MQ_PPR\@, %r10
        .endif
        addq    $\rec, %rdi
        addq    $\rec, %r12
        addq    $MQ_PB, %rax
        decq    %r11
        jnz     2b
        .if MQ_Q6
        popq    %r9
        .endif
        popq    %r12
        popq    %rdi
3:
        movq    F_LDY(%rbp), %r14
        pushq   %r13
        mq_store \mt, \ns
        popq    %r13
        addq    $MQ_VL*\ns, %rdi
        .if MQ_Q6
        addq    $MQ_VL/4*\ns, %r12
        addq    $MQ_VL/2*\ns, %r9
        .else
        addq    $MQ_VL/2*\ns, %r12
        .endif
        addq    $MQ_VL*\ns, %r13
        testq   %r15, %r15
        jz      4f
        addq    $MQ_VL*\ns, %r15
4:
        decq    F_SUB(%rbp)
        jnz     1b
        .endm

        /* a last token block of 1 .. TB-1 tokens (rax): its own unrolled loop (1-2 tokens: a wide
           pass), then to \done */
        .macro  mq_try m, rec, nsub, done, pf
        .if \m < MQ_TB
        cmpq    $\m, %rax
        jne     .Lno\@
        .if \m * MQ_NSW <= MQ_TB
        mq_tokens \m, \rec, \nsub, MQ_NSW, \pf*MQ_PFW_
        .elseif MQ_NSW2 && \m * MQ_NSW2 <= MQ_TB
        mq_tokens \m, \rec, \nsub, MQ_NSW2, \pf*MQ_PFW2_
        .else
        mq_tokens \m, \rec, \nsub, 1, \pf
        .endif
        jmp     \done
.Lno\@:
        .endif
        .endm

        .macro  mq_dispatch rec, nsub, done, pf
        .irp    m, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11
        mq_try  \m, \rec, \nsub, \done, \pf
        .endr
        .endm

        /* the whole kernel: \rec record bytes (the block step), \csh = log2(c) of the correction; q6_k
           (\q6 = 1, \trec = 1680): a tile is nb * \trec bytes (super-record headers included: the block
           macro steps rdi / r12 over a header at every 8th block and r9 to the next header after every
           8th), the panel has 48 * TB bytes a block (the half corrections MQ_CO, MQ_C1, MQ_CW) */
        .macro  mm_q0 rec, csh, nsub, trec=0, q6=0
        .set    MQ_Q6, \q6
        .if \trec
        .set    MQ_TREC, \trec
        .else
        .set    MQ_TREC, \rec
        .endif
        .set    MQ_PB, 40 * MQ_TB + 8 * MQ_TB * \q6
        pushq   %rbp
        movq    %rsp, %rbp
        pushq   %rbx
        pushq   %r12
        pushq   %r13
        pushq   %r14
        pushq   %r15
        subq    $F_SIZE-48+8, %rsp              // the slots (rsp stays 16-byte aligned)
        /* (w, xq, ldq, xd, ldd, b | y, ldy, n_tokens, n_in, tile_begin, tile_end) at 16(%rbp) ... */
        movq    48(%rbp), %r10                  // tile_begin
        movq    56(%rbp), %r11                  // tile_end
        subq    %r10, %r11
        jbe     .Lret\@
        movq    %r11, F_TILES(%rbp)
        movq    32(%rbp), %rax                  // n_tokens
        testq   %rax, %rax
        jz      .Lret\@
        movq    %rax, F_NTOK(%rbp)
        movq    40(%rbp), %rax
        shrq    $5, %rax
        movq    %rax, F_NB(%rbp)
        imulq   $MQ_TREC, %rax, %rax
        movq    %rax, F_TREC(%rbp)
        imulq   %r10, %rax
        addq    %rax, %rdi
        movq    %rdi, F_W(%rbp)
        movq    %rsi, F_XQ(%rbp)
        movq    %rdx, F_LDQ(%rbp)
        movq    %rcx, F_XD(%rbp)
        shlq    $2, %r8
        movq    %r8, F_LDD(%rbp)
        shlq    $8, %r10                        // 64 floats per tile
        testq   %r9, %r9
        jz      1f
        addq    %r10, %r9
1:
        movq    %r9, F_B(%rbp)
        movq    16(%rbp), %rax
        addq    %r10, %rax
        movq    %rax, F_Y(%rbp)
        movq    24(%rbp), %rax
        shlq    $2, %rax
        movq    %rax, F_LDY(%rbp)
        /* panel: token blocks per super-chunk = max(1, MQ_PANEL / (nb * PB)) */
        movq    F_NB(%rbp), %rcx
        imulq   $MQ_PB, %rcx, %rcx              // bytes per token block
        movl    $1, %eax
        testq   %rcx, %rcx
        jz      2f
        movl    $MQ_PANEL, %eax
        xorl    %edx, %edx
        divq    %rcx
        testq   %rax, %rax
        jnz     2f
        movl    $1, %eax
2:
        movq    %rax, F_NTBMAX(%rbp)
        imulq   %rax, %rcx
        addq    $63, %rcx
        andq    $-64, %rcx
        subq    %rcx, %rsp
        andq    $-64, %rsp
        movq    %rsp, F_PANEL(%rbp)
        .if \q6
        subq    $512, %rsp                      // the scratch (the record's sub-scales, per sub-tile)
        .endif
        mq_consts
.Lsc\@:                                         // a super-chunk: tokens from F_XQ / F_XD / F_Y on
        movq    F_NTBMAX(%rbp), %rax
        imulq   $MQ_TB, %rax, %rax
        movq    F_NTOK(%rbp), %rcx
        cmpq    %rax, %rcx
        cmovaq  %rax, %rcx
        movq    %rcx, F_NTC(%rbp)
        /* repack: for each token u (block u / TB, slot t = u % TB), for each input block */
        movq    F_XQ(%rbp), %r13                // xq row
        movq    F_XD(%rbp), %r14                // xd row
        movq    F_PANEL(%rbp), %r12             // the token block's panel
        xorl    %r10d, %r10d                    // t
        movq    %rcx, %r15                      // tokens left
        vpbroadcastd Q0_K80(%rbx), %ymm1
        vpxor   %xmm0, %xmm0, %xmm0
.Lpk_tok\@:
        movq    %r10, %rdx
        shlq    $5, %rdx
        leaq    (%r12,%rdx), %rdi               // xq slot of token t, block 0
        leaq    MQ_XD(%r12,%r10,4), %rsi        // xd slot
        movq    %r13, %r8
        movq    %r14, %r9
        movq    F_NB(%rbp), %r11
        testq   %r11, %r11
        jz      4f
3:
        vmovdqu (%r8), %ymm2
        vmovdqu %ymm2, (%rdi)
        movl    (%r9), %eax
        movl    %eax, (%rsi)
        vpxor   %ymm1, %ymm2, %ymm2             // xq + 128
        vpsadbw %ymm0, %ymm2, %ymm2
        .if \q6
        vextracti128 $1, %ymm2, %xmm3
        vpshufd $0x4e, %xmm2, %xmm4
        vpaddq  %xmm4, %xmm2, %xmm2             // sum(xq + 128) of inputs 0-15
        vpshufd $0x4e, %xmm3, %xmm4
        vpaddq  %xmm4, %xmm3, %xmm3             // of inputs 16-31
        vmovd   %xmm2, %eax
        negl    %eax
        addl    $2048, %eax                     // -sum(xq of inputs 0-15)
        vmovd   %xmm3, %edx
        negl    %edx
        addl    $2048, %edx
        movw    %ax, MQ_CW-MQ_XD(%rsi)          // the int16 pair (|sum| <= 2048)
        movw    %dx, MQ_CW-MQ_XD+2(%rsi)
        shll    $5, %eax
        shll    $5, %edx
        movl    %eax, MQ_CO-MQ_XD(%rsi)
        movl    %edx, MQ_C1-MQ_XD(%rsi)
        .else
        vhfold  vpaddq, 2, 3, qw=1
        vmovd   %xmm2, %eax                     // sum(xq) + 4096
        negl    %eax
        addl    $4096, %eax
        shll    $\csh, %eax                     // -c * sum(xq)
        movl    %eax, MQ_CO-MQ_XD(%rsi)
        .endif
        addq    $32, %r8
        addq    $4, %r9
        addq    $MQ_PB, %rdi
        addq    $MQ_PB, %rsi
        decq    %r11
        jnz     3b
4:
        addq    F_LDQ(%rbp), %r13
        addq    F_LDD(%rbp), %r14
        incq    %r10
        cmpq    $MQ_TB, %r10
        jb      5f
        xorl    %r10d, %r10d
        movq    F_NB(%rbp), %rax
        imulq   $MQ_PB, %rax, %rax
        addq    %rax, %r12
5:
        decq    %r15
        jnz     .Lpk_tok\@
        /* tiles */
        movq    $0, F_TILE(%rbp)
.Ltile\@:
        movq    F_TILE(%rbp), %rax
        movq    %rax, %rcx
        imulq   F_TREC(%rbp), %rax
        addq    F_W(%rbp), %rax
        movq    %rax, F_WT(%rbp)
        shlq    $8, %rcx
        movq    F_B(%rbp), %rax
        testq   %rax, %rax
        jz      6f
        addq    %rcx, %rax
6:
        movq    %rax, F_BT(%rbp)
        addq    F_Y(%rbp), %rcx
        movq    %rcx, F_YT(%rbp)
        movq    F_PANEL(%rbp), %rax
        movq    %rax, F_PNL(%rbp)
        movq    F_NTC(%rbp), %rax
        movq    %rax, F_MT(%rbp)                // tokens left in the super-chunk
        xorl    %ecx, %ecx
        cmpq    $MQ_PF_TOK, %rax
        setbe   %cl
        movq    %rcx, F_PF(%rbp)                // the first token block of a small super-chunk prefetches
.Ltb\@:
        movq    F_MT(%rbp), %rax
        cmpq    $MQ_TB, %rax
        jb      .Lpart\@
        cmpq    $0, F_PF(%rbp)
        je      .Lfull0\@
        mq_tokens MQ_TB, \rec, \nsub, 1, 1
        jmp     .Lnexttb\@
.Lfull0\@:
        mq_tokens MQ_TB, \rec, \nsub, 1, 0
        jmp     .Lnexttb\@
.Lpart\@:
        cmpq    $0, F_PF(%rbp)
        je      .Lpart0\@
        mq_dispatch \rec, \nsub, .Lnexttb\@, 1
.Lpart0\@:
        mq_dispatch \rec, \nsub, .Lnexttb\@, 0
.Lnexttb\@:
        movq    $0, F_PF(%rbp)
        movq    F_NB(%rbp), %rax
        imulq   $MQ_PB, %rax, %rax
        addq    %rax, F_PNL(%rbp)
        movq    F_LDY(%rbp), %rax
        imulq   $MQ_TB, %rax, %rax
        addq    %rax, F_YT(%rbp)
        subq    $MQ_TB, F_MT(%rbp)
        jbe     7f
        jmp     .Ltb\@
7:
        incq    F_TILE(%rbp)
        movq    F_TILE(%rbp), %rax
        cmpq    F_TILES(%rbp), %rax
        jb      .Ltile\@
        /* next super-chunk */
        movq    F_NTC(%rbp), %rax
        subq    %rax, F_NTOK(%rbp)
        jz      .Lret\@
        movq    %rax, %rcx
        imulq   F_LDQ(%rbp), %rcx
        addq    %rcx, F_XQ(%rbp)
        movq    %rax, %rcx
        imulq   F_LDD(%rbp), %rcx
        addq    %rcx, F_XD(%rbp)
        imulq   F_LDY(%rbp), %rax
        addq    %rax, F_Y(%rbp)
        jmp     .Lsc\@
.Lret\@:
        leaq    -40(%rbp), %rsp
        pop_callee 1
        mq_exit
        .endm

#endif
