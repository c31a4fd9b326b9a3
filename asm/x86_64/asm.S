/*
 * asm/x86_64/asm.S -- portability header for the x86-64 kernels.
 *
 * Every kernel file starts with `#include "asm.S"`.  The files are GNU as, AT&T syntax, run through the
 * C preprocessor (`cc -c file.S`), so gcc and clang both assemble them.  System V AMD64 ABI only
 * (Linux and macOS): arguments in rdi, rsi, rdx, rcx, r8, r9; xmm/ymm/zmm registers are all
 * caller-saved; rbx, rbp, r12-r15 are callee-saved.  Every AVX function ends with vzeroupper.
 *
 *   function NAME        starts an exported function: aligned, global, typed (ELF), with the Mach-O
 *                        leading underscore where the object format wants it.
 *   endfunc              closes it (ELF: sets the symbol size).
 *   const NAME, ALIGN    starts a read-only constant block (ALIGN is a power-of-two exponent).
 *   endconst             closes it.
 *   movrel REG, NAME     loads the address of a constant block, RIP-relative (position independent).
 *   vzero R, RS...       zeroes ymmR, ymmRS... (+0.0: one vxorps each; register numbers).
 *   vclear OP, W, R, RS...  OP %W<R>, %W<R>, %W<R> for each listed register: zeroes them with the xor OP
 *                        (vpxor, vpxord, vxorps: the encoding the code had).
 *   push_callee          pushes the callee-saved rbx, rbp, r12-r15 (48 bytes); pop_callee pops them.
 *   vmemop OP, BASE, OFF, STEP, W, R, RS...
 *                        OP OFF+k*STEP(BASE), %W<R_k>, %W<R_k> for the k-th listed register (k = 0, 1, ...):
 *                        one elementwise op of consecutive vectors in memory into registers, in list order;
 *                        e.g. `vmemop vaddps, %rcx, 0, 32, ymm, 0,1,2,3,4,5,6,7` is y = acc + b of a tile.
 *   vmemop3 OP, SRC, BASE, OFF, STEP, W, R, RS...
 *                        OP OFF+k*STEP(BASE), SRC, %W<R_k> (e.g. vfmadd231ps: acc_k = fma(w_k, x, acc_k)).
 *   vstore BASE, OFF, STEP, W, R, RS...
 *                        vmovups %W<R_k>, OFF+k*STEP(BASE).
 *   each_off MAC, OFF, STEP, ARG, R, RS...
 *                        `MAC OFF+k*STEP, R_k[, ARG]` for the k-th listed register (ARG may be empty): one
 *                        step macro over consecutive vectors of a record, e.g. the 4 int sums of a group.
 *   vwidenfma4 T, W, BASE, OFF, STEP, XB, A0, A1, A2, A3
 *                        four weight vectors of type T at OFF + k*STEP(BASE) widened exactly to float into
 *                        W12-W15 (T = f16: vcvtph2ps; T = i8: vpmovsxbd, vcvtdq2ps), then
 *                        acc_k = fma(widened_k, XB, acc_k) into W<A0>..W<A3> (one weight row of a tile).
 *   whole_loop N, CNT, STEP, SKIP
 *                        entry of a loop over whole blocks: CNT = N rounded down to a multiple of STEP (a
 *                        power of two), rax (the index) = 0, and a jump to SKIP when there is no block.
 *   vhfold OP, A, T[, EXT, SHUF, QW]
 *                        OP (exact in any order: integer add / min / max, vmaxps without NaN) across ymmA's 8 dwords into xmmA's
 *                        lanes through xmmT: EXT (vextracti128) $1 + OP, SHUF (vpshufd) $0x4e + OP, then
 *                        SHUF $0xb1 + OP unless QW=1 (qword elements: two steps).
 *
 * Symbols are named gpt2asm_<op>_<dtype>_<isa>; docs/kernels.md documents each one.
 */
#ifndef GPT2ASM_X86_ASM_S
#define GPT2ASM_X86_ASM_S

#if defined(__APPLE__)
#  define GPT2ASM_MACHO 1
#else
#  define GPT2ASM_ELF 1
#endif

#ifdef GPT2ASM_MACHO
        .macro  function name
        .text
        .p2align 5
        .globl  _\name
_\name:
        .macro  endfunc
        .purgem endfunc
        .endm
        .endm

        .macro  const name, align=6
        .const_data
        .p2align \align
L_\name:
        .macro  endconst
        .purgem endconst
        .endm
        .endm

        .macro  movrel reg, name
        leaq    L_\name(%rip), \reg
        .endm
#else
        .macro  function name
        .text
        .p2align 5
        .globl  \name
        .type   \name, @function
\name:
        .macro  endfunc
        .size   \name, . - \name
        .purgem endfunc
        .endm
        .endm

        .macro  const name, align=6
        .section .rodata
        .p2align \align
.L_\name:
        .macro  endconst
        .purgem endconst
        .endm
        .endm

        .macro  movrel reg, name
        leaq    .L_\name(%rip), \reg
        .endm

        /* no executable stack */
        .section .note.GNU-stack, "", @progbits
        .text
#endif

        .macro  push_callee
        pushq   %rbx
        pushq   %rbp
        pushq   %r12
        pushq   %r13
        pushq   %r14
        pushq   %r15
        .endm

        /* a loop over \i = 0, 16, 32, .. below \n16 (the whole blocks of 16 of \n): loop16 opens it at
         * label \top (on to \end with no block); loop16_end closes it, and at label \end goes on to
         * \skip when \n16 = \n (no tail), else falls into the tail */
        .macro  loop16 i, n16, top, end
        xorq        \i, \i
        testq       \n16, \n16
        jz          \end\()f
\top:
        .endm
        .macro  loop16_end i, n16, n, top, end, skip
        addq        $16, \i
        cmpq        \n16, \i
        jb          \top\()b
\end:
        cmpq        \n, \n16
        je          \skip\()f
        .endm

        /* bp_first: rbp was pushed first (a frame pointer, then rbx, r12-r15), so it comes off last */
        .macro  pop_callee bp_first=0
        popq    %r15
        popq    %r14
        popq    %r13
        popq    %r12
        .if \bp_first
        popq    %rbx
        popq    %rbp
        .else
        popq    %rbp
        popq    %rbx
        .endif
        .endm

        .macro  vzero r, rs:vararg
        vxorps  %ymm\r, %ymm\r, %ymm\r
        .ifnb \rs
        vzero   \rs
        .endif
        .endm

        .macro  vclear op, w, r, rs:vararg
        \op     %\w\r, %\w\r, %\w\r
        .ifnb \rs
        vclear  \op, \w, \rs
        .endif
        .endm

        .macro  vmemop op, base, off, step, w, r, rs:vararg
        \op     \off(\base), %\w\r, %\w\r
        .ifnb \rs
        vmemop  \op, \base, \off+\step, \step, \w, \rs
        .endif
        .endm

        .macro  vmemop3 op, src, base, off, step, w, r, rs:vararg
        \op     \off(\base), \src, %\w\r
        .ifnb \rs
        vmemop3 \op, \src, \base, \off+\step, \step, \w, \rs
        .endif
        .endm

        .macro  vstore base, off, step, w, r, rs:vararg
        vmovups %\w\r, \off(\base)
        .ifnb \rs
        vstore  \base, \off+\step, \step, \w, \rs
        .endif
        .endm

        .macro  each_off mac, off, step, a, r, rs:vararg
        .ifb \a
        \mac    \off, \r
        .else
        \mac    \off, \r, \a
        .endif
        .ifnb \rs
        each_off \mac, \off+\step, \step, \a, \rs
        .endif
        .endm

        .macro  vwidenfma4 t, w, base, off, step, xb, a0, a1, a2, a3
        .ifc \t, i8
        vpmovsxbd   \off(\base), %\w\()12
        vpmovsxbd   \off+\step(\base), %\w\()13
        vpmovsxbd   \off+2*\step(\base), %\w\()14
        vpmovsxbd   \off+3*\step(\base), %\w\()15
        vcvtdq2ps   %\w\()12, %\w\()12
        vcvtdq2ps   %\w\()13, %\w\()13
        vcvtdq2ps   %\w\()14, %\w\()14
        vcvtdq2ps   %\w\()15, %\w\()15
        .else
        vcvtph2ps   \off(\base), %\w\()12
        vcvtph2ps   \off+\step(\base), %\w\()13
        vcvtph2ps   \off+2*\step(\base), %\w\()14
        vcvtph2ps   \off+3*\step(\base), %\w\()15
        .endif
        vfmadd231ps %\w\()12, \xb, %\w\a0
        vfmadd231ps %\w\()13, \xb, %\w\a1
        vfmadd231ps %\w\()14, \xb, %\w\a2
        vfmadd231ps %\w\()15, \xb, %\w\a3
        .endm

        .macro  whole_loop n, cnt, step, skip
        movq    \n, \cnt
        andq    $-\step, \cnt
        xorl    %eax, %eax
        testq   \cnt, \cnt
        jz      \skip
        .endm

        .macro  vhfold op, a, t, ext=vextracti128, shuf=vpshufd, qw=0
        \ext    $1, %ymm\a, %xmm\t
        \op     %xmm\t, %xmm\a, %xmm\a
        \shuf   $0x4e, %xmm\a, %xmm\t
        \op     %xmm\t, %xmm\a, %xmm\a
        .if \qw == 0
        \shuf   $0xb1, %xmm\a, %xmm\t
        \op     %xmm\t, %xmm\a, %xmm\a
        .endif
        .endm

#endif /* GPT2ASM_X86_ASM_S */
