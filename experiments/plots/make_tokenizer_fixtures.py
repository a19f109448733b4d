#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer_cases.json: strings and the token ids SmolLM2 gives them.

The ids come from an implementation independent of kvq's C++ tokenizer: PyPI's `gguf` reads
the vocabulary and merges out of the same GGUF file, and PyPI's `tokenizers` (the Rust library
behind Hugging Face's fast tokenizers) builds a BPE model from them with SmolLM2's
pre-tokenizer, as its tokenizer.json declares it:
    Sequence([Digits(individual_digits=True),
              ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
with no normalizer. Bytes that have no token of their own (21 in SmolLM2) are dropped, as
`tokenizers` does; they are listed under "unencodable_bytes". Special tokens (token_type 3, CONTROL) are added as special AddedTokens
for the cases that parse them. Chat cases are rendered from the GGUF's own Jinja template
(tokenizer.chat_template) with `jinja2`. It also records the token count and an FNV-1a hash of
the ids of the whole King James Bible (Debian's bible-kjv) for the C++ test's timing run.

Run (from the repository root; the packages are pinned in experiments/plots/requirements-fixtures.txt
under "# fixture generators"):
    python3 -m venv /tmp/tokvenv
    /tmp/tokvenv/bin/pip install --only-binary :all: gguf==0.19.0 tokenizers==0.23.3 \
        jinja2==3.1.6
    scripts/fetch-model.sh
    /tmp/tokvenv/bin/python experiments/plots/make_tokenizer_fixtures.py
Options: --model PATH (default ${KVQ_MODEL_DIR:-~/.cache/kvq}/SmolLM2-135M-Instruct.Q4_1.gguf),
--out PATH (default tests/fixtures/tokenizer_cases.json), --no-kjv (skip the Bible).
"""

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import jinja2
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
KJV_COMMAND = ["bible", "-f", "Gen1:1-Rev22:21"]
CONTROL = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL

# (name, text, parse_special)
CASES = [
    ("english", "Hello world! This is a test of the tokenizer.", False),
    ("kjv_verse", "In the beginning God created the heaven and the earth.", False),
    ("kjv_gen1_1_5", None, False),  # filled from `bible -f Gen1:1-1:5`
    ("integer", "12345", False),
    ("decimal", "3.14", False),
    ("numbers_in_text", "In 2024, 1,000,000 people paid $19.99 each (50% off).", False),
    ("spaced_numbers", " 42 and  7 ", False),
    ("punctuation_runs", "Wait... what?!?! --- ***hello*** ((x)) ;; <<>>", False),
    ("multiple_spaces", "a  b   c    d", False),
    ("leading_spaces", "   start", False),
    ("trailing_spaces", "end   ", False),
    ("newlines", "line1\nline2\n\nline3\n\n\n", False),
    ("tabs", "\tindented\t\tcode\t", False),
    ("mixed_whitespace", " \n \t\r\n x \r\n", False),
    ("contractions", "It's the cat's toy; don't, they're, we've, I'm, you'll, he'd.", False),
    ("contractions_upper", "IT'S DON'T 'tis ''", False),
    ("accents", "café résumé naïve Zürich façade", False),
    ("combining_marks", "cafe\u0301 n\u0303o A\u030a", False),
    ("cjk", "中文分词测试，你好世界。日本語のテキスト", False),
    ("emoji", "I love 🦀 and 👍🏽 and 👨‍👩‍👧!", False),
    ("other_digits", "٣ and १२३ or x² ½ Ⅻ", False),
    ("unicode_spaces", "a\u00a0b\u2003c\u3000d\u0085e\u180ef\u200bg", False),
    ("cyrillic_greek", "Привет мир, Γειά σου κόσμε", False),
    ("code", "def f(x):\n    return x**2  # square\n", False),
    ("url", "https://example.com/a?b=1&c=2 mail@host.org", False),
    ("repeats", "a" * 41 + "!" * 9 + " " * 7 + "zz", False),
    ("empty", "", False),
    ("single_space", " ", False),
    # Bytes with no token (0x04 0x06 0x13 0x14 0x16 0x1d, and 0xf1 0xf2 lead bytes) are dropped.
    ("unencodable_bytes", "x\x04y !\x06! a\x13\x14\x16\x1db \U00050000 \U00090000 ok", False),
    ("special_as_text", "<|im_start|>user\nhi<|im_end|>\n", False),
    ("special_adjacent", "<|endoftext|><|endoftext|>hi<|im_end|>", True),
    ("special_near_miss", "<|im_start |> <|im_end| <|im_end|>x", True),
    ("chat_turn", None, True),  # filled from the chat template
]

# (name, messages, add_generation_prompt)
CHAT_CASES = [
    ("one_turn_default_system", [("user", "What is 2+2?")], True),
    ("system_and_turns",
     [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "Bye")], False),
    ("assistant_first", [("assistant", "Hi"), ("user", "Hello\nthere")], True),
]


def default_model() -> Path:
    return Path(os.environ.get("KVQ_MODEL_DIR", Path.home() / ".cache/kvq")) / MODEL_NAME


def field_strings(reader, key):
    return [str(s) for s in reader.fields[key].contents()]


def build_tokenizers(reader):
    """(plain, with_special): BPE tokenizers over the GGUF vocabulary."""
    tokens = field_strings(reader, "tokenizer.ggml.tokens")
    types = list(reader.fields["tokenizer.ggml.token_type"].contents())
    merges = [tuple(m.split(" ")) for m in field_strings(reader, "tokenizer.ggml.merges")]
    assert all(len(m) == 2 for m in merges), "a merge is not 'a b'"
    vocab = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == len(tokens), "duplicate tokens"
    out = []
    for with_special in (False, True):
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ])
        tok.decoder = decoders.ByteLevel()
        if with_special:
            tok.add_special_tokens(
                [AddedToken(t, special=True, normalized=False)
                 for t, ty in zip(tokens, types) if ty == CONTROL])
        out.append(tok)
    return out


def encode(tok, text, unencodable):
    ids = tok.encode(text, add_special_tokens=False).ids
    # A fixture must round-trip (less the bytes without a token); otherwise the generator itself
    # is broken.
    kept = bytes(b for b in text.encode("utf-8") if b not in unencodable)
    got = b"".join(tok.id_to_token(i).encode("utf-8") if tok.id_to_token(i) in SPECIAL_TEXT
                   else bytes(BYTE_OF[c] for c in tok.id_to_token(i)) for i in ids)
    assert got == kept, repr(text)
    return ids


def byte_to_unicode():
    """GPT-2's map from bytes to the characters the vocabulary spells them with."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + k) for k, b in enumerate(extra)}}


BYTE_OF = {c: b for b, c in byte_to_unicode().items()}
SPECIAL_TEXT = set()


def fnv1a64(ids):
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little", signed=True):
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=default_model())
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).resolve().parents[2] / "tests/fixtures/tokenizer_cases.json")
    ap.add_argument("--no-kjv", action="store_true")
    args = ap.parse_args()

    reader = gguf.GGUFReader(str(args.model))
    pre = str(reader.fields["tokenizer.ggml.pre"].contents())
    assert pre == "smollm", f"unexpected tokenizer.ggml.pre {pre!r}"
    plain, special = build_tokenizers(reader)
    vocab = set(field_strings(reader, "tokenizer.ggml.tokens"))
    SPECIAL_TEXT.update(t for t, ty in zip(field_strings(reader, "tokenizer.ggml.tokens"),
                                           reader.fields["tokenizer.ggml.token_type"].contents())
                        if ty == CONTROL)
    unencodable = {b for b, c in byte_to_unicode().items() if c not in vocab}
    template = jinja2.Environment().from_string(
        str(reader.fields["tokenizer.chat_template"].contents()))

    def render(messages, add_generation_prompt):
        return template.render(messages=[{"role": r, "content": c} for r, c in messages],
                               add_generation_prompt=add_generation_prompt)

    if shutil.which("bible") is None:
        sys.exit("make_tokenizer_fixtures: `bible` not found (apt-get install bible-kjv)")
    gen1 = subprocess.run(["bible", "-f", "Gen1:1-1:5"], check=True, capture_output=True,
                          text=True).stdout
    texts = {"kjv_gen1_1_5": gen1, "chat_turn": render(CHAT_CASES[0][1], True)}

    cases = []
    for name, text, parse_special in CASES:
        text = texts.get(name, text)
        ids = encode(special if parse_special else plain, text, unencodable)
        cases.append({"name": name, "text": text, "parse_special": parse_special, "ids": ids})
    chats = [{"name": name, "messages": [{"role": r, "content": c} for r, c in messages],
              "add_generation_prompt": agp, "text": render(messages, agp)}
             for name, messages, agp in CHAT_CASES]

    doc = {
        "model": MODEL_NAME,
        "unencodable_bytes": sorted(unencodable),
        "generator": "experiments/plots/make_tokenizer_fixtures.py",
        "versions": {p: importlib.metadata.version(p) for p in ("gguf", "tokenizers", "jinja2")},
        "pre_tokenizer": "Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space="
                         "False, use_regex=True)]",
        "cases": cases,
        "chat": chats,
    }
    if not args.no_kjv:
        kjv = subprocess.run(KJV_COMMAND, check=True, capture_output=True).stdout
        ids = encode(plain, kjv.decode("utf-8"), unencodable)
        doc["kjv"] = {"command": " ".join(KJV_COMMAND), "bytes": len(kjv), "tokens": len(ids),
                      "ids_fnv1a64": fnv1a64(ids)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # One line per id list keeps the file short and diffs readable.
    text = json.dumps(doc, indent=1, ensure_ascii=True)
    text = re.sub(r"\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]",
                  lambda m: "[" + ", ".join(re.findall(r"-?\d+", m.group(1))) + "]", text)
    args.out.write_text(text + "\n")
    print(f"wrote {args.out}: {len(cases)} cases, {len(chats)} chat cases"
          + ("" if args.no_kjv else f", KJV {doc['kjv']['tokens']} tokens"))


if __name__ == "__main__":
    main()
