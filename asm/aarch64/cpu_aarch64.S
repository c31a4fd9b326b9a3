/*
 * asm/aarch64/cpu_aarch64.S -- the library's build id and the SME streaming vector length probe.
 */
#include "asm.S"

        .arch_extension sme                     // rdsvl

#ifndef GPT2ASM_BUILD_ID
#  define GPT2ASM_BUILD_ID "unknown"
#endif

/*
 * const char *gpt2asm_build_id(void);
 *   SHA-256 (hex) of the assembly sources the library was built from; Python compares it with the
 *   sources beside the package to detect a stale library.
 */
function gpt2asm_build_id, export=1
        movrel  x0, build_id
        ret
endfunc

/*
 * uint64_t gpt2asm_rdsvl(void);
 *   The streaming vector length in bytes (16, 32, 64, ... for SVL 128, 256, 512 bits): RDSVL, which is
 *   legal outside streaming mode.  SME only: on a CPU without FEAT_SME this is an illegal instruction
 *   (SIGILL), so call it only when the OS reports SME (Linux HWCAP2_SME, macOS hw.optional.arm.FEAT_SME);
 *   gpt2asm/cpu_arm.py does.
 */
function gpt2asm_rdsvl, export=1
        rdsvl   x0, #1
        ret
endfunc

const build_id, align=0
        .asciz  GPT2ASM_BUILD_ID
endconst
