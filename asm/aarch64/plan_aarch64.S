/*
 * asm/aarch64/plan_aarch64.S -- the -j thread pool and the plan executor for AArch64 (one forward step
 * per call): the same records, jobs and protocol as asm/x86_64/plan_x86.S, documented in docs/kernels.md
 * ("Thread pool and plans").
 *
 *     void gpt2asm_plan_run_{neon,sme2}(pool_t *ctx, plan_t *plan, size_t job_begin, size_t job_end);
 *     size_t gpt2asm_plan_step_{neon,sme2}(pool_t *ctx, plan_t *plan, size_t token, size_t pos);
 *     void gpt2asm_worker_{neon,sme2}(pool_t *ctx, size_t tid);        // returns at shutdown
 *     void gpt2asm_pool_shutdown(pool_t *ctx);
 *
 * Every participant (the caller as thread 0, the workers 1 .. n-1 parked in gpt2asm_worker_*) walks the
 * job list, claims work items (tiles of 64 outputs, heads, rows) from each job's counter and runs the
 * NEON / SME2 kernels on them; each output is computed whole by one thread with the kernels' own
 * operation sequence, so results do not depend on the thread count or on who claimed what.
 *
 * Families: plan_run_neon runs every job with NEON kernels.  plan_run_sme2 runs thread 0's matrix-vector
 * products (f32, f16 weights) and prefill matrix-matrix products (every dtype) with the SME2 kernels and
 * everything else with NEON's; its workers (gpt2asm_worker_sme2) run NEON only.  SME2 and NEON give the same bits (contract 1), so the split is
 * free to choose: on Apple M4 a cluster of cores shares one SME unit, so one streaming-mode thread per
 * process and NEON on the other cores use both the SME unit and the cores' own vector units.
 *
 * Prefill and batched decode: the row jobs ROWLN (with PRO_EMBED and the row table: each row's own
 * token and position), ROWATTN, MATMUL, and the batched decode kinds BATTN (item by item: row t, head h)
 * and ROWARGMAX, as on x86 (docs/kernels.md "Batched decode").
 *
 * q8_0 / q4_0 (FL_Q0, KIND_ROWQUANT; docs/kernels.md "q8_0 / q4_0 jobs"): the job carries the addresses of
 * the kernel variants Python chose (J_QFN the activation quantizer, J_FN the q0 matvec / matmul: neon's
 * best variant, or sme2's for the sme2 family -- its workers, which otherwise run NEON, call them too),
 * called with blr: MATVEC / QKV quantize their input into the thread's private area in the prologue,
 * MATMUL reads rows quantized by a ROWQUANT job (J_X / J_LDX bytes, J_XD / J_LDD).
 *
 * Atomics: load-exclusive / store-exclusive loops (base ARMv8.0, no LSE needed).  Where the x86 code
 * relies on a locked instruction being a full fence (publishing a run, arriving at a barrier, counting a
 * sleeper), the loop is acquire/release and followed by `dmb ish`; every wait ends with `dmb ish`, so the
 * reads after it see the writes before the matching atomic.
 *
 * Waiting: spin with `isb` (a short delay that, unlike `yield`, really waits on current cores) for
 * ctx.spin_ticks nanoseconds (on AArch64 ctx.spin / ctx.yield are nanoseconds, converted with
 * CNTFRQ_EL0 to ticks of the virtual counter CNTVCT_EL0), calling sched_yield between rounds after
 * ctx.yield, then park: Linux futex, macOS __ulock_wait / __ulock_wake (link-checked, not run here).
 * A thread that parks first counts itself in a sleeper word next to the one it waits on; the thread that
 * changes the word wakes only if that count is nonzero.  Both sides are fenced, so no wake-up is lost.
 * With ctx.n_threads == 1 nothing here spins, parks, reads the counter or makes a system call.
 *
 * x18 is never touched.  The kernels are called directly (ELF: declared .protected, so the links bind
 * inside the library without a PLT).
 */
#include "asm.S"

/* the records, kinds and flags: asm/plan_abi.h (this file also emits its table, gpt2asm_plan_abi) */
#define PLAN_ABI_TABLE
#include "plan_abi.h"

#ifdef GPT2ASM_ELF
        .protected gpt2asm_matvec_f32_neon, gpt2asm_matvec_f16_neon
        .protected gpt2asm_matvec_f32_sme2, gpt2asm_matvec_f16_sme2, gpt2asm_layernorm_f32_neon
        .protected gpt2asm_gelu_f32_neon, gpt2asm_attention_f32_neon, gpt2asm_attention_f16_neon
        .protected gpt2asm_matmul_f32_neon, gpt2asm_matmul_f16_neon
        .protected gpt2asm_matmul_f32_sme2, gpt2asm_matmul_f16_sme2
        .protected gpt2asm_argmax_f32_neon, gpt2asm_plan_run_neon, gpt2asm_plan_run_sme2
#endif

/* ================================================================================================ */
/* atomics                                                                                          */

        /* *addr += 1 (u32) as a full fence; \new = the new value.  Clobbers \new, \st. */
        .macro  inc32_fence addr, new, st
.Linc\@:
        ldaxr   \new, [\addr]
        add     \new, \new, #1
        stlxr   \st, \new, [\addr]
        cbnz    \st, .Linc\@
        dmb     ish
        .endm

        /* *addr = *addr \op 1 (\op add or sub; u32 with a w register, u64 with an x one), relaxed */
        .macro  step_relaxed op, addr, val, st
.Lstep\@:
        ldxr    \val, [\addr]
        \op     \val, \val, #1
        stxr    \st, \val, [\addr]
        cbnz    \st, .Lstep\@
        .endm

/* ================================================================================================ */
/* parking: the only OS-specific code (system calls keep every register but x0; macOS: x0, x1)     */

/* pool_park(u32 *addr = x0, u32 expected = w1): sleep while *addr == expected (may return spuriously). */
function pool_park
#ifdef GPT2ASM_MACHO
        mov     w2, w1                          // __ulock_wait(UL_COMPARE_AND_WAIT, addr, value, 0)
        mov     x1, x0
        mov     w0, #1
        mov     x3, #0
        mov     x16, #515
        svc     #0x80
#else
        mov     w2, w1                          // futex(addr, FUTEX_WAIT_PRIVATE, expected, NULL)
        mov     w1, #128
        mov     x3, #0
        mov     x8, #98
        svc     #0
#endif
        ret
endfunc

/* pool_wake(u32 *addr = x0): wake every thread parked on addr. */
function pool_wake
#ifdef GPT2ASM_MACHO
        mov     x1, x0                          // __ulock_wake(UL_COMPARE_AND_WAIT | ULF_WAKE_ALL, addr, 0)
        mov     w0, #0x101
        mov     x2, #0
        mov     x16, #516
        svc     #0x80
#else
        mov     w1, #129                        // futex(addr, FUTEX_WAKE_PRIVATE, INT_MAX)
        mov     w2, #0x7fffffff
        mov     x8, #98
        svc     #0
#endif
        ret
endfunc

/* pool_yield(): sched_yield() (macOS: a no-op). */
function pool_yield
#ifndef GPT2ASM_MACHO
        mov     x8, #124
        svc     #0
#endif
        ret
endfunc

/*
 * pool_wait_eq / pool_wait_ne (u32 *addr = x0, u32 value = w1, u32 *sleepers = x2, u64 spin_ns = x3,
 * u64 *parks = x4 = &ctx.parks): return once *addr == value (eq) / *addr != value (ne), then `dmb ish`.
 * Spin with isb for spin_ns (yielding between rounds of 64 after ctx.yield ns), then park on addr
 * (counted in *sleepers while parked, and in *parks).  Preserves x19-x28.
 */
        .macro  pool_wait_fn name, done
function \name
        ldr     w9, [x0]
        cmp     w9, w1
        b.\done 9f                              // already there
        stp     x29, x30, [sp, #-64]!
        mov     x29, sp
        stp     x19, x20, [sp, #16]
        stp     x21, x22, [sp, #32]
        stp     x23, x24, [sp, #48]
        mov     x19, x0                         // addr
        mov     w20, w1                         // value
        mov     x21, x2                         // sleepers
        mov     x22, x4                         // parks
        mrs     x9, cntfrq_el0                  // ticks per second
        mov     x10, #0xca00
        movk    x10, #0x3b9a, lsl #16           // 1e9
        mul     x11, x3, x9
        udiv    x11, x11, x10                   // spin ticks
        ldr     x12, [x4, #CTX_YIELD - CTX_PARKS]
        mul     x12, x12, x9
        udiv    x12, x12, x10                   // yield ticks
        isb
        mrs     x13, cntvct_el0
        add     x23, x13, x11                   // deadline: park
        add     x24, x13, x12                   // from then on: yield between rounds
1:      mov     w9, #64
2:      isb
        ldr     w10, [x19]
        cmp     w10, w20
        b.\done 8f
        subs    w9, w9, #1
        b.ne    2b
        mrs     x13, cntvct_el0
        cmp     x13, x23
        b.hs    3f
        cmp     x13, x24
        b.lo    1b
        bl      pool_yield                      // the thread we wait for may need this CPU
        b       1b
3:      inc32_fence x21, w10, w11               // parked from here on (a full fence)
5:      ldr     w1, [x19]
        cmp     w1, w20
        b.\done 4f
        step_relaxed add, x22, x10, w11
        mov     x0, x19
        bl      pool_park                       // sleeps while *addr == w1
        b       5b
4:      step_relaxed sub, x21, w10, w11
8:      ldp     x23, x24, [sp, #48]
        ldp     x21, x22, [sp, #32]
        ldp     x19, x20, [sp, #16]
        ldp     x29, x30, [sp], #64
9:      dmb     ish
        ret
endfunc
        .endm

        pool_wait_fn pool_wait_eq, eq
        pool_wait_fn pool_wait_ne, ne

/*
 * pool_arrive(u32 *count = x0, u32 wait = w1, u32 *sleepers = x2, u32 n = w3, pool_t *ctx = x4): count
 * one arrival (a full fence: the thread's outputs are visible); the n-th wakes the parked ones; if
 * `wait`, the others return once all n have arrived.
 */
function pool_arrive
        inc32_fence x0, w9, w10
        cmp     w9, w3
        b.ne    1f
        ldr     w10, [x2]
        cbnz    w10, pool_wake                  // tail call: the last one wakes the parked
        ret
1:      cbz     w1, 2f
        mov     w1, w3
        ldr     x3, [x4, #CTX_SPIN]
        add     x4, x4, #CTX_PARKS
        b       pool_wait_eq                    // tail call
2:      ret
endfunc

/*
 * void gpt2asm_pool_shutdown(pool_t *ctx);
 *   Tell the workers to return (call only while no plan runs): shutdown = 1, a new generation, wake.
 */
function gpt2asm_pool_shutdown, export=1
        mov     w9, #1
        str     w9, [x0, #CTX_SHUTDOWN]
        inc32_fence x0, w9, w10                 // CTX_SEQ (offset 0); release orders the store above
        ldr     w10, [x0, #CTX_SEQ_SLEEPERS]
        cbnz    w10, pool_wake
        ret
endfunc

/* ================================================================================================ */
/* elementwise helpers (exact: one binary32 operation per element, any vector width gives the bits) */

/* vadd_neon(dst = x0, a = x1, b = x2, n = x3): dst[i] = a[i] + b[i], n a multiple of 16 (dst may be a
 * or b).  Clobbers x0-x3, v0-v7. */
function vadd_neon
        cbz     x3, 2f
1:      ld1     {v0.4s, v1.4s, v2.4s, v3.4s}, [x1], #64
        ld1     {v4.4s, v5.4s, v6.4s, v7.4s}, [x2], #64
        fadd    v0.4s, v0.4s, v4.4s
        fadd    v1.4s, v1.4s, v5.4s
        fadd    v2.4s, v2.4s, v6.4s
        fadd    v3.4s, v3.4s, v7.4s
        st1     {v0.4s, v1.4s, v2.4s, v3.4s}, [x0], #64
        subs    x3, x3, #16
        b.hi    1b
2:      ret
endfunc

/* kv16_store(dst = x0, src = x1, n = x2): dst[i] = binary16(src[i]), rounded to nearest even (FCVTN
 * under the default FPCR: the rounding of numpy's astype(float16)), n a multiple of 8: the float32 k / v
 * rows of a binary16 cache, written from their staging rows.  Clobbers x0-x2, v0-v1. */
function kv16_store
        cbz     x2, 2f
1:      ld1     {v0.4s, v1.4s}, [x1], #32
        fcvtn   v0.4h, v0.4s
        fcvtn2  v0.8h, v1.4s
        st1     {v0.8h}, [x0], #16
        subs    x2, x2, #8
        b.hi    1b
2:      ret
endfunc

/* kv32_copy(dst = x0, src = x1): dst[i] = src[i] for 64 floats (a float32 k / v row into its cache; no
 * float operation: the bits as they are).  Clobbers x0-x2, v0-v3. */
function kv32_copy
        mov     x2, #4
1:      ld1     {v0.4s, v1.4s, v2.4s, v3.4s}, [x1], #64
        st1     {v0.4s, v1.4s, v2.4s, v3.4s}, [x0], #64
        subs    x2, x2, #1
        b.ne    1b
        ret
endfunc

/* ================================================================================================ */
/* the executor, once per family                                                                    */

/* Frame of plan_jobs_<isa> (FRAME bytes; sp 16-byte aligned at every call):
 *     [sp, #0 .. #31]    stack arguments 9-11 of the kernel being called
 *     F_H                current head / tile / row / item       F_ROW    row of a MATMUL epilogue
 *     F_KVDST            FL_KV16: the cache row(s) its staged k / v rows go to
 *     x19-x28, x29/x30   saved
 * Callee-saved registers: x19 ctx, x20 plan, x21 current job, x22 thread id, x23 private area, x24 the
 * job's matvec input (x, or the private LayerNorm output), x25 end of the job range, x26 the job's item
 * count, x27 / x28 the current claim [first, end). */
#define F_H     32
#define F_ROW   40
#define F_KVDST 48
#define FRAME   160

        /* x24 = the job's matvec input, after its prologue (embedding add, LayerNorm) */
        .macro  job_prologue
        ldr     x24, [x21, #J_X]
        ldr     w9, [x21, #J_FLAGS]
        ands    w9, w9, #PRO_MASK
        b.eq    .Lpro_done\@
        tbz     w9, #B_PRO_EMBED, .Lpro_ln\@
        ldr     x0, [x20, #PL_X]                // thread 0 writes the residual stream ...
        cbz     x22, .Lpro_e\@
        ldr     x9, [x20, #PL_E_OFF]
        add     x0, x23, x9                     // ... the others a private copy of it
.Lpro_e\@:
        mov     x24, x0
        ldr     x3, [x20, #PL_C]
        ldr     x9, [x20, #PL_TOKEN]
        mul     x9, x9, x3
        ldr     x1, [x20, #PL_WTE]
        add     x1, x1, x9, lsl #2              // wte[token]
        ldr     x9, [x20, #PL_POS]
        mul     x9, x9, x3
        ldr     x2, [x20, #PL_WPE]
        add     x2, x2, x9, lsl #2              // wpe[pos]
        bl      vadd_neon                       // x = wte[token] + wpe[pos]
.Lpro_ln\@:
        mov     x0, x24
        ldr     x1, [x21, #J_G]
        ldr     x2, [x21, #J_BETA]
        ldr     x9, [x20, #PL_H_OFF]
        add     x3, x23, x9
        mov     x24, x3                         // the matvec reads the private h
        ldr     x4, [x21, #J_NIN]
        bl      SYM(gpt2asm_layernorm_f32_neon)
.Lpro_done\@:
        /* FL_Q0: every thread quantizes the input into its private area (J_XD: xq [n_in], then xd at
         * + n_in) with the job's quantizer J_QFN; x24 = xq, which mv_call's q0 path turns into (xq, xd) */
        unless_bit B_Q0, .Lpro_q0\@
        mov     x0, x24
        ldr     x9, [x21, #J_XD]
        add     x1, x23, x9                     // xq
        ldr     x3, [x21, #J_NIN]
        add     x2, x1, x3                      // xd
        mov     x24, x1
        ldr     x9, [x21, #J_QFN]
        blr     x9                              // qfn(in, xq, xd, n_in)
.Lpro_q0\@:
        .endm

        /* claim the next items: x27, x28 = [first, end); branch to \none if none is left.
         * Fixed claims (flags bits 8-13 zero): J_CHUNK items per atomic add.  Guided claims (bits 8-13 =
         * s): max(J_CHUNK, remaining >> s) items, large contiguous claims first, J_CHUNK-sized ones at
         * the end, so the threads finish together.  No other memory access inside an exclusive pair. */
        .macro  claim none
        ldr     w9, [x21, #J_FLAGS]
        ubfx    w9, w9, #B_CLAIM_SHIFT, #CLAIM_SHIFT_BITS  // s
        ldr     x10, [x21, #J_CHUNK]
        add     x11, x21, #J_CLAIM
        cbnz    w9, .Lguided\@
.Lfixed\@:
        ldxr    x12, [x11]
        add     x13, x12, x10
        stxr    w14, x13, [x11]
        cbnz    w14, .Lfixed\@
        cmp     x12, x26
        b.hs    \none
        mov     x27, x12
        cmp     x13, x26
        csel    x28, x13, x26, lo               // min(first + chunk, n)
        b       .Lclaimed\@
.Lguided\@:
        ldxr    x12, [x11]
        cmp     x12, x26
        b.hs    .Lnone\@
        sub     x13, x26, x12
        lsr     x13, x13, x9                    // remaining >> s
        cmp     x13, x10
        csel    x13, x13, x10, hs               // at least J_CHUNK
        add     x13, x13, x12
        cmp     x13, x26
        csel    x13, x13, x26, lo               // at most to the end
        stxr    w14, x13, [x11]
        cbnz    w14, .Lguided\@
        mov     x27, x12
        mov     x28, x13
        b       .Lclaimed\@
.Lnone\@:
        clrex
        b       \none
.Lclaimed\@:
        .endm

        /* matvec (w = x0, x = x1, b = x2, y = x3, n_in = x4, tile_begin = x5, tile_end = x6) with the
         * kernel of the job's dtype: gpt2asm_matvec_{f32,f16}_\isa; FL_Q0 (tested first): the job's kernel
         * J_FN with x = xq (job_prologue) as (w, xq, xd = xq + n_in, b, y, n_in, tile_begin, tile_end) */
        .macro  mv_call isa
        ldr     w9, [x21, #J_FLAGS]
        tbnz    w9, #B_Q0, .Lmv0\@
        tbnz    w9, #B_F16, .Lmv1\@
        bl      SYM(gpt2asm_matvec_f32_\isa)
        b       .Lmv3\@
.Lmv1\@:
        bl      SYM(gpt2asm_matvec_f16_\isa)
        b       .Lmv3\@
.Lmv0\@:
        mov_up  7, 6, 5, 4, 3, 2                // x7 .. x3 = x6 .. x2
        add     x2, x1, x5                      // xd = xq + n_in
        ldr     x9, [x21, #J_FN]
        blr     x9
.Lmv3\@:
        .endm

        /* matmul (w = x0, x = x1, ldx = x2, b = x3, y = x4, ldy = x5, n_tokens = x6, n_in = x7, tile_begin,
         * tile_end = [sp], [sp, #8]) with the kernel of the job's dtype: gpt2asm_matmul_{f32,f16}_\isa;
         * FL_Q0 (tested first): the job's kernel J_FN as (w, xq = x, ldq = ldx (bytes), xd = J_XD, ldd = J_LDD, b, y, ldy, n_tokens,
         * n_in, tile_begin, tile_end) */
        .macro  mm_call isa
        ldr     w9, [x21, #J_FLAGS]
        tbnz    w9, #B_Q0, .Lmm0\@
        tbnz    w9, #B_F16, .Lmm1\@
        bl      SYM(gpt2asm_matmul_f32_\isa)
        b       .Lmm3\@
.Lmm1\@:
        bl      SYM(gpt2asm_matmul_f16_\isa)
        b       .Lmm3\@
.Lmm0\@:
        ldp     x9, x10, [sp]
        stp     x9, x10, [sp, #16]              // tile_begin, tile_end
        stp     x6, x7, [sp]                    // n_tokens, n_in
        mov     x7, x5                          // ldy
        mov     x6, x4                          // y
        mov     x5, x3                          // b
        ldr     x3, [x21, #J_XD]                // xd
        ldr     x4, [x21, #J_LDD]               // ldd
        ldr     x9, [x21, #J_FN]
        blr     x9
.Lmm3\@:
        .endm

        /* the attention kernel of the job's cache: float32, or with FL_KV16 binary16 */
        .macro  att_call
        if_bit B_KV16, .Latt16\@
        bl      SYM(gpt2asm_attention_f32_neon)
        b       .Latt32\@
.Latt16\@:
        bl      SYM(gpt2asm_attention_f16_neon)
.Latt32\@:
        .endm

        /* the job's matvec over the claimed tiles [x27, x28): W (J_W) times the input x24, plus
         * J_B, into J_Y */
        .macro  mv_claimed isa
        ldr     x0, [x21, #J_W]
        mov     x1, x24
        ldr     x2, [x21, #J_B]
        ldr     x3, [x21, #J_Y]
        ldr     x4, [x21, #J_NIN]
        mov     x5, x27
        mov     x6, x28
        mv_call \isa
        .endm

        /* the attention arguments of the claimed heads [x27, x28) but n_pos (x5): q = J_Y, k / v caches
         * = a0 / a1, out = a2, this thread's scratch, head stride a3 */
        .macro  att_claimed
        ldr     x0, [x21, #J_Y]
        ldr     x1, [x21, #J_A0]
        ldr     x2, [x21, #J_A1]
        ldr     x3, [x21, #J_A2]
        ldr     x9, [x20, #PL_S_OFF]
        add     x4, x23, x9
        ldr     x6, [x21, #J_A3]
        mov     x7, x27
        str     x28, [sp]
        .endm

        /* one tile of the qkv matvec for head h = F_H: tile t = \part * n_head + h (\part 1: k, 2: v) into
         * the cache at (h * head_stride + pos * 64) elements, as tiles [0, 1) of the pointers shifted to
         * tile t (w + t * tile_bytes, b + 64 t); a binary16 cache through the staging row */
        .macro  qkv_tile isa, part
        ldr     x9, [sp, #F_H]
        ldr     x10, [x21, #J_N]
        .if \part == 2
        lsl     x10, x10, #1
        .endif
        add     x9, x9, x10                     // t
        ldr     x10, [x21, #J_TILEB]
        ldr     x0, [x21, #J_W]
        madd    x0, x9, x10, x0                 // the tile's weights
        mov     x1, x24
        ldr     x2, [x21, #J_B]
        cbz     x2, .Lqtb\@
        add     x2, x2, x9, lsl #8              // b + 64 t (or 0)
.Lqtb\@:
        ldr     x10, [sp, #F_H]
        ldr     x11, [x21, #J_A3]
        mul     x10, x10, x11
        ldr     x11, [x20, #PL_POS]
        add     x10, x10, x11, lsl #6           // (h * head_stride + 64 pos) elements
        .if \part == 1
        ldr     x3, [x21, #J_A0]                // k cache
        .else
        ldr     x3, [x21, #J_A1]                // v cache
        .endif
        if_bit B_KV16, .Lqt16\@, w11
        add     x3, x3, x10, lsl #2             // [h][pos]
        b       .Lqt32\@
.Lqt16\@:
        add     x3, x3, x10, lsl #1             // binary16 [h][pos] ...
        str     x3, [sp, #F_KVDST]
        ldr     x10, [x20, #PL_KV_OFF]
        add     x3, x23, x10                    // ... after the staging row
.Lqt32\@:
        ldr     x4, [x21, #J_NIN]
        mov     x5, #0                          // tiles [0, 1) of the shifted pointers
        mov     x6, #1
        mv_call \isa
        unless_bit B_KV16, .Lqtd\@, w11
        ldr     x0, [sp, #F_KVDST]
        ldr     x10, [x20, #PL_KV_OFF]
        add     x1, x23, x10
        mov     x2, #64
        bl      kv16_store                      // the row, rounded to binary16, into the cache
.Lqtd\@:
        .endm

        /* x9 = ++F_H; branch to \loop while it is below the claim's end */
        .macro  next_item loop
        ldr     x9, [sp, #F_H]
        add     x9, x9, #1
        str     x9, [sp, #F_H]
        cmp     x9, x28
        b.lo    \loop
        .endm

/* The executor of a family: plan_jobs_<isa> walks the job range; per job it computes the item count
 * (x26), branches to the routine of the job's kind through the jump table .Lkinds_<isa> (one entry per
 * KIND_*, plus a guard entry for anything else), and that routine claims and computes items until none
 * is left, then branches to .Lbarrier_<isa>, which waits for the other threads and goes on with the next
 * job.  Common contract of the kind routines (kind_<kind>_<isa>): entered by branch, never called, on
 * plan_jobs' frame; x19 ctx, x20 plan, x21 the job, x22 the thread id, x23 this thread's private area,
 * x25 the end of the job range, x26 the job's item count; a routine may clobber x24, x27, x28, every
 * caller-saved register and the frame slots it names, keeps x19-x23, x25, x26, x29 and sp, and leaves by
 * a branch to .Lbarrier_<isa>. */

        /* the frame of plan_jobs: FRAME bytes, x29/x30 at its top, x19-x28 below them */
        .macro  jobs_enter
        sub     sp, sp, #FRAME
        stp     x29, x30, [sp, #144]
        add     x29, sp, #144
        callee_x19_x28 stp, 64
        .endm
        .macro  jobs_leave
        callee_x19_x28 ldp, 64
        ldp     x29, x30, [sp, #144]
        add     sp, sp, #FRAME
        ret
        .endm

        /* branch to \label if bit \bit of the job's (x21) flags is set (if_bit) / clear (unless_bit);
         * the flags stay in \reg */
        .macro  if_bit bit, label, reg=w9
        ldr     \reg, [x21, #J_FLAGS]
        tbnz    \reg, #\bit, \label
        .endm
        .macro  unless_bit bit, label, reg=w9
        ldr     \reg, [x21, #J_FLAGS]
        tbz     \reg, #\bit, \label
        .endm

        /* entry \kind of the jump table at .Lkinds_\isa: the offset of \target (checked to be in order) */
        .macro  kind_entry isa, kind, target
        .if . - .Lkinds_\isa != 4 * (\kind)
        .error  "plan_aarch64.S: the jump table is out of KIND_* order"
        .endif
        .word   \target - .Lkinds_\isa
        .endm

        /* one new k (\part 1) or v (\part 2) row of BATTN's item (row t: entry x24, c_attn row x27; head
         * h = F_ROW): K / V = RT_K + a0 / RT_V + a1 (bytes), at (h a3 + 64 pos_t) elements, = the 64
         * floats at x27 + 64 (\part H + h): a copy, or with KV16 rounded to binary16 (kv16_store, as
         * QKV's staged rows) */
        .macro  battn_put part
        ldr     x9, [sp, #F_ROW]                // h
        ldr     x10, [x21, #J_N]                // H
        ldr     x11, [x21, #J_A3]
        ldr     x12, [x24, #RT_POS]
        lsl     x12, x12, #6
        madd    x11, x9, x11, x12               // h a3 + 64 pos_t (elements)
        .if \part == 1
        add     x9, x9, x10                     // H + h
        ldr     x0, [x24, #RT_K]
        ldr     x12, [x21, #J_A0]
        .else
        add     x9, x9, x10, lsl #1             // 2H + h
        ldr     x0, [x24, #RT_V]
        ldr     x12, [x21, #J_A1]
        .endif
        add     x0, x0, x12                     // the layer's cache of row t
        add     x1, x27, x9, lsl #8             // k_h / v_h
        ldr     w13, [x21, #J_FLAGS]
        tbnz    w13, #B_KV16, .Lbp16\@
        add     x0, x0, x11, lsl #2
        bl      kv32_copy
        b       .Lbpd\@
.Lbp16\@:
        add     x0, x0, x11, lsl #1
        mov     x2, #64
        bl      kv16_store
.Lbpd\@:
        .endm

        .macro  plan_family isa
/* plan_jobs_<isa>(ctx = x0, plan = x1, first job = x2, end = x3, tid = x4) */
function plan_jobs_\isa, align=5
        jobs_enter
        mov     x19, x0
        mov     x20, x1
        mov     x21, x2
        mov     x25, x3
        mov     x22, x4
        ldr     x9, [x20, #PL_PRIV_STRIDE]
        ldr     x10, [x20, #PL_PRIV]
        madd    x23, x22, x9, x10               // this thread's private area
        cmp     x21, x25
        b.hs    .Lret_\isa

.Ljob_\isa:
        ldr     x26, [x21, #J_N]
        unless_bit B_ROWS, 1f
        ldr     x10, [x20, #PL_NTOK]
        mul     x26, x26, x10                   // a row job: J_N items per row
1:      ldr     w9, [x21, #J_KIND]              // the kind's routine, through the jump table;
        mov     w10, #KIND_COUNT
        cmp     w9, w10
        csel    w9, w9, w10, lo                 // an unknown kind takes the guard entry
        adr     x10, .Lkinds_\isa
        ldrsw   x11, [x10, w9, uxtw #2]
        add     x10, x10, x11
        br      x10

        /* ---- barrier: every job's outputs are complete before the next job starts */
.Lbarrier_\isa:
        ldr     w3, [x19, #CTX_NTHREADS]
        cmp     w3, #1
        b.ls    .Lnext_\isa
        mov     x4, x19
        add     x9, x21, #J_SIZE
        cmp     x9, x25
        b.hs    1f
        add     x0, x21, #J_ARRIVE
        add     x2, x21, #J_SLEEPERS
        mov     w1, #1
        bl      pool_arrive
        b       .Lnext_\isa
1:      add     x0, x19, #CTX_DONE              // the last job: the pool's own counter, and only
        add     x2, x19, #CTX_DONE_SLEEPERS     // the caller waits (the plan may be freed after)
        cmp     x22, #0
        cset    w1, eq
        bl      pool_arrive
.Lnext_\isa:
        add     x21, x21, #J_SIZE
        cmp     x21, x25
        b.lo    .Ljob_\isa
.Lret_\isa:
        jobs_leave
        /* the jump table: entry k = kind_<k>_<isa> - .Lkinds_<isa> (PC-relative: no relocation, no
         * text relocation on Mach-O), and the guard entry KIND_COUNT (a kind Python never builds: no
         * work, straight to the barrier) */
        .p2align 2
.Lkinds_\isa:
        kind_entry \isa, KIND_MATVEC, kind_matvec_\isa
        kind_entry \isa, KIND_QKV, kind_qkv_\isa
        kind_entry \isa, KIND_ATTN, kind_attn_\isa
        kind_entry \isa, KIND_MATMUL, kind_matmul_\isa
        kind_entry \isa, KIND_ROWLN, kind_rowln_\isa
        kind_entry \isa, KIND_ROWATTN, kind_rowattn_\isa
        kind_entry \isa, KIND_ROWQUANT, kind_rowquant_\isa
        kind_entry \isa, KIND_BATTN, kind_battn_\isa
        kind_entry \isa, KIND_ROWARGMAX, kind_rowargmax_\isa
        kind_entry \isa, KIND_COUNT, .Lbarrier_\isa
endfunc

        /* ---- MATVEC: y = W in + b over claimed tiles, then the epilogue on them (GELU in place,
         * RESID x += y, or ARGMAX into this thread's 16-byte slot at a0 + 16 tid: { u64 index of its
         * first maximum so far (SIZE_MAX: none yet), f32 its value, u32 1 if a NaN or an infinity was
         * seen } over the outputs < a1 of its claims, which ascend) */
/* kind_matvec_<isa> (KIND_MATVEC): entered by branch from plan_jobs_<isa> (the common contract above);
 * x24 = the job's input after job_prologue; x27, x28 the claim; frame F_H (ARGMAX: o0). Leaves by
 * `claim` branching to .Lbarrier_<isa> once no item is left. */
function kind_matvec_\isa
.Lmatvec_\isa:
        job_prologue
        ldr     w9, [x21, #J_FLAGS]
        and     w9, w9, #EPI_MASK
        cmp     w9, #EPI_ARGMAX
        b.ne    .Lmv_claim_\isa
        ldr     x10, [x21, #J_A0]
        add     x10, x10, x22, lsl #4           // this thread's slot
        mov     x11, #-1
        stp     x11, xzr, [x10]
.Lmv_claim_\isa:
        claim   .Lbarrier_\isa
        mv_claimed \isa
        ldr     w9, [x21, #J_FLAGS]
        ands    w9, w9, #EPI_MASK
        b.eq    .Lmv_claim_\isa
        lsl     x10, x27, #6                    // o0 = 64 t0
        sub     x2, x28, x27
        lsl     x2, x2, #6                      // 64 (t1 - t0) outputs
        ldr     x11, [x21, #J_Y]
        add     x0, x11, x10, lsl #2            // y + o0
        cmp     w9, #EPI_GELU
        b.ne    3f
        mov     x1, x0
        bl      SYM(gpt2asm_gelu_f32_neon)      // y = gelu(y), in place
        b       .Lmv_claim_\isa
3:      cmp     w9, #EPI_RESID
        b.ne    4f
        mov     x3, x2
        mov     x2, x0                          // y + o0
        ldr     x11, [x21, #J_A0]
        add     x0, x11, x10, lsl #2            // x + o0
        mov     x1, x0
        bl      vadd_neon                       // x = x + y
        b       .Lmv_claim_\isa
4:      str     x10, [sp, #F_H]                 // ARGMAX: o0
        ldr     x11, [x21, #J_A1]
        subs    x11, x11, x10                   // outputs from o0 that count
        b.ls    .Lmv_claim_\isa
        cmp     x2, x11
        csel    x1, x2, x11, lo
        bl      SYM(gpt2asm_argmax_f32_neon)    // first maximum of y[o0 .. o0 + n), or SIZE_MAX
        ldr     x11, [x21, #J_A0]
        add     x11, x11, x22, lsl #4           // the slot
        cmn     x0, #1
        b.eq    5f
        ldr     x10, [sp, #F_H]
        add     x0, x0, x10                     // the output index
        ldr     x12, [x21, #J_Y]
        ldr     s0, [x12, x0, lsl #2]
        ldr     x13, [x11]
        cmn     x13, #1
        b.eq    6f                              // the thread's first candidate
        ldr     s1, [x11, #8]
        fcmp    s0, s1
        b.le    .Lmv_claim_\isa                 // not larger: the earlier one stays
6:      str     x0, [x11]
        str     s0, [x11, #8]
        b       .Lmv_claim_\isa
5:      mov     w12, #1                         // a NaN or an infinity
        str     w12, [x11, #12]
        b       .Lmv_claim_\isa
endfunc

        /* ---- QKV: for the claimed heads [h0, h1): the q tiles (one call), the k tiles and the v tiles
         * (one call per tile, straight into the cache), then their attention (one call) */
/* kind_qkv_<isa> (KIND_QKV): entered by branch from plan_jobs_<isa> (the common contract above); x24 =
 * the job's input after job_prologue; x27, x28 the claimed heads; frame F_H (head), F_KVDST. Leaves by
 * `claim` branching to .Lbarrier_<isa> once no item is left. */
function kind_qkv_\isa
.Lqkv_\isa:
        job_prologue
.Lqkv_claim_\isa:
        claim   .Lbarrier_\isa
        mv_claimed \isa                         // q tiles h0 .. h1-1 into y + 64 h
        str     x27, [sp, #F_H]
.Lqkv_k_\isa:
        qkv_tile \isa, 1
        next_item .Lqkv_k_\isa
        str     x27, [sp, #F_H]
.Lqkv_v_\isa:
        qkv_tile \isa, 2
        next_item .Lqkv_v_\isa
        att_claimed                             // the attention of the claimed heads, one call,
        ldr     x5, [x20, #PL_POS]
        add     x5, x5, #1                      // over n_pos = pos + 1
        att_call
        b       .Lqkv_claim_\isa
endfunc

        /* ---- ATTN: attention over claimed heads, n_pos fixed in the record */
/* kind_attn_<isa> (KIND_ATTN): entered by branch from plan_jobs_<isa> (the common contract above);
 * x27, x28 the claimed heads. Leaves by `claim` branching to .Lbarrier_<isa> once no item is left. */
function kind_attn_\isa
.Lattn_\isa:
        claim   .Lbarrier_\isa
        att_claimed
        ldr     x5, [x21, #J_A4]                // n_pos of the record
        att_call
        b       .Lattn_\isa
endfunc

        /* ---- MATMUL (prefill; items = tiles): for each claimed tile tau, NEON's matmul of the dtype
         * over the PL_NTOK rows of x into y, as tiles [0, 1) of the pointers shifted to tau; with FL_KV
         * the tiles [H, 2H) and [2H, 3H) (H = J_A4) go to the k / v cache rows pos ..; then the epilogue
         * on the tile's 64 outputs of every row: GELU in place, or RESID r[t ldr + o] += y[t ldy + o]. */
/* kind_matmul_<isa> (KIND_MATMUL): entered by branch from plan_jobs_<isa> (the common contract above);
 * x27, x28 the claimed tiles; frame F_H (tile tau), F_ROW (epilogue row), F_KVDST. Leaves by `claim`
 * branching to .Lbarrier_<isa> once no item is left. */
function kind_matmul_\isa
.Lmatmul_\isa:
        claim   .Lbarrier_\isa
        str     x27, [sp, #F_H]
.Lmm_tile_\isa:
        ldr     x9, [sp, #F_H]                  // tau
        ldr     x10, [x21, #J_TILEB]
        ldr     x0, [x21, #J_W]
        madd    x0, x9, x10, x0                 // the tile's weights
        ldr     x3, [x21, #J_B]
        cbz     x3, 1f
        add     x3, x3, x9, lsl #8              // b + 64 tau
1:      ldr     x4, [x21, #J_Y]
        add     x4, x4, x9, lsl #8              // y + 64 tau
        ldr     x5, [x21, #J_LDY]
        unless_bit B_KV, 3f, w11
        ldr     x12, [x21, #J_A4]               // H
        subs    x10, x9, x12                    // tau - H
        b.lo    3f                              // a q tile
        ldr     x4, [x21, #J_A0]                // a k tile: head tau - H
        cmp     x10, x12
        b.lo    2f
        sub     x10, x10, x12                   // a v tile: head tau - 2H
        ldr     x4, [x21, #J_A1]
2:      ldr     x13, [x21, #J_A3]
        mul     x10, x10, x13                   // h * head_stride
        ldr     x13, [x20, #PL_POS]
        add     x10, x10, x13, lsl #6
        mov     x5, #64                         // rows of 64 elements
        tbnz    w11, #B_KV16, 5f
        add     x4, x4, x10, lsl #2             // cache [h][pos]
        b       3f
5:      add     x4, x4, x10, lsl #1
        str     x4, [sp, #F_KVDST]              // binary16 cache [h][pos] ...
        ldr     x13, [x20, #PL_KV_OFF]
        add     x4, x23, x13                    // ... after the staging rows
3:      ldr     x1, [x21, #J_X]
        ldr     x2, [x21, #J_LDX]
        ldr     x6, [x20, #PL_NTOK]             // n_tokens
        ldr     x7, [x21, #J_NIN]               // n_in
        mov     x9, #1
        stp     xzr, x9, [sp]                   // tiles [0, 1) of the shifted pointers
        mm_call \isa
        unless_bit B_KV16, 6f, w11
        tbz     w11, #B_KV, 6f
        ldr     x9, [sp, #F_H]
        ldr     x12, [x21, #J_A4]
        cmp     x9, x12
        b.lo    .Lmm_next_\isa                  // a q tile
        ldr     x0, [sp, #F_KVDST]              // a k / v tile: its PL_NTOK staged rows, rounded to
        ldr     x13, [x20, #PL_KV_OFF]          // binary16, into the cache rows pos .. (contiguous)
        add     x1, x23, x13
        ldr     x2, [x20, #PL_NTOK]
        lsl     x2, x2, #6
        bl      kv16_store
        b       .Lmm_next_\isa
6:      tst     w11, #EPI_MASK
        b.eq    .Lmm_next_\isa
        str     xzr, [sp, #F_ROW]
.Lmm_epi_\isa:                                  // the tile's 64 outputs of row F_ROW
        ldr     x9, [sp, #F_ROW]
        ldr     x10, [x20, #PL_NTOK]
        cmp     x9, x10
        b.hs    .Lmm_next_\isa
        add     x10, x9, #1
        str     x10, [sp, #F_ROW]
        ldr     x10, [sp, #F_H]
        lsl     x10, x10, #6                    // 64 tau
        ldr     x11, [x21, #J_LDY]
        madd    x12, x9, x11, x10
        ldr     x13, [x21, #J_Y]
        add     x2, x13, x12, lsl #2            // &y[row][64 tau]
        unless_bit B_EPI_GELU, 4f, w11
        mov     x0, x2
        mov     x1, x2
        mov     x2, #64
        bl      SYM(gpt2asm_gelu_f32_neon)      // y = gelu(y), in place
        b       .Lmm_epi_\isa
4:      ldr     x11, [x21, #J_LDR]
        madd    x12, x9, x11, x10
        ldr     x13, [x21, #J_A0]
        add     x0, x13, x12, lsl #2            // &r[row][64 tau]
        mov     x1, x0
        mov     x3, #64
        bl      vadd_neon                       // r = r + y
        b       .Lmm_epi_\isa
.Lmm_next_\isa:
        next_item .Lmm_tile_\isa
        b       .Lmatmul_\isa
endfunc

        /* ---- ROWLN (items = rows t < PL_NTOK): y[t ldy ..] = layernorm(x[t ldx ..]), n_in floats; with
         * PRO_EMBED (batched decode) first x[t ldx ..] = wte[token_t] + wpe[pos_t] (the row table's) */
/* kind_rowln_<isa> (KIND_ROWLN): entered by branch from plan_jobs_<isa> (the common contract above);
 * x27, x28 the claimed rows; frame F_H (row). Leaves by `claim` branching to .Lbarrier_<isa> once no
 * item is left. */
function kind_rowln_\isa
.Lrowln_\isa:
        claim   .Lbarrier_\isa
        str     x27, [sp, #F_H]
.Lrowln_row_\isa:
        unless_bit B_PRO_EMBED, 1f              // batched decode, layer 0: row t's embedding first
        ldr     x9, [sp, #F_H]
        ldr     x10, [x21, #J_LDX]
        mul     x10, x9, x10
        ldr     x0, [x21, #J_X]
        add     x0, x0, x10, lsl #2             // x row t
        mov     x10, #RT_SIZE
        ldr     x11, [x20, #PL_RTAB]
        madd    x11, x9, x10, x11               // its row table entry
        ldp     x9, x10, [x11, #RT_TOKEN]       // token_t, pos_t
        ldr     x3, [x20, #PL_C]
        mul     x9, x9, x3
        ldr     x1, [x20, #PL_WTE]
        add     x1, x1, x9, lsl #2              // wte[token_t]
        mul     x10, x10, x3
        ldr     x2, [x20, #PL_WPE]
        add     x2, x2, x10, lsl #2             // wpe[pos_t]
        bl      vadd_neon                       // x[t] = wte[token_t] + wpe[pos_t]
1:
        ldr     x9, [sp, #F_H]
        ldr     x10, [x21, #J_LDX]
        mul     x10, x9, x10
        ldr     x0, [x21, #J_X]
        add     x0, x0, x10, lsl #2             // x row t
        ldr     x10, [x21, #J_LDY]
        mul     x10, x9, x10
        ldr     x3, [x21, #J_Y]
        add     x3, x3, x10, lsl #2             // y row t
        ldr     x1, [x21, #J_G]
        ldr     x2, [x21, #J_BETA]
        ldr     x4, [x21, #J_NIN]
        bl      SYM(gpt2asm_layernorm_f32_neon)
        next_item .Lrowln_row_\isa
        b       .Lrowln_\isa
endfunc

        /* ---- ROWATTN (items i < H * PL_NTOK): head h = i / PL_NTOK, row t = PL_NTOK - 1 - i % PL_NTOK:
         * attention of head h of query row t (J_Y + t ldx) over positions 0 .. pos + t into out row t
         * (J_A2 + t ldy) */
/* kind_rowattn_<isa> (KIND_ROWATTN): entered by branch from plan_jobs_<isa> (the common contract
 * above); x27, x28 the claimed items; frame F_H (item). Leaves by `claim` branching to .Lbarrier_<isa>
 * once no item is left. */
function kind_rowattn_\isa
.Lrowattn_\isa:
        claim   .Lbarrier_\isa
        str     x27, [sp, #F_H]
.Lra_item_\isa:
        ldr     x9, [sp, #F_H]
        ldr     x10, [x20, #PL_NTOK]
        udiv    x11, x9, x10                    // h
        msub    x12, x11, x10, x9               // i mod n_tok
        sub     x12, x10, x12
        sub     x12, x12, #1                    // t
        mov     x7, x11                         // head_begin
        add     x11, x11, #1
        str     x11, [sp]                       // head_end
        ldr     x6, [x21, #J_A3]                // head_stride
        ldr     x10, [x21, #J_LDX]
        mul     x10, x12, x10
        ldr     x0, [x21, #J_Y]
        add     x0, x0, x10, lsl #2             // q row t
        ldr     x10, [x21, #J_LDY]
        mul     x10, x12, x10
        ldr     x3, [x21, #J_A2]
        add     x3, x3, x10, lsl #2             // out row t
        ldr     x1, [x21, #J_A0]                // k
        ldr     x2, [x21, #J_A1]                // v
        ldr     x10, [x20, #PL_S_OFF]
        add     x4, x23, x10                    // scratch
        ldr     x5, [x20, #PL_POS]
        add     x5, x5, x12
        add     x5, x5, #1                      // n_pos = pos + t + 1
        att_call
        next_item .Lra_item_\isa
        b       .Lrowattn_\isa
endfunc

        /* ---- ROWQUANT (items = rows t < PL_NTOK): src = x[t ldx ..] (n_in floats), with PRO_LN first
         * h = layernorm(src) into the private h and src = h; then J_QFN(src, y + t ldy (int8 xq row:
         * ldy bytes), J_XD + t ldd (float xd row), n_in) */
/* kind_rowquant_<isa> (KIND_ROWQUANT): entered by branch from plan_jobs_<isa> (the common contract
 * above); x27, x28 the claimed rows; x24 the row's source; frame F_H (row). Leaves by `claim` branching
 * to .Lbarrier_<isa> once no item is left. */
function kind_rowquant_\isa
.Lrowquant_\isa:
        claim   .Lbarrier_\isa
        str     x27, [sp, #F_H]
.Lrq_row_\isa:
        ldr     x9, [sp, #F_H]
        ldr     x10, [x21, #J_LDX]
        mul     x10, x9, x10
        ldr     x24, [x21, #J_X]
        add     x24, x24, x10, lsl #2           // x row t
        unless_bit B_PRO_LN, 1f
        mov     x0, x24
        ldr     x1, [x21, #J_G]
        ldr     x2, [x21, #J_BETA]
        ldr     x9, [x20, #PL_H_OFF]
        add     x3, x23, x9
        mov     x24, x3                         // the private h
        ldr     x4, [x21, #J_NIN]
        bl      SYM(gpt2asm_layernorm_f32_neon)
1:      ldr     x9, [sp, #F_H]
        ldr     x10, [x21, #J_LDY]
        ldr     x1, [x21, #J_Y]
        madd    x1, x9, x10, x1                 // xq row t (ldy bytes)
        ldr     x10, [x21, #J_LDD]
        mul     x10, x9, x10
        ldr     x2, [x21, #J_XD]
        add     x2, x2, x10, lsl #2             // xd row t (ldd floats)
        mov     x0, x24
        ldr     x3, [x21, #J_NIN]
        ldr     x9, [x21, #J_QFN]
        blr     x9                              // qfn(src, xq, xd, n_in)
        next_item .Lrq_row_\isa
        b       .Lrowquant_\isa
endfunc

        /* ---- BATTN (batched decode; items i < H * PL_NTOK: row t = i / H, head h = i % H, J_N = H), item
         * by item: head h's new key and value (the c_attn output row J_X + t ldx: k_h at 64 (H + h), v_h at
         * 64 (2H + h) floats) into row t's caches (row table: RT_K + J_A0, RT_V + J_A1 bytes, head h at
         * h J_A3 elements) at position pos_t, then the attention of head h: q = J_X + t ldx, out = J_Y +
         * t ldy, heads [h, h+1), n_pos = pos_t + 1 -- the step's call on that sequence (the same bits as
         * a call over a range of heads). */
/* kind_battn_<isa> (KIND_BATTN): entered by branch from plan_jobs_<isa> (the common contract above);
 * x28 the claim's end; x24 row t's row table entry, x27 its c_attn output row; frame F_H (item), F_ROW
 * (head h), F_KVDST (out row t). Leaves by `claim` branching to .Lbarrier_<isa> once no item is left. */
function kind_battn_\isa
.Lbattn_\isa:
        claim   .Lbarrier_\isa
        str     x27, [sp, #F_H]
.Lba_item_\isa:
        ldr     x9, [sp, #F_H]
        ldr     x10, [x21, #J_N]                // H
        udiv    x11, x9, x10                    // t
        msub    x12, x11, x10, x9               // h
        str     x12, [sp, #F_ROW]
        mov     x13, #RT_SIZE
        ldr     x14, [x20, #PL_RTAB]
        madd    x24, x11, x13, x14              // row t's row table entry
        ldr     x13, [x21, #J_LDY]
        mul     x13, x11, x13
        ldr     x14, [x21, #J_Y]
        add     x14, x14, x13, lsl #2
        str     x14, [sp, #F_KVDST]             // out row t
        ldr     x13, [x21, #J_LDX]
        mul     x13, x11, x13
        ldr     x14, [x21, #J_X]
        add     x27, x14, x13, lsl #2           // c_attn output row t: q | k | v
        battn_put 1
        battn_put 2
        mov     x0, x27                         // q
        ldr     x1, [x24, #RT_K]
        ldr     x9, [x21, #J_A0]
        add     x1, x1, x9                      // the layer's k cache of row t
        ldr     x2, [x24, #RT_V]
        ldr     x9, [x21, #J_A1]
        add     x2, x2, x9                      // ... and v cache
        ldr     x3, [sp, #F_KVDST]              // out row t
        ldr     x9, [x20, #PL_S_OFF]
        add     x4, x23, x9                     // scratch
        ldr     x5, [x24, #RT_POS]
        add     x5, x5, #1                      // n_pos = pos_t + 1
        ldr     x6, [x21, #J_A3]                // head_stride
        ldr     x7, [sp, #F_ROW]                // head_begin h
        add     x9, x7, #1
        str     x9, [sp]                        // head_end h + 1
        att_call
        next_item .Lba_item_\isa
        b       .Lbattn_\isa
endfunc

        /* ---- ROWARGMAX (batched decode; items = rows t < PL_NTOK): row t's RT_ARGMAX = the first maximum
         * of x[t ldx .. + n_in) (gpt2asm_argmax_f32_neon), SIZE_MAX - 1 if one is NaN or an infinity */
/* kind_rowargmax_<isa> (KIND_ROWARGMAX): entered by branch from plan_jobs_<isa> (the common contract
 * above); x27, x28 the claimed rows; frame F_H (row). Leaves by `claim` branching to .Lbarrier_<isa>
 * once no item is left. */
function kind_rowargmax_\isa
.Lrowargmax_\isa:
        claim   .Lbarrier_\isa
        str     x27, [sp, #F_H]
.Lram_row_\isa:
        ldr     x9, [sp, #F_H]
        ldr     x10, [x21, #J_LDX]
        mul     x10, x9, x10
        ldr     x0, [x21, #J_X]
        add     x0, x0, x10, lsl #2             // logits row t
        ldr     x1, [x21, #J_NIN]
        bl      SYM(gpt2asm_argmax_f32_neon)    // first maximum, SIZE_MAX if not all finite
        mov     x9, #-2
        cmn     x0, #1
        csel    x0, x9, x0, eq                  // SIZE_MAX - 1: a NaN or an infinity
        ldr     x9, [sp, #F_H]
        mov     x10, #RT_SIZE
        ldr     x11, [x20, #PL_RTAB]
        madd    x11, x9, x10, x11
        str     x0, [x11, #RT_ARGMAX]
        next_item .Lram_row_\isa
        b       .Lrowargmax_\isa
endfunc

        .endm

        plan_family neon
        plan_family sme2

/*
 * void gpt2asm_plan_run_<isa>(pool_t *ctx, plan_t *plan, size_t job_begin, size_t job_end);
 *   Run jobs [job_begin, job_end) of the plan with every thread of the pool; returns when all are done.
 */
        .macro  plan_run isa
function gpt2asm_plan_run_\isa, export=1
        cmp     x2, x3
        b.hs    9f
        mov     x9, #J_SIZE
        madd    x2, x2, x9, x1
        add     x2, x2, #PL_HEADER              // first job
        madd    x3, x3, x9, x1
        add     x3, x3, #PL_HEADER              // end
        mov     x9, x2
1:      str     xzr, [x9, #J_CLAIM]             // fresh counters (no thread is inside the plan)
        str     xzr, [x9, #J_ARRIVE]            // arrive and sleepers
        add     x9, x9, #J_SIZE
        cmp     x9, x3
        b.lo    1b
        mov     x4, #0                          // thread 0
        ldr     w9, [x0, #CTX_NTHREADS]
        cmp     w9, #1
        b.ls    plan_jobs_\isa                  // no workers: tail call
        str     wzr, [x0, #CTX_DONE]
        str     x1, [x0, #CTX_PLAN]
        stp     x2, x3, [x0, #CTX_FIRST]
        inc32_fence x0, w9, w10                 // CTX_SEQ: publish (release, then a full fence)
        ldr     w9, [x0, #CTX_SEQ_SLEEPERS]
        cbz     w9, plan_jobs_\isa
        stp     x29, x30, [sp, #-48]!
        mov     x29, sp
        stp     x0, x1, [sp, #16]
        stp     x2, x3, [sp, #32]
        bl      pool_wake                       // x0 = &ctx.seq
        ldp     x0, x1, [sp, #16]
        ldp     x2, x3, [sp, #32]
        ldp     x29, x30, [sp], #48
        mov     x4, #0
        b       plan_jobs_\isa
9:      ret
endfunc
        .endm

/*
 * void gpt2asm_worker_<isa>(pool_t *ctx, size_t tid);
 *   Worker thread tid (1 .. n_threads-1): run every plan the caller starts, until shutdown, with the
 *   jobs of family \jobs (sme2's workers run NEON's: see the top of this file).
 */
        .macro  worker isa, jobs
function gpt2asm_worker_\isa, export=1
        stp     x29, x30, [sp, #-48]!
        mov     x29, sp
        stp     x19, x20, [sp, #16]
        str     x21, [sp, #32]
        mov     x19, x0
        mov     x20, x1
        mov     w21, #0                         // generation seen: 0 (no plan ran before start)
1:      mov     x0, x19                         // &ctx.seq
        mov     w1, w21
        add     x2, x19, #CTX_SEQ_SLEEPERS
        ldr     x3, [x19, #CTX_SPIN]
        add     x4, x19, #CTX_PARKS
        bl      pool_wait_ne
        ldr     w21, [x19, #CTX_SEQ]
        ldr     w9, [x19, #CTX_SHUTDOWN]
        cbnz    w9, 9f
        mov     x0, x19
        ldr     x1, [x19, #CTX_PLAN]
        ldp     x2, x3, [x19, #CTX_FIRST]
        mov     x4, x20
        bl      plan_jobs_\jobs
        b       1b
9:      ldr     x21, [sp, #32]
        ldp     x19, x20, [sp, #16]
        ldp     x29, x30, [sp], #48
        ret
endfunc
        .endm

/*
 * size_t gpt2asm_plan_step_<isa>(pool_t *ctx, plan_t *plan, size_t token, size_t pos);
 *   A decode step in one call, as on x86 (plan_x86.S): plan.token, plan.pos = token, pos; every job run
 *   by gpt2asm_plan_run_<isa>(ctx, plan, 0, plan.n_jobs); then the first maximum from the ARGMAX job's
 *   n_threads slots at plan.argmax: SIZE_MAX - 1 if any slot saw a NaN or an infinity, SIZE_MAX if no
 *   slot holds an index (or plan.argmax is 0), else the least index among the slots holding the
 *   largest value.
 */
        .macro  plan_step isa
function gpt2asm_plan_step_\isa, export=1
        stp     x29, x30, [sp, #-32]!
        mov     x29, sp
        stp     x19, x20, [sp, #16]
        mov     x19, x0                         // ctx
        mov     x20, x1                         // plan
        stp     x2, x3, [x1, #PL_TOKEN]         // token, pos
        mov     x2, #0
        ldr     x3, [x1, #PL_NJOBS]
        bl      SYM(gpt2asm_plan_run_\isa)
        mov     x0, #-1                         // SIZE_MAX: no index yet
        ldr     x9, [x20, #PL_ARGMAX]
        cbz     x9, 9f
        ldr     w10, [x19, #CTX_NTHREADS]       // >= 1
1:      ldr     w11, [x9, #12]
        cbnz    w11, 8f                         // a NaN or an infinity
        ldr     x12, [x9]                       // the slot's index (SIZE_MAX: none)
        cmn     x12, #1
        b.eq    3f
        ldr     s1, [x9, #8]                    // its value
        cmn     x0, #1
        b.eq    2f                              // the first index: taken
        fcmp    s1, s0
        b.gt    2f                              // larger: taken
        b.ne    3f                              // smaller (finite values: never unordered)
        cmp     x12, x0
        b.hs    3f                              // equal: the least index wins
2:      mov     x0, x12
        fmov    s0, s1
3:      add     x9, x9, #16
        subs    w10, w10, #1
        b.ne    1b
        b       9f
8:      mov     x0, #-2                         // SIZE_MAX - 1
9:      ldp     x19, x20, [sp, #16]
        ldp     x29, x30, [sp], #32
        ret
endfunc
        .endm

        plan_run neon
        plan_run sme2
        plan_step neon
        plan_step sme2
        worker  neon, neon
        worker  sme2, neon
