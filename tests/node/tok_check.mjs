// Differential tokenizer test: dsv4 tokenize vs @huggingface/tokenizers (independent JS implementation) on the
// corpus, fixed vectors from the spec and seeded random fuzz; plus decode(encode(x)) == x and long-input timing.
// usage: node tok_check.mjs DSV4_BIN TOKDIR CORPUS.jsonl VECTORS.jsonl    -> prints "N passed, N failed"
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { Tokenizer } from '@huggingface/tokenizers';

const [bin, dir, corpusFile, vectorsFile] = process.argv.slice(2);
const tok = new Tokenizer(JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8')),
                          JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8')));
const ref = (s) => tok.encode(s, { add_special_tokens: false }).ids;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'dsv4tok-'));
let passed = 0, failed = 0;
const check = (ok, what) => { if (ok) passed++; else { failed++; console.log('FAIL ' + what); } };

function ours(texts, extra = []) {
    const f = path.join(tmp, 'in.jsonl');
    fs.writeFileSync(f, texts.map((s) => JSON.stringify(s)).join('\n') + '\n');
    const out = execFileSync(bin, ['tokenize', '--tokenizer', path.join(dir, 'tokenizer.json'), '--jsonl', '--file', f, ...extra],
                             { maxBuffer: 1 << 30 }).toString();
    return out.split('\n').slice(0, texts.length);
}
function decodeOurs(idLines) {
    const f = path.join(tmp, 'ids.txt');
    fs.writeFileSync(f, idLines.join('\n') + '\n');
    const out = execFileSync(bin, ['tokenize', '--tokenizer', path.join(dir, 'tokenizer.json'), '--jsonl', '--decode', '--file', f],
                             { maxBuffer: 1 << 30 }).toString();
    return out.split('\n').slice(0, idLines.length).map((l) => JSON.parse(l));
}
function compare(name, texts) {
    const got = ours(texts);
    texts.forEach((s, i) => {
        const want = ref(s).join(',');
        check(got[i] === want, `${name}[${i}] ${JSON.stringify(s).slice(0, 80)}\n  want ${want.slice(0, 200)}\n  got  ${(got[i] || '').slice(0, 200)}`);
    });
    const back = decodeOurs(got);
    texts.forEach((s, i) => check(back[i] === s, `${name}[${i}] decode(encode(x)) != x for ${JSON.stringify(s).slice(0, 80)}`));
}

// 1. fixed vectors from the spec (ids known independently of both implementations)
const vectors = fs.readFileSync(vectorsFile, 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l));
const vgot = ours(vectors.map((v) => v.text));
vectors.forEach((v, i) => check(vgot[i] === v.ids.join(','), `vector ${JSON.stringify(v.text)}: want ${v.ids} got ${vgot[i]}`));
vectors.forEach((v) => check(ref(v.text).join(',') === v.ids.join(','), `reference disagrees with spec vector ${JSON.stringify(v.text)}`));

// 2. the assembled corpus
const corpus = fs.readFileSync(corpusFile, 'utf8').split('\n').filter((l) => l.length).map((l) => JSON.parse(l));
compare('corpus', corpus);

// 3. seeded fuzz: strings drawn from pools that stress the pre-tokenizer boundaries
let seed = 12345;
const rnd = (n) => { seed = (seed * 1103515245 + 12345) & 0x7fffffff; return seed % n; };
const pools = [
    'abcXYZ', '0123456789', ' ', '  ', '\t', '\n', '\r\n', '\r', '.,;:!?-_()[]{}<>"\'`/\\@#$%^&*+=|~',
    '中文字符测试', 'ひらがなカタカナ', '한국어', 'مرحبا', 'नमस्ते', '😀🎉👍🏽👨‍👩‍👧', '²³½①١٢٣１２',
    '\u00a0\u3000\u2009\u0085\u2028\ufeff\u180e', '，。！“”—…', 'éàüñ', '\u0301\u0308', '\u0000\u0001\u007f',
    '<｜User｜>', '<think>', '</think>', '｜DSML｜', '<｜end▁of▁sentence｜>', '<|place_holder_mm_span_0100|>',
];
const fuzz = [];
for (let k = 0; k < 400; k++) {
    let s = '';
    const len = 1 + rnd(24);
    for (let j = 0; j < len; j++) {
        const p = [...pools[rnd(pools.length)]];
        if (p.length > 6 && rnd(2)) s += p.join(''); else s += p[rnd(p.length)].repeat(1 + rnd(3));
    }
    fuzz.push(s);
}
compare('fuzz', fuzz);

// 4. plain mode must not produce added-token ids for text that spells them
const plain = execFileSync(bin, ['tokenize', '--tokenizer', path.join(dir, 'tokenizer.json'), '--plain', '--text', '<｜User｜><think>x</think>']).toString().trim().split(',').map(Number);
check(plain.every((id) => id < 128000), `--plain produced an added-token id: ${plain}`);

// 5. long inputs stay fast (no quadratic pieces) and stay exact
const longs = { 'letters': 'a'.repeat(1 << 20), 'digits': '7'.repeat(1 << 20), 'cjk': '中'.repeat(350000),
                'spaces': ' '.repeat(1 << 20) + 'x', 'punct': '!'.repeat(1 << 20), 'mixed': 'ab1 中。'.repeat(100000) };
for (const [name, s] of Object.entries(longs)) {
    const t0 = Date.now();
    const got = ours([s])[0];
    const dt = (Date.now() - t0) / 1000;
    check(dt < 10, `long ${name}: ${dt}s for ${Buffer.byteLength(s)} bytes`);
    if (name !== 'letters' && name !== 'cjk' && name !== 'punct') check(got === ref(s).join(','), `long ${name}: ids differ from reference`);
    else {
        // The reference BPE is quadratic on one huge piece; compare a 64 KiB prefix-sized sample instead.
        const small = [...s].slice(0, 20000).join('');
        check(ours([small])[0] === ref(small).join(','), `long ${name} (20k chars): ids differ from reference`);
    }
}
fs.rmSync(tmp, { recursive: true, force: true });
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
