/*
 * asm/x86_64/attn_rows.h -- what gpt2asm_attention_rows_* of attn_avx2.S and attn_avx512.S share (docs/kernels.md
 * "gpt2asm_attention_rows"): the stack frame, the argument set-up up to the 4 rows' q pointers, and the p.V loop
 * over the positions around the ISA's step.
 *
 * The including file defines RL_EXTRA (bytes of its own frame space at RL_BUF: AVX-512's binary16 buffer, 0 for
 * AVX2) before including it.
 */
#ifndef GPT2ASM_X86_ATTN_ROWS_H
#define GPT2ASM_X86_ATTN_ROWS_H

#define RL_OUT       0                              /* out (row 0)                          */
#define RL_V         8                              /* v                                    */
#define RL_R        16                              /* n_rows                               */
#define RL_O1       24                              /* rows 1-3: byte offsets of out        */
#define RL_O2       32
#define RL_O3       40
#define RL_S1       48                              /* rows 1-3: byte offsets of scratch    */
#define RL_S2       56
#define RL_S3       64
#define RL_CNT      72                              /* softmax rows (AVX2: / quarters) left */
#define RL_BUF      80                              /* the ISA's own RL_EXTRA bytes         */
#define RL_LOC      (RL_BUF + RL_EXTRA)
#define RA_ROWS     (RL_LOC + 56)                   /* stack arguments                      */
#define RA_LDQ      (RL_LOC + 64)
#define RA_LDO      (RL_LOC + 72)

        /* \dst = min(\r, R - 1), R - 1 in r10 */
        .macro  rowidx r, dst
        movq        $\r, \dst
        cmpq        \dst, %r10
        cmovbq      %r10, \dst
        .endm

        /* \tmp = \slot(%rsp) = \idx * \bytes */
        .macro  rowoff idx, bytes, tmp, slot
        movq        \idx, \tmp
        imulq       \bytes, \tmp
        movq        \tmp, \slot(%rsp)
        .endm

        /* the kernel's entry: callee-saved registers and the frame; n_rows outside 1..4 jumps to the
         * function's `9:` (the exit); r11 = \math (the ISA's constants), RL_OUT / RL_V / RL_R, r15 = nmax =
         * n_pos + R - 1, r14 = the scratch row stride 4 roundup16(nmax) bytes, RL_O1-3 / RL_S1-3 the byte
         * offsets of rows 1-3 (min(r, R - 1)) in out and scratch (the latter also in r10, r12, r13), and
         * rdi / rcx / rbx / rbp the q of rows 0-3 */
        .macro  rows_enter math
        push_callee
        subq        $RL_LOC, %rsp
        movq        RA_ROWS(%rsp), %rax
        leaq        -1(%rax), %r10                  // R - 1
        cmpq        $3, %r10
        ja          9f                              // n_rows outside 1..4
        movrel      %r11, \math
        movq        %rcx, RL_OUT(%rsp)
        movq        %rdx, RL_V(%rsp)
        movq        %rax, RL_R(%rsp)
        leaq        (%r9,%r10), %r15                // nmax = n_pos + R - 1
        leaq        15(%r15), %r14
        andq        $-16, %r14
        shlq        $2, %r14                        // scratch row stride: 4 roundup16(nmax)
        rowidx      1, %rcx                         // rows 1-3 -> rows min(r, R - 1)
        rowidx      2, %rbx
        rowidx      3, %rbp
        movq        RA_LDO(%rsp), %rdx
        shlq        $2, %rdx                        // ldo bytes
        rowoff      %rcx, %rdx, %rax, RL_O1
        rowoff      %rbx, %rdx, %rax, RL_O2
        rowoff      %rbp, %rdx, %rax, RL_O3
        rowoff      %rcx, %r14, %r10, RL_S1         // (kept in r10, r12, r13 for the scores)
        rowoff      %rbx, %r14, %r12, RL_S2
        rowoff      %rbp, %r14, %r13, RL_S3
        movq        RA_LDQ(%rsp), %rax
        shlq        $2, %rax                        // ldq bytes
        imulq       %rax, %rcx
        addq        %rdi, %rcx                      // q rows 1-3
        imulq       %rax, %rbx
        addq        %rdi, %rbx
        imulq       %rax, %rbp
        addq        %rdi, %rbp
        .endm

        /* p.V over the positions: \pv \es, first for each position (rsi v_t, rax its p column; both step
         * on), t < n_pos (r15 = n_pos) with every row (first = 0), then t = n_pos + j for the rows j + 1 ..
         * R - 1 (first = j + 1) */
        .macro  rows_pv pv, es
.Lpv\@:                                             // t < n_pos: every row
        \pv         \es, 0
        addq        $64*\es, %rsi
        addq        $4, %rax
        decq        %r15
        jnz         .Lpv\@
        cmpq        $2, RL_R(%rsp)                  // t = n_pos + j: rows j+1 .. 3
        jb          .Lpvend\@
        \pv         \es, 1
        addq        $64*\es, %rsi
        addq        $4, %rax
        cmpq        $3, RL_R(%rsp)
        jb          .Lpvend\@
        \pv         \es, 2
        addq        $64*\es, %rsi
        addq        $4, %rax
        cmpq        $4, RL_R(%rsp)
        jb          .Lpvend\@
        \pv         \es, 3
.Lpvend\@:
        .endm

#endif
