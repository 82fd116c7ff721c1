#!/usr/bin/python3
"""Tokenise text files into llm.c's token format, for `data.source: tokens`.

    /usr/bin/python3 scripts/prepare_tokens.py --out data/text \\
        '/usr/share/common-licenses/*' '/usr/share/doc/*/copyright'
    /usr/bin/python3 scripts/prepare_tokens.py --tokenizer models/SmolLM-135M --out data/smol \\
        'corpus/*.txt'

Writes OUT/train.bin and OUT/val.bin (the last --val-fraction of the tokens) in llm.c's
format: a header of 256 little-endian int32 (magic, version, token count, zeros) followed by
the tokens, little-endian: uint16 (magic 20240520, version 1), or uint32 (magic 20240801,
version 7, llm.c's "llama-3" layout) when the vocabulary holds an id of 65,536 or above (Llama
3, Qwen). ferry also reads nanoGPT's headerless uint16 train.bin. docs/data.md has the layout.
OUT/tokens.json records what wrote them: the tokenizer (a Hugging Face one's tokenizer.json
path), vocabulary, end-of-text id, token width and token counts.

Tokenizers (--tokenizer):
  PATH   a Hugging Face tokenizer.json, or the model folder holding it, through the
         `tokenizers` library (offline): each document is the ids of its text (no special tokens
         added by the tokenizer's post-processor), preceded by the model's end-of-text token:
         --eot-id, else the eos_token of tokenizer_config.json, else eos_token_id of
         generation_config.json or config.json, else a special token named <|endoftext|>,
         <|end_of_text|>, </s> or <eos>. The script prints the model.vocab and data.eot_token
         to set.
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
model.vocab - 1, which is 50256 for gpt2 and 256 for bytes (a Hugging Face tokenizer's is
printed). With --split paragraph each paragraph (text between blank lines, the blank lines
dropped) is a document of its own instead of each file: shorter documents of real lengths.

Files are read in the order given, each glob's matches sorted; a directory or unreadable file
is skipped with a note. Progress goes to stderr every few seconds on long inputs. The script
prints the tokenizer and the model.vocab to use.
"""

import argparse
import glob
import hashlib
import json
import os
import re
import struct
import sys
import tempfile
import time
from array import array

MAGIC = 20240520
VERSION = 1
MAGIC32 = 20240801  # llm.c's uint32 ("llama-3") token files
VERSION32 = 7
U16_IDS = 65536  # a vocabulary larger than this needs uint32 tokens
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


# Special tokens that end a text, in the order they are looked for when no config names one.
EOT_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
KEYWORDS = ("auto", "gpt2", "bytes")


class HfTokenizer:
    """A Hugging Face tokenizer.json through the `tokenizers` library, and its end-of-text."""

    def __init__(self, arg, eot_id):
        path = arg
        if os.path.isdir(path):
            path = os.path.join(arg, "tokenizer.json")
            if not os.path.isfile(path):
                usage_error("--tokenizer %s: the folder holds no tokenizer.json (a model with "
                            "only a slow tokenizer: save it once with transformers' "
                            "AutoTokenizer.save_pretrained to get one)" % arg)
        elif not os.path.isfile(path):
            usage_error("--tokenizer %s: no such file or folder; give auto, gpt2, bytes, or a "
                        "Hugging Face tokenizer.json (or the folder holding it)" % arg)
        try:
            from tokenizers import Tokenizer
        except ImportError:
            usage_error("--tokenizer %s needs the tokenizers package; scripts/setup.sh installs "
                        "it (pip install tokenizers==0.20.3)" % arg)
        try:
            self.tok = Tokenizer.from_file(path)
        except Exception as e:  # the library's own error, one line
            usage_error("--tokenizer %s: tokenizers cannot read it: %s" %
                        (path, str(e).splitlines()[0] if str(e) else type(e).__name__))
        self.tok.no_truncation()  # a tokenizer.json may carry a model's max length: not here
        self.tok.no_padding()
        self.path = path
        self.folder = os.path.dirname(os.path.abspath(path))
        self.vocab = max(self.tok.get_vocab(with_added_tokens=True).values()) + 1
        self.eot, self.eot_source = self.end_of_text(eot_id)

    def read_json(self, name):
        path = os.path.join(self.folder, name)
        if not os.path.isfile(path):
            return {}
        try:
            with open(path, encoding="utf-8") as f:
                value = json.load(f)
        except (OSError, ValueError) as e:
            usage_error("--tokenizer: cannot read %s: %s" % (path, e))
        return value if isinstance(value, dict) else {}

    def end_of_text(self, eot_id):
        """(id, where it came from): --eot-id, the configs, then the special tokens by name."""
        if eot_id is not None:
            if not 0 <= eot_id < self.vocab:
                usage_error("--eot-id %d is outside the tokenizer's vocabulary (0 to %d)" %
                            (eot_id, self.vocab - 1))
            return eot_id, "--eot-id"
        eos = self.read_json("tokenizer_config.json").get("eos_token")
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str) and eos:
            tid = self.tok.token_to_id(eos)
            if tid is None:
                usage_error("--tokenizer %s: tokenizer_config.json's eos_token %r is not in "
                            "tokenizer.json; give --eot-id" % (self.path, eos))
            return tid, "eos_token %r of tokenizer_config.json" % eos
        for name in ("generation_config.json", "config.json"):
            ids = self.read_json(name).get("eos_token_id")
            if isinstance(ids, list) and ids:
                ids = ids[0]
            if isinstance(ids, int) and not isinstance(ids, bool) and 0 <= ids < self.vocab:
                return ids, "eos_token_id of %s" % name
        special = {t.content: i for i, t in self.tok.get_added_tokens_decoder().items()
                   if t.special}
        for name in EOT_NAMES:
            if name in special:
                return special[name], "special token %r" % name
        usage_error("--tokenizer %s: no end-of-text token found (no eos_token in "
                    "tokenizer_config.json, no eos_token_id in generation_config.json or "
                    "config.json, no special token %s); give --eot-id ID" %
                    (self.path, ", ".join(EOT_NAMES)))

    def encode(self, texts):
        """The ids of each text, without the post-processor's special tokens (a batch is encoded
        on all cores by the library)."""
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]


class Progress:
    """A line on stderr every few seconds while the inputs are tokenised; silent on short runs."""

    def __init__(self, total_bytes, every=3.0):
        self.total = max(total_bytes, 1)
        self.every = every
        self.start = time.monotonic()
        self.last = self.start
        self.shown = False
        self.tty = sys.stderr.isatty()

    def update(self, done_bytes, tokens, final=False):
        now = time.monotonic()
        if not final and now - self.last < self.every:
            return
        if final and not self.shown:
            return
        self.last = now
        self.shown = True
        mb = 1 << 20
        line = "tokenised %3.0f%% (%.1f of %.1f MiB), %d tokens, %.1f MiB/s" % (
            100.0 * done_bytes / self.total, done_bytes / mb, self.total / mb, tokens,
            done_bytes / mb / max(now - self.start, 1e-9))
        end = "\n" if final or not self.tty else ""
        print(("\r" if self.tty else "") + line, end=end, file=sys.stderr, flush=True)


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


def token_array(wide):
    """An empty array of uint32 (wide) or uint16 tokens."""
    if not wide:
        return array("H")
    for code in ("I", "L"):
        if array(code).itemsize == 4:
            return array(code)
    sys.exit("error: this Python has no 4-byte array type")


def write_tokens(path, tokens):
    """llm.c's format: 256 int32 header, then uint16 or uint32 tokens (little-endian)."""
    if len(tokens) >= 2**31:
        sys.exit("error: %s would hold %d tokens, more than llm.c's int32 count" %
                 (path, len(tokens)))
    wide = tokens.itemsize == 4
    header = [0] * HEADER_INTS
    header[0], header[1], header[2] = ((MAGIC32, VERSION32) if wide else (MAGIC, VERSION)) + (
        len(tokens),)
    body = tokens
    if sys.byteorder != "little":
        body.byteswap()
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "wb") as f:
            f.write(struct.pack("<%di" % HEADER_INTS, *header))
            f.write(body.tobytes())
    except OSError as e:
        usage_error("cannot write %s: %s; give another --out" % (path, e.strerror or e))


def write_meta(path, meta):
    """OUT/tokens.json: what wrote train.bin and val.bin (rewritten with them, never stale)."""
    try:
        with open(path, "w") as f:
            json.dump(meta, f, indent=1)
            f.write("\n")
    except OSError as e:
        usage_error("cannot write %s: %s; give another --out" % (path, e.strerror or e))


def total_bytes(files):
    """The inputs' size, for the progress line (files that cannot be sized count 0)."""
    total = 0
    for path in files:
        try:
            if os.path.isfile(path):
                total += os.path.getsize(path)
        except OSError:
            pass
    return total


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("inputs", nargs="+", help="text files or globs (quote them)")
    p.add_argument("--out", default="data/text", help="output folder (default data/text)")
    p.add_argument("--tokenizer", default="auto", metavar="auto|gpt2|bytes|PATH",
                   help="auto (default), gpt2, bytes, or a Hugging Face tokenizer.json or the "
                        "model folder holding it")
    p.add_argument("--eot-id", type=int, default=None,
                   help="Hugging Face tokenizer: the end-of-text id put before each document, "
                        "when the tokenizer's files name none (or another one is wanted)")
    p.add_argument("--val-fraction", type=float, default=0.1,
                   help="the last fraction of the tokens written to val.bin (default 0.1)")
    p.add_argument("--split", choices=("file", "paragraph"), default="file",
                   help="what a document is, each led by the separator: a file (default), or "
                        "a paragraph (text between blank lines)")
    p.add_argument("--progress-every", type=float, default=3.0, metavar="SECONDS",
                   help="a progress line on stderr at most this often (default 3; short inputs "
                        "finish before the first)")
    p.add_argument("--no-separator", action="store_true",
                   help="bytes: no separator token before each file (vocabulary 256); "
                        "data.documents then has no documents to split")
    args = p.parse_args()
    if not 0 < args.val_fraction < 1:
        sys.exit("error: --val-fraction must be in (0, 1), got %s" % args.val_fraction)
    if args.split == "paragraph" and args.no_separator:
        sys.exit("error: --split paragraph needs the separator; drop --no-separator")
    hf = args.tokenizer not in KEYWORDS
    if args.eot_id is not None and not hf:
        usage_error("--eot-id is for a Hugging Face tokenizer (--tokenizer PATH); %s has its own "
                    "separator" % args.tokenizer)
    if args.no_separator and hf:
        usage_error("--no-separator is for --tokenizer bytes")
    check_out_folder(args.out)

    encoding = None
    tokenizer = HfTokenizer(args.tokenizer, args.eot_id) if hf else None
    if args.tokenizer in ("auto", "gpt2"):
        encoding, why = gpt2_encoding()
        if encoding is None:
            if args.tokenizer == "gpt2":
                sys.exit("error: --tokenizer gpt2: " + why)
            print("note: %s; tokenising bytes" % why, file=sys.stderr)

    tokens = token_array(tokenizer is not None and tokenizer.vocab > U16_IDS)
    files = 0
    documents = 0
    paths = input_files(args.inputs)
    progress = Progress(total_bytes(paths), args.progress_every)
    done = 0
    pending = []  # Hugging Face: texts encoded a batch at a time
    pending_bytes = 0

    def flush():
        nonlocal pending, pending_bytes
        for ids in tokenizer.encode(pending):
            tokens.append(tokenizer.eot)
            tokens.extend(ids)
        pending, pending_bytes = [], 0

    for path, data in read_documents(paths):
        files += 1
        for doc in paragraphs(data) if args.split == "paragraph" else [data]:
            documents += 1
            if tokenizer is not None:
                pending.append(doc.decode("utf-8", errors="replace"))
                pending_bytes += len(doc)
                if len(pending) >= 4096 or pending_bytes >= 16 << 20:
                    flush()
            elif encoding is not None:
                tokens.append(GPT2_EOT)
                tokens.extend(encoding.encode_ordinary(doc.decode("utf-8", errors="replace")))
            else:
                if not args.no_separator:
                    tokens.append(BYTES_SEPARATOR)
                tokens.extend(doc)
        done += len(data)
        progress.update(done, len(tokens))  # tokens of documents still pending not counted yet
    if pending:
        flush()
    progress.update(done, len(tokens), final=True)
    if len(tokens) < 2:
        sys.exit("error: the inputs hold %d tokens; need at least 2 (train and val)" % len(tokens))

    val = max(1, int(len(tokens) * args.val_fraction + 0.5))
    val = min(val, len(tokens) - 1)
    train_path = os.path.join(args.out, "train.bin")
    val_path = os.path.join(args.out, "val.bin")
    write_tokens(train_path, tokens[: len(tokens) - val])
    write_tokens(val_path, tokens[len(tokens) - val:])

    if tokenizer is not None:
        meta = {"tokenizer": "huggingface", "tokenizer_path": os.path.abspath(tokenizer.path),
                "vocab": tokenizer.vocab, "eot_token": tokenizer.eot}
    elif encoding is not None:
        meta = {"tokenizer": "gpt2", "vocab": GPT2_VOCAB, "eot_token": GPT2_EOT}
    else:
        meta = {"tokenizer": "bytes", "vocab": 256 if args.no_separator else 257,
                "eot_token": None if args.no_separator else BYTES_SEPARATOR}
    meta.update({"token_bytes": tokens.itemsize, "documents": args.split,
                 "train_tokens": len(tokens) - val, "val_tokens": val})
    write_meta(os.path.join(args.out, "tokens.json"), meta)

    if tokenizer is not None:
        print("tokenizer %s (Hugging Face; end-of-text %d, the %s, before each %s): set "
              "model.vocab=%d (or more) and data.eot_token=%d" %
              (tokenizer.path, tokenizer.eot, tokenizer.eot_source, args.split, tokenizer.vocab,
               tokenizer.eot))
    else:
        if encoding is not None:
            name, vocab = "gpt2 (tiktoken BPE)", GPT2_VOCAB
        elif args.no_separator:
            name, vocab = "bytes", 256
        else:
            name, vocab = "bytes (separator %d before each %s)" % (BYTES_SEPARATOR,
                                                                   args.split), 257
        print("tokenizer %s: set model.vocab=%d (or more)" % (name, vocab))
    print("read %d file%s: %d tokens%s" % (files, "" if files == 1 else "s", len(tokens),
                                            ", %d paragraphs" % documents
                                            if args.split == "paragraph" else ""))
    print("train %s: %d tokens" % (train_path, len(tokens) - val))
    print("val   %s: %d tokens" % (val_path, val))
    if tokens.itemsize == 4:
        print("ids reach %d: written as uint32 (llm.c's magic 20240801, version 7)" %
              (tokenizer.vocab - 1))


if __name__ == "__main__":
    main()
