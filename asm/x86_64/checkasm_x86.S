/*
 * asm/x86_64/checkasm_x86.S -- test harness only: a checkasm-style call trampoline that catches a kernel
 * clobbering a callee-saved register, moving the stack pointer, or leaving the direction flag, the MXCSR
 * control bits or the AVX upper state (no vzeroupper) changed.  Nothing in gpt2asm's own paths calls it;
 * gpt2asm/checkasm.py routes the tests' calls through it (docs/kernels.md, gpt2asm_checked_call).
 *
 * The trampoline and its state are static: NOT re-entrant and NOT thread-safe.  One call at a time in the
 * whole process (gpt2asm/checkasm.py holds a lock around each call), and never from the library's own
 * worker threads.
 */
#include "asm.S"

/* gpt2asm_checked_state: u64 slots.  In: TARGET (the function the next call runs; zeroed by every call),
 * FLAGS; out: STATUS (the clobber bits of docs/kernels.md, ORed in by every call; the caller clears it).
 * The others are the trampoline's private save area. */
#define ST_TARGET       0
#define ST_FLAGS        8               /* bit 0: check the AVX upper state (the CPU has XGETBV(1) and AVX) */
#define ST_STATUS       16
#define ST_RET          24              /* the caller's return address */
#define ST_RSP          32              /* rsp after popping it: the kernel must return with the same */
#define ST_RBX          40              /* rbx, rbp, r12-r15 of the caller: 40 .. 80 */
#define ST_MXCSR        88              /* MXCSR before the call (u32), after it (u32 at 92) */
#define ST_RAX          96              /* the kernel's rax, rdx while XGETBV needs them */
#define ST_RDX          104
#define ST_BYTES        128

/* the bits of STATUS (the same on both architectures, docs/kernels.md) */
#define CK_RBX          0               /* .. 5: rbx, rbp, r12, r13, r14, r15 */
#define CK_SP           24              /* the stack pointer moved */
#define CK_FPCTL        25              /* MXCSR control bits (DAZ, exception masks, rounding, FZ) changed */
#define CK_DF           26              /* the direction flag left set */
#define CK_AVX          27              /* the AVX upper state left in use: a missing vzeroupper */
#define CK_NOTARGET     31              /* called with TARGET 0: nothing was called */

#ifdef GPT2ASM_MACHO
        .data
        .p2align 6
        .globl  _gpt2asm_checked_state
_gpt2asm_checked_state:
L_checkasm_state:
        .space  ST_BYTES
#else
        .data
        .p2align 6
        .globl  gpt2asm_checked_state
        .type   gpt2asm_checked_state, @object
        .size   gpt2asm_checked_state, ST_BYTES
gpt2asm_checked_state:
.L_checkasm_state:
        .space  ST_BYTES
#endif
        .text

/* the canaries loaded into rbx, rbp, r12-r15 (a kernel that keeps them must give them back) */
const checkasm_canaries, 6
        .quad   0x5afeca11b0000000, 0x5afeca11b0000001, 0x5afeca11b0000002
        .quad   0x5afeca11b0000003, 0x5afeca11b0000004, 0x5afeca11b0000005
endconst

/* mask |= 1 << bit if reg != the canary at off(%r10) */
        .macro  check_canary reg, off, bit
        cmpq    \off(%r10), \reg
        je      1f
        orl     $(1 << (\bit)), %r9d
1:
        .endm

/*
 * <the kernel's prototype> gpt2asm_checked_call(<the kernel's arguments>);
 *
 *   Calls the function in gpt2asm_checked_state.TARGET with the caller's arguments untouched and returns
 *   its result untouched; afterwards ORs into STATUS what the function broke, and repairs it.
 *
 *   Why a static target slot: ctypes sets only the argument registers (rdi, rsi, rdx, rcx, r8, r9,
 *   xmm0-7) and the stack arguments, so the target cannot travel in r11 or rax, and an extra argument
 *   would shift the kernel's own (an extra first one moves every register, an extra last one lands in
 *   a register or on the stack depending on the kernel).  So Python binds one more ctypes prototype of
 *   this trampoline per kernel, with the kernel's argtypes and restype, and writes the kernel's address
 *   into TARGET before each call: the trampoline sees exactly the kernel's argument registers and stack.
 *
 *   The stack arguments keep their offsets: the return address is popped into the save area, so rsp
 *   points at the first stack argument as in the caller, and `call` pushes the trampoline's own return
 *   address where the caller's was.  rbx, rbp, r12-r15 are saved and loaded with canaries; after the
 *   call each is compared with its canary, rsp with its value before the call, DF with 0, the MXCSR
 *   control bits with their value before the call and (FLAGS bit 0) XINUSE bit 2 (YMM upper halves) with
 *   0: the upper halves are zeroed (vzeroupper) before the call, so a dirty state afterwards is the
 *   kernel's.  Only rcx, rsi, rdi, r8-r11 are used after the call: rax, rdx and xmm0-1 (the return value)
 *   are preserved (XGETBV's eax/edx are saved around it).
 */
function gpt2asm_checked_call
        movrel  %r11, checkasm_state
        popq    ST_RET(%r11)
        movq    %rsp, ST_RSP(%r11)
        movq    %rbx, ST_RBX(%r11)
        movq    %rbp, ST_RBX+8(%r11)
        movq    %r12, ST_RBX+16(%r11)
        movq    %r13, ST_RBX+24(%r11)
        movq    %r14, ST_RBX+32(%r11)
        movq    %r15, ST_RBX+40(%r11)
        stmxcsr ST_MXCSR(%r11)
        movrel  %r10, checkasm_canaries
        movq    0(%r10), %rbx
        movq    8(%r10), %rbp
        movq    16(%r10), %r12
        movq    24(%r10), %r13
        movq    32(%r10), %r14
        movq    40(%r10), %r15
        testb   $1, ST_FLAGS(%r11)
        jz      1f
        vzeroupper                              // a clean upper state: what is dirty after is the kernel's
1:      cmpq    $0, ST_TARGET(%r11)
        je      8f
        callq   *ST_TARGET(%r11)

        movrel  %r11, checkasm_state
        movrel  %r10, checkasm_canaries
        xorl    %r9d, %r9d                      // r9d: the clobber bits of this call
        check_canary %rbx, 0, CK_RBX
        check_canary %rbp, 8, CK_RBX+1
        check_canary %r12, 16, CK_RBX+2
        check_canary %r13, 24, CK_RBX+3
        check_canary %r14, 32, CK_RBX+4
        check_canary %r15, 40, CK_RBX+5
        cmpq    ST_RSP(%r11), %rsp
        je      1f
        orl     $(1 << CK_SP), %r9d
        movq    ST_RSP(%r11), %rsp
1:      pushfq
        popq    %rcx
        btl     $10, %ecx                       // DF
        jnc     1f
        orl     $(1 << CK_DF), %r9d
        cld
1:      stmxcsr ST_MXCSR+4(%r11)
        movl    ST_MXCSR+4(%r11), %ecx
        xorl    ST_MXCSR(%r11), %ecx
        testl   $0xffc0, %ecx                   // bits 6-15: DAZ, the six masks, RC, FZ
        jz      1f
        orl     $(1 << CK_FPCTL), %r9d
        ldmxcsr ST_MXCSR(%r11)
1:      testb   $1, ST_FLAGS(%r11)
        jz      9f
        movq    %rax, ST_RAX(%r11)
        movq    %rdx, ST_RDX(%r11)
        movl    $1, %ecx
        xgetbv                                  // XINUSE
        testb   $4, %al
        jz      1f
        orl     $(1 << CK_AVX), %r9d
        vzeroupper
1:      movq    ST_RAX(%r11), %rax
        movq    ST_RDX(%r11), %rdx
        jmp     9f

8:      movl    $(1 << CK_NOTARGET), %r9d       // no target: nothing called, returns 0
        xorl    %eax, %eax
9:      orq     %r9, ST_STATUS(%r11)
        movq    $0, ST_TARGET(%r11)
        movq    ST_RBX(%r11), %rbx
        movq    ST_RBX+8(%r11), %rbp
        movq    ST_RBX+16(%r11), %r12
        movq    ST_RBX+24(%r11), %r13
        movq    ST_RBX+32(%r11), %r14
        movq    ST_RBX+40(%r11), %r15
        pushq   ST_RET(%r11)
        ret
endfunc

/* ---- self-tests: functions that break the ABI on purpose (tests/test_checkasm.py) ------------------- */

/*
 * double gpt2asm_checkasm_args(uint64_t a0, ..., uint64_t a9, double d0, double d1);
 *   d0 - d1 + sum (i + 1) a_i (the sum in uint64, then converted): a0-a5 come in registers, a6-a9 on the
 *   stack, d0 and d1 in xmm0 and xmm1, the result in xmm0 -- shows that the trampoline passes all of them.
 */
function gpt2asm_checkasm_args
        leaq    (%rdi, %rsi, 2), %rax           // a0 + 2 a1
        imulq   $3, %rdx, %rdx
        addq    %rdx, %rax
        leaq    (%rax, %rcx, 4), %rax           // + 4 a3
        imulq   $5, %r8, %r8
        addq    %r8, %rax
        imulq   $6, %r9, %r9
        addq    %r9, %rax
        imulq   $7, 8(%rsp), %rcx               // a6 .. a9: the stack arguments
        addq    %rcx, %rax
        movq    16(%rsp), %rcx
        leaq    (%rax, %rcx, 8), %rax
        imulq   $9, 24(%rsp), %rcx
        addq    %rcx, %rax
        imulq   $10, 32(%rsp), %rcx
        addq    %rcx, %rax
        subsd   %xmm1, %xmm0
        cvtsi2sdq %rax, %xmm1
        addsd   %xmm1, %xmm0
        ret
endfunc

/*
 * void gpt2asm_checkasm_clobber(uint64_t mask);
 *   zeroes, without saving them, the callee-saved registers whose STATUS bits are set in mask: bit 0 rbx,
 *   1 rbp, 2 r12, 3 r13, 4 r14, 5 r15.
 */
        .macro  clobber_if bit, reg
        btq     $\bit, %rdi
        jnc     1f
        xorl    \reg, \reg
1:
        .endm
function gpt2asm_checkasm_clobber
        clobber_if 0, %ebx
        clobber_if 1, %ebp
        clobber_if 2, %r12d
        clobber_if 3, %r13d
        clobber_if 4, %r14d
        clobber_if 5, %r15d
        ret
endfunc

/* void gpt2asm_checkasm_clobber_rsp(void);   returns with rsp 16 bytes lower than it should be */
function gpt2asm_checkasm_clobber_rsp
        popq    %rcx
        subq    $16, %rsp
        jmpq    *%rcx
endfunc

/* void gpt2asm_checkasm_clobber_df(void);   returns with the direction flag set */
function gpt2asm_checkasm_clobber_df
        std
        ret
endfunc

/* void gpt2asm_checkasm_clobber_mxcsr(void);   returns with flush-to-zero set */
function gpt2asm_checkasm_clobber_mxcsr
        subq    $8, %rsp
        stmxcsr (%rsp)
        orl     $0x8000, (%rsp)
        ldmxcsr (%rsp)
        addq    $8, %rsp
        ret
endfunc

/* void gpt2asm_checkasm_clobber_vzeroupper(void);   returns with ymm0's upper half in use (AVX) */
function gpt2asm_checkasm_clobber_vzeroupper
        vcmpps  $0x0f, %ymm0, %ymm0, %ymm0     // all ones (TRUE_UQ)
        ret
endfunc
