/*
 * asm/x86_64/cpu_x86.S -- CPU feature probes and the library's build id.
 */
#include "asm.S"

#ifndef GPT2ASM_BUILD_ID
#  define GPT2ASM_BUILD_ID "unknown"
#endif

/*
 * void gpt2asm_cpuid(uint32_t leaf, uint32_t subleaf, uint32_t regs[4]);
 *   regs = { eax, ebx, ecx, edx } of CPUID(leaf, subleaf).
 */
function gpt2asm_cpuid
        pushq   %rbx                    // cpuid clobbers rbx, which is callee-saved
        movq    %rdx, %r8               // regs
        movl    %edi, %eax              // leaf
        movl    %esi, %ecx              // subleaf
        cpuid
        movl    %eax,  0(%r8)
        movl    %ebx,  4(%r8)
        movl    %ecx,  8(%r8)
        movl    %edx, 12(%r8)
        popq    %rbx
        ret
endfunc

/*
 * uint64_t gpt2asm_xgetbv(uint32_t xcr);
 *   XCR[xcr] (0 = XCR0, the register state the OS saves).  Only call it when CPUID.1:ECX.OSXSAVE is 1.
 */
function gpt2asm_xgetbv
        movl    %edi, %ecx
        xgetbv
        shlq    $32, %rdx
        orq     %rdx, %rax
        ret
endfunc

/*
 * const char *gpt2asm_build_id(void);
 *   SHA-256 (hex) of the assembly sources the library was built from; Python compares it with the
 *   sources beside the package to detect a stale library.
 */
function gpt2asm_build_id
        movrel  %rax, build_id
        ret
endfunc

const build_id, 0
        .asciz  GPT2ASM_BUILD_ID
endconst
