"""Strings the GPT-2 tokenizer is checked on (against Hugging Face's GPT2TokenizerFast).

VERIFY_CASES: 12 short cases, also used by tools/verify.py.
CORPUS: a broad list of edge cases (ASCII and Unicode).
fuzz_strings(): seeded random strings drawn from mixed Unicode ranges.
"""
from __future__ import annotations

import random

VERIFY_CASES: list[str] = [
    "Hello, world! It's a test: we're sure they've done what I'm told you'll do, he'd say.",
    "IT'S LOUD, WE'RE SURE, THEY'VE GONE, I'M HERE, YOU'LL SEE, HE'D SAY, 'S 'T",
    "runs   of    spaces,  two  and     five,     then trailing   ",
    "line one\nline two\n\n\nafter blank lines\r\nwindows line\n",
    "\tindented\twith\ttabs\n\t\tand two\t \t mixed",
    "digits 0 12 345 6789 3.14159 1,000,000 and 12345678901234567890",
    "punctuation!!! ??? ... --- (a) [b] {c} <d> @#$%^&*_+=|\\/~` \"quoted\" 'single'",
    "https://example.com/path?q=1&r=two#frag and def f(x): return x**2 + 1",
    "Café naïve résumé façade Ångström e\u0301 Zürich",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "emoji 😀👍🏽 👨\u200d👩\u200d👧\u200d👦 🇫🇷🇯🇵",
    "before<|endoftext|>after <|endoftext|> again",
]

CORPUS: list[str] = VERIFY_CASES + [
    # empty and whitespace-only
    "", " ", "  ", "   ", "\n", "\n\n", "\r\n", "\t", " \n ", "\n \n", "a", " a", "a ", " a ",
    # contractions in context and out of it
    "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D",
    "don't can't won't shan't", "It'S THE cAt'S", "rock'n'roll", "'''", "''s", "'", " 's", "x's'", "o'clock",
    "we're we'RE We'Re", "y'all'd've",
    # runs of spaces, leading/trailing spaces
    "a  b", "a   b", "a    b", "   leading", "trailing   ", "  both  ", "a \n b", "a  \n  b", " \t ",
    "word" + " " * 40 + "word", " " * 100, "x" + " " * 17,
    # newlines, CR, tabs
    "a\nb", "a\n\nb", "a\n\n\n\nb", "a\r\nb\r\n", "\r", "a\rb", "\n\n\n", "\t\t\ta", "a\t\tb", "\t\n\t",
    "end\n", "\n\nstart",
    # digits and long numbers
    "0", "1", "42", "123", "1234", "12345", "3.14", "-17", "+1e-10", "0x1F", "1_000_000", "2024-01-31",
    "12:34:56", "٣٤٥", "१२३", "①②③", "½ ¾", "Ⅻ", "12345678901234567890123456789012345678901234567890",
    "9" * 200,
    # punctuation runs
    "!!!", "?!?!", "...", "…", "--", "—", "––", "***", "###", "$$$", "::", ";;", ",,,,", "...and", "(((x)))",
    "a.b.c", "e.g., i.e.", "!@#$%^&*()_+-=[]{}|;':\",./<>?`~\\",
    # URLs, e-mail, code
    "https://www.example.org/a/b-c_d?x=1&y=%20#top", "mailto:someone@example.com",
    "def main():\n    print('hi')\n    return 0\n",
    "for (int i = 0; i < n; ++i) { x[i] = y[i] * 2; }",
    "<html><body class=\"x\">&amp;&lt;</body></html>", "{\"key\": [1, 2.5, null, true]}",
    "#include <stdio.h>\nint main(void) { return 0; }",
    "SELECT * FROM t WHERE a = 'b';", "$ ls -la | grep foo > out.txt 2>&1",
    # accents / Latin-1 / combining marks
    "é", "e\u0301", "ñ", "n\u0303", "ÀÉÎÕÜ", "àéîõü", "ß", "ẞ", "Ω", "ÿ", "©®™", "¡¿", "«»", "°±²³µ¶·¸¹º",
    "a\u0300\u0301\u0302\u0303", "\u0301", " \u0301", "Ελληνικά", "Русский текст", "Ўзбек", "Việt Nam",
    # CJK, Japanese, Korean
    "中文", "汉字漢字", "你好，世界！", "日本語", "ひらがな カタカナ ｶﾀｶﾅ", "東京都", "한국어", "안녕하세요 세계",
    "ㄱㄴㄷ", "中a文b", "ＡＢＣ１２３",
    # Arabic, Hebrew, Hindi, Thai and other scripts
    "مرحبا بالعالم", "العربية ١٢٣", "שלום עולם", "नमस्ते दुनिया", "हिन्दी", "ภาษาไทย", "ქართული", "Հայերեն",
    "አማርኛ", "ᚠᛇᚻ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝟘𝟙𝟚",
    # emoji incl. skin tones, ZWJ sequences, flags, keycaps
    "😀", "👍🏿", "❤️", "👩\u200d💻", "👨\u200d👩\u200d👧", "🏳️\u200d🌈", "🇺🇸", "🇩🇪🇬🇧", "1️⃣", "#️⃣",
    "a😀b", " 😀 ", "😀😀😀", "🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",
    # unusual whitespace
    "\u00a0", "a\u00a0b", "a \u00a0 b", "\u2009", "a\u2009b", "\u3000", "a\u3000b", "\u200b", "a\u200bb",
    "\x0b", "a\x0bb", "\x0c", "a\x0cb", "\x85", "a\x85b", "\u2028", "a\u2028b", "\u2029", "\u1680", "\u202f",
    "\u205f", "\ufeff", "\ufeffbom", "\u180e", " \u00a0 ", "\u00a0\u00a0\u00a0x", "\u2003\u2003word",
    "a \u3000\u3000b", "x\x1cy\x1dz\x1ew\x1fv",
    # control characters
    "\x00", "a\x00b", "\x01\x02\x03", "\x07bell", "\x1b[31mred\x1b[0m", "\x7f", "\x80\x81\x9f", "\x08\x08",
    # the special token inside text
    "<|endoftext|>", "<|endoftext|><|endoftext|>", " <|endoftext|>", "<|endoftext|> ", "x<|endoftext|>y",
    "<|endoftext|>\n<|endoftext|>", "<|endoftext", "|endoftext|>", "<|endoftext |>", "<|ENDOFTEXT|>",
    "<|<|endoftext|>|>", "<|endoftext|>'s",
    # private use, noncharacters, unassigned, astral
    "\ue000\uf8ff", "\U000f0000", "\U0010ffff", "\ufffe\uffff", "\ufffd", "\U0001d11e", "\U00020000",
    # a longer mixed paragraph
    "The quick brown fox jumps over the lazy dog. Le cœur a ses raisons que la raison ne connaît point. "
    "素早い茶色の狐がのろまな犬を飛び越える。 Быстрая коричневая лиса. 🦊🐕 1984, 2001: a space odyssey.\n\n"
    "    Indented code block\n\tTabbed line\r\n",
]

# Ranges the fuzz draws from: (weight, lo, hi) inclusive code point ranges.
_FUZZ_RANGES = [
    (30, 0x20, 0x7E),        # printable ASCII
    (6, 0x00, 0x1F),         # C0 controls (\t \n \r \x0b \x0c \x1c-\x1f ...)
    (4, 0x7F, 0xFF),         # DEL, C1 controls, Latin-1
    (6, 0x100, 0x24F),       # Latin extended
    (4, 0x300, 0x36F),       # combining marks
    (4, 0x370, 0x6FF),       # Greek, Cyrillic, Armenian, Hebrew, Arabic
    (4, 0x900, 0xDFF),       # Indic scripts, Thai
    (3, 0x1100, 0x11FF),     # Hangul jamo
    (4, 0x2000, 0x206F),     # general punctuation, unusual spaces, ZWJ/ZWSP
    (3, 0x2070, 0x2BFF),     # super/subscripts, symbols, arrows, math
    (3, 0x3000, 0x30FF),     # CJK punctuation, ideographic space, kana
    (6, 0x4E00, 0x9FFF),     # CJK ideographs
    (4, 0xAC00, 0xD7A3),     # Hangul syllables
    (2, 0xE000, 0xF8FF),     # private use
    (2, 0xFE00, 0xFFFF),     # variation selectors, fullwidth forms, specials
    (6, 0x1F300, 0x1FAFF),   # emoji
    (2, 0x1F1E6, 0x1F1FF),   # regional indicators (flags)
    (2, 0x10000, 0x10FFFF),  # anything astral (incl. unassigned)
]
_FUZZ_SPECIAL = [" ", " ", " ", "\n", "\t", "\r\n", "  ", "'s", "'ll", "<|endoftext|>", "\u200d", "\u00a0", "123"]


def fuzz_strings(n: int = 200, seed: int = 1234, max_len: int = 60) -> list[str]:
    """n seeded random strings mixing the ranges above (no surrogates)."""
    rng = random.Random(seed)
    weights = [w for w, _, _ in _FUZZ_RANGES]
    out = []
    for _ in range(n):
        chars = []
        for _ in range(rng.randrange(1, max_len + 1)):
            if rng.random() < 0.12:
                chars.append(rng.choice(_FUZZ_SPECIAL))
                continue
            _, lo, hi = rng.choices(_FUZZ_RANGES, weights)[0]
            c = rng.randint(lo, hi)
            if 0xD800 <= c <= 0xDFFF:
                c = 0xFFFD
            chars.append(chr(c))
        out.append("".join(chars))
    return out
