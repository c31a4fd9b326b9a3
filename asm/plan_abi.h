/*
 * asm/plan_abi.h -- the plan ABI: pool_t, the plan header (plan_t), the job record, the job kinds and the
 * flags.  The ONE source of these numbers:
 *   - both executors include it (asm/x86_64/plan_x86.S, asm/aarch64/plan_aarch64.S; build.py puts asm/
 *     on the include path and hashes this file into the library's build id);
 *   - gpt2asm/plan_abi.py parses it (a checkout: this file; a wheel: the copy build.py ships in the
 *     package) and the plan encoder takes every offset, size, kind and flag from there;
 *   - the library exports the values as a table, gpt2asm_plan_abi (below), which tests/test_plan_abi.py
 *     compares with the Python mirror entry by entry.
 * docs/kernels.md ("Thread pool and plans") describes what the fields mean.
 *
 * Format (gpt2asm/plan_abi.py reads it, so keep to it; no spaces inside an expression: an assembler
 * macro argument ends at a space, e.g. `if_flag FL_KV16, 1f`):
 *   #define NAME EXPR      an integer: a decimal or hex number, or an expression (| & << >> + - * ~ and
 *                          parentheses) of numbers and names defined above it.  Comments are C comments.
 *   PLAN_FIELD(NAME, TYPE, RECORD_SIZE, key)   in the index at the end: NAME is a field (TYPE u32 or
 *                          u64) of the record RECORD_SIZE bytes long; `key` is the field's name in Python
 *   PLAN_VALUE(NAME)       in the index: NAME is a size, kind, flag or bit number
 * Every #define of this file but the PLAN_* machinery is in the index exactly once (plan_abi.py refuses
 * anything else), and the index order is the order of gpt2asm_plan_abi's entries.
 *
 * Adding a field or a kind: its #define here and its index line; the executors' use of it (a kind: its
 * routine and its entry in each executor's jump table); Python's mirror follows by itself.
 */
#ifndef GPT2ASM_PLAN_ABI_H
#define GPT2ASM_PLAN_ABI_H

/* ---- pool context (pool_t, zeroed by Python, owned by Kernels) ------------------------------------- */
#define POOL_SIZE           256     /* bytes; 64-byte aligned                                          */
#define CTX_SEQ             0       /* u32: plan generation; workers wait for it to change          */
#define CTX_SEQ_SLEEPERS    4       /* u32: workers parked on CTX_SEQ                               */
#define CTX_SHUTDOWN        8       /* u32: 1 = workers return                                      */
#define CTX_NTHREADS        12      /* u32: participants, the caller included (1 = no workers)      */
#define CTX_PLAN            16      /* u64: plan of the current run                                 */
#define CTX_FIRST           24      /* u64: address of its first job record                         */
#define CTX_END             32      /* u64: address past its last job record (AArch64: one stp with
                                       CTX_FIRST)                                                       */
#define CTX_SPIN            40      /* u64: x86: TSC ticks (AArch64: nanoseconds) to spin before parking */
#define CTX_YIELD           48      /* u64: ticks (ns) after which a spinning thread yields each round */
#define CTX_DONE            64      /* u32: arrivals at the last job of the run (own cache line)    */
#define CTX_DONE_SLEEPERS   68      /* u32                                                           */
#define CTX_PARKS           128     /* u64: futex waits so far (statistics; own cache line)         */

/* ---- plan header (plan_t: this header, then PL_NJOBS job records; 64-byte aligned) ---------------- */
#define PL_HEADER           128     /* bytes                                                           */
#define PL_TOKEN            0       /* u64: token id of this step (Python checks < vocab)          */
#define PL_POS              8       /* u64: its position (Python checks < n_ctx); AArch64 stores
                                       PL_TOKEN and PL_POS with one stp                                 */
#define PL_NJOBS            16      /* u64: job records that follow                                  */
#define PL_PRIV             24      /* u64: private area of thread 0 (64-byte aligned)               */
#define PL_PRIV_STRIDE      32      /* u64: bytes between the private areas of threads t and t+1     */
#define PL_C                40      /* u64: n_embd (embedding length, a multiple of 16)              */
#define PL_WTE              48      /* u64: wte [vocab][C]                                           */
#define PL_WPE              56      /* u64: wpe [n_ctx][C]                                           */
#define PL_X                64      /* u64: residual stream x [C] (the embedding of thread 0)        */
#define PL_H_OFF            72      /* u64: offset of the LayerNorm output in a private area        */
#define PL_E_OFF            80      /* u64: offset of the embedding copy of threads >= 1             */
#define PL_S_OFF            88      /* u64: offset of the attention scratch                          */
#define PL_NTOK             96      /* u64: rows of a prefill / batch run (row jobs: items = J_N * PL_NTOK) */
#define PL_KV_OFF           104     /* u64: offset of the k / v staging rows (FL_KV16: float32 rows of
                                       64, one for QKV, PL_NTOK for MATMUL+KV) in a private area      */
#define PL_ARGMAX           112     /* u64: the ARGMAX job's slots (n_threads x ARGMAX_SLOT bytes), 0
                                       if none: gpt2asm_plan_step reduces them                        */
/* batched decode (docs/kernels.md "Batched decode"): PL_NTOK = n_rows, the active rows of the run */
#define PL_RTAB             120     /* u64: the row table, PL_NTOK entries of RT_SIZE bytes (0 if none):
                                       BATTN, ROWARGMAX, ROWLN+PRO_EMBED                              */

/* ---- job record (three read-only cache lines, then the counters' own line) ----------------------- */
#define J_SIZE              256     /* bytes                                                           */
#define J_KIND              0       /* u32: KIND_*                                                   */
#define J_FLAGS             4       /* u32: prologue | dtype | epilogue | ROWS | KV | claim shift | KV16 | Q0 */
#define J_N                 8       /* u64: work items (tiles, heads; row jobs: per row)             */
#define J_CHUNK             16      /* u64: items per claim (guided: the minimum), >= 1              */
#define J_W                 24      /* u64: tiled weights                                            */
#define J_B                 32      /* u64: bias or 0                                                */
#define J_Y                 40      /* u64: output (MATVEC, MATMUL, ROWLN); q / qkv (QKV); q (ATTN,
                                       ROWATTN)                                                       */
#define J_NIN               48      /* u64: matvec / matmul inputs (= LayerNorm length)             */
#define J_X                 56      /* u64: matvec / matmul input, or the LayerNorm source           */
#define J_G                 64      /* u64: LayerNorm gain                                           */
#define J_BETA              72      /* u64: LayerNorm bias                                           */
#define J_A0                80      /* u64: RESID: x;  ARGMAX: slots;  QKV, ATTN, ROWATTN, MATMUL+KV: k cache */
#define J_A1                88      /* u64: ARGMAX: outputs that count;  QKV, ATTN, ROWATTN, MATMUL+KV: v cache */
#define J_A2                96      /* u64: QKV, ATTN, ROWATTN: attention output                     */
#define J_A3                104     /* u64: QKV, ATTN, ROWATTN, MATMUL+KV: head stride (elements)    */
#define J_A4                112     /* u64: ATTN: n_pos;  MATMUL+KV: n_head                          */
#define J_TILEB             120     /* u64: bytes of one weight tile (n_in * 64 * element size)     */
                                    /* bytes 128-135: unused (Python writes 0)                        */
#define J_LDX               136     /* u64: row jobs: floats between input rows                      */
#define J_LDY               144     /* u64: row jobs: floats between output rows                     */
#define J_LDR               152     /* u64: MATMUL+RESID: floats between rows of the residual (A0)   */
/* q8_0 / q4_0 (FL_Q0 jobs and ROWQUANT; docs/kernels.md "q8_0 / q4_0 jobs"): Python puts the addresses of
   the kernel variants it chose for this CPU into the job, so the executors know no variant              */
#define J_QFN               160     /* u64: the activation quantizer, void (*)(const float *x, int8_t *xq,
                                       float *xd, size_t n_in): MATVEC / QKV with Q0, ROWQUANT          */
#define J_FN                168     /* u64: the q0 kernel: MATVEC / QKV: gpt2asm_matvec_{q8_0,q4_0}_<v>;
                                       MATMUL: gpt2asm_matmul_{q8_0,q4_0}_<v>; x86 float MATMUL: 0,
                                       or a variant of the family's f32 / f16 matmul
                                       (gpt2asm_matmul_{f32,f16}_avx512_zen4)                          */
#define J_XD                176     /* u64: ROWQUANT, MATMUL with Q0: the xd rows (float, J_LDD apart);
                                       MATVEC / QKV with Q0: offset in a private area of the quantized
                                       input: xq [n_in] int8 there, xd [n_in/32] float at + n_in         */
#define J_LDD               184     /* u64: ROWQUANT, MATMUL with Q0: floats between xd rows          */
#define J_COUNTERS          192     /* the counters' cache line: written by every thread             */
#define J_CLAIM             192     /* u64: next unclaimed item (zeroed by plan_run)                */
#define J_ARRIVE            200     /* u32: threads done with the job (zeroed by plan_run, with
                                       J_SLEEPERS: one u64 store)                                      */
#define J_SLEEPERS          204     /* u32: threads parked on J_ARRIVE                               */

/* ---- job kinds: the index of each executor's jump table (an unknown kind takes its guard entry) --- */
#define KIND_MATVEC         0
#define KIND_QKV            1
#define KIND_ATTN           2
#define KIND_MATMUL         3
#define KIND_ROWLN          4
#define KIND_ROWATTN        5
#define KIND_ROWQUANT       6       /* q8_0 / q4_0 prefill: rows of x -> xq / xd (PRO_LN: of LN(x))  */
/* batched decode: one row per sequence, each with its own position and KV cache (the row table) */
#define KIND_BATTN          7       /* ROWS, J_N = H: items = row x head; the row's k / v into its
                                       cache at its position, then its attention                       */
#define KIND_ROWARGMAX      8       /* ROWS, J_N = 1: items = rows; first maximum -> RT_ARGMAX     */
#define KIND_COUNT          9       /* kinds; the jump tables' guard entry                           */

/* ---- flags (J_FLAGS): bit numbers B_* (AArch64 tests bits) and masks (x86 tests masks) ------------ */
#define B_PRO_LN            0       /* LayerNorm(J_X) -> private h; the matvec reads h               */
#define B_PRO_EMBED         1       /* with PRO_LN: x = wte[token] + wpe[pos] first (thread 0 into PL_X,
                                       the others into a private copy that their LayerNorm reads)     */
                                    /* ROWLN (with a row table): row t's x = wte[RT_TOKEN] + wpe[RT_POS]
                                       first, into J_X + t*J_LDX, by the thread of row t               */
#define B_F16               2       /* weights: binary16 (F16), else binary32 (bit 3: unused)        */
#define B_EPI               4       /* bits 4-5: the epilogue (EPI_*)                                */
#define B_EPI_GELU          4       /* the low epilogue bit: GELU (or ARGMAX), not RESID             */
#define B_ROWS              6       /* items = J_N * PL_NTOK (ROWLN, ROWATTN)                         */
#define B_KV                7       /* MATMUL of c_attn: tiles [H, 3H) into the k / v caches          */
#define B_CLAIM_SHIFT       8       /* bits 8-13: guided-claim shift s (0: fixed claims of J_CHUNK)   */
#define CLAIM_SHIFT_BITS    6
#define B_KV16              14      /* QKV, ATTN, ROWATTN, MATMUL+KV: binary16 caches (rows of 64
                                       halves; J_A3 counts elements)                                  */
#define B_Q0                15      /* MATVEC, QKV, MATMUL: q8_0 / q4_0 tiled records, the kernel J_FN
                                       (F16 clear)                                                    */
#define PRO_LN              (1<<B_PRO_LN)
#define PRO_EMBED           (1<<B_PRO_EMBED)
#define PRO_MASK            (PRO_LN|PRO_EMBED)
#define FL_F16              (1<<B_F16)
#define EPI_MASK            (3<<B_EPI)
#define EPI_GELU            (1<<B_EPI)    /* y = gelu(y) over the claimed tiles                    */
#define EPI_RESID           (2<<B_EPI)    /* x[o] = x[o] + y[o] over the claimed tiles             */
#define EPI_ARGMAX          (3<<B_EPI)    /* MATVEC: the first maximum of y[0 .. a1) into the thread's
                                               slot of a0 (greedy sampling on outputs still in cache) */
#define FL_ROWS             (1<<B_ROWS)
#define FL_KV               (1<<B_KV)
#define CLAIM_SHIFT_MASK    (((1<<CLAIM_SHIFT_BITS)-1)<<B_CLAIM_SHIFT)
#define FL_KV16             (1<<B_KV16)
#define FL_Q0               (1<<B_Q0)

/* ---- the ARGMAX job's per-thread slots (at J_A0 + ARGMAX_SLOT * tid; PL_ARGMAX) -------------------- */
#define ARGMAX_SLOT         16      /* bytes                                                           */
#define AS_INDEX            0       /* u64: index of the thread's first maximum so far, SIZE_MAX: none */
#define AS_VALUE            8       /* u32: its value (binary32)                                     */
#define AS_BAD              12      /* u32: 1 once a NaN or an infinity was seen                     */

/* ---- the row table of a batched decode run (at PL_RTAB; entry t = row t, t < PL_NTOK) ------------ */
#define RT_SIZE             64      /* bytes per entry (64-byte aligned table: one line per row)     */
#define RT_TOKEN            0       /* u64: the row's token id (Python checks < vocab)                */
#define RT_POS              8       /* u64: its position (Python checks < n_ctx, the cache's too)   */
#define RT_K                16      /* u64: its k cache [n_layer][H][n_ctx][64] (BATTN adds J_A0)   */
#define RT_V                24      /* u64: its v cache (BATTN adds J_A1)                            */
#define RT_ARGMAX           32      /* u64: written by ROWARGMAX: first maximum of the row's logits,
                                       SIZE_MAX - 1 if one is NaN or +-inf (as gpt2asm_plan_step)   */

/* ---- sizes shared with Python ------------------------------------------------------------------- */
#define ROWATTN_ROWS        4       /* ROWATTN (x86): query rows per gpt2asm_attention_rows call; the
                                       attention scratch holds this many rows                          */

/* ==================================================================================================== */
/* the index: every value above, once, in the order of gpt2asm_plan_abi's entries                       */

#if defined(__ASSEMBLER__)
/*
 * Assemble-time guards, and (in the file that defines PLAN_ABI_TABLE before including this header: the
 * executor) the exported table
 *     const uint64_t gpt2asm_plan_abi[][2];   { size (4: a u32 field, 8: a u64 field, 0: a
 *                                               value), value (a field's offset) } per index line,
 *                                               then { ~0, ~0 }
 * Each index line is one assembler macro call (no statement separators: `;` is a comment on Mach-O arm64).
 */
        .macro  plan_abi_field off, size, rec
        .if (\off) < 0 || (\off) + (\size) > (\rec)
        .error  "plan_abi.h: a field does not fit inside its record"
        .endif
        .if (\off) % (\size)
        .error  "plan_abi.h: a field is not aligned to its size"
        .endif
#ifdef PLAN_ABI_TABLE
        .quad   \size, \off
#endif
        .endm
        .macro  plan_abi_value val
#ifdef PLAN_ABI_TABLE
        .quad   0, \val
#endif
        .endm
#  define PLAN_FIELD(name, type, rec, key)  plan_abi_field name, PLAN_ABI_##type, rec
#  define PLAN_VALUE(name)                  plan_abi_value name
#  define PLAN_ABI_u32                      4
#  define PLAN_ABI_u64                      8

#  ifdef PLAN_ABI_TABLE
#    ifdef __APPLE__
        .const
        .p2align 3
        .globl  _gpt2asm_plan_abi
_gpt2asm_plan_abi:
#    else
        .section .rodata
        .p2align 3
        .globl  gpt2asm_plan_abi
        .type   gpt2asm_plan_abi, %object
gpt2asm_plan_abi:
#    endif
#  endif
#else
#  define PLAN_FIELD(name, type, rec, key)
#  define PLAN_VALUE(name)
#endif

PLAN_VALUE(POOL_SIZE)
PLAN_FIELD(CTX_SEQ, u32, POOL_SIZE, seq)
PLAN_FIELD(CTX_SEQ_SLEEPERS, u32, POOL_SIZE, seq_sleepers)
PLAN_FIELD(CTX_SHUTDOWN, u32, POOL_SIZE, shutdown)
PLAN_FIELD(CTX_NTHREADS, u32, POOL_SIZE, n_threads)
PLAN_FIELD(CTX_PLAN, u64, POOL_SIZE, plan)
PLAN_FIELD(CTX_FIRST, u64, POOL_SIZE, first)
PLAN_FIELD(CTX_END, u64, POOL_SIZE, end)
PLAN_FIELD(CTX_SPIN, u64, POOL_SIZE, spin_ticks)
PLAN_FIELD(CTX_YIELD, u64, POOL_SIZE, yield_ticks)
PLAN_FIELD(CTX_DONE, u32, POOL_SIZE, done)
PLAN_FIELD(CTX_DONE_SLEEPERS, u32, POOL_SIZE, done_sleepers)
PLAN_FIELD(CTX_PARKS, u64, POOL_SIZE, parks)

PLAN_VALUE(PL_HEADER)
PLAN_FIELD(PL_TOKEN, u64, PL_HEADER, token)
PLAN_FIELD(PL_POS, u64, PL_HEADER, pos)
PLAN_FIELD(PL_NJOBS, u64, PL_HEADER, n_jobs)
PLAN_FIELD(PL_PRIV, u64, PL_HEADER, priv)
PLAN_FIELD(PL_PRIV_STRIDE, u64, PL_HEADER, priv_stride)
PLAN_FIELD(PL_C, u64, PL_HEADER, C)
PLAN_FIELD(PL_WTE, u64, PL_HEADER, wte)
PLAN_FIELD(PL_WPE, u64, PL_HEADER, wpe)
PLAN_FIELD(PL_X, u64, PL_HEADER, x)
PLAN_FIELD(PL_H_OFF, u64, PL_HEADER, h_off)
PLAN_FIELD(PL_E_OFF, u64, PL_HEADER, e_off)
PLAN_FIELD(PL_S_OFF, u64, PL_HEADER, s_off)
PLAN_FIELD(PL_NTOK, u64, PL_HEADER, n_tok)
PLAN_FIELD(PL_KV_OFF, u64, PL_HEADER, kv_off)
PLAN_FIELD(PL_ARGMAX, u64, PL_HEADER, argmax)
PLAN_FIELD(PL_RTAB, u64, PL_HEADER, rtab)

PLAN_VALUE(J_SIZE)
PLAN_FIELD(J_KIND, u32, J_SIZE, kind)
PLAN_FIELD(J_FLAGS, u32, J_SIZE, flags)
PLAN_FIELD(J_N, u64, J_SIZE, n)
PLAN_FIELD(J_CHUNK, u64, J_SIZE, chunk)
PLAN_FIELD(J_W, u64, J_SIZE, w)
PLAN_FIELD(J_B, u64, J_SIZE, b)
PLAN_FIELD(J_Y, u64, J_SIZE, y)
PLAN_FIELD(J_NIN, u64, J_SIZE, n_in)
PLAN_FIELD(J_X, u64, J_SIZE, x)
PLAN_FIELD(J_G, u64, J_SIZE, g)
PLAN_FIELD(J_BETA, u64, J_SIZE, beta)
PLAN_FIELD(J_A0, u64, J_SIZE, a0)
PLAN_FIELD(J_A1, u64, J_SIZE, a1)
PLAN_FIELD(J_A2, u64, J_SIZE, a2)
PLAN_FIELD(J_A3, u64, J_SIZE, a3)
PLAN_FIELD(J_A4, u64, J_SIZE, a4)
PLAN_FIELD(J_TILEB, u64, J_SIZE, tile_bytes)
PLAN_FIELD(J_LDX, u64, J_SIZE, ldx)
PLAN_FIELD(J_LDY, u64, J_SIZE, ldy)
PLAN_FIELD(J_LDR, u64, J_SIZE, ldr)
PLAN_FIELD(J_QFN, u64, J_SIZE, qfn)
PLAN_FIELD(J_FN, u64, J_SIZE, fn)
PLAN_FIELD(J_XD, u64, J_SIZE, xd)
PLAN_FIELD(J_LDD, u64, J_SIZE, ldd)
PLAN_VALUE(J_COUNTERS)
PLAN_FIELD(J_CLAIM, u64, J_SIZE, claim)
PLAN_FIELD(J_ARRIVE, u32, J_SIZE, arrive)
PLAN_FIELD(J_SLEEPERS, u32, J_SIZE, sleepers)

PLAN_VALUE(KIND_MATVEC)
PLAN_VALUE(KIND_QKV)
PLAN_VALUE(KIND_ATTN)
PLAN_VALUE(KIND_MATMUL)
PLAN_VALUE(KIND_ROWLN)
PLAN_VALUE(KIND_ROWATTN)
PLAN_VALUE(KIND_ROWQUANT)
PLAN_VALUE(KIND_BATTN)
PLAN_VALUE(KIND_ROWARGMAX)
PLAN_VALUE(KIND_COUNT)

PLAN_VALUE(B_PRO_LN)
PLAN_VALUE(B_PRO_EMBED)
PLAN_VALUE(B_F16)
PLAN_VALUE(B_EPI)
PLAN_VALUE(B_EPI_GELU)
PLAN_VALUE(B_ROWS)
PLAN_VALUE(B_KV)
PLAN_VALUE(B_CLAIM_SHIFT)
PLAN_VALUE(CLAIM_SHIFT_BITS)
PLAN_VALUE(B_KV16)
PLAN_VALUE(PRO_LN)
PLAN_VALUE(PRO_EMBED)
PLAN_VALUE(PRO_MASK)
PLAN_VALUE(FL_F16)
PLAN_VALUE(EPI_MASK)
PLAN_VALUE(EPI_GELU)
PLAN_VALUE(EPI_RESID)
PLAN_VALUE(EPI_ARGMAX)
PLAN_VALUE(FL_ROWS)
PLAN_VALUE(FL_KV)
PLAN_VALUE(CLAIM_SHIFT_MASK)
PLAN_VALUE(FL_KV16)
PLAN_VALUE(B_Q0)
PLAN_VALUE(FL_Q0)

PLAN_VALUE(ARGMAX_SLOT)
PLAN_FIELD(AS_INDEX, u64, ARGMAX_SLOT, index)
PLAN_FIELD(AS_VALUE, u32, ARGMAX_SLOT, value)
PLAN_FIELD(AS_BAD, u32, ARGMAX_SLOT, bad)

PLAN_VALUE(RT_SIZE)
PLAN_FIELD(RT_TOKEN, u64, RT_SIZE, token)
PLAN_FIELD(RT_POS, u64, RT_SIZE, pos)
PLAN_FIELD(RT_K, u64, RT_SIZE, k)
PLAN_FIELD(RT_V, u64, RT_SIZE, v)
PLAN_FIELD(RT_ARGMAX, u64, RT_SIZE, argmax)

PLAN_VALUE(ROWATTN_ROWS)

#if defined(__ASSEMBLER__)
#  ifdef PLAN_ABI_TABLE
        .quad   -1, -1
#    ifndef __APPLE__
        .size   gpt2asm_plan_abi, . - gpt2asm_plan_abi
#    endif
        .text
#  endif
/* the records' shapes */
        .if POOL_SIZE != 256 || PL_HEADER % 64 || J_SIZE % 64
        .error  "plan_abi.h: pool_t is 256 bytes; the header and the job records are whole cache lines"
        .endif
        .if J_COUNTERS % 64 || J_LDR + 8 > J_COUNTERS || J_LDD + 8 > J_COUNTERS || J_CLAIM < J_COUNTERS || J_ARRIVE < J_COUNTERS
        .error  "plan_abi.h: the job's counters have their own cache line, after every read-only field"
        .endif
        .if J_SLEEPERS != J_ARRIVE + 4 || CTX_SEQ_SLEEPERS != CTX_SEQ + 4 || CTX_DONE_SLEEPERS != CTX_DONE + 4
        .error  "plan_abi.h: a sleeper count is the word after the one it waits on"
        .endif
        .if CTX_DONE % 64 || CTX_PARKS % 64 || CTX_DONE < CTX_YIELD + 8 || CTX_PARKS < CTX_DONE + 64
        .error  "plan_abi.h: ctx.done and ctx.parks have their own cache lines"
        .endif
        .if CTX_END != CTX_FIRST + 8 || PL_POS != PL_TOKEN + 8 || CTX_SEQ != 0
        .error  "plan_abi.h: AArch64 stores first/end and token/pos with one stp, and parks on &ctx.seq = ctx"
        .endif
        .if PRO_MASK + FL_F16 + EPI_MASK + FL_ROWS + FL_KV + CLAIM_SHIFT_MASK + FL_KV16 + FL_Q0 != 0xfff7
        .error  "plan_abi.h: the flags overlap or leave a gap (but bit 3, unused)"
        .endif
        .if RT_SIZE % 64 || RT_POS != RT_TOKEN + 8 || RT_V != RT_K + 8
        .error  "plan_abi.h: a row table entry is whole cache lines; token/pos and k/v are pairs (stp)"
        .endif
        .if B_EPI_GELU != B_EPI || EPI_ARGMAX != EPI_MASK
        .error  "plan_abi.h: the epilogue is bits 4-5, GELU its low bit, ARGMAX both"
        .endif
#endif

#endif /* GPT2ASM_PLAN_ABI_H */
