/*
 * asm/x86_64/plan_x86.S -- the -j thread pool and the plan executor (one forward step per call).
 *
 * docs/kernels.md ("Thread pool and plans") documents the records and the exported symbols:
 *
 *     void gpt2asm_plan_run_{avx2,avx512}(pool_t *ctx, plan_t *plan, size_t job_begin, size_t job_end);
 *     size_t gpt2asm_plan_step_{avx2,avx512}(pool_t *ctx, plan_t *plan, size_t token, size_t pos);
 *     void gpt2asm_worker_{avx2,avx512}(pool_t *ctx, size_t tid);       // returns at shutdown
 *     void gpt2asm_pool_shutdown(pool_t *ctx);
 *
 * A plan is a header (per-step parameters: token, position; per-run rows of a prefill; per-thread
 * private buffers) followed by job records.  Every participant (the caller as thread 0, and the
 * workers 1 .. n-1 parked in gpt2asm_worker) walks the same job list: it runs the job's prologue
 * (LayerNorm of the residual stream into its private buffer; for the first job of a step also the
 * embedding add), claims work items (tiles of 64 outputs, heads, rows) from the job's counter
 * (`lock xadd`, or `lock cmpxchg` for guided claims: large contiguous claims first, single items at
 * the end), runs the kernels of
 * docs/kernels.md on them (with the job's epilogue: GELU in place, or the residual add x += y), and
 * arrives at the job's barrier.  Each output is computed whole by one thread with the kernels' own
 * operation sequence, so the results do not depend on the thread count or on who claimed what.
 *
 * Prefill (a prompt of n_tok tokens at positions pos .. pos+n_tok-1, layer by layer): row jobs whose item
 * count is J_N * PL_NTOK (FL_ROWS): ROWLN (items = rows: LayerNorm of row t), ROWATTN (items = head x row
 * pairs: the attention of query row t over pos+t+1 positions), and MATMUL (items = tiles: the matmul
 * kernels over the PL_NTOK rows, one tile per call, with the GELU / residual epilogues per row; with
 * FL_KV the k and v tiles of c_attn go straight into the caches at rows pos ..).
 *
 * q8_0 / q4_0 (FL_Q0, KIND_ROWQUANT; docs/kernels.md "q8_0 / q4_0 jobs"): the job carries the addresses of
 * the kernel variants Python chose (J_QFN the activation quantizer, J_FN the q0 matvec / matmul), called
 * indirectly: MATVEC / QKV quantize their input into the thread's private area in the prologue, MATMUL
 * reads rows quantized by a ROWQUANT job (J_X / J_LDX bytes, J_XD / J_LDD).
 *
 * Waiting: spin on the word with `pause` for ctx.spin_ticks TSC ticks (calling sched_yield between
 * rounds after ctx.yield_ticks), then park with a futex on it (pool_park / pool_wake / pool_yield below
 * are the only OS-specific code: Linux system calls; a macOS __ulock variant is provided untested).  A thread that parks first increments a sleeper count next to the word; the
 * thread that changes the word (with a locked instruction: a full fence) wakes only if that count is
 * nonzero.  Both sides are fenced, so a wake-up cannot be lost.
 *
 * With ctx.n_threads == 1 (no workers) nothing here spins, parks, reads the TSC or makes a system
 * call: the plan is just run in order (this is also how it runs under the AVX-512 emulator).
 *
 * The kernels are called directly; they are declared .protected here (ELF) so that the links bind
 * locally (no PLT, no symbol relocation) -- they stay exported.
 */
#include "asm.S"

/* the records, kinds and flags: asm/plan_abi.h (this file also emits its table, gpt2asm_plan_abi) */
#define PLAN_ABI_TABLE
#include "plan_abi.h"

/* ---- calls to the kernels (other objects of this library) --------------------------------------- */
#ifndef GPT2ASM_MACHO
        .protected gpt2asm_matvec_f32_avx2, gpt2asm_matvec_f16_avx2, gpt2asm_layernorm_f32_avx2
        .protected gpt2asm_gelu_f32_avx2, gpt2asm_attention_f32_avx2
        .protected gpt2asm_matmul_f32_avx2, gpt2asm_matmul_f16_avx2
        .protected gpt2asm_matvec_f32_avx512, gpt2asm_matvec_f16_avx512, gpt2asm_layernorm_f32_avx512
        .protected gpt2asm_gelu_f32_avx512, gpt2asm_attention_f32_avx512
        .protected gpt2asm_matmul_f32_avx512, gpt2asm_matmul_f16_avx512
        .protected gpt2asm_attention_f16_avx2, gpt2asm_argmax_f32_avx2, gpt2asm_argmax_f32_avx512
        .protected gpt2asm_attention_rows_f32_avx2, gpt2asm_attention_rows_f16_avx2
        .protected gpt2asm_attention_rows_f32_avx512, gpt2asm_attention_rows_f16_avx512
        .protected gpt2asm_plan_run_avx2, gpt2asm_plan_run_avx512
#endif

        .macro  xcall name
#ifdef GPT2ASM_MACHO
        call    _\name
#else
        call    \name
#endif
        .endm

        .text

/* ================================================================================================ */
/* parking: the only OS-specific code                                                              */

/*
 * pool_park(u32 *addr = rdi, u32 expected = esi): sleep while *addr == expected (returns at once if it
 * differs; may return spuriously).  pool_wake(u32 *addr = rdi): wake every thread parked on addr.
 * Both clobber rax, rcx, rdx, rsi, rdi, r10, r11 (the system call registers).
 */
        .p2align 4
pool_park:
#ifdef GPT2ASM_MACHO
        movl    %esi, %edx                      /* __ulock_wait(UL_COMPARE_AND_WAIT, addr, value, 0) */
        movq    %rdi, %rsi
        movl    $1, %edi
        xorl    %r10d, %r10d
        movl    $0x2000203, %eax
#else
        movl    %esi, %edx                      /* futex(addr, FUTEX_WAIT_PRIVATE, expected, NULL)  */
        movl    $128, %esi
        xorl    %r10d, %r10d
        movl    $202, %eax
#endif
        syscall
        ret

        .p2align 4
pool_wake:
#ifdef GPT2ASM_MACHO
        movq    %rdi, %rsi                      /* __ulock_wake(UL_COMPARE_AND_WAIT|ULF_WAKE_ALL, addr, 0) */
        movl    $0x101, %edi
        xorl    %edx, %edx
        movl    $0x2000204, %eax
#else
        movl    $129, %esi                      /* futex(addr, FUTEX_WAKE_PRIVATE, INT_MAX)          */
        movl    $0x7fffffff, %edx
        movl    $202, %eax
#endif
        syscall
        ret

/* pool_yield(): give the CPU to another runnable thread, if any (sched_yield).  Clobbers rax, rcx, r11. */
        .p2align 4
pool_yield:
#ifndef GPT2ASM_MACHO                           /* (macOS: a no-op) */
        movl    $24, %eax                       /* sched_yield() */
        syscall
#endif
        ret

/*
 * pool_wait_eq / pool_wait_ne (u32 *addr = rdi, u32 value = esi, u32 *sleepers = rdx, u64 spin = rcx,
 * u64 *parks = r8 = &ctx.parks): return once *addr == value (eq) / *addr != value (ne).  Spin with pause
 * for `spin` TSC ticks (after ctx.yield_ticks also calling pool_yield between rounds of 64 pauses), then
 * park on addr (counted in *sleepers while parked, and in *parks).
 * Clobbers the caller-saved registers; preserves the callee-saved ones.
 */
        .macro  pool_wait_fn name, jdone
        .p2align 4
\name:
        movl    (%rdi), %eax
        cmpl    %esi, %eax
        \jdone  9f                              /* already there */
        push_callee
        subq    $8, %rsp
        movq    %rdi, %rbx                      /* addr */
        movl    %esi, %r12d                     /* value */
        movq    %rdx, %r13                      /* sleepers */
        movq    %r8, %r15                       /* parks */
        movq    %rcx, %r14
        rdtsc
        shlq    $32, %rdx
        orq     %rdx, %rax
        movq    CTX_YIELD - CTX_PARKS(%r15), %rbp
        addq    %rax, %rbp                      /* from then on: yield between spin rounds */
        addq    %rax, %r14                      /* deadline: park */
1:      movl    $64, %ecx
2:      pause
        movl    (%rbx), %eax
        cmpl    %r12d, %eax
        \jdone  8f
        decl    %ecx
        jnz     2b
        rdtsc
        shlq    $32, %rdx
        orq     %rdx, %rax
        cmpq    %r14, %rax
        jae     3f
        cmpq    %rbp, %rax
        jb      1b
        call    pool_yield                      /* the thread we wait for may need this CPU */
        jmp     1b
3:      lock incl (%r13)                        /* parked from here on (a full fence) */
5:      movl    (%rbx), %esi
        cmpl    %r12d, %esi
        \jdone  4f
        lock incq (%r15)
        movq    %rbx, %rdi
        call    pool_park                       /* sleeps while *addr == esi */
        jmp     5b
4:      lock decl (%r13)
8:      addq    $8, %rsp
        pop_callee
9:      ret
        .endm

        pool_wait_fn pool_wait_eq, je
        pool_wait_fn pool_wait_ne, jne

/*
 * pool_arrive(u32 *count = rdi, u32 *sleepers = rdx, u32 n = ecx, wait = esi, ctx = r8): count one
 * arrival; the n-th wakes the parked ones; if `wait`, the others return once all n have arrived.
 */
        .p2align 4
pool_arrive:
        movl    $1, %eax
        lock xaddl %eax, (%rdi)                 /* a full fence: the thread's outputs are visible */
        incl    %eax
        cmpl    %ecx, %eax
        jne     1f
        cmpl    $0, (%rdx)
        jne     pool_wake                       /* tail call: the last one wakes the parked */
        ret
1:      testl   %esi, %esi
        jz      2f
        movl    %ecx, %esi
        movq    CTX_SPIN(%r8), %rcx
        leaq    CTX_PARKS(%r8), %r8
        jmp     pool_wait_eq                    /* tail call */
2:      ret

/*
 * void gpt2asm_pool_shutdown(pool_t *ctx);
 *   Tell the workers to return (call only while no plan runs): shutdown = 1, a new generation, wake.
 */
function gpt2asm_pool_shutdown
        movl    $1, CTX_SHUTDOWN(%rdi)
        lock incl CTX_SEQ(%rdi)
        cmpl    $0, CTX_SEQ_SLEEPERS(%rdi)
        je      1f
        jmp     pool_wake
1:      ret
endfunc

/* ================================================================================================ */
/* elementwise adds (exact: one binary32 add per element, so any vector width gives the same bits) */

/* vadd_avx2(dst = rdi, a = rsi, b = rdx, n = rcx): dst[i] = a[i] + b[i], n a multiple of 16.
 * dst may equal a or b.  Clobbers rax, ymm0-1; ends with vzeroupper. */
        .p2align 4
vadd_avx2:
        xorl    %eax, %eax
        testq   %rcx, %rcx
        jz      2f
1:      vmovups   (%rsi,%rax,4), %ymm0
        vmovups 32(%rsi,%rax,4), %ymm1
        vaddps    (%rdx,%rax,4), %ymm0, %ymm0
        vaddps  32(%rdx,%rax,4), %ymm1, %ymm1
        vmovups %ymm0,   (%rdi,%rax,4)
        vmovups %ymm1, 32(%rdi,%rax,4)
        addq    $16, %rax
        cmpq    %rcx, %rax
        jb      1b
2:      vzeroupper
        ret

/* kv16_store(dst = rdi, src = rsi, n = rcx): dst[i] = binary16(src[i]) rounded to nearest even
 * (vcvtps2ph, F16C: every AVX-512 CPU has it too), n a multiple of 8: the float32 k / v rows of a
 * binary16 cache, written from their staging rows.  The same rounding as numpy's astype(float16).
 * Clobbers rax, ymm0; ends with vzeroupper. */
        .p2align 4
kv16_store:
        xorl    %eax, %eax
        testq   %rcx, %rcx
        jz      2f
1:      vmovups (%rsi,%rax,4), %ymm0
        vcvtps2ph $0, %ymm0, (%rdi,%rax,2)
        addq    $8, %rax
        cmpq    %rcx, %rax
        jb      1b
2:      vzeroupper
        ret

/* kv_put(dst = rdi, src = rsi; r14 = the job): one new cache row of 64 elements from 64 floats: with
 * FL_KV16 rounded to binary16 (vcvtps2ph, round to nearest even: kv16_store's), else copied.  Clobbers
 * ymm0-1 only; ends with vzeroupper. */
        .p2align 4
kv_put:
        testl   $FL_KV16, J_FLAGS(%r14)
        jnz     2f
        .irp    o, 0, 64, 128, 192
        vmovups \o(%rsi), %ymm0
        vmovups \o+32(%rsi), %ymm1
        vmovups %ymm0, \o(%rdi)
        vmovups %ymm1, \o+32(%rdi)
        .endr
        vzeroupper
        ret
2:      .irp    o, 0, 32, 64, 96, 128, 160, 192, 224
        vmovups \o(%rsi), %ymm0
        vcvtps2ph $0, %ymm0, \o/2(%rdi)
        .endr
        vzeroupper
        ret

/* vadd_avx512: the same with one zmm per 16 elements (AVX-512F). */
        .p2align 4
vadd_avx512:
        xorl    %eax, %eax
        testq   %rcx, %rcx
        jz      2f
1:      vmovups (%rsi,%rax,4), %zmm0
        vaddps  (%rdx,%rax,4), %zmm0, %zmm0
        vmovups %zmm0, (%rdi,%rax,4)
        addq    $16, %rax
        cmpq    %rcx, %rax
        jb      1b
2:      vzeroupper
        ret

/* ================================================================================================ */
/* the executor, once per kernel family                                                             */

/* Frame of plan_jobs (after 6 pushes and sub $FRAME; rsp is 16-byte aligned at every call):
 *     0 .. 40(%rsp)   stack arguments 7-12 of the kernel being called (12: the q0 matmul)
 *     56(%rsp)        end of the job range          64(%rsp)  first item of the claim
 *     72(%rsp)        end of the claim              80(%rsp)  current head / tile / row / item
 *     88(%rsp)        the job's item count          96(%rsp)  row of a MATMUL epilogue
 *     104(%rsp)       FL_KV16: the cache rows its staged k / v rows go to
 *     112(%rsp)       BATTN: the end of the claimed heads of the current row
 *     120(%rsp)       MATMUL: the tiles of the current kernel call  (128: padding)
 * Callee-saved registers: r12 ctx, r13 plan, r14 current job, r15 thread id, rbx private area,
 * rbp the job's matvec input (x, or the private LayerNorm output). */
#define F_END   56
#define F_T0    64
#define F_T1    72
#define F_H     80
#define F_N     88
#define F_ROW   96
#define F_KVDST 104
#define F_HEND  112     /* BATTN: the end of the claim's heads in the current row */
#define F_NT    120     /* MATMUL: tiles of the current kernel call (1, or a q0 claim's) */
#define FRAME   136

        /* rbp = the job's matvec input, after its prologue (embedding add, LayerNorm) */
        .macro  job_prologue isa, sfx
        movq    J_X(%r14), %rbp
        movl    J_FLAGS(%r14), %eax
        andl    $PRO_MASK, %eax
        jz      .Lpro_done_\sfx\()_\isa
        testl   $PRO_EMBED, %eax
        jz      .Lpro_ln_\sfx\()_\isa
        movq    PL_X(%r13), %rdi                /* thread 0 writes the residual stream ...        */
        testq   %r15, %r15
        jz      1f
        movq    %rbx, %rdi                      /* ... the others a private copy of it           */
        addq    PL_E_OFF(%r13), %rdi
1:      movq    %rdi, %rbp
        movq    PL_C(%r13), %rcx
        movq    PL_TOKEN(%r13), %rsi
        frow    %rsi, %rcx, PL_WTE(%r13)        /* wte[token] */
        movq    PL_POS(%r13), %rdx
        frow    %rdx, %rcx, PL_WPE(%r13)        /* wpe[pos] */
        call    vadd_\isa                       /* x = wte[token] + wpe[pos] */
.Lpro_ln_\sfx\()_\isa:
        movq    %rbp, %rdi
        movq    J_G(%r14), %rsi
        movq    J_BETA(%r14), %rdx
        movq    %rbx, %rcx
        addq    PL_H_OFF(%r13), %rcx
        movq    %rcx, %rbp                      /* the matvec reads the private h */
        movq    J_NIN(%r14), %r8
        xcall   gpt2asm_layernorm_f32_\isa
.Lpro_done_\sfx\()_\isa:
        /* FL_Q0: every thread quantizes the input into its private area (J_XD: xq [n_in], then xd at
         * + n_in) with the job's quantizer J_QFN; rbp = xq, which q0_mv_args turns into (xq, xd) */
        unless_flag FL_Q0, .Lpro_q0_\sfx\()_\isa
        movq    %rbp, %rdi
        movq    %rbx, %rsi
        addq    J_XD(%r14), %rsi                /* xq */
        movq    J_NIN(%r14), %rcx
        leaq    (%rsi,%rcx), %rdx               /* xd */
        movq    %rsi, %rbp
        call    *J_QFN(%r14)                    /* qfn(in, xq, xd, n_in) */
.Lpro_q0_\sfx\()_\isa:
        .endm

        /* claim the next items: F_T0, F_T1 = [first, end); jump to \none if none is left.
         * Fixed claims (flags bits 8-13 zero): J_CHUNK items with one lock xadd.  Guided claims (bits
         * 8-13 = s): max(J_CHUNK, remaining >> s) items with lock cmpxchg -- large contiguous claims
         * first, J_CHUNK-sized ones at the end, so the threads finish together. */
        .macro  claim none
        movl    J_FLAGS(%r14), %ecx
        shrl    $8, %ecx
        andl    $63, %ecx
        jnz     5f
        movq    J_CHUNK(%r14), %rax
        lock xaddq %rax, J_CLAIM(%r14)
        movq    F_N(%rsp), %rcx
        cmpq    %rcx, %rax
        jae     \none
        movq    %rax, F_T0(%rsp)
        addq    J_CHUNK(%r14), %rax
        cmpq    %rcx, %rax
        cmova   %rcx, %rax
        movq    %rax, F_T1(%rsp)
        jmp     7f
5:      movq    J_CLAIM(%r14), %rax             /* expected value */
6:      movq    F_N(%rsp), %rdx
        cmpq    %rdx, %rax
        jae     \none
        subq    %rax, %rdx
        shrq    %cl, %rdx                       /* remaining >> s */
        cmpq    J_CHUNK(%r14), %rdx
        cmovb   J_CHUNK(%r14), %rdx             /* at least J_CHUNK */
        addq    %rax, %rdx
        cmpq    F_N(%rsp), %rdx
        cmova   F_N(%rsp), %rdx                 /* at most to the end */
        lock cmpxchgq %rdx, J_CLAIM(%r14)       /* claim = rdx if still rax, else rax = claim */
        jne     6b
        movq    %rax, F_T0(%rsp)
        movq    %rdx, F_T1(%rsp)
7:
        .endm

        /* a claim's items F_T0 .. F_T1 - 1, one at a time in F_H: item_first starts at F_T0 (also in rax);
         * item_next steps F_H (rax = the new item) and jumps to \again while it is below F_T1, else (with
         * \done) to \done */
        .macro  item_first
        movq    F_T0(%rsp), %rax
        movq    %rax, F_H(%rsp)
        .endm
        .macro  claim_first isa                 // claim, then its first item
        claim   .Lbarrier_\isa
        item_first
        .endm
        .macro  item_row r                      // \r = row F_H of the job's x (J_X, J_LDX floats apart)
        movq    F_H(%rsp), \r
        frow    \r, J_LDX(%r14), J_X(%r14)
        .endm
        .macro  item_next again, done
        movq    F_H(%rsp), %rax
        incq    %rax
        movq    %rax, F_H(%rsp)
        cmpq    F_T1(%rsp), %rax
        jb      \again
        .ifnb   \done
        jmp     \done
        .endif
        .endm

        /* one tile of the qkv matvec for head h = F_H: tile t = \part * n_head + h (\part 1: k, 2: v)
         * into the cache at (h * head_stride + pos * 64) floats, as tiles [0, 1) of the pointers
         * shifted to tile t (w + t * tile_bytes, b + 64 t) */
        .macro  qkv_tile isa, part
        movq    F_H(%rsp), %rax
        movq    J_N(%r14), %rcx
        .if \part == 2
        addq    %rcx, %rcx
        .endif
        addq    %rcx, %rax                      /* t */
        movq    %rax, %rdi
        imulq   J_TILEB(%r14), %rdi
        addq    J_W(%r14), %rdi                 /* the tile's weights */
        movq    %rbp, %rsi
        shlq    $8, %rax
        movq    J_B(%r14), %rdx
        addq    %rax, %rdx                      /* b + 64 t */
        movq    F_H(%rsp), %rcx
        imulq   J_A3(%r14), %rcx
        movq    PL_POS(%r13), %rax
        shlq    $6, %rax
        addq    %rax, %rcx                      /* (h * head_stride + 64 pos) elements */
        if_flag FL_KV16, 1f
        shlq    $2, %rcx
        .if \part == 1
        addq    J_A0(%r14), %rcx                /* k cache [h][pos] */
        .else
        addq    J_A1(%r14), %rcx                /* v cache [h][pos] */
        .endif
        jmp     2f
1:      addq    %rcx, %rcx
        .if \part == 1
        addq    J_A0(%r14), %rcx                /* binary16 k cache [h][pos] ... */
        .else
        addq    J_A1(%r14), %rcx                /* ... or v cache [h][pos] */
        .endif
        movq    %rcx, F_KVDST(%rsp)
        movq    %rbx, %rcx
        addq    PL_KV_OFF(%r13), %rcx           /* the float32 row goes to the staging row first */
2:      movq    J_NIN(%r14), %r8
        xorl    %r9d, %r9d                      /* tiles [0, 1) of the shifted pointers */
        movq    $1, 0(%rsp)
        mv_call \isa
        unless_flag FL_KV16, 3f
        movq    F_KVDST(%rsp), %rdi
        movq    %rbx, %rsi
        addq    PL_KV_OFF(%r13), %rsi
        movl    $64, %ecx
        call    kv16_store                      /* the row, rounded to binary16, into the cache */
3:
        .endm

        /* the attention kernel of the job's cache: gpt2asm_attention_f32_<isa>, or with FL_KV16
         * gpt2asm_attention_f16_avx2 (one kernel for both families: the same operations) */
        .macro  att_call isa
        if_flag FL_KV16, .Latt16\@
        xcall   gpt2asm_attention_f32_\isa
        jmp     .Latt32\@
.Latt16\@:
        xcall   gpt2asm_attention_f16_avx2
.Latt32\@:
        .endm

        /* the \op kernel of the job's dtype (FL_F16 in its flags): gpt2asm_\op_f32 / _f16 with the
         * arguments as they are (a nonzero J_FN: that variant of the dtype's kernel, the same arguments);
         * FL_Q0: the job's kernel J_FN after \q0args */
        .macro  dtype_call op, isa, q0args
        if_flag FL_Q0, .Ldt0\@
        movq    J_FN(%r14), %rax
        testq   %rax, %rax
        jnz     .Ldtv\@
        if_flag FL_F16, .Ldt2\@
        xcall   gpt2asm_\op\()_f32_\isa
        jmp     .Ldt3\@
.Ldtv\@:
        call    *%rax
        jmp     .Ldt3\@
.Ldt2\@:
        xcall   gpt2asm_\op\()_f16_\isa
        jmp     .Ldt3\@
.Ldt0\@:
        \q0args
        call    *J_FN(%r14)
.Ldt3\@:
        .endm

        /* \r = \base + 4 * \r * \ld: the address of float row \r of \ld floats a row */
        .macro  frow r, ld, base
        imulq   \ld, \r
        shlq    $2, \r
        addq    \base, \r
        .endm

        /* the stack arguments 0 .. \n - 1 (8 bytes each) move up by \by bytes, the last first (via rax) */
        .macro  args_up n, by
        .irp    k, 3, 2, 1, 0
        .if     \k < \n
        movq    8*\k(%rsp), %rax
        movq    %rax, 8*\k+\by(%rsp)
        .endif
        .endr
        .endm

        /* matvec's (w, x, b, y, n_in, tile_begin, tile_end) one argument up from b on: the q0 kernels
         * take one more (xd) before b */
        .macro  mv_args_up
        args_up 1, 8                            /* tile_end */
        movq    %r9, 0(%rsp)                    /* tile_begin */
        movq    %r8, %r9                        /* n_in */
        movq    %rcx, %r8                       /* y */
        movq    %rdx, %rcx                      /* b */
        .endm

        /* matvec (w = rdi, x = rsi = xq of the job_prologue, b = rdx, y = rcx, n_in = r8, tile_begin = r9,
         * tile_end = 0(%rsp)) -> gpt2asm_matvec_{q8_0,q4_0}'s (w, xq, xd = xq + n_in, b, y, n_in,
         * tile_begin, tile_end) */
        .macro  mv_q0_args
        mv_args_up
        leaq    (%rsi,%r9), %rdx                /* xd */
        .endm

        /* matmul (w = rdi, x = rsi = xq rows, ldx = rdx (bytes), b = rcx, y = r8, ldy = r9, n_tokens,
         * n_in, tile_begin, tile_end = 0, 8, 16, 24(%rsp)) -> gpt2asm_matmul_{q8_0,q4_0}'s (w, xq, ldq,
         * xd = J_XD, ldd = J_LDD, b, y, ldy, n_tokens, n_in, tile_begin, tile_end) */
        .macro  mm_q0_args
        args_up 4, 16                           /* n_tokens, n_in, tile_begin, tile_end */
        movq    %r9, 8(%rsp)                    /* ldy */
        movq    %r8, 0(%rsp)                    /* y */
        movq    %rcx, %r9                       /* b */
        movq    J_LDD(%r14), %r8                /* ldd */
        movq    J_XD(%r14), %rcx                /* xd */
        .endm

        .macro  mv_call isa
        dtype_call matvec, \isa, mv_q0_args
        .endm

        /* the job's matvec over the claimed tiles [F_T0, F_T1): W (J_W) times the input rbp,
         * plus J_B, into J_Y */
        .macro  mv_claimed isa
        movq    J_W(%r14), %rdi
        movq    %rbp, %rsi
        movq    J_B(%r14), %rdx
        movq    J_Y(%r14), %rcx
        movq    J_NIN(%r14), %r8
        movq    F_T0(%rsp), %r9
        movq    F_T1(%rsp), %rax
        movq    %rax, 0(%rsp)
        mv_call \isa
        .endm

        /* the attention arguments of the claimed heads [F_T0, F_T1) but n_pos (r9): q = J_Y, k / v
         * caches = a0 / a1, out = a2, this thread's scratch (a row per head), head stride a3 */
        .macro  att_claimed
        movq    J_Y(%r14), %rdi
        movq    J_A0(%r14), %rsi
        movq    J_A1(%r14), %rdx
        movq    J_A2(%r14), %rcx
        movq    %rbx, %r8
        addq    PL_S_OFF(%r13), %r8
        movq    J_A3(%r14), %rax
        movq    %rax, 0(%rsp)
        movq    F_T0(%rsp), %rax
        movq    %rax, 8(%rsp)
        movq    F_T1(%rsp), %rax
        movq    %rax, 16(%rsp)
        .endm

        .macro  mm_call isa
        dtype_call matmul, \isa, mm_q0_args
        .endm

/* The executor of a family: plan_jobs_<isa> walks the job range; per job it computes the item count
 * (F_N), jumps to the routine of the job's kind through the jump table .Lkinds_<isa> (one entry per
 * KIND_*, plus a guard entry for anything else), and that routine claims and computes items until none
 * is left, then jumps to .Lbarrier_<isa>, which waits for the other threads and goes on with the next job.
 * Common contract of the kind routines (kind_<kind>_<isa>): entered by jump, never called; r12 ctx,
 * r13 plan, r14 the job, r15 the thread id, rbx this thread's private area, F_END and F_N set in the
 * frame; a routine may clobber rbp, every caller-saved register and the frame slots it names, keeps
 * r12-r15, rbx and rsp, and leaves by a jump to .Lbarrier_<isa>. */

        /* the frame of plan_jobs: the callee-saved registers, then FRAME bytes (rsp 16-byte aligned) */
        .macro  jobs_enter
        pushq   %rbp
        pushq   %rbx
        pushq   %r12
        pushq   %r13
        pushq   %r14
        pushq   %r15
        subq    $FRAME, %rsp
        .endm
        .macro  jobs_leave
        addq    $FRAME, %rsp
        pop_callee 1
        vzeroupper
        ret
        .endm

        /* branch to \label if the job (r14) has any of the flags \mask (if_flag) / none of them */
        .macro  if_flag mask, label
        testl   $(\mask), J_FLAGS(%r14)
        jnz     \label
        .endm
        .macro  unless_flag mask, label
        testl   $(\mask), J_FLAGS(%r14)
        jz      \label
        .endm

        /* entry \kind of the jump table at .Lkinds_\isa: the offset of \target (checked to be in order) */
        .macro  kind_entry isa, kind, target
        .if . - .Lkinds_\isa != 4 * (\kind)
        .error  "plan_x86.S: the jump table is out of KIND_* order"
        .endif
        .long   \target - .Lkinds_\isa
        .endm

        .macro  plan_family isa
        .p2align 5
/* plan_jobs_<isa>(ctx = rdi, plan = rsi, first job = rdx, end = rcx, tid = r8) */
plan_jobs_\isa:
        jobs_enter
        movq    %rdi, %r12
        movq    %rsi, %r13
        movq    %rdx, %r14
        movq    %rcx, F_END(%rsp)
        movq    %r8, %r15
        movq    %r8, %rbx
        imulq   PL_PRIV_STRIDE(%r13), %rbx
        addq    PL_PRIV(%r13), %rbx
        cmpq    F_END(%rsp), %r14
        jae     .Lret_\isa

.Ljob_\isa:
        movq    J_N(%r14), %rax
        unless_flag FL_ROWS, 1f
        imulq   PL_NTOK(%r13), %rax             /* a row job: J_N items per row */
1:      movq    %rax, F_N(%rsp)
        movl    J_KIND(%r14), %eax              /* the kind's routine, through the jump table; */
        movl    $KIND_COUNT, %ecx
        cmpl    %ecx, %eax
        cmova   %ecx, %eax                      /* an unknown kind takes the guard entry */
        leaq    .Lkinds_\isa(%rip), %rcx
        movslq  (%rcx,%rax,4), %rax
        addq    %rcx, %rax
        jmp     *%rax

        /* ---- barrier: every job's outputs are complete before the next job starts */
.Lbarrier_\isa:
        movl    CTX_NTHREADS(%r12), %ecx
        cmpl    $1, %ecx
        jbe     .Lnext_\isa
        movq    %r12, %r8
        leaq    J_SIZE(%r14), %rax
        cmpq    F_END(%rsp), %rax
        jae     1f
        leaq    J_ARRIVE(%r14), %rdi
        leaq    J_SLEEPERS(%r14), %rdx
        movl    $1, %esi
        call    pool_arrive
        jmp     .Lnext_\isa
1:      leaq    CTX_DONE(%r12), %rdi            /* the last job: the pool's own counter, and only */
        leaq    CTX_DONE_SLEEPERS(%r12), %rdx   /* the caller waits (the plan may be freed after) */
        xorl    %esi, %esi
        testq   %r15, %r15
        sete    %sil
        call    pool_arrive
.Lnext_\isa:
        addq    $J_SIZE, %r14
        cmpq    F_END(%rsp), %r14
        jb      .Ljob_\isa
.Lret_\isa:
        jobs_leave

        /* the jump table: entry k = kind_<k>_<isa> - .Lkinds_<isa> (PC-relative: no relocation), and the
         * guard entry KIND_COUNT (a kind Python never builds: no work, straight to the barrier) */
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

        /* ---- MATVEC: y = W in + b over claimed tiles, then the epilogue on them.  ARGMAX: each thread
         * keeps, in its 16-byte slot at a0 + 16 tid, { u64 index of its first maximum so far (SIZE_MAX:
         * none yet), f32 its value, u32 1 if a NaN or an infinity was seen }, over the outputs < a1 of
         * its claims (which ascend: a later claim only wins with a strictly larger value). */
        .p2align 4
/* kind_matvec_<isa> (KIND_MATVEC): entered by jump from plan_jobs_<isa> (the common contract above);
 * rbp = the job's input after job_prologue; frame F_T0, F_T1 (claim), F_H (ARGMAX: o0). Leaves by
 * `claim` jumping to .Lbarrier_<isa> once no item is left. */
kind_matvec_\isa:
.Lmatvec_\isa:
        job_prologue \isa, mv
        movl    J_FLAGS(%r14), %eax
        andl    $EPI_MASK, %eax
        cmpl    $EPI_ARGMAX, %eax
        jne     .Lmv_claim_\isa
        movq    %r15, %rax
        shlq    $4, %rax
        addq    J_A0(%r14), %rax                /* this thread's slot */
        movq    $-1, 0(%rax)
        movq    $0, 8(%rax)
.Lmv_claim_\isa:
        claim   .Lbarrier_\isa
        mv_claimed \isa
        movl    J_FLAGS(%r14), %eax
        andl    $EPI_MASK, %eax
        jz      .Lmv_claim_\isa
        movq    F_T0(%rsp), %rsi
        shlq    $8, %rsi
        movq    F_T1(%rsp), %rcx
        shlq    $8, %rcx
        subq    %rsi, %rcx
        shrq    $2, %rcx                        /* 64 (t1 - t0) outputs */
        movq    J_Y(%r14), %rdx
        addq    %rsi, %rdx                      /* y + 64 t0 */
        cmpl    $EPI_GELU, %eax
        jne     3f
        movq    %rdx, %rdi
        movq    %rdx, %rsi
        movq    %rcx, %rdx
        xcall   gpt2asm_gelu_f32_\isa           /* y = gelu(y), in place */
        jmp     .Lmv_claim_\isa
3:      cmpl    $EPI_RESID, %eax
        jne     4f
        movq    J_A0(%r14), %rdi
        addq    %rsi, %rdi                      /* x + 64 t0 */
        movq    %rdi, %rsi
        call    vadd_\isa                       /* x = x + y */
        jmp     .Lmv_claim_\isa
4:      shrq    $2, %rsi                        /* ARGMAX: o0 = 64 t0 */
        movq    %rsi, F_H(%rsp)
        movq    J_A1(%r14), %rax
        subq    %rsi, %rax                      /* outputs from o0 that count */
        jbe     .Lmv_claim_\isa
        cmpq    %rax, %rcx
        cmova   %rax, %rcx
        movq    %rdx, %rdi
        movq    %rcx, %rsi
        xcall   gpt2asm_argmax_f32_\isa         /* first maximum of y[o0 .. o0 + n), or SIZE_MAX */
        movq    %r15, %rcx
        shlq    $4, %rcx
        addq    J_A0(%r14), %rcx                /* the slot */
        cmpq    $-1, %rax
        je      5f
        addq    F_H(%rsp), %rax                 /* the output index */
        movq    J_Y(%r14), %rdx
        vmovss  (%rdx,%rax,4), %xmm0
        cmpq    $-1, 0(%rcx)
        je      6f                              /* the thread's first candidate */
        vucomiss 8(%rcx), %xmm0
        jbe     .Lmv_claim_\isa                 /* not larger: the earlier one stays */
6:      movq    %rax, 0(%rcx)
        vmovss  %xmm0, 8(%rcx)
        jmp     .Lmv_claim_\isa
5:      movl    $1, 12(%rcx)                    /* a NaN or an infinity */
        jmp     .Lmv_claim_\isa

        /* ---- QKV: for the claimed heads [h0, h1): the q tiles (one call), the k tiles and the v tiles
         * (one call per tile, straight into the cache), then their attention (one call).  Each third of
         * c_attn is read front to back, so a claim of several heads is one forward stream per third. */
        .p2align 4
/* kind_qkv_<isa> (KIND_QKV): entered by jump from plan_jobs_<isa> (the common contract above); rbp =
 * the job's input after job_prologue; frame F_T0, F_T1, F_H (head), F_KVDST. Leaves by `claim` jumping
 * to .Lbarrier_<isa> once no item is left. */
kind_qkv_\isa:
.Lqkv_\isa:
        job_prologue \isa, qkv
.Lqkv_claim_\isa:
        claim   .Lbarrier_\isa
        mv_claimed \isa                         /* q tiles h0 .. h1-1 into y + 64 h */
        item_first
.Lqkv_k_\isa:
        qkv_tile \isa, 1
        item_next .Lqkv_k_\isa
        item_first
.Lqkv_v_\isa:
        qkv_tile \isa, 2
        item_next .Lqkv_v_\isa
        att_claimed                             /* the attention of the claimed heads, one call, */
        movq    PL_POS(%r13), %r9
        incq    %r9                             /* over n_pos = pos + 1 */
        att_call \isa
        jmp     .Lqkv_claim_\isa

        /* ---- ATTN: attention over claimed heads, n_pos fixed in the record */
        .p2align 4
/* kind_attn_<isa> (KIND_ATTN): entered by jump from plan_jobs_<isa> (the common contract above); frame
 * F_T0, F_T1 (claimed heads); rbp unused. Leaves by `claim` jumping to .Lbarrier_<isa> once no item is
 * left. */
kind_attn_\isa:
.Lattn_\isa:
        claim   .Lbarrier_\isa
        att_claimed
        movq    J_A4(%r14), %r9                 /* n_pos of the record */
        att_call \isa
        jmp     .Lattn_\isa

        /* ---- MATMUL (prefill; items = tiles): for each claimed tile tau, the matmul kernel of the
         * dtype over the PL_NTOK rows of x (J_LDX floats apart) into y (J_LDY apart), as tiles [0, 1)
         * of the pointers shifted to tau (w + tau tile_bytes, b / y + 64 tau); with FL_KV the
         * tiles [H, 2H) and [2H, 3H) (H = J_A4) go to the k / v cache rows pos .. (rows 64 floats apart);
         * then the epilogue on the tile's 64 outputs of every row: GELU in place, or RESID
         * r[t ldr + o] = r[t ldr + o] + y[t ldy + o].  FL_Q0 without FL_KV: the claim's tiles
         * [tau, F_T1) in one call (tiles [0, F_NT) shifted to tau) and one epilogue over their 64 F_NT
         * outputs per row -- the q0 kernels repack their input rows once per call. */
        .p2align 4
/* kind_matmul_<isa> (KIND_MATMUL): entered by jump from plan_jobs_<isa> (the common contract above);
 * frame F_T0, F_T1, F_H (tile tau), F_NT, F_ROW (epilogue row), F_KVDST; rbp unused. Leaves by `claim`
 * jumping to .Lbarrier_<isa> once no item is left. */
kind_matmul_\isa:
.Lmatmul_\isa:
        claim_first \isa
.Lmm_tile_\isa:
        movl    $1, %eax
        movl    J_FLAGS(%r14), %ecx
        andl    $(FL_Q0|FL_KV), %ecx
        cmpl    $FL_Q0, %ecx
        jne     0f
        movq    F_T1(%rsp), %rax
        subq    F_H(%rsp), %rax                 /* q0 without KV: every claimed tile */
0:      movq    %rax, F_NT(%rsp)
        movq    F_H(%rsp), %rax                 /* tau */
        movq    %rax, %rdi
        imulq   J_TILEB(%r14), %rdi
        addq    J_W(%r14), %rdi                 /* the tile's weights */
        shlq    $8, %rax                        /* 64 tau outputs, in bytes */
        movq    J_B(%r14), %rcx
        testq   %rcx, %rcx
        jz      1f
        addq    %rax, %rcx                      /* b + 64 tau */
1:      movq    J_Y(%r14), %r8
        addq    %rax, %r8                       /* y + 64 tau */
        movq    J_LDY(%r14), %r9
        unless_flag FL_KV, 3f
        movq    F_H(%rsp), %rax
        subq    J_A4(%r14), %rax                /* tau - H */
        jb      3f                              /* a q tile */
        movq    J_A0(%r14), %r8                 /* a k tile: head tau - H */
        cmpq    J_A4(%r14), %rax
        jb      2f
        subq    J_A4(%r14), %rax                /* a v tile: head tau - 2H */
        movq    J_A1(%r14), %r8
2:      imulq   J_A3(%r14), %rax                /* h * head_stride */
        movq    PL_POS(%r13), %r9
        shlq    $6, %r9
        addq    %r9, %rax
        movl    $64, %r9d                       /* rows of 64 floats */
        if_flag FL_KV16, 5f
        leaq    (%r8,%rax,4), %r8               /* cache [h][pos] */
        jmp     3f
5:      leaq    (%r8,%rax,2), %r8
        movq    %r8, F_KVDST(%rsp)              /* binary16 cache [h][pos] ... */
        movq    %rbx, %r8
        addq    PL_KV_OFF(%r13), %r8            /* ... after the staging rows */
3:      movq    J_X(%r14), %rsi
        movq    J_LDX(%r14), %rdx
        movq    PL_NTOK(%r13), %rax
        movq    %rax, 0(%rsp)                   /* n_tokens */
        movq    J_NIN(%r14), %rax
        movq    %rax, 8(%rsp)                   /* n_in */
        movq    $0, 16(%rsp)                    /* tiles [0, F_NT) of the shifted pointers */
        movq    F_NT(%rsp), %rax
        movq    %rax, 24(%rsp)
        mm_call \isa
        movl    J_FLAGS(%r14), %eax
        testl   $FL_KV16, %eax
        jz      6f
        testl   $FL_KV, %eax
        jz      6f
        movq    F_H(%rsp), %rcx
        cmpq    J_A4(%r14), %rcx
        jb      .Lmm_next_\isa                  /* a q tile */
        movq    F_KVDST(%rsp), %rdi             /* a k / v tile: its PL_NTOK staged rows, rounded */
        movq    %rbx, %rsi                      /* to binary16, into the cache rows pos .. (64 */
        addq    PL_KV_OFF(%r13), %rsi           /* halves apart: contiguous) */
        movq    PL_NTOK(%r13), %rcx
        shlq    $6, %rcx
        call    kv16_store
        jmp     .Lmm_next_\isa
6:      andl    $EPI_MASK, %eax
        jz      .Lmm_next_\isa
        movq    $0, F_ROW(%rsp)
.Lmm_epi_\isa:                                  /* the tile's 64 outputs of row F_ROW */
        movq    F_ROW(%rsp), %rax
        cmpq    PL_NTOK(%r13), %rax
        jae     .Lmm_next_\isa
        addq    $1, F_ROW(%rsp)
        movq    F_H(%rsp), %rsi
        shlq    $8, %rsi                        /* 64 tau, in bytes */
        movq    %rax, %rdx
        imulq   J_LDY(%r14), %rdx
        leaq    (%rsi,%rdx,4), %rdx
        addq    J_Y(%r14), %rdx                 /* &y[row][64 tau] */
        unless_flag EPI_GELU, 4f
        movq    %rdx, %rdi
        movq    %rdx, %rsi
        movq    F_NT(%rsp), %rdx
        shlq    $6, %rdx                        /* 64 F_NT outputs */
        xcall   gpt2asm_gelu_f32_\isa           /* y = gelu(y), in place */
        jmp     .Lmm_epi_\isa
4:      imulq   J_LDR(%r14), %rax
        leaq    (%rsi,%rax,4), %rdi
        addq    J_A0(%r14), %rdi                /* &r[row][64 tau] */
        movq    %rdi, %rsi
        movq    F_NT(%rsp), %rcx
        shlq    $6, %rcx                        /* 64 F_NT outputs */
        call    vadd_\isa                       /* r = r + y */
        jmp     .Lmm_epi_\isa
.Lmm_next_\isa:
        movq    F_NT(%rsp), %rax
        decq    %rax
        addq    %rax, F_H(%rsp)                 /* the last tile of the call */
        item_next .Lmm_tile_\isa, .Lmatmul_\isa

        /* ---- ROWLN (items = rows t < PL_NTOK): y[t ldy ..] = layernorm(x[t ldx ..]), n_in floats; with
         * PRO_EMBED (batched decode) first x[t ldx ..] = wte[token_t] + wpe[pos_t] (the row table's) */
        .p2align 4
/* kind_rowln_<isa> (KIND_ROWLN): entered by jump from plan_jobs_<isa> (the common contract above);
 * frame F_T0, F_T1, F_H (row); rbp unused. Leaves by `claim` jumping to .Lbarrier_<isa> once no item
 * is left. */
kind_rowln_\isa:
.Lrowln_\isa:
        claim_first \isa
.Lrowln_row_\isa:
        unless_flag PRO_EMBED, 1f               /* batched decode, layer 0: row t's embedding first */
        movq    F_H(%rsp), %rax
        movq    %rax, %rdi
        frow    %rdi, J_LDX(%r14), J_X(%r14)    /* x row t */
        imulq   $RT_SIZE, %rax
        addq    PL_RTAB(%r13), %rax             /* its row table entry */
        movq    PL_C(%r13), %rcx
        movq    RT_TOKEN(%rax), %rsi
        frow    %rsi, %rcx, PL_WTE(%r13)        /* wte[token_t] */
        movq    RT_POS(%rax), %rdx
        frow    %rdx, %rcx, PL_WPE(%r13)        /* wpe[pos_t] */
        call    vadd_\isa                       /* x[t] = wte[token_t] + wpe[pos_t] */
1:      movq    F_H(%rsp), %rax
        movq    %rax, %rdi
        frow    %rdi, J_LDX(%r14), J_X(%r14)    /* x row t */
        movq    %rax, %rcx
        frow    %rcx, J_LDY(%r14), J_Y(%r14)    /* y row t */
        movq    J_G(%r14), %rsi
        movq    J_BETA(%r14), %rdx
        movq    J_NIN(%r14), %r8
        xcall   gpt2asm_layernorm_f32_\isa
        item_next .Lrowln_row_\isa, .Lrowln_\isa

        /* ---- ROWQUANT (items = rows t < PL_NTOK): src = x[t ldx ..] (n_in floats), with PRO_LN first
         * h = layernorm(src) into the private h and src = h; then J_QFN(src, y + t ldy (int8 xq row:
         * ldy bytes), J_XD + t ldd (float xd row), n_in) */
        .p2align 4
/* kind_rowquant_<isa> (KIND_ROWQUANT): entered by jump from plan_jobs_<isa> (the common contract above);
 * frame F_T0, F_T1, F_H (row); rbp the row's source. Leaves by `claim` jumping to .Lbarrier_<isa> once
 * no item is left. */
kind_rowquant_\isa:
.Lrowquant_\isa:
        claim_first \isa
.Lrq_row_\isa:
        item_row %rbp                           /* x row t */
        unless_flag PRO_LN, 1f
        movq    %rbp, %rdi
        movq    J_G(%r14), %rsi
        movq    J_BETA(%r14), %rdx
        movq    %rbx, %rcx
        addq    PL_H_OFF(%r13), %rcx
        movq    %rcx, %rbp                      /* the private h */
        movq    J_NIN(%r14), %r8
        xcall   gpt2asm_layernorm_f32_\isa
1:      movq    F_H(%rsp), %rax
        movq    %rax, %rsi
        imulq   J_LDY(%r14), %rsi
        addq    J_Y(%r14), %rsi                 /* xq row t */
        movq    %rax, %rdx
        frow    %rdx, J_LDD(%r14), J_XD(%r14)   /* xd row t */
        movq    %rbp, %rdi
        movq    J_NIN(%r14), %rcx
        call    *J_QFN(%r14)                    /* qfn(src, xq, xd, n_in) */
        item_next .Lrq_row_\isa, .Lrowquant_\isa

        /* ---- ROWATTN (items i < H * PL_NTOK): head h = i / PL_NTOK, row t = PL_NTOK - 1 - i % PL_NTOK
         * (each head's longest rows first, one head's cache rows reused by consecutive items):
         * attention of head h of query row t (J_Y + t ldx) over positions 0 .. pos + t into out row t
         * (J_A2 + t ldy).  4 consecutive items of one claim and one head (rows t-3 .. t) are one
         * gpt2asm_attention_rows call (the family's kernel: the same bits), which reads the cache
         * rows the 4 rows share once; with fewer such items left, one row per call of the single-row
         * kernel (a rows call costs the same for 1 to 4 rows, about 3.2 single-row calls). */
        .p2align 4
/* kind_rowattn_<isa> (KIND_ROWATTN): entered by jump from plan_jobs_<isa> (the common contract above);
 * frame F_T0, F_T1, F_H (item); rbp unused. Leaves by `claim` jumping to .Lbarrier_<isa> once no item
 * is left. */
kind_rowattn_\isa:
.Lrowattn_\isa:
        claim_first \isa
.Lra_item_\isa:
        movq    F_H(%rsp), %rax
        xorl    %edx, %edx
        divq    PL_NTOK(%r13)                   /* rax = h, rdx = i mod n_tok */
        movq    PL_NTOK(%r13), %r11
        subq    %rdx, %r11                      /* t + 1 */
        movq    F_T1(%rsp), %r10
        subq    F_H(%rsp), %r10                 /* items left in the claim */
        cmpq    %r11, %r10
        cmovaq  %r11, %r10                      /* ... that are rows t, t-1, ... of head h */
        movl    $1, %ecx
        movl    $ROWATTN_ROWS, %edx
        cmpq    %rdx, %r10
        cmovaeq %rdx, %rcx
        movq    %rcx, %r10                      /* R = 4 if there are 4 of them, else 1 */
        addq    %r10, F_H(%rsp)
        subq    %r10, %r11                      /* the first row: t - R + 1 */
        movq    J_LDX(%r14), %rdi
        imulq   %r11, %rdi
        movq    J_LDY(%r14), %rcx
        imulq   %r11, %rcx
        movq    %rax, %rdx
        shlq    $6, %rdx                        /* 64 h */
        addq    %rdx, %rdi
        addq    %rdx, %rcx
        shlq    $2, %rdi
        addq    J_Y(%r14), %rdi                 /* q of the first row, head h */
        shlq    $2, %rcx
        addq    J_A2(%r14), %rcx                /* out of the first row, head h */
        imulq   J_A3(%r14), %rax                /* h * head_stride (elements) */
        shlq    $2, %rax                        /* in bytes: float32 ... */
        unless_flag FL_KV16, 1f
        shrq    $1, %rax                        /* ... or binary16 */
1:      movq    J_A0(%r14), %rsi
        addq    %rax, %rsi                      /* k_h */
        movq    J_A1(%r14), %rdx
        addq    %rax, %rdx                      /* v_h */
        movq    PL_POS(%r13), %r9
        leaq    1(%r9,%r11), %r9                /* n_pos of the first row: pos + t - R + 2 */
        movq    %rbx, %r8
        addq    PL_S_OFF(%r13), %r8             /* scratch */
        cmpq    $1, %r10
        je      .Lra_one_\isa
        movq    %r10, 0(%rsp)                   /* n_rows */
        movq    J_LDX(%r14), %rax
        movq    %rax, 8(%rsp)                   /* ldq */
        movq    J_LDY(%r14), %rax
        movq    %rax, 16(%rsp)                  /* ldo */
        if_flag FL_KV16, 1f
        xcall   gpt2asm_attention_rows_f32_\isa
        jmp     2f
1:      xcall   gpt2asm_attention_rows_f16_\isa
        jmp     2f
.Lra_one_\isa:                                  /* one row: the single-row kernel on head 0 of the */
        movq    J_A3(%r14), %rax                /* pointers above */
        movq    %rax, 0(%rsp)                   /* head_stride */
        movq    $0, 8(%rsp)                     /* head_begin */
        movq    $1, 16(%rsp)                    /* head_end */
        att_call \isa
2:      movq    F_H(%rsp), %rax
        cmpq    F_T1(%rsp), %rax
        jb      .Lra_item_\isa
        jmp     .Lrowattn_\isa

        /* ---- BATTN (batched decode; items i < H * PL_NTOK: row t = i / H, head h = i % H, J_N = H): the
         * claim's items of one row t, heads [h0, h1), at once: for each head its new key and value (the
         * c_attn output row J_X + t ldx: k_h at 64 (H + h), v_h at 64 (2H + h) floats) into row t's caches
         * (row table: RT_K + J_A0, RT_V + J_A1 bytes, head h at h J_A3 elements) at position pos_t (a
         * copy; KV16: rounded to binary16 as kv16_store), then one attention call over heads [h0, h1):
         * q = J_X + t ldx, out = J_Y + t ldy, n_pos = pos_t + 1 -- the step's call on that sequence. */
        .p2align 4
/* kind_battn_<isa> (KIND_BATTN): entered by jump from plan_jobs_<isa> (the common contract above);
 * frame F_T0, F_T1, F_H (item), F_ROW (row t), F_HEND (h1); rbp = row t's row table entry. Leaves by
 * `claim` jumping to .Lbarrier_<isa> once no item is left. */
kind_battn_\isa:
.Lbattn_\isa:
        claim_first \isa
.Lba_row_\isa:
        movq    F_H(%rsp), %rax
        xorl    %edx, %edx
        divq    J_N(%r14)                       /* rax = t, rdx = h0 */
        movq    %rax, F_ROW(%rsp)
        movq    F_T1(%rsp), %rcx
        subq    F_H(%rsp), %rcx
        addq    %rdx, %rcx                      /* h0 + items left in the claim */
        cmpq    J_N(%r14), %rcx
        cmova   J_N(%r14), %rcx
        movq    %rcx, F_HEND(%rsp)              /* h1 = min(H, that) */
        movq    %rax, %rbp
        imulq   $RT_SIZE, %rbp
        addq    PL_RTAB(%r13), %rbp             /* row t's row table entry */
        movq    %rax, %r10
        frow    %r10, J_LDX(%r14), J_X(%r14)    /* its c_attn output row: q | k | v */
        movq    %rdx, %r8                       /* h = h0 */
.Lba_kv_\isa:                                   /* k_h, v_h into the caches at pos_t */
        movq    %r8, %r9
        imulq   J_A3(%r14), %r9                 /* h head_stride */
        movq    RT_POS(%rbp), %rax
        shlq    $6, %rax
        addq    %rax, %r9                       /* + 64 pos_t (elements) */
        shlq    $2, %r9                         /* bytes: float32 ... */
        unless_flag FL_KV16, 1f
        shrq    $1, %r9                         /* ... or binary16 */
1:      movq    J_N(%r14), %rsi
        addq    %r8, %rsi
        shlq    $8, %rsi
        addq    %r10, %rsi                      /* k_h = row + 64 (H + h) floats */
        movq    RT_K(%rbp), %rdi
        addq    J_A0(%r14), %rdi
        addq    %r9, %rdi
        call    kv_put                          /* clobbers ymm0-1 only */
        movq    J_N(%r14), %rax
        shlq    $8, %rax
        addq    %rax, %rsi                      /* v_h = k_h + 64 H floats */
        movq    RT_V(%rbp), %rdi
        addq    J_A1(%r14), %rdi
        addq    %r9, %rdi
        call    kv_put
        incq    %r8
        cmpq    F_HEND(%rsp), %r8
        jb      .Lba_kv_\isa
        movq    F_ROW(%rsp), %rcx                /* attention of heads [h0, h1) of row t */
        frow    %rcx, J_LDY(%r14), J_Y(%r14)    /* out row t */
        movq    F_H(%rsp), %rax
        xorl    %edx, %edx
        divq    J_N(%r14)
        movq    %rdx, 8(%rsp)                   /* head_begin h0 */
        movq    F_HEND(%rsp), %rax
        movq    %rax, 16(%rsp)                  /* head_end h1 */
        subq    %rdx, %rax
        addq    %rax, F_H(%rsp)                 /* the items done */
        movq    J_A3(%r14), %rax
        movq    %rax, 0(%rsp)                   /* head_stride */
        movq    %r10, %rdi                      /* q */
        movq    RT_K(%rbp), %rsi
        addq    J_A0(%r14), %rsi                /* the layer's k cache of row t */
        movq    RT_V(%rbp), %rdx
        addq    J_A1(%r14), %rdx                /* ... and v cache */
        movq    %rbx, %r8
        addq    PL_S_OFF(%r13), %r8             /* scratch */
        movq    RT_POS(%rbp), %r9
        incq    %r9                             /* n_pos = pos_t + 1 */
        att_call \isa
        movq    F_H(%rsp), %rax
        cmpq    F_T1(%rsp), %rax
        jb      .Lba_row_\isa
        jmp     .Lbattn_\isa

        /* ---- ROWARGMAX (batched decode; items = rows t < PL_NTOK): row t's RT_ARGMAX = the first maximum
         * of x[t ldx .. + n_in) (gpt2asm_argmax_f32), SIZE_MAX - 1 if one is NaN or an infinity */
        .p2align 4
/* kind_rowargmax_<isa> (KIND_ROWARGMAX): entered by jump from plan_jobs_<isa> (the common contract
 * above); frame F_T0, F_T1, F_H (row); rbp unused. Leaves by `claim` jumping to .Lbarrier_<isa> once no
 * item is left. */
kind_rowargmax_\isa:
.Lrowargmax_\isa:
        claim_first \isa
.Lrowam_row_\isa:
        item_row %rdi                           /* logits row t */
        movq    J_NIN(%r14), %rsi
        xcall   gpt2asm_argmax_f32_\isa         /* first maximum, SIZE_MAX if not all finite */
        movq    $-2, %rcx
        cmpq    $-1, %rax
        cmove   %rcx, %rax                      /* SIZE_MAX - 1: a NaN or an infinity */
        movq    F_H(%rsp), %rcx
        imulq   $RT_SIZE, %rcx
        addq    PL_RTAB(%r13), %rcx
        movq    %rax, RT_ARGMAX(%rcx)
        item_next .Lrowam_row_\isa, .Lrowargmax_\isa


/*
 * void gpt2asm_plan_run_<isa>(pool_t *ctx, plan_t *plan, size_t job_begin, size_t job_end);
 *   Run jobs [job_begin, job_end) of the plan with every thread of the pool; returns when all are done.
 */
function gpt2asm_plan_run_\isa
        cmpq    %rcx, %rdx
        jae     9f
        imulq   $J_SIZE, %rdx
        leaq    PL_HEADER(%rsi,%rdx), %rdx      /* first job */
        imulq   $J_SIZE, %rcx
        leaq    PL_HEADER(%rsi,%rcx), %rcx      /* end */
        movq    %rdx, %rax
1:      movq    $0, J_CLAIM(%rax)               /* fresh counters (no thread is inside the plan) */
        movq    $0, J_ARRIVE(%rax)              /* arrive and sleepers */
        addq    $J_SIZE, %rax
        cmpq    %rcx, %rax
        jb      1b
        xorl    %r8d, %r8d                      /* thread 0 */
        cmpl    $1, CTX_NTHREADS(%rdi)
        jbe     plan_jobs_\isa                  /* no workers: tail call */
        movl    $0, CTX_DONE(%rdi)
        movq    %rsi, CTX_PLAN(%rdi)
        movq    %rdx, CTX_FIRST(%rdi)
        movq    %rcx, CTX_END(%rdi)
        lock incl CTX_SEQ(%rdi)                 /* publish (a full fence) */
        cmpl    $0, CTX_SEQ_SLEEPERS(%rdi)
        je      plan_jobs_\isa
        pushq   %rdi
        pushq   %rsi
        pushq   %rdx
        pushq   %rcx
        subq    $8, %rsp
        leaq    CTX_SEQ(%rdi), %rdi
        call    pool_wake
        addq    $8, %rsp
        popq    %rcx
        popq    %rdx
        popq    %rsi
        popq    %rdi
        xorl    %r8d, %r8d
        jmp     plan_jobs_\isa
9:      ret
endfunc

/*
 * size_t gpt2asm_plan_step_<isa>(pool_t *ctx, plan_t *plan, size_t token, size_t pos);
 *   A decode step in one call: plan.token = token, plan.pos = pos, every job run as by
 *   gpt2asm_plan_run_<isa>(ctx, plan, 0, plan.n_jobs), then the first maximum of the ARGMAX job's
 *   outputs from its n_threads slots at plan.argmax (each { u64 index or SIZE_MAX, f32 value, u32 bad }):
 *       SIZE_MAX - 1   if any slot saw a NaN or an infinity
 *       SIZE_MAX       if no slot holds an index (or plan.argmax is 0: no ARGMAX job)
 *       else the least index among the slots holding the largest value (every value is finite)
 *   -- what Python's Plan.first_max() computed from the slots, without a second trip through Python.
 */
function gpt2asm_plan_step_\isa
        pushq   %rbx
        pushq   %r12
        subq    $8, %rsp                        /* rsp 16-byte aligned at the call */
        movq    %rdi, %rbx                      /* ctx */
        movq    %rsi, %r12                      /* plan */
        movq    %rdx, PL_TOKEN(%rsi)
        movq    %rcx, PL_POS(%rsi)
        xorl    %edx, %edx
        movq    PL_NJOBS(%rsi), %rcx
        xcall   gpt2asm_plan_run_\isa
        movq    $-1, %rax                       /* SIZE_MAX: no index yet */
        movq    PL_ARGMAX(%r12), %rdx
        testq   %rdx, %rdx
        jz      9f
        movl    CTX_NTHREADS(%rbx), %ecx        /* >= 1 */
1:      cmpl    $0, 12(%rdx)
        jne     8f                              /* a NaN or an infinity */
        movq    0(%rdx), %rsi                   /* the slot's index (SIZE_MAX: none) */
        cmpq    $-1, %rsi
        je      3f
        vmovss  8(%rdx), %xmm1                  /* its value */
        cmpq    $-1, %rax
        je      2f                              /* the first index: taken */
        vucomiss %xmm0, %xmm1
        ja      2f                              /* larger: taken */
        jne     3f                              /* smaller (finite values: never unordered) */
        cmpq    %rax, %rsi
        jae     3f                              /* equal: the least index wins */
2:      movq    %rsi, %rax
        vmovaps %xmm1, %xmm0
3:      addq    $16, %rdx
        decl    %ecx
        jnz     1b
        jmp     9f
8:      movq    $-2, %rax                       /* SIZE_MAX - 1 */
9:      addq    $8, %rsp
        popq    %r12
        popq    %rbx
        ret
endfunc

/*
 * void gpt2asm_worker_<isa>(pool_t *ctx, size_t tid);
 *   Worker thread tid (1 .. n_threads-1): run every plan the caller starts, until shutdown.
 */
function gpt2asm_worker_\isa
        pushq   %rbx
        pushq   %r12
        pushq   %r13
        movq    %rdi, %r12
        movq    %rsi, %r13
        xorl    %ebx, %ebx                      /* generation seen: 0 (no plan ran before start) */
1:      leaq    CTX_SEQ(%r12), %rdi
        movl    %ebx, %esi
        leaq    CTX_SEQ_SLEEPERS(%r12), %rdx
        movq    CTX_SPIN(%r12), %rcx
        leaq    CTX_PARKS(%r12), %r8
        call    pool_wait_ne
        movl    CTX_SEQ(%r12), %ebx
        cmpl    $0, CTX_SHUTDOWN(%r12)
        jne     9f
        movq    %r12, %rdi
        movq    CTX_PLAN(%r12), %rsi
        movq    CTX_FIRST(%r12), %rdx
        movq    CTX_END(%r12), %rcx
        movq    %r13, %r8
        call    plan_jobs_\isa
        jmp     1b
9:      popq    %r13
        popq    %r12
        popq    %rbx
        vzeroupper
        ret
endfunc
        .endm

        plan_family avx2
        plan_family avx512
