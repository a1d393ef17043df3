// Constrained generation (issue 13) checked by an independent validator: for every schema in
// tests/data/constraint and many seeds, `dsv4 generate --json-schema` on a tiny random model (temperature 1) must
// print text that JSON.parse accepts and that ajv (JSON Schema 2020-12) validates; --json output must parse;
// --grammar output must match the same grammar written as a JavaScript RegExp. Prints "N passed, N failed".
//
// usage: node constraint_check.mjs DSV4_BIN MODEL_DIR DATA_DIR
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import Ajv2020 from 'ajv/dist/2020.js';

const [bin, model, data] = process.argv.slice(2);
const ajv = new Ajv2020({ strict: false, allErrors: false });
let pass = 0, fail = 0;
const bad = (msg) => { fail++; console.log('FAIL: ' + msg); };

function generate(args) {
    const r = spawnSync(bin, ['generate', '-m', model, '--tokens', '5,6,7', ...args], { encoding: 'utf8' });
    if (r.status !== 0) return { err: `exit ${r.status}: ${r.stderr.trim()}` };
    if (!r.stdout.endsWith('\n')) return { err: 'no final newline' };
    return { text: r.stdout.slice(0, -1) };
}

const schemas = fs.readdirSync(data).filter((f) => f.endsWith('.json')).sort();
for (const file of schemas) {
    const schema = JSON.parse(fs.readFileSync(path.join(data, file), 'utf8'));
    const validate = ajv.compile(schema);
    for (let seed = 1; seed <= 6; seed++) {
        for (const n of [40, 120]) {
            const args = ['--json-schema', path.join(data, file), '--temp', '1', '--seed', String(seed), '-n', String(n), '--json-ws', '2'];
            if (seed % 3 === 0) args.push('--spec', 'ngram');
            const g = generate(args);
            if (g.err) { bad(`${file} seed ${seed} -n ${n}: ${g.err}`); continue; }
            let v;
            try { v = JSON.parse(g.text); } catch (e) { bad(`${file} seed ${seed} -n ${n}: does not parse: ${JSON.stringify(g.text)}`); continue; }
            if (!validate(v)) { bad(`${file} seed ${seed} -n ${n}: ajv: ${ajv.errorsText(validate.errors)}: ${g.text}`); continue; }
            pass++;
        }
    }
}
// JSON mode: any value, always parses
for (let seed = 1; seed <= 10; seed++) {
    const g = generate(['--json', '--temp', '1', '--seed', String(seed), '-n', '60']);
    if (g.err) { bad(`--json seed ${seed}: ${g.err}`); continue; }
    try { JSON.parse(g.text); pass++; } catch (e) { bad(`--json seed ${seed}: does not parse: ${JSON.stringify(g.text)}`); }
}
// the grammar, as an independent regular expression
const re = /^(yes|no|maybe), score ([1-9][0-9]?|100)\.$/;
for (let seed = 1; seed <= 10; seed++) {
    const g = generate(['--grammar', path.join(data, 'answer.gbnf'), '--temp', '1', '--seed', String(seed), '-n', '30']);
    if (g.err) { bad(`--grammar seed ${seed}: ${g.err}`); continue; }
    if (re.test(g.text)) pass++; else bad(`--grammar seed ${seed}: ${JSON.stringify(g.text)}`);
}
console.log(`${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
