// Reference encoder: @huggingface/tokenizers (pure JS, independent of our C code).
// usage: node ref_encode.mjs TOKDIR CORPUS.jsonl   (one JSON string per line) -> one comma-separated id line each
//        node ref_encode.mjs TOKDIR --bench FILE   -> "MB/s" encoding FILE's lines
import fs from 'node:fs';
import path from 'node:path';
import { Tokenizer } from '@huggingface/tokenizers';

const [dir, a, b] = process.argv.slice(2);
const tj = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8'));
const tc = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
const tok = new Tokenizer(tj, tc);
const enc = (s) => tok.encode(s, { add_special_tokens: false }).ids;
if (a === '--bench') {
    const text = fs.readFileSync(b, 'utf8');
    const lines = text.split('\n');
    const bytes = Buffer.byteLength(text);
    let best = Infinity;
    for (let r = 0; r < 3; r++) {
        const t0 = process.hrtime.bigint();
        for (const l of lines) enc(l);
        const dt = Number(process.hrtime.bigint() - t0) / 1e9;
        best = Math.min(best, dt);
    }
    console.log((bytes / 1e6 / best).toFixed(2));
} else {
    const lines = fs.readFileSync(a, 'utf8').split('\n').filter((l) => l.length);
    const out = lines.map((l) => enc(JSON.parse(l)).join(','));
    process.stdout.write(out.join('\n') + '\n');
}
