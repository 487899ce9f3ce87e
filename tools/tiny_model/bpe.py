"""A byte-level BPE tokenizer trained from scratch, written as a Hugging Face tokenizer.json in the
same schema as DeepSeek-V3's: model BPE with vocab and merges ("a b" strings), DeepSeek-V3's
pre-tokenizer unchanged (three regex Splits then ByteLevel without its own regex), ByteLevel
decoder and post-processor, added tokens for BOS/EOS and the chat roles.

Ids: 0 = BOS and 1 = EOS (in model.vocab, as in DeepSeek-V3), then the 256 byte symbols in byte
order, then one token per merge; the two chat-role tokens come last, after model.vocab, as
DeepSeek-V3's <｜User｜> and <｜Assistant｜> do.
"""

import collections
import heapq
import json
import os

import regex

from . import dsv3_spec
from .dsv3_spec import BOS, EOS

USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"


def bytes_to_unicode():
    """GPT-2's reversible map from bytes to printable unicode characters (ByteLevel's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


class PreTokenizer:
    """DeepSeek-V3's pre-tokenizer: Split(regex, Isolated) x3 then ByteLevel(use_regex=false)."""

    def __init__(self, spec=None):
        spec = spec or dsv3_spec.PRE_TOKENIZER
        assert spec["type"] == "Sequence"
        self.patterns = []
        for p in spec["pretokenizers"]:
            if p["type"] == "Split":
                assert p["behavior"] == "Isolated" and not p["invert"]
                self.patterns.append(regex.compile(p["pattern"]["Regex"]))
            else:
                assert p["type"] == "ByteLevel" and not p["use_regex"] and not p["add_prefix_space"]

    def split(self, text):
        """-> list of text pieces (before the byte-level mapping)."""
        pieces = [text]
        for pat in self.patterns:
            out = []
            for piece in pieces:
                pos = 0
                for m in pat.finditer(piece):
                    if m.start() > pos:
                        out.append(piece[pos:m.start()])
                    if m.end() > m.start():
                        out.append(m.group())
                    pos = m.end()
                if pos < len(piece):
                    out.append(piece[pos:])
            pieces = out
        return pieces

    def __call__(self, text):
        """-> list of byte-level strings (each char one byte)."""
        return ["".join(BYTE_TO_CHAR[b] for b in p.encode("utf-8")) for p in self.split(text)]


def train_bpe(texts, vocab_size, log=print):
    """Trains merges on the pre-tokens of `texts` until model.vocab has vocab_size - 2 entries
    (two ids are left for the chat-role tokens). Ties between equally frequent pairs go to the
    lexicographically smallest pair, so the result is deterministic. -> list of (a, b) merges."""
    pre = PreTokenizer()
    counts = collections.Counter()
    for t in texts:
        counts.update(pre(t))
    words = [list(w) for w in sorted(counts)]
    freq = [counts["".join(w)] for w in words]
    pair_count = collections.Counter()
    where = collections.defaultdict(set)
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] += freq[i]
            where[(a, b)].add(i)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    n_tokens = vocab_size - 2 - 2 - 256  # new symbols to make (two merges may make the same one)
    merges = []
    made = set(BYTE_TO_CHAR.values())
    while len(made) - 256 < n_tokens and heap:
        negc, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negc or -negc <= 0:
            continue  # stale entry
        merges.append(pair)
        a, b = pair
        merged = a + b
        made.add(merged)
        changed = set()
        for i in list(where[pair]):
            w = words[i]
            if len(w) < 2:
                continue
            f = freq[i]
            for x, y in zip(w, w[1:]):
                pair_count[(x, y)] -= f
                changed.add((x, y))
            out = []
            j = 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    out.append(merged)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
            for x, y in zip(out, out[1:]):
                pair_count[(x, y)] += f
                where[(x, y)].add(i)
                changed.add((x, y))
        del where[pair]
        pair_count.pop(pair, None)
        for p in changed:
            c = pair_count.get(p, 0)
            if c > 0:
                heapq.heappush(heap, (-c, p))
            elif p in pair_count:
                del pair_count[p]
        if len(merges) % 1000 == 0:
            log(f"  bpe: {len(merges)} merges, last {merged!r} x{-negc}")
    return merges


class Tokenizer:
    """Encoder/decoder for the trained BPE (the same algorithm the tokenizer.json describes)."""

    def __init__(self, merges):
        self.merges = list(merges)
        self.vocab = {BOS: 0, EOS: 1}
        for b in range(256):
            self.vocab[BYTE_TO_CHAR[b]] = 2 + b
        for a, b in self.merges:
            self.vocab.setdefault(a + b, len(self.vocab))
        self.added = [(len(self.vocab), USER), (len(self.vocab) + 1, ASSISTANT)]
        self.id_to_token = {i: t for t, i in self.vocab.items()}
        for i, t in self.added:
            self.id_to_token[i] = t
        self.special = {BOS: 0, EOS: 1, USER: self.added[0][0], ASSISTANT: self.added[1][0]}
        self.vocab_size = len(self.id_to_token)
        self.bos_id, self.eos_id = 0, 1
        self.rank = {m: r for r, m in enumerate(self.merges)}
        self.pre = PreTokenizer()
        self._special_re = regex.compile("|".join(regex.escape(s) for s in self.special))
        self._cache = {}

    def _bpe(self, piece):
        if piece in self._cache:
            return self._cache[piece]
        sym = list(piece)
        while len(sym) > 1:
            best, best_rank = None, None
            for j in range(len(sym) - 1):
                r = self.rank.get((sym[j], sym[j + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = j, r
            if best is None:
                break
            a, b = sym[best], sym[best + 1]
            out, j = [], 0
            while j < len(sym):
                if j + 1 < len(sym) and sym[j] == a and sym[j + 1] == b:
                    out.append(a + b)
                    j += 2
                else:
                    out.append(sym[j])
                    j += 1
            sym = out
        ids = [self.vocab[s] for s in sym]
        self._cache[piece] = ids
        return ids

    def encode(self, text, add_bos=False):
        ids = [self.bos_id] if add_bos else []
        pos = 0
        for m in self._special_re.finditer(text):
            ids += self._encode_plain(text[pos:m.start()])
            ids.append(self.special[m.group()])
            pos = m.end()
        ids += self._encode_plain(text[pos:])
        return ids

    def _encode_plain(self, text):
        ids = []
        if text:
            for piece in self.pre(text):
                ids += self._bpe(piece)
        return ids

    def decode(self, ids):
        out = bytearray()
        for i in ids:
            t = self.id_to_token[i]
            if t in self.special:
                out += t.encode("utf-8")
            else:
                out += bytes(CHAR_TO_BYTE[c] for c in t)
        return out.decode("utf-8", errors="replace")

    # -- files -----------------------------------------------------------------------------------
    def tokenizer_json(self):
        def added(i, content):
            return {"id": i, "content": content, "single_word": False, "lstrip": False,
                    "rstrip": False, "normalized": False, "special": True}
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [added(0, BOS), added(1, EOS)] + [added(i, t) for i, t in self.added],
            "normalizer": {"type": "Sequence", "normalizers": []},
            "pre_tokenizer": dsv3_spec.PRE_TOKENIZER,
            "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                               "use_regex": True},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False,
                      "vocab": self.vocab,
                      "merges": [f"{a} {b}" for a, b in self.merges]},
        }


    def save(self, out_dir, max_len):
        with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(self.tokenizer_json(), f, ensure_ascii=False, indent=2)
            f.write("\n")
        with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(dsv3_spec.tokenizer_config(dsv3_spec.CHAT_TEMPLATE, max_len), f, ensure_ascii=False, indent=2)
            f.write("\n")

    @classmethod
    def load(cls, path):
        with open(path, encoding="utf-8") as f:
            j = json.load(f)
        return cls([tuple(m.split(" ")) for m in j["model"]["merges"]])
