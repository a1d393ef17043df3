#!/usr/bin/env bash
# dsv4 bench --json FILE and --context LIST (issue 18's instrument): the file parses, holds the sections of the run
# with the numbers the table printed (decode tok/s, one row per stream count and per context), and a file that
# cannot be written is one error line. Run from the repository root with DSV4_BIN set; prints "N passed, N failed".
. "$(dirname "$0")/lib.sh"

"$BIN" tiny -o "$T/m" >/dev/null 2>&1 || { echo "tiny failed"; echo "0 passed, 1 failed"; exit 1; }
expect_ok "bench --json" "$BIN" bench -m "$T/m" --no-bandwidth --prompt 8 --decode 4 --streams 1,3 --context 0,300 --json "$T/r.json"
cp "$T/out" "$T/table"
# the JSON is read by node (an independent parser), and its decode rate must be the one the table printed
node -e '
const fs = require("fs");
const r = JSON.parse(fs.readFileSync(process.argv[1], "utf8")), table = fs.readFileSync(process.argv[2], "utf8");
const fail = (m) => { console.log("FAIL: " + m); process.exitCode = 1; };
if (r.model.layers !== 6 || typeof r.model.decode_bytes_per_token !== "number") fail("model section: " + JSON.stringify(r.model));
const d = /decode, 1 stream\s+([0-9.]+) tok\/s/.exec(table);
if (!d || Math.abs(r.single_stream.decode_tok_s - Number(d[1])) > 0.006) fail("decode tok/s " + r.single_stream.decode_tok_s + " vs table " + (d && d[1]));
if (r.single_stream.prompt_tokens !== 8 || !(r.single_stream.prefill_tok_s > 0)) fail("single_stream: " + JSON.stringify(r.single_stream));
if (!Array.isArray(r.streams) || r.streams.map((x) => x.streams).join() !== "1,3") fail("streams rows: " + JSON.stringify(r.streams));
if (!Array.isArray(r.context) || r.context.map((x) => x.context).join() !== "0,300" || !(r.context[1].decode_tok_s > 0))
  fail("context rows: " + JSON.stringify(r.context));
if (!/^ +300 +[0-9.]+ +[0-9.]+$/m.test(table)) fail("no table row for the 300-token context");
if (r.machine !== undefined) fail("--no-bandwidth still reported a bandwidth");
// the verify step (6 tokens) reads the fixed weights and the distinct experts of its tokens: at least the bytes of one,
// at most six tokens worth (each one its own experts), and the table line says the same
const s = r.single_stream, one = r.model.decode_bytes_per_token, v = /verify step weights\s+([0-9.]+) GB\/step\s+([0-9.]+)x/.exec(table);
if (!(s.verify_step_weight_bytes >= one && s.verify_step_weight_bytes <= 6 * one)) fail("verify bytes " + s.verify_step_weight_bytes + " vs one token " + one);
if (Math.abs(s.verify_step_bytes_vs_one_token * one / s.verify_step_weight_bytes - 1) > 1e-5) fail("verify ratio " + s.verify_step_bytes_vs_one_token);
if (!v || Math.abs(Number(v[1]) - s.verify_step_weight_bytes / 1e9) > 0.0006 || Math.abs(Number(v[2]) - s.verify_step_bytes_vs_one_token) > 0.006)
  fail("verify line " + (v && v[0]) + " vs json " + s.verify_step_weight_bytes);
' "$T/r.json" "$T/table" >"$T/node.out" 2>&1
if [ -s "$T/node.out" ]; then bad "json: $(cat "$T/node.out")"; else ok; fi
# without --no-bandwidth a CPU model's run also measures the multiply-add peak (backend/cpu/peak.h) and holds the
# linears' counted work against it: the JSON has the peak and each stream row's flops (N x one token's), and the
# table's last column is that work over the step's time over the peak (the JSON keeps 6 significant digits)
expect_ok "bench with the peak" "$BIN" bench -m "$T/m" --prompt 8 --decode 4 --streams 1,3 --json "$T/p.json"
node -e '
const fs = require("fs");
const r = JSON.parse(fs.readFileSync(process.argv[1], "utf8")), table = fs.readFileSync(process.argv[2], "utf8");
const fail = (m) => { console.log("FAIL: " + m); process.exitCode = 1; };
const peak = r.machine && r.machine.multiply_add_peak_gflop_s, f = r.single_stream.token_linear_flops;
if (!(peak > 0) || !(f > 0)) fail("peak " + peak + ", token flops " + f);
if (!/^multiply-add peak +[0-9.]+ GFLOP\/s/m.test(table)) fail("no peak line");
for (const row of r.streams) {
  if (Math.abs(row.step_linear_flops / (row.streams * f) - 1) > 1e-5) fail("row " + row.streams + ": " + row.step_linear_flops + " flops vs " + row.streams + " x " + f);
  const m = new RegExp("^ +" + row.streams + " .* ([0-9.]+)%$", "m").exec(table), want = 100 * row.step_linear_flops / (row.step_ms_mean * 1e-3) / 1e9 / peak;
  if (!m || Math.abs(Number(m[1]) - want) > 0.051 + 1e-3 * want) fail("row " + row.streams + " of peak: " + (m && m[1]) + " vs " + want);
}
const d = Math.abs(r.single_stream.decode_peak_fraction / (f * r.single_stream.decode_tok_s / 1e9 / peak) - 1);
if (!(d < 3e-5)) fail("decode fraction " + r.single_stream.decode_peak_fraction);
' "$T/p.json" "$T/out" >"$T/node.out" 2>&1
if [ -s "$T/node.out" ]; then bad "peak: $(cat "$T/node.out")"; else ok; fi
# a run shorter than the verify step's 6 tokens (1 + 2 here): the verify step still has its own 6 ids (it read past
# the bench's 3 before: a token id outside the vocabulary on the GPU, a heap overflow under ASan)
expect_ok "bench with fewer tokens than the verify step" "$BIN" bench -m "$T/m" --no-bandwidth --prompt 1 --decode 2
if grep -q "^speculative verify step" "$T/out"; then ok; else bad "short bench: $(tail -2 "$T/out")"; fi
# --kernel-trace traces GPU kernels: on a CPU model one line says so (and nothing runs)
"$BIN" bench -m "$T/m" --no-bandwidth --prompt 4 --decode 2 --kernel-trace >"$T/kt.out" 2>"$T/kt.err"; rc=$?
if [ $rc -ne 0 ] && grep -q -- "--kernel-trace traces the GPU's kernels: it needs --device cuda" "$T/kt.err" && [ ! -s "$T/kt.out" ]; then ok
else bad "--kernel-trace on the CPU: exit $rc, $(cat "$T/kt.err")"; fi
# a context at the model's maximum (V4: 1M positions) starts the decode steps that many rows short, and says so
expect_ok "bench --context at the maximum position" "$BIN" bench -m "$T/m" --no-bandwidth --prompt 4 --decode 3 --context 1048576 --json "$T/max.json"
if grep -q "^ *1048576 .*(from position 1048573: the model's maximum is 1048576)" "$T/out" &&
   node -e 'const r = JSON.parse(require("fs").readFileSync(process.argv[1])); process.exit(r.context[0].start === 1048573 && r.context[0].context === 1048576 ? 0 : 1)' "$T/max.json"
then ok; else bad "context at the maximum: $(grep -i context "$T/out" | tail -2)"; fi
# --prefill-chunk: 10 prompt tokens in steps of 4 are three steps, the last of 2; the JSON says so
expect_ok "bench --prefill-chunk" "$BIN" bench -m "$T/m" --no-bandwidth --prompt 10 --prefill-chunk 4 --decode 2 --json "$T/c.json"
if grep -q "^prefill .*(10 tokens in 3 steps of 4; the first step [0-9.]* tok/s, the last [0-9.]*)" "$T/out" &&
   node -e 'const s = JSON.parse(require("fs").readFileSync(process.argv[1])).single_stream;
            process.exit(s.prefill_steps === 3 && s.prefill_chunk_tokens === 4 && s.prefill_last_step_tok_s > 0 ? 0 : 1)' "$T/c.json"
then ok; else bad "prefill chunks: $(grep -i prefill "$T/out")"; fi
# --warmup: the timed prefill follows an untimed one (one step and chunked), and the JSON says so
expect_ok "bench --warmup" "$BIN" bench -m "$T/m" --no-bandwidth --prompt 10 --decode 2 --warmup --json "$T/w.json"
if grep -q "^prefill .*(10 tokens in one step, after a warm-up prefill)" "$T/out" &&
   node -e 'process.exit(JSON.parse(require("fs").readFileSync(process.argv[1])).single_stream.prefill_warmed_up === 1 ? 0 : 1)' "$T/w.json" &&
   node -e 'process.exit(JSON.parse(require("fs").readFileSync(process.argv[1])).single_stream.prefill_warmed_up === 0 ? 0 : 1)' "$T/c.json"
then ok; else bad "bench --warmup: $(grep -i prefill "$T/out")"; fi
expect_ok "bench --warmup --prefill-chunk" "$BIN" bench -m "$T/m" --no-bandwidth --prompt 10 --prefill-chunk 4 --decode 2 --warmup
grep -q "^prefill .*(10 tokens in 3 steps of 4; .*; after a warm-up prefill)" "$T/out" && ok || bad "bench --warmup chunked: $(grep -i prefill "$T/out")"
# --profile on the CPU: a per-stage table for the prefill (one step) and for the decode steps, every stage named,
# times not negative and shares adding up to 100 %
expect_ok "bench --profile (cpu)" "$BIN" bench -m "$T/m" --no-bandwidth --prompt 6 --decode 3 --profile
if grep -q "^prefill of 6 tokens, per-stage time over 1 steps (CPU, wall clock):" "$T/out" &&
   grep -q "^decode, per-stage time over [0-9]* steps (CPU, wall clock):" "$T/out" &&
   awk '/per-stage time over/ { if (n) exit 1; n = 0; s = 0; on = 1; next }
        on && /^  [a-zA-Z].* ms\/step / { n++; if ($(NF-3) < 0) exit 1; s += $(NF-1); if (n == 10) { if (s < 99.4 || s > 100.6) exit 1; n = 0; on = 0; k++ } }
        END { exit k == 2 ? 0 : 1 }' "$T/out"
then ok; else bad "bench --profile on the CPU: $(grep -A11 per-stage "$T/out" | head -24)"; fi
expect_err "bench --prefill-chunk 0" "--prefill-chunk" "$BIN" bench -m "$T/m" --no-bandwidth --prefill-chunk 0
expect_err "bench --json to a folder that does not exist" "cannot write the JSON report" \
    "$BIN" bench -m "$T/m" --no-bandwidth --prompt 4 --decode 2 --json "$T/no/such/dir/r.json"
finish
