/*
 * asm/aarch64/checkasm_aarch64.S -- test harness only: a checkasm-style call trampoline that catches a
 * kernel clobbering a callee-saved register (x19-x29, d8-d15), moving sp, changing FPCR, or (SME) coming
 * back in streaming mode or with ZA on.  Nothing in gpt2asm's own paths calls it; gpt2asm/checkasm.py
 * routes the tests' calls through it (docs/kernels.md, gpt2asm_checked_call).
 *
 * The trampoline and its state are static: NOT re-entrant and NOT thread-safe.  One call at a time in the
 * whole process (gpt2asm/checkasm.py holds a lock around each call), and never from the library's own
 * worker threads.
 */
#include "asm.S"

        .arch_extension sme                     // mrs svcr / smstop, executed only with FLAGS bit 0

/* gpt2asm_checked_state: u64 slots.  In: TARGET (the function the next call runs; zeroed by every call),
 * FLAGS; out: STATUS (the clobber bits of docs/kernels.md, ORed in by every call; the caller clears it).
 * The others are the trampoline's private save area. */
#define ST_TARGET       0
#define ST_FLAGS        8               /* bit 0: check SVCR (the CPU has SME) */
#define ST_STATUS       16
#define ST_SP           24              /* sp at the call: the kernel must return with the same */
#define ST_FPCR         32
#define ST_X19          40              /* x19-x30 of the caller: 40 .. 128 */
#define ST_D8           136             /* d8-d15 of the caller: 136 .. 192 */
#define ST_BYTES        256

/* the bits of STATUS (the same on both architectures, docs/kernels.md) */
#define CK_X19          0               /* .. 10: x19 .. x29 */
#define CK_D8           16              /* .. 23: d8 .. d15 */
#define CK_SP           24              /* sp moved */
#define CK_FPCTL        25              /* FPCR changed */
#define CK_SM           26              /* came back in streaming mode or with ZA on (SVCR != 0) */
#define CK_NOTARGET     31              /* called with TARGET 0: nothing was called */

/* the canaries: x19-x29 at 0 .. 80, d8-d15 at 96 .. 152 (a kernel that keeps them must give them back) */
#define CAN_D8          96
const checkasm_canaries, align=6
        .quad   0x5afeca11b0000013, 0x5afeca11b0000014, 0x5afeca11b0000015, 0x5afeca11b0000016
        .quad   0x5afeca11b0000017, 0x5afeca11b0000018, 0x5afeca11b0000019, 0x5afeca11b000001a
        .quad   0x5afeca11b000001b, 0x5afeca11b000001c, 0x5afeca11b000001d, 0
        .quad   0x7ff5ca11d0000008, 0x7ff5ca11d0000009, 0x7ff5ca11d000000a, 0x7ff5ca11d000000b
        .quad   0x7ff5ca11d000000c, 0x7ff5ca11d000000d, 0x7ff5ca11d000000e, 0x7ff5ca11d000000f
endconst

#ifdef GPT2ASM_MACHO
        .data
        .p2align 6
        .globl  _gpt2asm_checked_state
_gpt2asm_checked_state:
checkasm_state:
        .space  ST_BYTES
#else
        .data
        .p2align 6
        .globl  gpt2asm_checked_state
        .type   gpt2asm_checked_state, %object
        .size   gpt2asm_checked_state, ST_BYTES
gpt2asm_checked_state:
checkasm_state:
        .space  ST_BYTES
#endif
        .text

/* x9 |= 1 << bit if reg (x) != the canary at [x17, #off] */
        .macro  check_x reg, off, bit
        ldr     x10, [x17, #\off]
        cmp     \reg, x10
        cset    x11, ne
        orr     x9, x9, x11, lsl #\bit
        .endm
/* ... for d reg */
        .macro  check_d reg, off, bit
        ldr     x10, [x17, #\off]
        fmov    x12, \reg
        cmp     x12, x10
        cset    x11, ne
        orr     x9, x9, x11, lsl #\bit
        .endm

/*
 * <the kernel's prototype> gpt2asm_checked_call(<the kernel's arguments>);
 *
 *   Calls the function in gpt2asm_checked_state.TARGET with the caller's arguments untouched and returns
 *   its result untouched; afterwards ORs into STATUS what the function broke, and repairs it.
 *
 *   Why a static target slot: ctypes sets only the argument registers (x0-x7, v0-v7) and the stack
 *   arguments, so the target cannot travel in x9-x17, and an extra argument would shift the kernel's
 *   own.  So Python binds one more ctypes prototype of this trampoline per kernel, with the kernel's
 *   argtypes and restype, and writes the kernel's address into TARGET before each call: the trampoline
 *   sees exactly the kernel's argument registers, and since it saves everything into the static area
 *   (no stack frame) and calls with blr, the kernel sees the caller's sp and stack arguments.
 *
 *   x19-x30 and d8-d15 are saved, x19-x29 and d8-d15 loaded with canaries; after the call (SME, FLAGS
 *   bit 0: SVCR first, leaving streaming mode / ZA if the kernel did not) each is compared with its
 *   canary, sp and FPCR with their values before the call.  Only x9-x17 are used after the call: x0-x7
 *   and v0-v7 (the return value) are preserved.
 */
function gpt2asm_checked_call, export=1
        movrel  x16, checkasm_state
        stp     x19, x20, [x16, #ST_X19]
        stp     x21, x22, [x16, #ST_X19+16]
        stp     x23, x24, [x16, #ST_X19+32]
        stp     x25, x26, [x16, #ST_X19+48]
        stp     x27, x28, [x16, #ST_X19+64]
        stp     x29, x30, [x16, #ST_X19+80]
        stp     d8, d9, [x16, #ST_D8]
        stp     d10, d11, [x16, #ST_D8+16]
        stp     d12, d13, [x16, #ST_D8+32]
        stp     d14, d15, [x16, #ST_D8+48]
        mov     x17, sp
        str     x17, [x16, #ST_SP]
        mrs     x17, fpcr
        str     x17, [x16, #ST_FPCR]
        movrel  x17, checkasm_canaries
        ldp     x19, x20, [x17]
        ldp     x21, x22, [x17, #16]
        ldp     x23, x24, [x17, #32]
        ldp     x25, x26, [x17, #48]
        ldp     x27, x28, [x17, #64]
        ldr     x29, [x17, #80]
        ldp     d8, d9, [x17, #CAN_D8]
        ldp     d10, d11, [x17, #CAN_D8+16]
        ldp     d12, d13, [x17, #CAN_D8+32]
        ldp     d14, d15, [x17, #CAN_D8+48]
        ldr     x16, [x16, #ST_TARGET]
        cbz     x16, 8f
        blr     x16

        movrel  x16, checkasm_state
        mov     x9, #0                          // x9: the clobber bits of this call
        ldr     x10, [x16, #ST_FLAGS]
        tbz     x10, #0, 1f
        mrs     x10, svcr                       // SM (bit 0), ZA (bit 1): both must be off again
        cbz     x10, 1f
        orr     x9, x9, #(1 << CK_SM)
        smstop                                  // (zeroes v0-v31: the d8-d15 checks report it too)
1:      movrel  x17, checkasm_canaries
        check_x x19, 0, CK_X19
        check_x x20, 8, CK_X19+1
        check_x x21, 16, CK_X19+2
        check_x x22, 24, CK_X19+3
        check_x x23, 32, CK_X19+4
        check_x x24, 40, CK_X19+5
        check_x x25, 48, CK_X19+6
        check_x x26, 56, CK_X19+7
        check_x x27, 64, CK_X19+8
        check_x x28, 72, CK_X19+9
        check_x x29, 80, CK_X19+10
        check_d d8, CAN_D8, CK_D8
        check_d d9, CAN_D8+8, CK_D8+1
        check_d d10, CAN_D8+16, CK_D8+2
        check_d d11, CAN_D8+24, CK_D8+3
        check_d d12, CAN_D8+32, CK_D8+4
        check_d d13, CAN_D8+40, CK_D8+5
        check_d d14, CAN_D8+48, CK_D8+6
        check_d d15, CAN_D8+56, CK_D8+7
        mov     x10, sp
        ldr     x11, [x16, #ST_SP]
        cmp     x10, x11
        cset    x12, ne
        orr     x9, x9, x12, lsl #CK_SP
        mov     sp, x11
        mrs     x10, fpcr
        ldr     x11, [x16, #ST_FPCR]
        cmp     x10, x11
        cset    x12, ne
        orr     x9, x9, x12, lsl #CK_FPCTL
        msr     fpcr, x11
        b       9f

8:      movrel  x16, checkasm_state             // no target: nothing called, returns 0
        mov     x9, #(1 << CK_NOTARGET)
        mov     x0, #0
9:      ldr     x10, [x16, #ST_STATUS]
        orr     x10, x10, x9
        str     x10, [x16, #ST_STATUS]
        str     xzr, [x16, #ST_TARGET]
        ldp     x19, x20, [x16, #ST_X19]
        ldp     x21, x22, [x16, #ST_X19+16]
        ldp     x23, x24, [x16, #ST_X19+32]
        ldp     x25, x26, [x16, #ST_X19+48]
        ldp     x27, x28, [x16, #ST_X19+64]
        ldp     x29, x30, [x16, #ST_X19+80]
        ldp     d8, d9, [x16, #ST_D8]
        ldp     d10, d11, [x16, #ST_D8+16]
        ldp     d12, d13, [x16, #ST_D8+32]
        ldp     d14, d15, [x16, #ST_D8+48]
        ret
endfunc

/* ---- self-tests: functions that break the ABI on purpose (tests/test_checkasm.py) ------------------- */

/*
 * double gpt2asm_checkasm_args(uint64_t a0, ..., uint64_t a9, double d0, double d1);
 *   d0 - d1 + sum (i + 1) a_i (the sum in uint64, then converted): a0-a7 come in x0-x7, a8 and a9 on the
 *   stack, d0 and d1 in d0 and d1, the result in d0 -- shows that the trampoline passes all of them.
 */
function gpt2asm_checkasm_args, export=1
        add     x0, x0, x1, lsl #1
        mov     x9, #3
        madd    x0, x2, x9, x0
        add     x0, x0, x3, lsl #2
        mov     x9, #5
        madd    x0, x4, x9, x0
        mov     x9, #6
        madd    x0, x5, x9, x0
        mov     x9, #7
        madd    x0, x6, x9, x0
        add     x0, x0, x7, lsl #3
        ldp     x10, x11, [sp]                  // a8, a9: the stack arguments
        mov     x9, #9
        madd    x0, x10, x9, x0
        mov     x9, #10
        madd    x0, x11, x9, x0
        fsub    d0, d0, d1
        ucvtf   d1, x0
        fadd    d0, d0, d1
        ret
endfunc

/*
 * void gpt2asm_checkasm_clobber(uint64_t mask);
 *   zeroes, without saving them, the callee-saved registers whose STATUS bits are set in mask: bits 0-10
 *   x19-x29, bits 16-23 d8-d15.
 */
        .macro  clobber_x bit, reg
        tbz     x0, #\bit, 1f
        mov     \reg, #0
1:
        .endm
        .macro  clobber_d bit, reg
        tbz     x0, #\bit, 1f
        movi    \reg, #0
1:
        .endm
function gpt2asm_checkasm_clobber, export=1
        clobber_x 0, x19
        clobber_x 1, x20
        clobber_x 2, x21
        clobber_x 3, x22
        clobber_x 4, x23
        clobber_x 5, x24
        clobber_x 6, x25
        clobber_x 7, x26
        clobber_x 8, x27
        clobber_x 9, x28
        clobber_x 10, x29
        clobber_d 16, d8
        clobber_d 17, d9
        clobber_d 18, d10
        clobber_d 19, d11
        clobber_d 20, d12
        clobber_d 21, d13
        clobber_d 22, d14
        clobber_d 23, d15
        ret
endfunc

/* void gpt2asm_checkasm_clobber_sp(void);   returns with sp 16 bytes lower */
function gpt2asm_checkasm_clobber_sp, export=1
        sub     sp, sp, #16
        ret
endfunc

/* void gpt2asm_checkasm_clobber_fpcr(void);   returns with flush-to-zero (FPCR.FZ) set */
function gpt2asm_checkasm_clobber_fpcr, export=1
        mrs     x9, fpcr
        orr     x9, x9, #(1 << 24)
        msr     fpcr, x9
        ret
endfunc

/* void gpt2asm_checkasm_clobber_sm(void);   returns in streaming mode (SME only: SIGILL without) */
function gpt2asm_checkasm_clobber_sm, export=1
        smstart sm
        ret
endfunc
