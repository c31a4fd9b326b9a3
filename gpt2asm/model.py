"""The GPT-2 forward pass: a plan of assembly jobs over validated, preallocated buffers.

A cached step is one call into the library (Plan.step): the plan (built once per State, every
pointer and size checked here and in plan.Plan) holds, per layer,

    QKV     LayerNorm 1 (each thread into its own buffer; layer 0 first adds wte[token] + wpe[pos]),
            then per head h: the q, k, v tiles of c_attn (k, v straight into the cache at pos) and the
            attention of head h
    MATVEC  attn c_proj, epilogue x += y (the residual add)
    MATVEC  LayerNorm 2, c_fc, epilogue y = gelu(y)
    MATVEC  mlp c_proj, epilogue x += y

and then LayerNorm f + the LM head.  Every output is computed by one thread with the kernels' own
operation sequence (docs/kernels.md), so the logits are the same bits on every kernel family and thread
count; the embedding and residual adds are single binary32 additions, like numpy's.  The matrices are
float32, float16 or q8_0 / q4_0 block records.

A prompt is prefilled layer by layer (prefill): a second plan runs each layer over up to PREFILL_ROWS
tokens at once -- LayerNorm rows, the batched matmul kernels (every (token, output) the matvec's
operation sequence; c_attn's keys and values straight into the cache), attention rows (row t over
positions 0..pos+t) -- except the last layer, which needs only its cache rows (ln_1 and c_attn) for every
token: the step plan runs the rest of it and the LM head for the last token only.  The same bits as one
step per token.
The full-prefix forward (GPT2.logits) runs the same row plan, then LayerNorm f and the head over every row.

A batched decode step (step_batch, for the scheduler) steps B sequences in one call: a third plan, of row
jobs over one row per sequence (build_batch_plan), whose row table gives each row its token, position
and KV cache -- the matmul kernels read each weight tile once for all rows, and the batched attention
job writes each row's key and value into its own cache and attends over it.  Each row the bits of its
step alone.

The forward pass is written here once per plan shape (build_plan: the step; build_prefill_plan: rows;
build_batch_plan: a batched step);
jobs are grouped into named spans (Plan.span: "layer", "kv", "head"), and prefill runs spans, never
counted job indices.  The same computation as single kernel calls from Python, the reference the plans
are tested against, is in tests/oracle.py.
"""
from __future__ import annotations

import threading

import numpy as np

from .args import integer, token_id, token_ids
from .errors import ContextOverflowError, InvalidArgumentError, KernelUnavailableError, shown
from .kernels import Kernels
from .plan import Plan
from .quant0 import head_kind
from .validate import HEAD_DIM, KV_DTYPES, Q0_RECORD, Q0_UNIT, check
from .state import BatchRows, State, best_reuse, reuse, zeros
from .weights import MATRIX_DTYPES, Q0_DTYPES, Weights


PREFILL_ROWS = 256              # tokens per prefill run: bounds the row buffers (~7 MB for GPT-2 124M)
BATCH_ROWS = 64                 # sequences per batched decode run: bounds its row buffers (~14 MB for 124M)
IDLE_STATE_BYTES = 256 << 20    # States kept for reuse after their call (lease_state): one, more up to this


class Transformer:
    def __init__(self, weights: Weights, kernels: Kernels, kv: str | None = None):
        """kv: the KV cache's dtype, 'f32' or 'f16'; None: float32 for float32 weights (PyTorch's numbers),
        binary16 for the other dtypes (half the bytes attention streams; each row rounded once, when
        written, to nearest even)."""
        self.w, self.k, self.cfg = weights, kernels, weights.config
        if kv is None:
            kv = "f32" if weights.dtype == "f32" else "f16"
        kv = kv.strip().lower() if isinstance(kv, str) else kv      # names as dtype's and isa's: any case
        if not isinstance(kv, str) or kv not in KV_DTYPES:
            raise InvalidArgumentError(f"kv cache dtype must be one of {', '.join(KV_DTYPES)}, got {shown(kv)}")
        self.kv = kv
        self._validate()
        self.n_tiles_head = -(-self.cfg.vocab_size // 64)
        self.arrays = object()          # identity of the weight arrays the states' plans point at
        self.resident = None            # a resident.Resident packing the matrices into one buffer (start_resident)
        self.batch_plan: Plan | None = None     # the batched decode plan (step_rows), for up to its rows
        self.batch_owner = None                 # ... over these weight arrays
        # The batched plan is shared by every caller of step_rows (its row table, row buffers and argmax
        # slots): two threads batching on one model (GPT2.generate of a list from each) would write each
        # other's rows between set_batch and the read-back.  One batched step at a time.
        self.batch_lock = threading.Lock()
        # States of finished calls (their buffers and plans made), for the next call's lease_state.  The
        # lock is re-entrant: a generator left in a reference cycle is finalized by the garbage collector,
        # which may run at any allocation -- also one under this lock -- and its release_state takes it again
        # (with a plain Lock that thread deadlocked, and every later call of the model with it).
        self._idle: list[State] = []
        self._idle_lock = threading.RLock()
        self._made = object()           # the mark of the States new_state makes (release_state takes only those)

    def start_resident(self) -> None:
        """Pack the matrices (file-mapped from a warm tile cache, or separate arrays) into one buffer of
        anonymous memory in the background, in the order a step reads them; steps adopt the copies once
        they are complete (resident.py: faster streaming on Linux guests)."""
        from .resident import Resident
        if self.resident is None:
            self.resident = Resident(self.w)

    def _adopt(self) -> None:
        """Between steps: swap in the resident copies if ready; states rebuild their plans."""
        if self.resident.poll():
            self._validate()
            self.arrays = object()

    def _validate(self) -> None:
        """Every weight array reaches assembly by address: check each once, here."""
        C, w = self.cfg.n_embd, self.w
        if self.cfg.n_embd != self.cfg.n_head * HEAD_DIM:
            raise InvalidArgumentError(f"n_embd {C} must be n_head * {HEAD_DIM}")
        if w.dtype not in MATRIX_DTYPES:
            raise InvalidArgumentError(f"weights dtype {w.dtype!r}: expected one of {', '.join(MATRIX_DTYPES)}")
        if w.dtype in Q0_DTYPES and not getattr(self.k, f"has_{w.dtype}", False):
            raise KernelUnavailableError(f"the {self.k.family} kernel family runs no {w.dtype} plan jobs")
        for name, a, n_in, n_out in self._matrices():
            if w.dtype in Q0_DTYPES:            # records [n_tiles][n_in/unit][RECORD]; the head: quant0.head_kind
                kind = head_kind(w.dtype, n_in) if name == "head_w" else w.dtype
                check(a, name, np.uint8, aligned=True)
                if a.shape != (-(-n_out // 64), n_in // Q0_UNIT[kind], Q0_RECORD[kind]) or n_in % Q0_UNIT[kind]:
                    raise InvalidArgumentError(f"{name}: {kind} records {a.shape} do not fit {n_in}x{n_out}")
                continue
            check(a, name, MATRIX_DTYPES[w.dtype], aligned=True)
            if a.shape != (-(-n_out // 64), n_in, 64):
                raise InvalidArgumentError(f"{name}: tiled shape {a.shape} does not fit {n_in}x{n_out}")
        for i, L in enumerate(w.layers):
            for name in ("ln1_g", "ln1_b", "ln2_g", "ln2_b"):
                check(getattr(L, name), f"h.{i}.{name}", np.float32, C)
            for name, n in (("attn_b", 3 * C), ("attn_proj_b", C), ("fc_b", 4 * C), ("proj_b", C)):
                check(getattr(L, name), f"h.{i}.{name}", np.float32, -(-n // 64) * 64)
        check(w.ln_f_g, "ln_f_g", np.float32, C)
        check(w.ln_f_b, "ln_f_b", np.float32, C)
        check(w.wte, "wte", np.float32, self.cfg.vocab_size * C)
        check(w.wpe, "wpe", np.float32, self.cfg.n_ctx * C)
        if w.head_b is not None:
            check(w.head_b, "head_b", np.float32, -(-self.cfg.vocab_size // 64) * 64)

    def _matrices(self):
        """(name, tiled matrix, n_in, n_out) for every weight matrix."""
        C = self.cfg.n_embd
        for i, L in enumerate(self.w.layers):
            for m, n_in, n_out in (("attn", C, 3 * C), ("attn_proj", C, C), ("fc", C, 4 * C), ("proj", 4 * C, C)):
                yield f"h.{i}.{m}_w", getattr(L, m + "_w"), n_in, n_out
        yield "head_w", self.w.head_w, C, self.cfg.vocab_size

    def new_state(self) -> State:
        s = State(self.cfg, self.k.threads, KV_DTYPES[self.kv])
        s.made_by = self._made
        return s

    def lease_state(self, ids: list[int] | None = None) -> State:
        """A State for one call: an idle one of this model's, its buffers and plans already made (124M
        q8_0: a short prompt's first token in 7.4 ms, against 12.7 with a new State), else a new one.
        Given the call's token ids, the idle State whose cached tokens share the longest prefix with
        them, its n set past that prefix (state.reuse: the same bits as a fresh cache) -- the caller
        feeds ids[n:]; else n = 0.  Hand it back with release_state once nothing else refers to it."""
        with self._idle_lock:
            s = self._idle.pop(best_reuse(self._idle, ids)) if self._idle else None
        if s is None:
            return self.new_state()
        reuse(s, ids)
        return s

    def release_state(self, s: State, tokens: list[int] | None = None) -> None:
        """Keep s (a State of this model that its caller is done with) for a later lease_state: always
        one, more while the idle ones hold at most IDLE_STATE_BYTES; the rest go to the collector.
        tokens: those whose keys and values s caches at positions 0, 1, ... (only the first s.n of them
        count; None: nothing reusable).  A State another Transformer made (another shape, cache dtype or
        thread count: other bits, or a plan over buffers of the wrong size) is refused."""
        if not isinstance(s, State) or getattr(s, "made_by", None) is not self._made:
            raise InvalidArgumentError("release_state takes a State of this model (its new_state or lease_state), "
                                       f"got {'one of another model' if isinstance(s, State) else type(s).__name__}")
        with self._idle_lock:
            if any(x is s for x in self._idle):         # released already: it is idle as it is
                return
            s.tokens = [] if tokens is None else list(tokens[:s.n])
            s.n = 0
            if not self._idle or sum(x.nbytes for x in self._idle) + s.nbytes <= IDLE_STATE_BYTES:
                self._idle.append(s)

    def drop_idle_states(self) -> None:
        """Let the idle States go (GPT2.close)."""
        with self._idle_lock:
            self._idle.clear()

    # -- the plan ------------------------------------------------------------------------------------

    def build_plan(self, s: State, embed: bool = True) -> Plan:
        """The forward step of the token at the plan's position on state s: span "layer" i holds layer
        i's jobs, span "head" the head job (LayerNorm f + LM head into s.logits, and their argmax).  With
        embed, the first job starts with x = wte[token] + wpe[pos]; without, it normalises s.x as it is."""
        cfg, w = self.cfg, self.w
        C, V = cfg.n_embd, cfg.vocab_size
        wte, wpe = w.wte.reshape(V, C), w.wpe.reshape(cfg.n_ctx, C)
        p = self.k.new_plan()
        p.set_embedding(wte, wpe, s.x)
        for i, L in enumerate(w.layers):
            with p.span("layer"):
                p.qkv_attention(L.attn_w, L.attn_b, s.qkv, s.k[i], s.v[i], s.att, ln=(s.x, L.ln1_g, L.ln1_b),
                                embed=embed and i == 0)
                p.matvec(L.attn_proj_w, s.att, L.attn_proj_b, s.proj, resid=s.x)
                p.matvec(L.fc_w, None, L.fc_b, s.fc, ln=(s.x, L.ln2_g, L.ln2_b), gelu=True)
                p.matvec(L.proj_w, s.fc, L.proj_b, s.proj, resid=s.x)
        with p.span("head"):
            p.matvec(w.head_w, None, w.head_b, s.logits, ln=(s.x, w.ln_f_g, w.ln_f_b),
                     argmax=V)                     # + the first maximum of the logits, while in cache
        return p.build()

    def build_prefill_plan(self, s: State) -> Plan:
        """Every layer of a prefill run over the row buffers r = s.rows [R][.]: rows t < n_tok, the tokens
        at positions pos + t (Plan.set_rows), r.x holding their embeddings; span "layer" i holds layer i's
        jobs, span "kv" i the first of them, all that fills the layer's k / v cache rows."""
        r, p = s.prefill_rows(PREFILL_ROWS), self.k.new_plan()
        if self.w.dtype in Q0_DTYPES:
            return self._build_prefill_plan_q0(s, r, p)
        for i, L in enumerate(self.w.layers):
            k, v = s.k[i], s.v[i]                                                 # [H][n_ctx][64]
            with p.span("layer"):
                with p.span("kv"):
                    p.rows_layernorm(r.x, L.ln1_g, L.ln1_b, r.h)                  # h = ln_1(x)      [T][C]
                    p.matmul(L.attn_w, r.h, L.attn_b, r.q, kv=(k, v))             # q; k, v -> cache
                p.rows_attention(r.q, k, v, r.att)                                # att, causal     [T][C]
                p.matmul(L.attn_proj_w, r.att, L.attn_proj_b, r.y, resid=r.x)
                p.rows_layernorm(r.x, L.ln2_g, L.ln2_b, r.h)                      # h = ln_2(x)
                p.matmul(L.fc_w, r.h, L.fc_b, r.fc, gelu=True)                    # fc = gelu(h W) [T][4C]
                p.matmul(L.proj_w, r.fc, L.proj_b, r.y, resid=r.x)                # x += fc W
        return p.build()

    def _build_prefill_plan_q0(self, s: State, r, p: Plan) -> Plan:
        """build_prefill_plan for q8_0 / q4_0 records: each matmul reads its input rows quantized by a
        ROWQUANT job just before it (the step's quantizer on the same floats: the same bits), into the
        shared rows xq [R][4C] int8, xd [R][4C/32]."""
        xq, xd = r.q0_rows()
        for i, L in enumerate(self.w.layers):
            k, v = s.k[i], s.v[i]                                                 # [H][n_ctx][64]
            with p.span("layer"):
                with p.span("kv"):
                    p.rows_quantize(r.x, xq, xd, ln=(L.ln1_g, L.ln1_b))           # xq = q(ln_1(x))
                    p.matmul(L.attn_w, xq, L.attn_b, r.q, kv=(k, v), xd=xd)       # q; k, v -> cache
                p.rows_attention(r.q, k, v, r.att)                                # att, causal     [T][C]
                p.rows_quantize(r.att, xq, xd)                                    # xq = q(att)
                p.matmul(L.attn_proj_w, xq, L.attn_proj_b, r.y, resid=r.x, xd=xd)
                p.rows_quantize(r.x, xq, xd, ln=(L.ln2_g, L.ln2_b))               # xq = q(ln_2(x))
                p.matmul(L.fc_w, xq, L.fc_b, r.fc, gelu=True, xd=xd)              # fc = gelu(h W) [T][4C]
                p.rows_quantize(r.fc, xq, xd)                                     # xq = q(fc)
                p.matmul(L.proj_w, xq, L.proj_b, r.y, resid=r.x, xd=xd)           # x += fc W
        return p.build()

    def build_batch_plan(self, R: int) -> Plan:
        """A batched decode step of up to R sequences, each at its own position with its own cache (the
        plan's row table, Plan.set_batch): per layer the prefill's row jobs, but c_attn's keys and values
        go into each row's cache in the batched attention job; then LayerNorm f, the LM head and the
        argmax per row.  Span "layer" i holds layer i's jobs, span "head" the last three.  Row buffers:
        plan.rows (state.BatchRows)."""
        cfg, w = self.cfg, self.w
        C, V = cfg.n_embd, cfg.vocab_size
        r, p = BatchRows(cfg, R), self.k.new_plan()
        p.set_embedding(w.wte.reshape(V, C), w.wpe.reshape(cfg.n_ctx, C), None)
        p.row_table(R, (cfg.n_layer, cfg.n_head, cfg.n_ctx), KV_DTYPES[self.kv])
        p.rows = r
        if w.dtype in Q0_DTYPES:
            return self._build_batch_plan_q0(r, p)
        for i, L in enumerate(w.layers):
            with p.span("layer"):
                p.rows_layernorm(r.x, L.ln1_g, L.ln1_b, r.h, embed=i == 0)       # (x = wte + wpe,) h = ln_1(x)
                p.matmul(L.attn_w, r.h, L.attn_b, r.qkv)                          # q | k | v       [B][3C]
                p.batch_attention(r.qkv, r.att, i)                                # k, v -> caches; att
                p.matmul(L.attn_proj_w, r.att, L.attn_proj_b, r.y, resid=r.x)
                p.rows_layernorm(r.x, L.ln2_g, L.ln2_b, r.h)                      # h = ln_2(x)
                p.matmul(L.fc_w, r.h, L.fc_b, r.fc, gelu=True)                    # fc = gelu(h W) [B][4C]
                p.matmul(L.proj_w, r.fc, L.proj_b, r.y, resid=r.x)                # x += fc W
        with p.span("head"):
            p.rows_layernorm(r.x, w.ln_f_g, w.ln_f_b, r.h)                        # h = ln_f(x)
            p.matmul(w.head_w, r.h, w.head_b, r.logits)                           # logits [B][V padded]
            p.rows_argmax(r.logits, V)                                            # + their first maximum
        return p.build()

    def _build_batch_plan_q0(self, r: BatchRows, p: Plan) -> Plan:
        """build_batch_plan for q8_0 / q4_0 records, as _build_prefill_plan_q0: each matmul reads its input
        rows quantized by a ROWQUANT job just before it (LayerNorm folded in), into the shared rows
        xq [R][4C] int8, xd [R][4C/32] -- the decode step's quantizer on the same floats, so the same ints
        and scales, and the q0 matmul gives each row the q0 matvec's bits.  Layer 0 starts with the ROWLN
        that writes x = wte + wpe (h = ln_1(x): the same layernorm call as ROWQUANT's), then quantizes h.
        The head: its records (quant0.head_kind: q8_0, q6_k for q4_0) over the quantized ln_f(x) rows, then
        ROWARGMAX."""
        w, C, V = self.w, self.cfg.n_embd, self.cfg.vocab_size
        xq, xd = r.q0_rows()
        for i, L in enumerate(w.layers):
            with p.span("layer"):
                if i == 0:
                    p.rows_layernorm(r.x, L.ln1_g, L.ln1_b, r.h, embed=True)     # x = wte + wpe, h = ln_1(x)
                    p.rows_quantize(r.h, xq, xd)                                  # xq = q(h)
                else:
                    p.rows_quantize(r.x, xq, xd, ln=(L.ln1_g, L.ln1_b))           # xq = q(ln_1(x))
                p.matmul(L.attn_w, xq, L.attn_b, r.qkv, xd=xd)                    # q | k | v       [B][3C]
                p.batch_attention(r.qkv, r.att, i)                                # k, v -> caches; att
                p.rows_quantize(r.att, xq, xd)                                    # xq = q(att)
                p.matmul(L.attn_proj_w, xq, L.attn_proj_b, r.y, resid=r.x, xd=xd)
                p.rows_quantize(r.x, xq, xd, ln=(L.ln2_g, L.ln2_b))               # xq = q(ln_2(x))
                p.matmul(L.fc_w, xq, L.fc_b, r.fc, gelu=True, xd=xd)              # fc = gelu(h W) [B][4C]
                p.rows_quantize(r.fc[:, :4 * C], xq, xd)                          # xq = q(fc)
                p.matmul(L.proj_w, xq, L.proj_b, r.y, resid=r.x, xd=xd)           # x += fc W
        with p.span("head"):
            p.rows_quantize(r.x, xq, xd, ln=(w.ln_f_g, w.ln_f_b))                 # xq = q(ln_f(x))
            p.matmul(w.head_w, xq, w.head_b, r.logits, xd=xd)                     # logits [B][V padded]
            p.rows_argmax(r.logits, V)                                            # + their first maximum
        return p.build()

    def _batch_plan(self, B: int) -> Plan:
        """The batched decode plan for B <= BATCH_ROWS rows: built for the next power of two >= B rows,
        rebuilt only when more are needed (or the weight arrays changed) -- sequences joining and leaving
        change only the row table."""
        p = self.batch_plan
        if p is None or self.batch_owner is not self.arrays or p.max_rows < B:
            self.batch_plan = self.batch_owner = None
            R = max(B, 1 << (B - 1).bit_length(), 0 if p is None else p.max_rows)
            self.batch_plan = self.build_batch_plan(min(R, BATCH_ROWS))
            self.batch_owner = self.arrays
        return self.batch_plan

    def _step_plan(self, s: State) -> Plan:
        if s.plan is None or s.plan_owner is not self.arrays:
            s.plan, s.plan_owner = None, None
            s.plan = self.build_plan(s, embed=True)
            s.plan_owner = self.arrays
        return s.plan

    def _prefill_plan(self, s: State) -> Plan:
        if s.prefill_plan is None or s.prefill_owner is not self.arrays:
            s.prefill_plan, s.prefill_owner = None, None
            s.prefill_plan = self.build_prefill_plan(s)
            s.prefill_owner = self.arrays
        return s.prefill_plan

    def check_step(self, s: State, token) -> tuple[int, int]:
        """(token, position) of the next step on s: ContextOverflowError when the cache is full."""
        _check_state(s)
        pos = s.n
        if pos >= self.cfg.n_ctx:
            raise ContextOverflowError(pos + 1, self.cfg.n_ctx)
        return token_id(token, self.cfg.vocab_size), pos

    def check_tokens(self, s: State, tokens) -> list[int]:
        """At least one token id, all of which fit into s's cache."""
        _check_state(s)
        integer("position", s.n, 0, self.cfg.n_ctx)      # the rows' embeddings slice wpe from s.n
        tokens = token_ids(tokens, self.cfg.vocab_size, empty=False)
        if s.n + len(tokens) > self.cfg.n_ctx:
            raise ContextOverflowError(s.n + len(tokens), self.cfg.n_ctx)
        return tokens

    def step(self, s: State, token: int) -> tuple[np.ndarray, int | None]:
        """Feed one token at position s.n, extend the cache: (logits [vocab], a view of s; the index of
        their first maximum -- what greedy sampling takes -- or None if any is NaN or infinite)."""
        if self.resident is not None:
            self._adopt()
        token, pos = self.check_step(s, token)
        plan = s.plan if s.plan_owner is self.arrays else self._step_plan(s)
        plan.step(token, pos)                      # the whole forward step: one call into the library
        s.n = pos + 1
        return s.logits_view, plan.first_max()     # the head job's argmax, reduced by the same call

    def step_batch(self, states: list[State], tokens: list[int]) -> tuple[list[np.ndarray], list[int | None]]:
        """Feed tokens[b] at position states[b].n for each b (distinct States, each its own KV cache);
        return (logits [B] of [vocab], views of the states, argmax [B]: the first maximum of each row,
        None where a logit is NaN/inf).  Each row the bits of step(states[b], tokens[b]) alone: the
        scheduler's one engine call per decode step (scheduler.py).  Every row is checked before any is
        fed.  B >= 2 on a family with the batched kinds: one library call per BATCH_ROWS rows (step_rows:
        each weight tile read once for all of them); else one step per row."""
        _check_lists("step_batch", states, tokens)
        if len(states) != len(tokens) or len({id(s) for s in states}) != len(states):
            raise InvalidArgumentError("step_batch: one token per state, and every state distinct")
        if not all(isinstance(s, State) for s in states):
            raise InvalidArgumentError("step_batch: expected States of this model")
        checked = [self.check_step(s, t) for s, t in zip(states, tokens)]
        if len(states) >= 2 and self.k.has_batch:
            logits, argmax = [], []
            for c0 in range(0, len(states), BATCH_ROWS):
                lg, am = self.step_rows(states[c0:c0 + BATCH_ROWS], [t for t, _ in checked[c0:c0 + BATCH_ROWS]])
                logits += lg
                argmax += am
            return logits, argmax
        logits, argmax = [], []
        for s, (t, _) in zip(states, checked):
            row, first = self.step(s, t)
            logits.append(row)
            argmax.append(first)
        return logits, argmax

    def step_rows(self, states: list[State], tokens: list[int]) -> tuple[list[np.ndarray], list[int | None]]:
        """step_batch for 1 <= B <= BATCH_ROWS rows through the batched decode plan, in one call into the
        library: each weight tile read once for all rows, each row at its own position with its own cache
        (the plan's row table).  The logits are copied into each state's own (step()'s view of them)."""
        if not self.k.has_batch:
            raise KernelUnavailableError(f"the {self.k.family} family has no batched decode executor")
        _check_lists("step_rows", states, tokens)
        if not 1 <= len(states) <= BATCH_ROWS or len(states) != len(tokens):
            raise InvalidArgumentError(f"step_rows: 1..{BATCH_ROWS} states, one token each")
        if len({id(s) for s in states}) != len(states) or not all(isinstance(s, State) for s in states):
            raise InvalidArgumentError("step_rows: every state distinct, States of this model")
        if self.resident is not None:
            self._adopt()
        checked = [self.check_step(s, t) for s, t in zip(states, tokens)]
        with self.batch_lock:                      # set_batch .. the read-back: one caller's rows
            p = self._batch_plan(len(states))
            p.set_batch([t for t, _ in checked], [pos for _, pos in checked], [s.k for s in states],
                        [s.v for s in states])
            p.run()                                # every layer of every row, and the head: one call
            argmax = p.batch_argmax()
            rows = p.rows.logits
            for b, s in enumerate(states):
                s.logits[:] = rows[b]
                s.n = checked[b][1] + 1
        return [s.logits_view for s in states], argmax

    def prefill(self, s: State, tokens) -> tuple[np.ndarray, int | None]:
        """Feed tokens at positions s.n, s.n+1, ..., extend the cache; return step()'s (logits, argmax) of
        the last token.  Bit-identical to step() for each token (logits and cache): layer by layer over up
        to PREFILL_ROWS tokens per plan run, the LM head only for the last token."""
        tokens = self.check_tokens(s, tokens)
        if self.resident is not None:
            self._adopt()
        if len(tokens) == 1 or not self.k.has_matmul:
            for t in tokens:               # one token (a step is faster), or no matmul kernels: cached steps
                out = self.step(s, t)
            return out
        # Only the cache rows of the last layer are needed for all tokens (later steps read them); the
        # rest of that layer, like the head, only for the last token.  So the row plan stops after the
        # last layer's "kv" span (ln_1 + c_attn), and the step plan runs its last layer and the head for
        # the last token from the residual row going into it (its k / v rewritten with the same bits).
        step, rows = self._step_plan(s), self._prefill_plan(s)
        T = self._run_rows(s, tokens, PREFILL_ROWS, end=rows.spans["kv"][-1].stop)
        s.x[:] = s.rows.x[T - 1]
        step.set_step(tokens[-1], s.n - 1)
        step.run(range(step.spans["layer"][-1].start, step.spans["head"][-1].stop))
        return s.logits_view, step.first_max()

    def _run_rows(self, s: State, tokens: list[int], R: int, after=None, end: int | None = None) -> int:
        """Run the prefill plan (its jobs [0, end)) over tokens (checked) from position s.n, in runs of at
        most R rows; after each run, after(offset of the run in tokens, its rows) with s.rows.x holding its
        residual rows.  Returns the rows of the last run."""
        cfg, p = self.cfg, self._prefill_plan(s)
        wte, wpe = self.w.wte.reshape(cfg.vocab_size, -1), self.w.wpe.reshape(cfg.n_ctx, -1)
        x = s.rows.x                                               # [R][C] residual stream rows
        R = min(R, len(x))
        for c0 in range(0, len(tokens), R):
            ids = tokens[c0:c0 + R]
            T, pos = len(ids), s.n
            np.add(wte[ids], wpe[pos:pos + T], out=x[:T])          # x[t] = wte[token] + wpe[pos + t]
            p.set_rows(T, pos)
            p.run(None if end is None else range(end))             # the layers over the T rows: one call
            s.n = pos + T
            if after is not None:
                after(c0, T)
        return T

    def forward(self, tokens: list[int]) -> np.ndarray:
        """Full-prefix forward from an empty cache: logits [T][vocab] for every position.  The prefill's
        row jobs over up to PREFILL_ROWS tokens per run, then LayerNorm f and the LM head (a matmul) over
        the same rows: each output the same operations as in cached steps, so the same bits."""
        s = self.lease_state()
        try:
            return self._forward(s, tokens)
        finally:
            self.release_state(s, tokens if isinstance(tokens, list) else None)

    def _forward(self, s: State, tokens: list[int]) -> np.ndarray:
        w, V = self.w, self.cfg.vocab_size
        tokens = self.check_tokens(s, tokens)
        if self.resident is not None:
            self._adopt()
        if not self.k.has_matmul:                                            # cached steps: the same bits
            return np.stack([self.step(s, t)[0].copy() for t in tokens])    # (each a view of s.logits)
        T = len(tokens)
        R = min(T, PREFILL_ROWS)
        r = s.prefill_rows(PREFILL_ROWS)
        logits = zeros((R, self.n_tiles_head * 64))                         # [R][vocab padded]
        head = self.k.new_plan()
        if w.dtype in Q0_DTYPES:
            xq, xd = r.q0_rows()
            head.rows_quantize(r.x, xq, xd, ln=(w.ln_f_g, w.ln_f_b))       # xq = q(ln_f(x))
            head.matmul(w.head_w, xq, w.head_b, logits, xd=xd)                    # logits = h W_head
        else:
            head.rows_layernorm(r.x, w.ln_f_g, w.ln_f_b, r.h)                # h = ln_f(x)
            head.matmul(w.head_w, r.h, w.head_b, logits)                          # logits = h W_head
        head = head.build()
        out = np.empty((T, V), np.float32)

        def run_head(c0: int, n: int) -> None:                             # after every layer over n rows
            head.set_rows(n, c0)
            head.run()
            out[c0:c0 + n] = logits[:n, :V]
        self._run_rows(s, tokens, R, run_head)
        return out


def _check_state(s) -> None:
    """A State (new_state()), not anything else: its attributes are read before the plan checks them."""
    if not isinstance(s, State):
        raise InvalidArgumentError(f"expected a State of this model (Transformer.new_state()), got {type(s).__name__}")


def _check_lists(who: str, states, tokens) -> None:
    """step_batch / step_rows take sequences (len() and indexing), not one State or one token."""
    for name, v in (("states", states), ("tokens", tokens)):
        if not isinstance(v, (list, tuple, np.ndarray)) or (isinstance(v, np.ndarray) and v.ndim != 1):
            raise InvalidArgumentError(f"{who}: {name} must be a list, got {type(v).__name__}")
