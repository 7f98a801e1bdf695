#!/usr/bin/env python3
"""make_tokenizer_goldens.py — reference ids and decodes for tests/test_tokenizer.c.

Runs Hugging Face `tokenizers` (the reference implementation) on every text of
tests/data/tokenizer_corpus.jsonl with each of the three tokenizers and writes
tests/data/tokenizer_goldens.jsonl: one object per (tokenizer, text) with the
ids (encode without special tokens) and decode with skip_special_tokens
false/true.

It also writes tests/data/tokenizer_goldens_components.jsonl, which exercises
the components our three real files do not use (Metaspace prepend schemes,
Split behaviors and invert, Whitespace/WhitespaceSplit/Digits, ByteLevel with
add_prefix_space and use_regex, NFKC/NFD/Lowercase/Strip, regex Replace,
Strip/Metaspace decoders, added tokens with lstrip/rstrip/single_word/
normalized): each config is stories260K's tokenizer.json with the top-level
keys in "overrides" replaced (a {"config": ..., "overrides": ...} line), followed
by rows of random text from a fixed seed. Regenerate with:

    python3 tests/ref/make_tokenizer_goldens.py [SHARED_DATA_DIR]
"""
import copy
import json
import os
import random
import sys

from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "shared", "data")
TOKENIZERS = {
    "qwen2.5": "qwen2.5-tokenizer/tokenizer.json",
    "qwen2": "qwen2-tokenizer/tokenizer.json",
    "stories260K": "models/stories260K/hf/tokenizer.json",
}


def main():
    with open(os.path.join(ROOT, "tests/data/tokenizer_corpus.jsonl"), encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]
    out_path = os.path.join(ROOT, "tests/data/tokenizer_goldens.jsonl")
    n = 0
    with open(out_path, "w", encoding="utf-8") as out:
        for name, rel in TOKENIZERS.items():
            tok = Tokenizer.from_file(os.path.join(DATA, rel))
            for text in texts:
                ids = tok.encode(text, add_special_tokens=False).ids
                row = {
                    "tokenizer": name,
                    "text": text,
                    "ids": ids,
                    "decoded": tok.decode(ids, skip_special_tokens=False),
                    "decoded_skip": tok.decode(ids, skip_special_tokens=True),
                }
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
                n += 1
    print(f"wrote {n} goldens ({len(texts)} texts x {len(TOKENIZERS)} tokenizers) to {out_path}")
    write_components()


METASPACE = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}
BYTELEVEL_DECODER = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
COMPONENT_CONFIGS = {
    "metaspace_first": {
        "normalizer": None,
        "pre_tokenizer": METASPACE,
        "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, dict(METASPACE), {"type": "Fuse"}]},
    },
    "metaspace_always_nosplit": {
        "normalizer": None,
        "pre_tokenizer": dict(METASPACE, prepend_scheme="always", split=False),
        "decoder": dict(METASPACE, prepend_scheme="always", split=False),
    },
    "metaspace_never_nfkc": {
        "normalizer": {"type": "NFKC"},
        "pre_tokenizer": dict(METASPACE, prepend_scheme="never"),
        "decoder": dict(METASPACE, prepend_scheme="never"),
    },
    "split_behaviors": {
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Lowercase"}, {"type": "Replace", "pattern": {"Regex": " +"}, "content": "\u2581"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"String": "\u2581"}, "behavior": "MergedWithPrevious", "invert": False},
            {"type": "Split", "pattern": {"Regex": "[0-9]"}, "behavior": "Contiguous", "invert": False},
            {"type": "Split", "pattern": {"Regex": "[aeiou]"}, "behavior": "Removed", "invert": True},
            {"type": "Split", "pattern": {"String": "s"}, "behavior": "MergedWithNext", "invert": False},
            {"type": "Digits", "individual_digits": False}]},
    },
    "bytelevel_prefix_regex": {
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "use_regex": True, "trim_offsets": True},
        "decoder": BYTELEVEL_DECODER,
    },
    "whitespace_strip": {
        "normalizer": {"type": "Strip", "strip_left": True, "strip_right": True},
        "pre_tokenizer": {"type": "Whitespace"},
    },
    "whitespacesplit_nfd": {
        "normalizer": {"type": "NFD"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "WhitespaceSplit"}, {"type": "Digits", "individual_digits": True}]},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"Regex": "s+"}, "content": "S"},
            {"type": "Strip", "content": "\u2581", "start": 2, "stop": 0}]},
    },
}
# Added tokens on top of stories260K's: ids as HF assigns them ("ing" is in the vocab).
EXTRA_ADDED = [
    {"id": 299, "content": "ing", "single_word": True, "lstrip": False, "rstrip": False, "normalized": False, "special": False},
    {"id": 512, "content": "<x>", "single_word": False, "lstrip": True, "rstrip": True, "normalized": False, "special": True},
    {"id": 513, "content": "the", "single_word": False, "lstrip": False, "rstrip": False, "normalized": True, "special": False},
    {"id": 514, "content": "<xy>", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": False},
]
POOL = [" ", "  ", "\t", "\n", "\r\n", "a", "e", "i", "s", "ss", "B", "\u00e9", "e\u0301", "\ufb01", "\uff46", "\u0436",
        "\u4e2d", "\U0001F600", "0", "7", "12", "'", "'s", ".", ",", "!", "\u2581", "<s>", "</s>", "<x>", "<xy>", "<x",
        "ing", " ing ", "sing", "the", "The", "THE", "hello", " world", "Once", "upon", "\u00a0", "\u3000", "\u180e"]


def write_components():
    base_path = os.path.join(DATA, TOKENIZERS["stories260K"])
    with open(base_path, encoding="utf-8") as f:
        base = json.load(f)
    configs = dict(COMPONENT_CONFIGS)
    configs["added_tokens_options"] = {"added_tokens": base["added_tokens"] + EXTRA_ADDED}
    rng = random.Random(1234)
    out_path = os.path.join(ROOT, "tests/data/tokenizer_goldens_components.jsonl")
    n = 0
    with open(out_path, "w", encoding="utf-8") as out:
        for name, overrides in configs.items():
            j = copy.deepcopy(base)
            j.update(overrides)
            tok = Tokenizer.from_str(json.dumps(j))
            out.write(json.dumps({"config": name, "overrides": overrides}, ensure_ascii=False) + "\n")
            for _ in range(60):
                text = "".join(rng.choice(POOL) for _ in range(rng.randint(0, 16)))
                ids = tok.encode(text, add_special_tokens=False).ids
                row = {"tokenizer": name, "text": text, "ids": ids,
                       "decoded": tok.decode(ids, skip_special_tokens=False),
                       "decoded_skip": tok.decode(ids, skip_special_tokens=True)}
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
                n += 1
    print(f"wrote {n} component goldens ({len(configs)} configs) to {out_path}")


if __name__ == "__main__":
    main()
