"""The q8_0 / q4_0 integer kernels (docs/kernels.md; tests/q0ref.py is their numpy model): which ISA
variant runs inside a kernel family, the ctypes bindings, and checked numpy wrappers.

    Q0Kernels(family)   x86-64: the variant of the avx2 / avx512 family (VNNI where the CPU has it)
    ArmQ0(family)       AArch64: neon (base, dotprod, i8mm by cpu.q0_isa) or sme2
"""
from __future__ import annotations

import ctypes
import os
from ctypes import c_size_t, c_void_p

import numpy as np

from .cpu import choose_family, cpuid
from .errors import InvalidArgumentError, KernelUnavailableError, LibraryError, shown
from .lib import ARCH, load_library
from .validate import Q0_RECORD as RECORD, Q0_UNIT, TILE, addr, check, is_int as _is_int

# --------------------------------------------------------------------------------------------------
# q8_0 / q4_0 integer kernels (docs/kernels.md): one contiguous block (variant choice, bindings,
# checked wrappers), independent of Kernels above

Q0_QK = 32                                        # inputs per block
Q0_RECORD = RECORD                                # bytes per record (validate.py: q8_0, q4_0, q6_k) and
                                                  # the inputs it covers (Q0_UNIT: 32, 32, 256)
Q0_MAX_IN = 1 << 15      # the kernels keep per-block tables on the stack: matvec n_in/32 int32 (<= 4 KiB),
                         # matmul at least one token block's activation panel (n_in/32 * 320 bytes <= 320 KiB)
# family -> (plain variant, VNNI variant, the CPU feature the VNNI one needs)
Q0_VARIANTS = {"avx2": ("avx2", "avxvnni", "avx_vnni"), "avx512": ("avx512", "avx512vnni", "avx512_vnni")}
# decode (matvec) variants that also come with the Zen 4 tuning (the same code with nops, q6_k's without its
# prefetch hints: docs/kernels.md)
Q0_MV_ZEN4 = ("avx512vnni",)


def q0_features() -> dict[str, bool]:
    """The CPU features the q0 variants need beyond their family: avx512bw, avx512_vnni
    (CPUID.(7,0):EBX[30], ECX[11]) and avx_vnni (CPUID.(7,1):EAX[4])."""
    if ARCH != "x86_64" or cpuid(0)[0] < 7:
        return {"avx512bw": False, "avx512_vnni": False, "avx_vnni": False}
    eax7, ebx7, ecx7, _ = cpuid(7, 0)
    return {"avx512bw": bool(ebx7 >> 30 & 1), "avx512_vnni": bool(ecx7 >> 11 & 1),
            "avx_vnni": eax7 >= 1 and bool(cpuid(7, 1)[0] >> 4 & 1)}


def env_switch(name: str) -> bool | None:
    """A 1 / 0 override switch from the environment: True for "1", False for "0", None when unset or empty
    (the CPU decides).  Anything else is an InvalidArgumentError naming the variable (it used to count as
    "1" silently)."""
    v = os.environ.get(name, "").strip()
    if v == "":
        return None
    if v not in ("0", "1"):
        raise InvalidArgumentError(f"${name} must be 1 (force), 0 (forbid) or unset, got {v!r}")
    return v == "1"


def q0_variant(family: str, plain: bool | None = None) -> str:
    """The q0 kernel variant for a kernel family: its VNNI variant where the CPU has it, else the plain
    one (plain=True, or $GPT2ASM_Q0_PLAIN=1, forces the plain one).  The avx512 variants need AVX512BW
    too; an avx512 family without it uses the avx2 family's variant."""
    if family not in Q0_VARIANTS:
        raise KernelUnavailableError(f"no q8_0 / q4_0 kernels for the {shown(family)} family yet")
    if plain is None:
        plain = bool(env_switch("GPT2ASM_Q0_PLAIN"))
    f = q0_features()
    if family == "avx512" and not f["avx512bw"]:
        family = "avx2"
    base, vnni, feat = Q0_VARIANTS[family]
    return vnni if f[feat] and not plain else base


def is_zen4() -> bool:
    """An AMD CPU of family 19h with AVX-512 (Zen 4; Zen 3 has no AVX-512): CPUID vendor AuthenticAMD,
    display family = base 0xf + extended 0xa."""
    if ARCH != "x86_64":
        return False
    _, ebx, ecx, edx = cpuid(0)
    vendor = b"".join(r.to_bytes(4, "little") for r in (ebx, edx, ecx))
    eax1 = cpuid(1)[0]
    family = (eax1 >> 8 & 0xf) + (eax1 >> 20 & 0xff)
    return vendor == b"AuthenticAMD" and family == 0x19


def q6k_variant(variant: str) -> str:
    """The q6_k (the q4_0 models' head) kernels of a q0 variant: avx512vnni for avx512vnni, else avx2
    (every variant the same bits); the matvec in its CPU tuning: mv_variant of this."""
    return "avx512vnni" if variant == "avx512vnni" else "avx2"


def mv_variant(variant: str) -> str:
    """The decode (matvec) kernel of a q0 variant: its _zen4 tuning on Zen 4 (is_zen4), else the variant
    itself.  $GPT2ASM_Q0_ZEN4=1 / 0 forces / forbids the Zen 4 tuning (bits are the same)."""
    if variant not in Q0_MV_ZEN4:
        return variant
    force = env_switch("GPT2ASM_Q0_ZEN4")
    zen4 = is_zen4() if force is None else force
    return variant + "_zen4" if zen4 else variant


class Q0Kernels:
    """One q0 variant bound (quantizer of its width, q8_0 and q4_0 matvec).  Methods take numpy arrays
    and validate them before anything reaches the assembly."""

    def __init__(self, family: str | int | None = None, plain: bool | None = None):
        self.lib = load_library()
        self.family = choose_family(family)
        self.variant = q0_variant(self.family, plain)
        qisa = "avx512" if self.variant.startswith("avx512") else "avx2"
        P, N = c_void_p, c_size_t
        # void gpt2asm_quantize_q8_0_<isa>(const float *x, int8_t *xq, float *xd, size_t n_in);
        self.quantize_q8_0 = self._bind(f"gpt2asm_quantize_q8_0_{qisa}", [P, P, P, N])
        # void gpt2asm_matvec_q8_0_<isa>(const uint8_t *w, const int8_t *xq, const float *xd, const float *b,
        #                                float *y, size_t n_in, size_t tile_begin, size_t tile_end);
        # void gpt2asm_matvec_q4_0_<isa>(the same);
        # void gpt2asm_matvec_q6_k_<isa>(the same);
        mv = {"q8_0": mv_variant(self.variant), "q4_0": mv_variant(self.variant),
              "q6_k": mv_variant(q6k_variant(self.variant))}
        self.matvec_fn = {k: self._bind(f"gpt2asm_matvec_{k}_{mv[k]}", [P, P, P, P, P, N, N, N]) for k in Q0_RECORD}
        # void gpt2asm_matmul_q8_0_<isa>(const uint8_t *w, const int8_t *xq, size_t ldq, const float *xd,
        #                                size_t ldd, const float *b, float *y, size_t ldy, size_t n_tokens,
        #                                size_t n_in, size_t tile_begin, size_t tile_end);
        # void gpt2asm_matmul_q4_0_<isa>(the same);  void gpt2asm_matmul_q6_k_<isa>(the same);
        mm = {"q8_0": self.variant, "q4_0": self.variant, "q6_k": q6k_variant(self.variant)}
        self.matmul_fn = {k: self._bind(f"gpt2asm_matmul_{k}_{mm[k]}", [P, P, N, P, N, P, P, N, N, N, N, N])
                          for k in Q0_RECORD}

    def _bind(self, name: str, argtypes):
        try:
            fn = getattr(self.lib, name)
        except AttributeError:
            raise LibraryError(f"{name} is missing from the library: rebuild with `make build`") from None
        fn.argtypes = argtypes
        fn.restype = None
        return fn

    @staticmethod
    def _n_in(n_in) -> int:
        if isinstance(n_in, bool) or not isinstance(n_in, (int, np.integer)) or not (
                0 < n_in <= Q0_MAX_IN and n_in % Q0_QK == 0):
            raise InvalidArgumentError(f"n_in must be a multiple of {Q0_QK} in {Q0_QK}..{Q0_MAX_IN}, got {shown(n_in)}")
        return int(n_in)

    def quantize(self, x: np.ndarray, xq: np.ndarray | None = None, xd: np.ndarray | None = None):
        """x float32 [n_in] -> (xq int8 [n_in], xd float32 [n_in/32]) (written into xq, xd if given)."""
        if not isinstance(x, np.ndarray):
            raise InvalidArgumentError(f"x: expected a numpy array, got {type(x).__name__}")
        n_in = self._n_in(x.size)
        xq = np.empty(n_in, np.int8) if xq is None else xq
        xd = np.empty(n_in // Q0_QK, np.float32) if xd is None else xd
        px = check(x, "x", np.float32, n_in)
        pq = check(xq, "xq", np.int8, n_in, writable=True)
        pd = check(xd, "xd", np.float32, n_in // Q0_QK, writable=True)
        self.quantize_q8_0(px, pq, pd, n_in)
        return xq, xd

    @staticmethod
    def _range(xq: np.ndarray) -> None:
        """xq must be the quantizer's -127..127: the plain q8_0 variants' sign trick is wrong for -128."""
        if int(xq.min()) == -128:
            raise InvalidArgumentError("xq: -128 is outside the activation quantizer's range -127..127")

    def _weights(self, kind, w, n_in: int, b, tile_begin, tile_end) -> tuple[int, int, int | None, int, int]:
        """Validate the tiled records w and the bias: (n_tiles, w address, b address or None, tb, te)."""
        if kind not in Q0_RECORD:
            raise InvalidArgumentError(f"kind must be one of {', '.join(Q0_RECORD)}, got {shown(kind)}")
        if n_in % Q0_UNIT[kind]:
            raise InvalidArgumentError(f"{kind}: n_in must be a multiple of {Q0_UNIT[kind]}, got {n_in}")
        per_tile = n_in // Q0_UNIT[kind] * Q0_RECORD[kind]
        if not isinstance(w, np.ndarray) or w.size == 0 or w.size % per_tile:
            raise InvalidArgumentError(f"w: expected {kind} records, a whole number of tiles of "
                                       f"{per_tile} bytes for n_in {n_in}")
        nt = w.size // per_tile
        pw = check(w, "w", np.uint8, aligned=True)
        pb = check(b, "b", np.float32, nt * TILE) if b is not None else None
        te = nt if tile_end is None else tile_end
        for v, name in ((tile_begin, "tile_begin"), (te, "tile_end")):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise InvalidArgumentError(f"{name} must be an integer, got {shown(v)}")
        if not 0 <= tile_begin <= te <= nt:
            raise InvalidArgumentError(f"tile range [{tile_begin}, {te}) not within 0..{nt}")
        return nt, pw, pb, int(tile_begin), int(te)

    def matvec(self, kind: str, w: np.ndarray, xq: np.ndarray, xd: np.ndarray, b: np.ndarray | None = None,
               y: np.ndarray | None = None, tile_begin: int = 0, tile_end: int | None = None) -> np.ndarray:
        """y[o] for tiles tile_begin .. tile_end-1 of the tiled records w (uint8, 64-byte aligned,
        n_tiles * n_in/32 records); b, y float32 [64 * n_tiles] (b may be None)."""
        if not isinstance(xq, np.ndarray):
            raise InvalidArgumentError(f"xq: expected a numpy array, got {type(xq).__name__}")
        n_in = self._n_in(xq.size)
        nt, pw, pb, tb, te = self._weights(kind, w, n_in, b, tile_begin, tile_end)
        pq = check(xq, "xq", np.int8, n_in)
        self._range(xq)
        pd = check(xd, "xd", np.float32, n_in // Q0_QK)
        y = np.empty(nt * TILE, np.float32) if y is None else y
        py = check(y, "y", np.float32, nt * TILE, writable=True)
        self.matvec_fn[kind](pw, pq, pd, pb, py, n_in, tb, te)
        return y

    def matmul(self, kind: str, w: np.ndarray, xq: np.ndarray, xd: np.ndarray, b: np.ndarray | None = None,
               y: np.ndarray | None = None, tile_begin: int = 0, tile_end: int | None = None) -> np.ndarray:
        """The prefill: xq int8 [T][n_in], xd float32 [T][n_in/32] (C-contiguous) -> y float32
        [T][64 * n_tiles], each row the matvec of its token's row."""
        if not (isinstance(xq, np.ndarray) and xq.ndim == 2 and xq.shape[0] >= 1):
            raise InvalidArgumentError("xq: expected int8 rows [n_tokens][n_in]")
        n_tok, n_in = xq.shape
        n_in = self._n_in(n_in)
        nt, pw, pb, tb, te = self._weights(kind, w, n_in, b, tile_begin, tile_end)
        pq = check(xq, "xq", np.int8)
        self._range(xq)
        pd = check(xd, "xd", np.float32, n_tok * (n_in // Q0_QK))
        y = np.empty((n_tok, nt * TILE), np.float32) if y is None else y
        py = check(y, "y", np.float32, n_tok * nt * TILE, writable=True)
        self.matmul_fn[kind](pw, pq, n_in, pd, n_in // Q0_QK, pb, py, nt * TILE, n_tok, n_in, tb, te)
        return y


# --------------------------------------------------------------------------------------------------
# q8_0 / q4_0 integer kernels, AArch64 (docs/kernels.md; tests/q0ref.py is the numpy model).  The
# variant inside the neon family is chosen by cpu.q0_isa (dotprod / i8mm where the CPU has them;
# $GPT2ASM_ARM_Q0=neon forces base ARMv8.0); every variant gives the same bits.

Q0_BLOCK = 32                                   # inputs per block (of the activations)


class ArmQ0:
    """The checked numpy API of the AArch64 q8_0 / q4_0 kernels: quantize_q8_0, matvec_q8_0, matvec_q4_0,
    matmul_q8_0, matmul_q4_0.  Weights w: the tiled records (uint8, 64-byte aligned, n_tiles * nb records)."""

    def __init__(self, lib: ctypes.CDLL | None = None, cap: str | None = None, family: str = "neon"):
        """family "sme2": the matvec and matmul kernels are the sme2 ones (SME2 with SVL 128..512: the caller's choice,
        as for Kernels); cap: the best neon variant allowed (default $GPT2ASM_ARM_Q0)."""
        from .cpu import q0_isa
        self.lib = lib or load_library()
        P, N = c_void_p, c_size_t
        self.isa = {op: q0_isa(op, None if lib is None else lib, cap) for op in ("quantize", "matvec", "matmul")}
        if family == "sme2":
            self.isa["matvec"] = self.isa["matmul"] = "sme2"

        def bind(name, argtypes):
            fn = getattr(self.lib, name, None)
            if fn is None:
                raise LibraryError(f"{name} is missing from the library: rebuild with `make build`")
            fn.argtypes, fn.restype = argtypes, None
            return fn
        # void gpt2asm_quantize_q8_0_neon(const float *x, int8_t *xq, float *xd, size_t n_in);
        self._quantize = bind("gpt2asm_quantize_q8_0_neon", [P, P, P, N])
        # void gpt2asm_matvec_{q8_0,q4_0}_<isa>(const uint8_t *w, const int8_t *xq, const float *xd,
        #                     const float *b, float *y, size_t n_in, size_t tile_begin, size_t tile_end);
        #     void gpt2asm_matvec_q6_k_neon(the same)  (q6_k: neon for every family, the sme2 one too)
        self._matvec = {k: bind(f"gpt2asm_matvec_{k}_{'neon' if k == 'q6_k' else self.isa['matvec']}",
                                [P, P, P, P, P, N, N, N]) for k in Q0_RECORD}
        # void gpt2asm_matmul_{q8_0,q4_0}_<isa>(const uint8_t *w, const int8_t *xq, size_t ldq, const float *xd,
        #                     size_t ldd, const float *b, float *y, size_t ldy, size_t n_tokens, size_t n_in,
        #                     size_t tile_begin, size_t tile_end);     (optional until the library has them)
        from .cpu import Q0_ISAS            # (a library without the chosen variant: the next best)
        self._matmul = {}
        for k in ("q8_0", "q4_0"):
            isas = ("sme2",) if family == "sme2" else Q0_ISAS[:Q0_ISAS.index(self.isa["matmul"]) + 1]
            have = [i for i in isas if hasattr(self.lib, f"gpt2asm_matmul_{k}_{i}")]
            if have:
                self.isa["matmul"] = have[-1]
                self._matmul[k] = bind(f"gpt2asm_matmul_{k}_{have[-1]}", [P, P, N, P, N, P, P, N, N, N, N, N])
        self._matmul["q6_k"] = bind("gpt2asm_matmul_q6_k_neon", [P, P, N, P, N, P, P, N, N, N, N, N])

    @staticmethod
    def _n_in(n_in) -> int:
        if not (_is_int(n_in) and 0 < n_in < 1 << 40 and n_in % Q0_BLOCK == 0):
            raise InvalidArgumentError(f"n_in must be a positive multiple of {Q0_BLOCK}, got {shown(n_in)}")
        return int(n_in)

    def _weights(self, kind: str, w, n_in: int) -> int:
        """Validate tiled records for n_in inputs: n_tiles."""
        if kind not in Q0_RECORD:
            raise InvalidArgumentError(f"unknown integer weight type {shown(kind)}")
        if n_in % Q0_UNIT[kind]:
            raise InvalidArgumentError(f"{kind}: n_in must be a multiple of {Q0_UNIT[kind]}, got {n_in}")
        check(w, "w", np.uint8, aligned=True)
        per_tile = n_in // Q0_UNIT[kind] * Q0_RECORD[kind]
        if w.size == 0 or w.size % per_tile:
            raise InvalidArgumentError(f"w: {w.size} bytes is not a whole number of {kind} tiles of {n_in} "
                                       f"inputs ({per_tile} bytes each)")
        return w.size // per_tile

    def _tiles(self, n_tiles: int, tile_begin, tile_end) -> tuple[int, int]:
        tile_end = n_tiles if tile_end is None else tile_end
        if not (_is_int(tile_begin) and _is_int(tile_end) and 0 <= tile_begin <= tile_end <= n_tiles):
            raise InvalidArgumentError(f"tiles [{tile_begin}, {tile_end}) outside 0..{n_tiles}")
        return int(tile_begin), int(tile_end)

    def quantize_q8_0(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """x float32 [n_in] (n_in % 32 == 0) -> (xq int8 [n_in], xd float32 [n_in / 32])."""
        if not (isinstance(x, np.ndarray) and x.ndim == 1):
            raise InvalidArgumentError("x: expected a float32 vector")
        n_in = self._n_in(x.size)
        px = check(x, "x", np.float32, n_in)
        xq, xd = np.empty(n_in, np.int8), np.empty(n_in // Q0_BLOCK, np.float32)
        self._quantize(px, addr(xq), addr(xd), n_in)
        return xq, xd

    def matvec(self, kind: str, w: np.ndarray, n_in: int, xq: np.ndarray, xd: np.ndarray,
               b: np.ndarray | None = None, tile_begin: int = 0, tile_end: int | None = None) -> np.ndarray:
        """y float32 [64 n_tiles]: outputs of tiles [tile_begin, tile_end) (the rest left uninitialised)."""
        n_in = self._n_in(n_in)
        nt = self._weights(kind, w, n_in)
        tb, te = self._tiles(nt, tile_begin, tile_end)
        pq = check(xq, "xq", np.int8, n_in)
        pd = check(xd, "xd", np.float32, n_in // Q0_BLOCK)
        pb = None if b is None else check(b, "b", np.float32, nt * TILE)
        y = np.empty(nt * TILE, np.float32)
        self._matvec[kind](addr(w), pq, pd, pb, addr(y), n_in, tb, te)
        return y

    def matvec_q8_0(self, w, n_in, xq, xd, b=None, tile_begin=0, tile_end=None) -> np.ndarray:
        return self.matvec("q8_0", w, n_in, xq, xd, b, tile_begin, tile_end)

    def matvec_q4_0(self, w, n_in, xq, xd, b=None, tile_begin=0, tile_end=None) -> np.ndarray:
        return self.matvec("q4_0", w, n_in, xq, xd, b, tile_begin, tile_end)

    def matmul(self, kind: str, w: np.ndarray, n_in: int, xq: np.ndarray, xd: np.ndarray,
               b: np.ndarray | None = None, tile_begin: int = 0, tile_end: int | None = None) -> np.ndarray:
        """Y float32 [T][64 n_tiles] for xq int8 [T][n_in], xd float32 [T][n_in / 32]: each row the bits of
        matvec on that row (tiles outside [tile_begin, tile_end) left uninitialised)."""
        if kind not in self._matmul:
            raise KernelUnavailableError(f"this library has no AArch64 {kind} matmul kernel")
        n_in = self._n_in(n_in)
        nt = self._weights(kind, w, n_in)
        tb, te = self._tiles(nt, tile_begin, tile_end)
        if not (isinstance(xq, np.ndarray) and xq.ndim == 2 and xq.shape[1] == n_in):
            raise InvalidArgumentError(f"xq: expected int8 rows [T][{n_in}]")
        T = xq.shape[0]
        pq = check(xq, "xq", np.int8)
        if not (isinstance(xd, np.ndarray) and xd.shape == (T, n_in // Q0_BLOCK)):
            raise InvalidArgumentError(f"xd: expected float32 [{T}][{n_in // Q0_BLOCK}]")
        pd = check(xd, "xd", np.float32)
        pb = None if b is None else check(b, "b", np.float32, nt * TILE)
        y = np.empty((T, nt * TILE), np.float32)
        self._matmul[kind](addr(w), pq, n_in, pd, n_in // Q0_BLOCK, pb, addr(y), nt * TILE, T, n_in, tb, te)
        return y

    def matmul_q8_0(self, w, n_in, xq, xd, b=None, tile_begin=0, tile_end=None) -> np.ndarray:
        return self.matmul("q8_0", w, n_in, xq, xd, b, tile_begin, tile_end)

    def matmul_q4_0(self, w, n_in, xq, xd, b=None, tile_begin=0, tile_end=None) -> np.ndarray:
        return self.matmul("q4_0", w, n_in, xq, xd, b, tile_begin, tile_end)
