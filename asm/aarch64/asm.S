/*
 * asm/aarch64/asm.S -- portability header for the AArch64 kernels (Linux ELF and Apple Mach-O).
 *
 * Every kernel file starts with `#include "asm.S"` and then enables, for itself, the extensions it uses:
 *
 *     #include "asm.S"
 *             .arch_extension fp16          // NEON file with half-precision arithmetic, or
 *             .arch_extension sme2          // SME2 file (implies sme; clang >= 17, e.g. Debian's clang-19)
 *
 * This header resets the base to `.arch armv8-a` (FP and Advanced SIMD), so a file that forgets its
 * `.arch_extension` fails to assemble everywhere instead of only on a compiler whose default CPU lacks
 * the extension (Apple's clang defaults to apple-m1 and would accept fp16 silently).
 *
 * The files are GNU as syntax run through the C preprocessor (`cc -x assembler-with-cpp`): clang's
 * integrated assembler on every platform (Apple clang, Debian clang-19 for Linux and for the cross
 * builds), or GNU as where it knows the instructions (binutils 2.40 has no SME2).
 *
 * ABI (AAPCS64; Apple's variant is identical for everything these kernels do):
 *   arguments and results in x0-x7 / v0-v7; x9-x15 are scratch; x19-x28 and d8-d15 (the low 64 bits of
 *   v8-v15) are callee-saved; x16/x17 may be clobbered by the linker's veneers.
 *   x18 is the platform register: reserved on Apple (and Windows), so NO file ever touches it.
 *   SME: a function that enters streaming mode (smstart) must leave it (smstop) before it returns, so
 *   callers see an ordinary function; ZA is dead on entry and exit (no lazy-save protocol is used).
 *
 *   function NAME, export=0, align=4   starts a function (align is a power-of-two exponent). export=1
 *                                      makes it a global symbol with the Mach-O `_` prefix on Apple and
 *                                      (ELF) `.type NAME, %function`; otherwise a file-local label.
 *   endfunc                            closes it (ELF: `.size`).
 *   const NAME, align=4                starts a read-only block (.rodata / __TEXT,__const) with a
 *                                      file-local label; align is a power-of-two exponent.
 *   endconst                           closes it and returns to the text section.
 *   movrel REG, NAME[, OFFSET]         REG = address of NAME (+ OFFSET): position-independent adrp + add
 *                                      (ELF `:lo12:`, Mach-O `@PAGE` / `@PAGEOFF`). For a `const` or a
 *                                      non-exported function of the same file.
 *   SYM(NAME)                          the assembler name of an exported symbol (`_NAME` on Apple), e.g.
 *                                      `bl SYM(gpt2asm_expf_f32_neon)` to call another file's function.
 *   mov_up D, S, S2...                 xD = xS, xS = xS2, ... in that order (register numbers): arguments
 *                                      moved up one register, e.g. `mov_up 8, 7, 6, 5, 4, 3, 2, 1`.
 *
 * Symbols are named gpt2asm_<op>_<dtype>_<family> (family neon or sme2); docs/kernels.md documents each.
 */
#ifndef GPT2ASM_AARCH64_ASM_S
#define GPT2ASM_AARCH64_ASM_S

#if defined(__APPLE__)
#  define GPT2ASM_MACHO 1
#  define SYM(name) _##name
#elif defined(__ELF__)
#  define GPT2ASM_ELF 1
#  define SYM(name) name
#else
#  error "asm/aarch64/asm.S: only ELF (Linux) and Mach-O (Apple) targets are supported"
#endif

        .arch   armv8-a

#ifdef GPT2ASM_ELF
        /* no executable stack */
        .section .note.GNU-stack, "", %progbits
#endif
        .text

#ifdef GPT2ASM_MACHO
        .macro  function name, export=0, align=4
        .macro  endfunc
        .purgem endfunc
        .endm
        .text
        .p2align \align
        .if \export
        .globl  _\name
_\name:
        .else
\name:
        .endif
        .endm

        .macro  const name, align=4
        .macro  endconst
        .text
        .purgem endconst
        .endm
        .const
        .p2align \align
\name:
        .endm

        .macro  movrel rd, val, offset=0
        .if \offset < 0
        adrp    \rd, \val@PAGE
        add     \rd, \rd, \val@PAGEOFF
        sub     \rd, \rd, #-(\offset)
        .else
        adrp    \rd, \val+(\offset)@PAGE
        add     \rd, \rd, \val+(\offset)@PAGEOFF
        .endif
        .endm
#else
        .macro  function name, export=0, align=4
        .macro  endfunc
        .size   \name, . - \name
        .purgem endfunc
        .endm
        .text
        .p2align \align
        .if \export
        .globl  \name
        .endif
        .type   \name, %function
\name:
        .endm

        .macro  const name, align=4
        .macro  endconst
        .size   \name, . - \name
        .text
        .purgem endconst
        .endm
        .section .rodata
        .p2align \align
        .type   \name, %object
\name:
        .endm

        .macro  movrel rd, val, offset=0
        adrp    \rd, \val+(\offset)
        add     \rd, \rd, :lo12:\val+(\offset)
        .endm
#endif

        /* the callee-saved registers of AAPCS64 to (\op = stp) or from (\op = ldp) the stack frame:
         * x19-x28 at [sp, #\off] .. [sp, #\off + 72], d8-d15 at [sp, #\off] .. [sp, #\off + 56] */
        .macro  callee_x19_x28 op, off
        \op     x19, x20, [sp, #\off]
        \op     x21, x22, [sp, #\off+16]
        \op     x23, x24, [sp, #\off+32]
        \op     x25, x26, [sp, #\off+48]
        \op     x27, x28, [sp, #\off+64]
        .endm
        .macro  callee_d8_d15 op, off
        \op     d8, d9, [sp, #\off]
        \op     d10, d11, [sp, #\off+16]
        \op     d12, d13, [sp, #\off+32]
        \op     d14, d15, [sp, #\off+48]
        .endm

        .macro  mov_up dst, src, rest:vararg
        mov     x\dst, x\src
        .ifnb \rest
        mov_up  \src, \rest
        .endif
        .endm

#endif /* GPT2ASM_AARCH64_ASM_S */
