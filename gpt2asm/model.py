"""The GPT-2 forward pass: a plan of assembly jobs over validated, preallocated buffers.

A cached step is one call into the library (Kernels.run_plan): the plan (built once per State, every
pointer and size checked here and in kernels.Plan) holds, per layer,

    QKV     LayerNorm 1 (each thread into its own buffer; layer 0 first adds wte[token] + wpe[pos]),
            then per head h: the q, k, v tiles of c_attn (k, v straight into the cache at pos) and the
            attention of head h
    MATVEC  attn c_proj, epilogue x += y (the residual add)
    MATVEC  LayerNorm 2, c_fc, epilogue y = gelu(y)
    MATVEC  mlp c_proj, epilogue x += y

and then LayerNorm f + the LM head.  Every output is computed by one thread with the kernels' own
operation sequence (docs/kernels.md), so the logits are the same bits on every kernel family and thread
count; the embedding and residual adds are single binary32 additions, like numpy's.  The matrices are
float32, float16 or int8 (dtype 'q8': Layer.attn_s, .attn_proj_s, .fc_s, .proj_s and Weights.head_s
hold the per-output scales).

A prompt is prefilled layer by layer (prefill): a second plan runs each layer over up to PREFILL_ROWS
tokens at once -- LayerNorm rows, the batched matmul kernels (every (token, output) the matvec's
operation sequence; c_attn's keys and values straight into the cache), attention rows (row t over
positions 0..pos+t) -- except the last layer, which needs only its cache rows (ln_1 and c_attn) for every
token: the step plan runs the rest of it and the LM head for the last token only.  The same bits as one
step per token.
The full-prefix forward (GPT2.logits) runs the same row plan, then LayerNorm f and the head over every row.

`step_reference` is the same computation as a sequence of single kernel calls from Python (numpy for the
adds and cache copies): the reference the plan is tested against, the per-kernel comparison of the
emulated AVX-512 test, and the path of a kernel family without a plan executor.  `prefill_reference` is
the prefill done so (LayerNorm, attention and GELU kernel calls per row, the matmul kernels over the rows
with the tiles split over Kernels.run, numpy adds and cache copies): the prefill of such a family, and
the reference of the tests.
"""
from __future__ import annotations

import numpy as np

from .errors import ContextOverflowError, InvalidArgumentError, KernelUnavailableError
from .kernels import HEAD_DIM, KV_DTYPES, Kernels, Plan, addr, check
from .state import State, zeros
from .weights import MATRIX_DTYPES, Weights

JOBS_PER_LAYER = 4
ROW_JOBS_PER_LAYER = 7          # jobs per layer of the prefill plan
ROW_KV_JOBS = 2                 # its first two (ln_1, c_attn): all that fills the layer's cache rows
PREFILL_ROWS = 256              # tokens per prefill run: bounds the row buffers (~7 MB for GPT-2 124M)


def scale(obj, name: str) -> np.ndarray | None:
    """The int8 scales of matrix `name` of a Layer or Weights (attn -> attn_s), None unless q8."""
    return getattr(obj, name + "_s", None)


class Transformer:
    def __init__(self, weights: Weights, kernels: Kernels, kv: str | None = None):
        """kv: the KV cache's dtype, 'f32' or 'f16'; None: float32 for float32 weights (PyTorch's numbers),
        binary16 for the f16 and q8 dtypes (half the bytes attention streams; each row rounded once, when
        written, to nearest even)."""
        self.w, self.k, self.cfg = weights, kernels, weights.config
        if kv is None:
            kv = "f32" if weights.dtype == "f32" else "f16"
        if not isinstance(kv, str) or kv not in KV_DTYPES:
            raise InvalidArgumentError(f"kv cache dtype must be one of {', '.join(KV_DTYPES)}, got {kv!r}")
        self.kv = kv
        self._validate()
        self.n_tiles_head = -(-self.cfg.vocab_size // 64)
        self.arrays = object()          # identity of the weight arrays the states' plans point at
        self.resident = None            # a resident.Resident packing the matrices into one buffer (start_resident)

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
        if w.dtype == "q8" and not self.k.has_q8:
            raise KernelUnavailableError(f"the {self.k.family} kernel family has no int8 (q8) kernels")
        for name, a, s, n_in, n_out in self._matrices():
            check(a, name, MATRIX_DTYPES[w.dtype], aligned=True)
            if a.shape != (-(-n_out // 64), n_in, 64):
                raise InvalidArgumentError(f"{name}: tiled shape {a.shape} does not fit {n_in}x{n_out}")
            if w.dtype == "q8":
                check(s, name[:-2] + "_s", np.float32, a.shape[0] * 64)
            elif s is not None:
                raise InvalidArgumentError(f"{name[:-2]}_s: scales go only with q8 weights")
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
        """(name, tiled matrix, its int8 scales or None, n_in, n_out) for every weight matrix."""
        C = self.cfg.n_embd
        for i, L in enumerate(self.w.layers):
            for m, n_in, n_out in (("attn", C, 3 * C), ("attn_proj", C, C), ("fc", C, 4 * C), ("proj", 4 * C, C)):
                yield f"h.{i}.{m}_w", getattr(L, m + "_w"), scale(L, m), n_in, n_out
        yield "head_w", self.w.head_w, scale(self.w, "head"), C, self.cfg.vocab_size

    def new_state(self) -> State:
        return State(self.cfg, self.k.threads, KV_DTYPES[self.kv])

    # -- the plan ------------------------------------------------------------------------------------

    def build_plan(self, s: State, embed: bool = True) -> Plan:
        """The forward step of the token at the plan's position on state s: JOBS_PER_LAYER jobs per layer
        (jobs [4i, 4i+4) are layer i), then the head job (LayerNorm f + LM head into s.logits).  With
        embed, the first job starts with x = wte[token] + wpe[pos]; without, it normalises s.x as it is."""
        cfg, w = self.cfg, self.w
        C, V = cfg.n_embd, cfg.vocab_size
        wte, wpe = w.wte.reshape(V, C), w.wpe.reshape(cfg.n_ctx, C)
        p = self.k.new_plan()
        p.set_embedding(wte, wpe, s.x)
        for i, L in enumerate(w.layers):
            p.qkv_attention(L.attn_w, L.attn_b, s.qkv, s.k[i], s.v[i], s.att, ln=(s.x, L.ln1_g, L.ln1_b),
                            embed=embed and i == 0, scale=scale(L, "attn"))
            p.matvec(L.attn_proj_w, s.att, L.attn_proj_b, s.proj, resid=s.x, scale=scale(L, "attn_proj"))
            p.matvec(L.fc_w, None, L.fc_b, s.fc, ln=(s.x, L.ln2_g, L.ln2_b), gelu=True, scale=scale(L, "fc"))
            p.matvec(L.proj_w, s.fc, L.proj_b, s.proj, resid=s.x, scale=scale(L, "proj"))
        p.matvec(w.head_w, None, w.head_b, s.logits, ln=(s.x, w.ln_f_g, w.ln_f_b), scale=scale(w, "head"),
                 argmax=V)                         # + the first maximum of the logits, while in cache
        return p.build()

    def build_prefill_plan(self, s: State) -> Plan:
        """Every layer of a prefill run over the row buffers r = s.rows [R][.]: rows t < n_tok, the tokens
        at positions pos + t (Plan.set_rows), r.x holding their embeddings; ROW_JOBS_PER_LAYER jobs per layer,
        of which the first ROW_KV_JOBS fill the layer's k / v cache rows."""
        r, p = s.prefill_rows(PREFILL_ROWS), self.k.new_plan()
        for i, L in enumerate(self.w.layers):
            k, v = s.k[i], s.v[i]                                                 # [H][n_ctx][64]
            p.rows_layernorm(r.x, L.ln1_g, L.ln1_b, r.h)                          # h = ln_1(x)      [T][C]
            p.matmul(L.attn_w, r.h, L.attn_b, r.q, kv=(k, v), scale=scale(L, "attn"))  # q [T][C]; k, v -> cache
            p.rows_attention(r.q, k, v, r.att)                                    # att, causal     [T][C]
            p.matmul(L.attn_proj_w, r.att, L.attn_proj_b, r.y, resid=r.x, scale=scale(L, "attn_proj"))  # x += att W
            p.rows_layernorm(r.x, L.ln2_g, L.ln2_b, r.h)                          # h = ln_2(x)
            p.matmul(L.fc_w, r.h, L.fc_b, r.fc, gelu=True, scale=scale(L, "fc"))  # fc = gelu(h W) [T][4C]
            p.matmul(L.proj_w, r.fc, L.proj_b, r.y, resid=r.x, scale=scale(L, "proj"))  # x += fc W
        return p.build()

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

    def _check_step(self, s: State, token) -> tuple[int, int]:
        pos = s.n
        if pos >= self.cfg.n_ctx:
            raise ContextOverflowError(pos + 1, self.cfg.n_ctx)
        try:
            token = int(token)
        except (TypeError, ValueError, OverflowError):
            raise InvalidArgumentError(f"token id {token!r} is not an integer") from None
        if not 0 <= token < self.cfg.vocab_size:
            raise InvalidArgumentError(f"token id {token} out of range 0..{self.cfg.vocab_size - 1}")
        return token, pos

    def step(self, s: State, token: int) -> np.ndarray:
        """Feed one token at position s.n, extend the cache; return the logits [vocab] (a view of s)."""
        if self.resident is not None:
            self._adopt()
        if not self.k.has_plan:
            return self.step_reference(s, token)
        token, pos = self._check_step(s, token)
        plan = s.plan if s.plan_owner is self.arrays else self._step_plan(s)
        plan.step(token, pos)                      # the whole forward step: one call into the library
        s.n, s.greedy = pos + 1, plan              # plan.first_max(): the argmax of these logits
        return s.logits_view

    def step_batch(self, states: list[State], tokens: list[int]) -> tuple[list[np.ndarray], list[int | None]]:
        """Feed tokens[b] at position states[b].n for each b (distinct States, each its own KV cache);
        return (logits [B] of [vocab], views of the states, argmax [B]: the first maximum of each row,
        None where a logit is NaN/inf).  Each row the bits of step(states[b], tokens[b]) alone: the
        scheduler's one engine call per decode step (scheduler.py).  For now a loop of single-sequence
        plan steps; the batched plan (each weight tile read once for all B rows) replaces this body."""
        if len(states) != len(tokens) or len({id(s) for s in states}) != len(states):
            raise InvalidArgumentError("step_batch: one token per state, and every state distinct")
        logits, argmax = [], []
        for s, t in zip(states, tokens):
            row = self.step(s, t)
            logits.append(row)
            g = s.greedy
            argmax.append(g.first_max() if g is not None else self.k.argmax(row))
        return logits, argmax

    def _check_tokens(self, s: State, tokens) -> list[int]:
        if isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__len__"):
            raise InvalidArgumentError(f"tokens: expected a sequence of token ids, got {type(tokens).__name__}")
        if len(tokens) == 0:
            raise InvalidArgumentError("tokens: at least one token id is needed")
        V = self.cfg.vocab_size
        for t in tokens:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                raise InvalidArgumentError(f"token id {t!r} is not an integer")
            if not 0 <= t < V:
                raise InvalidArgumentError(f"token id {t} out of range 0..{V - 1}")
        if s.n + len(tokens) > self.cfg.n_ctx:
            raise ContextOverflowError(s.n + len(tokens), self.cfg.n_ctx)
        return [int(t) for t in tokens]

    def prefill(self, s: State, tokens) -> np.ndarray:
        """Feed tokens at positions s.n, s.n+1, ..., extend the cache; return the logits [vocab] of the last
        token (a view of s).  Bit-identical to step() for each token (logits and cache): layer by layer over
        up to PREFILL_ROWS tokens per plan run (per kernel call without a plan executor: prefill_reference),
        the LM head only for the last token."""
        tokens = self._check_tokens(s, tokens)
        if self.resident is not None:
            self._adopt()
        if len(tokens) == 1 or not self.k.has_matmul:
            for t in tokens:               # one token (a step is faster), or no matmul kernels: cached steps
                logits = self.step(s, t)
            return logits
        if not self.k.has_plan:
            return self.prefill_reference(s, tokens)
        # Only the cache rows of the last layer are needed for all tokens (later steps read them); the
        # rest of that layer, like the head, only for the last token.  So the row plan stops after the
        # last layer's ln_1 + c_attn, and the step plan runs that layer and the head for the last token
        # from the residual row going into it (its k / v rewritten with the same bits).
        n, head = self.cfg.n_layer, self._step_plan(s)
        T = self._run_rows(s, tokens, PREFILL_ROWS, end=ROW_JOBS_PER_LAYER * (n - 1) + ROW_KV_JOBS)
        s.x[:] = s.rows.x[T - 1]
        head.set_step(tokens[-1], s.n - 1)
        self.k.run_plan(head, JOBS_PER_LAYER * (n - 1), JOBS_PER_LAYER * n + 1)
        s.greedy = head
        return s.logits_view

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
            self.k.run_plan(p, 0, end)                             # the layers over the T rows: one call
            s.n = pos + T
            if after is not None:
                after(c0, T)
        return T

    def forward(self, tokens: list[int]) -> np.ndarray:
        """Full-prefix forward from an empty cache: logits [T][vocab] for every position.  The prefill's
        row jobs over up to PREFILL_ROWS tokens per run, then LayerNorm f and the LM head (a matmul) over
        the same rows: each output the same operations as in cached steps, so the same bits."""
        T, V = len(tokens), self.cfg.vocab_size
        if T > self.cfg.n_ctx:
            raise ContextOverflowError(T, self.cfg.n_ctx)
        tokens = [int(t) for t in tokens]
        for t in tokens:
            if not 0 <= t < V:
                raise InvalidArgumentError(f"token id {t} out of range 0..{V - 1}")
        if self.resident is not None:
            self._adopt()
        if not (self.k.has_plan and self.k.has_matmul):
            return self._forward_reference(tokens)
        w, s = self.w, self.new_state()
        R = min(T, PREFILL_ROWS)
        r = s.prefill_rows(PREFILL_ROWS)
        logits = zeros((R, self.n_tiles_head * 64))                         # [R][vocab padded]
        head = self.k.new_plan()
        head.rows_layernorm(r.x, w.ln_f_g, w.ln_f_b, r.h)                   # h = ln_f(x)
        head.matmul(w.head_w, r.h, w.head_b, logits, scale=scale(w, "head"))  # logits = h W_head
        head = head.build()
        out = np.empty((T, V), np.float32)

        def run_head(c0: int, n: int) -> None:                             # after every layer over n rows
            head.set_rows(n, c0)
            self.k.run_plan(head)
            out[c0:c0 + n] = logits[:n, :V]
        self._run_rows(s, tokens, R, run_head)
        return out

    # -- the per-call reference path -----------------------------------------------------------------

    def _matvec(self, w: np.ndarray, s: np.ndarray | None, x: int, b: np.ndarray | None, y: int, n_in: int) -> None:
        self.k.run(*self.k.matvec_job(w, x, None if b is None else addr(b), y, n_in, w.shape[0],
                                      None if s is None else addr(s)))

    def _block(self, s: State, i: int, pos: int) -> None:
        """Transformer block i for the token at position pos; s.x is the residual stream."""
        L, C, H = self.w.layers[i], self.cfg.n_embd, self.cfg.n_head
        K = self.k
        K.layernorm_f32(addr(s.x), addr(L.ln1_g), addr(L.ln1_b), addr(s.h), C)
        self._matvec(L.attn_w, scale(L, "attn"), addr(s.h), L.attn_b, addr(s.qkv), C)  # qkv [3C] = h W + b
        s.k[i, :, pos] = s.qkv[C:2 * C].reshape(H, HEAD_DIM)               # cache this position (a binary16
        s.v[i, :, pos] = s.qkv[2 * C:3 * C].reshape(H, HEAD_DIM)           # cache: rounded to nearest even)
        K.run(*K.attention_job(addr(s.qkv), addr(s.k[i]), addr(s.v[i]), addr(s.att), [addr(a) for a in s.scratch],
                               pos + 1, self.cfg.n_ctx * HEAD_DIM, H, s.k.dtype == np.float16))
        self._matvec(L.attn_proj_w, scale(L, "attn_proj"), addr(s.att), L.attn_proj_b, addr(s.proj), C)
        np.add(s.x, s.proj[:C], out=s.x)                                   # x += attn
        K.layernorm_f32(addr(s.x), addr(L.ln2_g), addr(L.ln2_b), addr(s.h), C)
        self._matvec(L.fc_w, scale(L, "fc"), addr(s.h), L.fc_b, addr(s.fc), C)  # fc [4C]
        K.gelu_f32(addr(s.fc), addr(s.fc), 4 * C)
        self._matvec(L.proj_w, scale(L, "proj"), addr(s.fc), L.proj_b, addr(s.proj), 4 * C)
        np.add(s.x, s.proj[:C], out=s.x)                                   # x += mlp

    def _embed(self, s: State, token: int, pos: int) -> None:
        np.add(self.w.wte[token], self.w.wpe[pos], out=s.x)

    def _head(self, s: State) -> np.ndarray:
        C = self.cfg.n_embd
        self.k.layernorm_f32(addr(s.x), addr(self.w.ln_f_g), addr(self.w.ln_f_b), addr(s.h), C)
        self._matvec(self.w.head_w, scale(self.w, "head"), addr(s.h), self.w.head_b, addr(s.logits), C)
        s.greedy = None
        return s.logits[:self.cfg.vocab_size]

    def step_reference(self, s: State, token: int) -> np.ndarray:
        """step() as single kernel calls from Python: the same logits bits, more overhead."""
        token, pos = self._check_step(s, token)
        self._embed(s, token, pos)
        for i in range(self.cfg.n_layer):
            self._block(s, i, pos)
        s.n = pos + 1
        return self._head(s)

    def _matmul(self, w: np.ndarray, s: np.ndarray | None, x: np.ndarray, b: np.ndarray | None, y: np.ndarray,
                T: int, n_in: int) -> None:
        """y[t] = W x[t] + b for the rows t < T of the C-contiguous row buffers x, y (the matmul kernels)."""
        self.k.run(*self.k.matmul_job(w, addr(x), x.shape[1], None if b is None else addr(b), addr(y), y.shape[1],
                                      T, n_in, w.shape[0], None if s is None else addr(s)))

    def _rows_block(self, s: State, qkv: np.ndarray, i: int, T: int, pos: int) -> None:
        """Transformer block i for the rows t < T of s.rows (the tokens at positions pos + t): _block's
        kernel calls and numpy adds, with the matmul kernels for the T rows at once."""
        L, C, H, K, r = self.w.layers[i], self.cfg.n_embd, self.cfg.n_head, self.k, s.rows
        x = r.x[:T]
        for t in range(T):
            K.layernorm_f32(addr(x[t]), addr(L.ln1_g), addr(L.ln1_b), addr(r.h[t]), C)
        self._matmul(L.attn_w, scale(L, "attn"), r.h, L.attn_b, qkv, T, C)     # qkv [T][3C]
        s.k[i, :, pos:pos + T] = qkv[:T, C:2 * C].reshape(T, H, HEAD_DIM).transpose(1, 0, 2)   # cache rows
        s.v[i, :, pos:pos + T] = qkv[:T, 2 * C:3 * C].reshape(T, H, HEAD_DIM).transpose(1, 0, 2)
        for t in range(T):                                                   # row t: positions 0 .. pos + t
            K.run(*K.attention_job(addr(qkv[t]), addr(s.k[i]), addr(s.v[i]), addr(r.att[t]),
                                   [addr(a) for a in s.scratch], pos + t + 1, self.cfg.n_ctx * HEAD_DIM, H,
                                   s.k.dtype == np.float16))
        self._matmul(L.attn_proj_w, scale(L, "attn_proj"), r.att, L.attn_proj_b, r.y, T, C)
        np.add(x, r.y[:T, :C], out=x)                                        # x += attn
        for t in range(T):
            K.layernorm_f32(addr(x[t]), addr(L.ln2_g), addr(L.ln2_b), addr(r.h[t]), C)
        self._matmul(L.fc_w, scale(L, "fc"), r.h, L.fc_b, r.fc, T, C)       # fc [T][4C]
        K.gelu_f32(addr(r.fc), addr(r.fc), T * 4 * C)
        self._matmul(L.proj_w, scale(L, "proj"), r.fc, L.proj_b, r.y, T, 4 * C)
        np.add(x, r.y[:T, :C], out=x)                                        # x += mlp

    def prefill_reference(self, s: State, tokens: list[int]) -> np.ndarray:
        """prefill() as single kernel calls from Python (a family with the matmul kernels but without a plan
        executor; every family of this library has one): layer by layer over up to PREFILL_ROWS tokens,
        then the head for the last token; the logits and cache bits of cached steps (any family with the
        matmul kernels; the tests force every family onto it)."""
        tokens = self._check_tokens(s, tokens)
        cfg, r = self.cfg, s.prefill_rows(PREFILL_ROWS)
        wte, wpe = self.w.wte.reshape(cfg.vocab_size, -1), self.w.wpe.reshape(cfg.n_ctx, -1)
        qkv = np.empty((min(len(r.x), len(tokens)), 3 * cfg.n_embd), np.float32)
        for c0 in range(0, len(tokens), len(r.x)):
            ids = tokens[c0:c0 + len(r.x)]
            T, pos = len(ids), s.n
            np.add(wte[ids], wpe[pos:pos + T], out=r.x[:T])                # x[t] = wte[token] + wpe[pos + t]
            for i in range(cfg.n_layer):
                self._rows_block(s, qkv, i, T, pos)
            s.n = pos + T
        s.x[:] = r.x[T - 1]
        return self._head(s)

    def _forward_reference(self, tokens: list[int]) -> np.ndarray:
        T, C = len(tokens), self.cfg.n_embd
        s = self.new_state()
        xs = np.empty((T, C), np.float32)
        for t, tok in enumerate(tokens):
            self._embed(s, tok, t)
            xs[t] = s.x
        for i in range(self.cfg.n_layer):
            for t in range(T):
                s.x[:] = xs[t]
                self._block(s, i, t)
                xs[t] = s.x
        out = np.empty((T, self.cfg.vocab_size), np.float32)
        for t in range(T):
            s.x[:] = xs[t]
            out[t] = self._head(s)
        return out
