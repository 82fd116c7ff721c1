#!/usr/bin/python3
"""scripts/prepare_tokens.py --tokenizer with Hugging Face tokenizers built here, offline.

A small BPE trained in the test gives, through the script and ferry's loader (token_dump), the
ids that `tokenizers` gives each document, each led by the end-of-text token the tokenizer's
files name; a word-level tokenizer of 70,001 ids makes a uint32 file (llm.c's magic 20240801)
holding ids above 65,535; a tokenizer without an end-of-text token is one error line and exit 2
unless --eot-id is given; data.documents trains on the uint32 file split at its end-of-text
id 70000; and the trainer refuses a file with a token at or above model.vocab
before training: exit 2, one error line naming the file, the first bad position, the token and
the vocabulary. Exit 77 (skip) without the tokenizers package.
"""

import argparse
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys

PY = "/usr/bin/python3"


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def run(cmd, expect=0):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != expect:
        fail("%s exited %d, expected %d\nstdout:\n%s\nstderr:\n%s" %
             (" ".join(cmd), r.returncode, expect, r.stdout, r.stderr))
    return r


def documents(folder):
    """Three text files of the test's own (UTF-8, repeated words, one of them empty of words
    but not of bytes), sorted as the script reads a glob."""
    texts = {
        "a.txt": "The quick brown fox jumps over the lazy dog.\n" * 20 + "Ünïcödé: naïve café.\n",
        "b.txt": "Lorem ipsum dolor sit amet, consectetur adipiscing elit.\n\nSed do eiusmod "
                 "tempor incididunt ut labore et dolore magna aliqua.\n" * 15,
        "c.txt": "   \n",
    }
    os.makedirs(folder, exist_ok=True)
    for name, text in texts.items():
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.write(text)
    return [texts[k] for k in sorted(texts)]


def dump(tool, path):
    """(format name, ids) as ferry's TokenFile reads them."""
    lines = run([tool, path]).stdout.splitlines()
    fmt, count = lines[0].rsplit(" ", 1)
    ids = [int(t) for t in lines[1].split()] if len(lines) > 1 else []
    check(len(ids) == int(count), "%s: %d ids dumped, count %s" % (path, len(ids), count))
    return fmt, ids


def prepare(source, tokenizer, inputs, out, extra=(), expect=0):
    cmd = [PY, os.path.join(source, "scripts", "prepare_tokens.py"), "--tokenizer", tokenizer,
           "--out", out] + list(extra) + [inputs]
    return run(cmd, expect)


def read_back(tool, out):
    fmt_train, train = dump(tool, os.path.join(out, "train.bin"))
    fmt_val, val = dump(tool, os.path.join(out, "val.bin"))
    check(fmt_train == fmt_val, "train and val formats differ: %s, %s" % (fmt_train, fmt_val))
    return fmt_train, train + val


def bpe_round_trip(args, texts):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>", "<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts * 3, trainer)
    # A post-processor that adds <s> (as Llama's does): the script leaves it out, as the
    # reference below does with add_special_tokens=False.
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    folder = os.path.join(args.dir, "bpe")
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    vocab = tok.get_vocab_size()
    check(vocab <= 300, "trained vocabulary %d" % vocab)
    inputs = os.path.join(args.dir, "docs", "*.txt")

    # 1. No config: the special token <|endoftext|> (id 2) by its name.
    # 2. tokenizer_config.json's eos_token (the dict form) wins over the names: </s> (id 1).
    # 3. --eot-id wins over both.
    eot_by_name = tok.token_to_id("<|endoftext|>")
    cases = [("name", [], eot_by_name, "special token '<|endoftext|>'"),
             ("config", [], 1, "eos_token '</s>' of tokenizer_config.json"),
             ("flag", ["--eot-id", "7"], 7, "--eot-id")]
    for name, extra, eot, source in cases:
        if name == "config":
            with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
                json.dump({"eos_token": {"content": "</s>", "special": True}}, f)
        out = os.path.join(args.dir, "bpe_out_" + name)
        r = prepare(args.source, folder, inputs, out, extra)
        first = r.stdout.splitlines()[0]
        expected_line = ("tokenizer %s (Hugging Face; end-of-text %d, the %s, before each file): "
                         "set model.vocab=%d (or more) and data.eot_token=%d" %
                         (os.path.join(folder, "tokenizer.json"), eot, source, vocab, eot))
        check(first == expected_line, "first line\n  %s\nexpected\n  %s" % (first, expected_line))
        fmt, ids = read_back(args.dump, out)
        check(fmt == "llm.c", "%s: format %s, expected llm.c (uint16)" % (name, fmt))
        expected = []
        for text in texts:
            expected.append(eot)
            expected.extend(tok.encode(text, add_special_tokens=False).ids)
        check(ids == expected, "%s: ids differ from tokenizers' (first difference at %s)" %
              (name, next((i for i, (a, b) in enumerate(zip(ids, expected)) if a != b),
                          min(len(ids), len(expected)))))
        check(tok.decode(ids[1:1 + len(expected) // 4]).startswith("The quick brown fox"),
              "the ids do not decode to the text")
        print("ok: BPE (%d ids), eot %d from the %s: %d ids equal tokenizers'" %
              (vocab, eot, source, len(ids)))

    # --split paragraph: each paragraph of b.txt is a document of its own; progress after each
    # file, the last at 100%.
    out = os.path.join(args.dir, "bpe_out_paragraph")
    r = prepare(args.source, folder, inputs, out, ["--split", "paragraph", "--progress-every", "0"])
    lines = r.stderr.splitlines()
    check(len(lines) >= 2 and all(line.startswith("tokenised ") for line in lines) and
          lines[-1].startswith("tokenised 100% ("), "progress lines: %r" % r.stderr)
    _, ids = read_back(args.dump, out)
    sys.path.insert(0, os.path.join(args.source, "scripts"))
    import prepare_tokens
    expected = []
    for text in texts:
        for p in prepare_tokens.paragraphs(text.encode()):
            expected.append(1)
            expected.extend(tok.encode(p.decode(), add_special_tokens=False).ids)
    check(ids == expected, "--split paragraph: ids differ from tokenizers'")
    print("ok: --split paragraph, %d ids" % len(ids))


def wide_round_trip(args, texts):
    from tokenizers import Tokenizer, models, pre_tokenizers
    # A word-level vocabulary of 70,000 words; the text uses ids on both sides of 65,536.
    words = ["w%d" % i for i in range(70000)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    folder = os.path.join(args.dir, "wide")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "tokenizer.json")
    tok.save(path)
    docs = os.path.join(args.dir, "wide_docs")
    os.makedirs(docs, exist_ok=True)
    picks = [[(i * 7919 + k * 104729) % 70000 for i in range(120)] for k in range(3)]
    picks[0][:3] = [65535, 65536, 69999]
    for k, p in enumerate(picks):
        with open(os.path.join(docs, "%d.txt" % k), "w") as f:
            f.write(" ".join("w%d" % i for i in p) + "\n")
    inputs = os.path.join(docs, "*.txt")

    # No end-of-text token anywhere: one error line, exit 2.
    r = prepare(args.source, path, inputs, os.path.join(args.dir, "wide_none"), expect=2)
    lines = r.stderr.splitlines()
    check(len(lines) == 1 and lines[0].startswith("error: --tokenizer %s: no end-of-text token "
                                                  "found" % path) and
          lines[0].endswith("give --eot-id ID"), "no eot: stderr %r" % r.stderr)
    r = prepare(args.source, path, inputs, os.path.join(args.dir, "wide_bad"),
                ["--eot-id", "70000"], expect=2)
    check(r.stderr.strip() == "error: --eot-id 70000 is outside the tokenizer's vocabulary "
          "(0 to 69999)", "--eot-id 70000: %r" % r.stderr)
    print("ok: no end-of-text token: one error line, exit 2")

    # eos_token_id of config.json (a list, as Llama 3's generation_config.json has) when no
    # tokenizer_config.json names one.
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"eos_token_id": [69999, 5]}, f)
    r = prepare(args.source, folder, inputs, os.path.join(args.dir, "wide_config"))
    check("end-of-text 69999, the eos_token_id of config.json" in r.stdout, r.stdout)
    os.remove(os.path.join(folder, "config.json"))
    print("ok: end-of-text from config.json's eos_token_id")

    # The end-of-text as an added special token, id 70000: vocabulary 70,001, uint32 tokens.
    tok.add_special_tokens(["<|end_of_text|>"])
    tok.save(path)
    eot = tok.token_to_id("<|end_of_text|>")
    check(eot == 70000, "eot id %s" % eot)
    out = os.path.join(args.dir, "wide_out")
    r = prepare(args.source, folder, inputs, out)
    check("set model.vocab=70001 (or more) and data.eot_token=70000" in r.stdout, r.stdout)
    check("ids reach 70000: written as uint32" in r.stdout, r.stdout)
    with open(os.path.join(out, "train.bin"), "rb") as f:
        magic, version, count = struct.unpack("<3i", f.read(12))
    check((magic, version) == (20240801, 7), "header %d %d" % (magic, version))
    fmt, ids = read_back(args.dump, out)
    check(fmt == "llm.c uint32", "format %s" % fmt)
    expected = []
    for k in range(3):
        with open(os.path.join(docs, "%d.txt" % k)) as f:
            expected.append(eot)
            expected.extend(tok.encode(f.read(), add_special_tokens=False).ids)
    check(expected[1:4] == [65535, 65536, 69999], "reference ids %s" % expected[1:4])
    check(ids == expected, "uint32: ids differ from tokenizers'")
    with open(os.path.join(out, "tokens.json")) as f:
        meta = json.load(f)
    expected_meta = {"tokenizer": "huggingface", "tokenizer_path": os.path.abspath(path),
                     "vocab": 70001, "eot_token": 70000, "token_bytes": 4, "documents": "file",
                     "train_tokens": count, "val_tokens": len(ids) - count}
    check(meta == expected_meta, "tokens.json %s, expected %s" % (meta, expected_meta))
    check(count == len(dump(args.dump, os.path.join(out, "train.bin"))[1]), "header count")
    print("ok: uint32 file, %d ids equal tokenizers' (largest %d)" % (len(ids), max(ids)))
    return folder, inputs, out


def mistakes_are_one_line(args):
    """Inputs a user gets wrong: one "error:" line on stderr, exit 2, nothing written."""
    inputs = os.path.join(args.dir, "docs", "*.txt")
    empty = os.path.join(args.dir, "empty_folder")
    os.makedirs(empty, exist_ok=True)
    corrupt = os.path.join(args.dir, "corrupt.json")
    with open(corrupt, "w") as f:
        f.write('{"model": 3}')
    unknown_eos = os.path.join(args.dir, "unknown_eos")
    os.makedirs(unknown_eos, exist_ok=True)
    shutil.copy(os.path.join(args.dir, "bpe", "tokenizer.json"), unknown_eos)
    with open(os.path.join(unknown_eos, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>"}, f)
    cases = [
        (empty, [], "error: --tokenizer %s: the folder holds no tokenizer.json" % empty),
        (os.path.join(args.dir, "missing"), [],
         "error: --tokenizer %s: no such file or folder" % os.path.join(args.dir, "missing")),
        (corrupt, [], "error: --tokenizer %s: tokenizers cannot read it: " % corrupt),
        (unknown_eos, [], "error: --tokenizer %s: tokenizer_config.json's eos_token "
         "'<|im_end|>' is not in tokenizer.json; give --eot-id" %
         os.path.join(unknown_eos, "tokenizer.json")),
        ("bytes", ["--eot-id", "3"], "error: --eot-id is for a Hugging Face tokenizer"),
        (unknown_eos, ["--no-separator"], "error: --no-separator is for --tokenizer bytes"),
    ]
    for tokenizer, extra, start in cases:
        out = os.path.join(args.dir, "mistake")
        r = prepare(args.source, tokenizer, inputs, out, extra, expect=2)
        lines = r.stderr.splitlines()
        check(len(lines) == 1 and lines[0].startswith(start),
              "%s %s: stderr %r, expected one line starting %r" % (tokenizer, extra, r.stderr,
                                                                   start))
        check(not os.path.exists(os.path.join(out, "train.bin")), "train.bin written")
    print("ok: %d mistakes, one error line each, exit 2" % len(cases))


def trainer_trains_documents(args, out):
    """data.documents over the uint32 file, split at its end-of-text id 70000: a step trains."""
    r = run([args.trainer, "train", os.path.join(args.source, "configs", "gpt_text.yaml"),
             "data.path=" + os.path.join(out, "train.bin"), "data.val_path=", "run.steps=1",
             "run.overwrite=true", "memory.measure=false", "data.batch_size=2", "data.seq_len=16",
             "model.layers=1", "model.width=32", "model.heads=2", "model.context=16",
             "model.vocab=70001", "data.documents=true", "data.eot_token=70000",
             "run.dir=" + os.path.join(args.dir, "run_documents")])
    check("documents split at token 70000" in r.stdout, r.stdout)
    check(any(line.startswith("step 1/1") for line in r.stdout.splitlines()), r.stdout)
    print("ok: data.documents on the uint32 file, split at 70000: a step trained")


def trainer_refuses_bad_ids(args, folder, inputs):
    """The trainer on a uint32 file (end-of-text 3, so the first id above 65,535 is the third
    token): model.vocab 70001 trains a step; 65536 is refused before training, exit 2, one error
    line naming that position."""
    out = os.path.join(args.dir, "wide_out_eot3")
    prepare(args.source, folder, inputs, out, ["--eot-id", "3"])
    train = os.path.join(out, "train.bin")
    base = [args.trainer, "train", os.path.join(args.source, "configs", "gpt_text.yaml"),
            "data.path=" + train, "data.val_path=", "run.steps=1", "run.overwrite=true",
            "memory.measure=false", "data.batch_size=2", "data.seq_len=16", "model.layers=1",
            "model.width=32", "model.heads=2", "model.context=16"]
    run(base + ["model.vocab=70001", "run.dir=" + os.path.join(args.dir, "run_ok")])
    r = run(base + ["model.vocab=65536", "run.dir=" + os.path.join(args.dir, "run_bad")],
            expect=2)
    errors = [line for line in r.stderr.splitlines() if not line.startswith("hint: ")]
    _, ids = dump(args.dump, train)
    first = next(i for i, t in enumerate(ids) if t >= 65536)
    expected = ("error: token file '%s': token %d at position %d is outside the vocabulary of "
                "65536 (model.vocab); the file's largest token is %d" %
                (train, ids[first], first, max(ids)))
    check(errors == [expected], "stderr:\n%s\nexpected\n%s" % (r.stderr, expected))
    check(not any(line.startswith("step ") for line in r.stdout.splitlines()),
          "a step ran before the refusal:\n" + r.stdout)
    check(first == 2, "first id above 65535 at %d" % first)
    print("ok: trainer refuses token %d at %d for model.vocab 65536 (exit 2, one line)" %
          (ids[first], first))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--source", required=True)
    p.add_argument("--dump", required=True)
    p.add_argument("--trainer", required=True)
    p.add_argument("--dir", required=True)
    args = p.parse_args()
    if importlib.util.find_spec("tokenizers") is None:
        print("SKIP: the tokenizers package is not installed (scripts/setup.sh installs it)")
        sys.exit(77)
    shutil.rmtree(args.dir, ignore_errors=True)
    texts = documents(os.path.join(args.dir, "docs"))
    bpe_round_trip(args, texts)
    mistakes_are_one_line(args)
    folder, inputs, out = wide_round_trip(args, texts)
    trainer_trains_documents(args, out)
    trainer_refuses_bad_ids(args, folder, inputs)


if __name__ == "__main__":
    main()
