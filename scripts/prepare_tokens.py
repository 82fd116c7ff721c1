#!/usr/bin/python3
"""Tokenise text files into llm.c's token format, for `data.source: tokens`.

    /usr/bin/python3 scripts/prepare_tokens.py --out data/text \\
        '/usr/share/common-licenses/*' '/usr/share/doc/*/copyright'

Writes OUT/train.bin and OUT/val.bin (the last --val-fraction of the tokens) in llm.c's
format: a header of 256 little-endian int32 (magic 20240520, version 1, token count, zeros)
followed by the tokens as little-endian uint16. ferry also reads nanoGPT's headerless uint16
train.bin.

Tokenizers (--tokenizer):
  gpt2   GPT-2's BPE through tiktoken (vocabulary 50257); each file is preceded by
         <|endoftext|> (50256), as llm.c's scripts do. Needs tiktoken and its gpt2 encoding
         files already cached (no network is used: TIKTOKEN_CACHE_DIR, DATA_GYM_CACHE_DIR or
         <tmp>/data-gym-cache).
  bytes  one token per byte, each file preceded by the separator 256 (vocabulary 257), so
         decoding is bytes(t for t in tokens if t != 256); with --no-separator the files' bytes
         are concatenated as they are (vocabulary 256).
  auto   gpt2 when it works offline, else bytes (the default).

The separator before every file (the end-of-text token of the previous one) is what
`data.documents: true` splits the stream at: ferry's `data.eot_token` defaults to
model.vocab - 1, which is 50256 for gpt2 and 256 for bytes. With --split paragraph each
paragraph (text between blank lines, the blank lines dropped) is a document of its own instead
of each file: shorter documents of real lengths.

Files are read in the order given, each glob's matches sorted; a directory or unreadable file
is skipped with a note. The script prints the tokenizer and the model.vocab to use.
"""

import argparse
import glob
import hashlib
import os
import re
import struct
import sys
import tempfile
from array import array

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
GPT2_VOCAB = 50257
GPT2_EOT = 50256
BYTES_SEPARATOR = 256  # one past the bytes: the bytes tokenizer's end-of-text token
# The files tiktoken's gpt2 encoding loads (tiktoken_ext/openai_public.py).
GPT2_FILES = (
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
)


def tiktoken_cache_dir():
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return os.environ["TIKTOKEN_CACHE_DIR"]
    if "DATA_GYM_CACHE_DIR" in os.environ:
        return os.environ["DATA_GYM_CACHE_DIR"]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def gpt2_encoding():
    """tiktoken's gpt2 encoding when it loads without the network, else (None, reason)."""
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        return None, "tiktoken is not installed"
    cache = tiktoken_cache_dir()
    for url in GPT2_FILES:
        key = hashlib.sha1(url.encode()).hexdigest()
        if not os.path.isfile(os.path.join(cache, key)):
            return None, "tiktoken's gpt2 files are not cached in %s (no download is tried)" % cache
    try:
        return tiktoken.get_encoding("gpt2"), ""
    except Exception as e:  # a damaged cache: fall back rather than fail
        return None, "tiktoken could not load gpt2 offline: %s" % e


def input_files(patterns):
    files = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            print("note: %s matches no file" % pattern, file=sys.stderr)
        files.extend(matches)
    return files


def read_documents(files):
    for path in files:
        if os.path.isdir(path):
            print("note: skipping directory %s" % path, file=sys.stderr)
            continue
        try:
            with open(path, "rb") as f:
                yield path, f.read()
        except OSError as e:
            print("note: skipping %s: %s" % (path, e.strerror), file=sys.stderr)


def paragraphs(data):
    """The non-blank paragraphs of `data` (bytes), split at lines holding only whitespace."""
    return [p for p in re.split(rb"\n[ \t\r\f\v]*\n\s*", data) if p.strip()]


def usage_error(message):
    """One line on stderr and exit 2: an input the user can fix, never a traceback."""
    print("error: " + message, file=sys.stderr)
    sys.exit(2)


def check_out_folder(out):
    """--out must be a folder or a path a folder can be made at, checked before any reading."""
    if os.path.exists(out) and not os.path.isdir(out):
        usage_error("--out %s is a file, not a folder: give a folder (train.bin and val.bin are "
                    "written into it)" % out)
    parent = os.path.abspath(out)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        usage_error("--out %s: %s is a file, not a folder" % (out, parent))


def write_tokens(path, tokens):
    """llm.c's format: 256 int32 header, then uint16 tokens (little-endian)."""
    if len(tokens) >= 2**31:
        sys.exit("error: %s would hold %d tokens, more than llm.c's int32 count" %
                 (path, len(tokens)))
    header = [0] * HEADER_INTS
    header[0], header[1], header[2] = MAGIC, VERSION, len(tokens)
    body = array("H", tokens)
    if sys.byteorder != "little":
        body.byteswap()
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "wb") as f:
            f.write(struct.pack("<%di" % HEADER_INTS, *header))
            f.write(body.tobytes())
    except OSError as e:
        usage_error("cannot write %s: %s; give another --out" % (path, e.strerror or e))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("inputs", nargs="+", help="text files or globs (quote them)")
    p.add_argument("--out", default="data/text", help="output folder (default data/text)")
    p.add_argument("--tokenizer", choices=("auto", "gpt2", "bytes"), default="auto")
    p.add_argument("--val-fraction", type=float, default=0.1,
                   help="the last fraction of the tokens written to val.bin (default 0.1)")
    p.add_argument("--split", choices=("file", "paragraph"), default="file",
                   help="what a document is, each led by the separator: a file (default), or "
                        "a paragraph (text between blank lines)")
    p.add_argument("--no-separator", action="store_true",
                   help="bytes: no separator token before each file (vocabulary 256); "
                        "data.documents then has no documents to split")
    args = p.parse_args()
    if not 0 < args.val_fraction < 1:
        sys.exit("error: --val-fraction must be in (0, 1), got %s" % args.val_fraction)
    check_out_folder(args.out)

    encoding = None
    if args.tokenizer != "bytes":
        encoding, why = gpt2_encoding()
        if encoding is None:
            if args.tokenizer == "gpt2":
                sys.exit("error: --tokenizer gpt2: " + why)
            print("note: %s; tokenising bytes" % why, file=sys.stderr)

    tokens = array("H")
    files = 0
    documents = 0
    if args.split == "paragraph" and args.no_separator:
        sys.exit("error: --split paragraph needs the separator; drop --no-separator")
    for path, data in read_documents(input_files(args.inputs)):
        files += 1
        for doc in paragraphs(data) if args.split == "paragraph" else [data]:
            documents += 1
            if encoding is not None:
                tokens.append(GPT2_EOT)
                tokens.extend(encoding.encode_ordinary(doc.decode("utf-8", errors="replace")))
            else:
                if not args.no_separator:
                    tokens.append(BYTES_SEPARATOR)
                tokens.extend(doc)
    if len(tokens) < 2:
        sys.exit("error: the inputs hold %d tokens; need at least 2 (train and val)" % len(tokens))

    val = max(1, int(len(tokens) * args.val_fraction + 0.5))
    val = min(val, len(tokens) - 1)
    train_path = os.path.join(args.out, "train.bin")
    val_path = os.path.join(args.out, "val.bin")
    write_tokens(train_path, tokens[: len(tokens) - val])
    write_tokens(val_path, tokens[len(tokens) - val:])

    if encoding is not None:
        name, vocab = "gpt2 (tiktoken BPE)", GPT2_VOCAB
    elif args.no_separator:
        name, vocab = "bytes", 256
    else:
        name, vocab = "bytes (separator %d before each %s)" % (BYTES_SEPARATOR, args.split), 257
    print("tokenizer %s: set model.vocab=%d (or more)" % (name, vocab))
    print("read %d file%s: %d tokens%s" % (files, "" if files == 1 else "s", len(tokens),
                                            ", %d paragraphs" % documents
                                            if args.split == "paragraph" else ""))
    print("train %s: %d tokens" % (train_path, len(tokens) - val))
    print("val   %s: %d tokens" % (val_path, val))


if __name__ == "__main__":
    main()
