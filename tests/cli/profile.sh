#!/usr/bin/env bash
# dsv4 profile and the host-expert placement (issue 15) on a tiny model, without a GPU:
#   - the profile's counts: on the hash-routed layers they must equal what the checkpoint's tid2eid table gives for
#     the prompt tokens (read here by Python straight from the safetensors, an independent route); on every layer
#     each token adds top-k; the file does not depend on the prefill chunk; --generate adds its tokens;
#   - `inspect --gpu-mem` places experts by the rule of model/expert_place.h, recomputed here in Python from the
#     profile (most used first, ties to the lower layer then expert) and, without one, evenly;
#   - inspect's share of the profile's routes on the GPU, the host's cores and the bus, recomputed from the counts;
#   - a skewed synthetic router (dsv4_route_skew): its bias read back from the file, its routing in the profile;
#   - damaged, foreign or misplaced profiles and bad budgets are one-line errors.
. "$(dirname "$0")/lib.sh"

"$BIN" tiny -o "$T/m" --preset flash-tiny --seed 7 >/dev/null 2>&1 || { bad "tiny model"; finish; }
printf '1,2,3,4,5,6,7\n\n9,10,11\n500,3,3,3\n' >"$T/prompts.txt"

expect_ok "profile" "$BIN" profile -m "$T/m" --file "$T/prompts.txt" --out "$T/p1.json"
grep -q "3 prompts, 14 tokens, 6 layers x 8 experts" "$T/out" && ok || bad "profile summary: $(cat "$T/out")"
expect_ok "profile --chunk 1" "$BIN" profile -m "$T/m" --file "$T/prompts.txt" --out "$T/p2.json" --chunk 1
cmp -s "$T/p1.json" "$T/p2.json" && ok || bad "the profile depends on the prefill chunk"
expect_ok "profile --generate 2" "$BIN" profile -m "$T/m" --file "$T/prompts.txt" --out "$T/p3.json" --generate 2
grep -q "3 prompts, 20 tokens" "$T/out" && ok || bad "--generate 2 tokens not counted: $(cat "$T/out")"
# the default place: next to the checkpoint, where loads find it
expect_ok "profile default out" "$BIN" profile -m "$T/m" --file "$T/prompts.txt"
cmp -s "$T/p1.json" "$T/m/expert_profile.json" && ok || bad "default output differs from --out"

# independent check of the counts
check=$(python3 - "$T/m" "$T/p1.json" "$T/p3.json" <<'EOF'
import json, struct, sys
mdir, p1, p3 = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
cfg = json.load(open(mdir + "/config.json"))
L, E, K, H = cfg["num_hidden_layers"], cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["num_hash_layers"]
wm = json.load(open(mdir + "/model.safetensors.index.json"))["weight_map"]
def tensor(name):
    f = open(mdir + "/" + wm[name], "rb")
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))[name]
    f.seek(8 + n + h["data_offsets"][0])
    raw = f.read(h["data_offsets"][1] - h["data_offsets"][0])
    fmt = {"I32": "i", "I64": "q"}[h["dtype"]]
    vals = struct.unpack("<%d%s" % (len(raw) // struct.calcsize(fmt), fmt), raw)
    return [vals[i * h["shape"][1]:(i + 1) * h["shape"][1]] for i in range(h["shape"][0])]
prompts = [[int(x) for x in l.split(",")] for l in open(mdir + "/../prompts.txt") if l.strip()]
toks = [t for p in prompts for t in p]
errors = []
if p1["tokens"] != len(toks): errors.append("tokens %d != %d" % (p1["tokens"], len(toks)))
for l in range(H):
    want = [0] * E
    table = tensor("layers.%d.ffn.gate.tid2eid" % l)
    for t in toks:
        for e in set(table[t]): want[e] += 1
    if p1["counts"][l] != want: errors.append("hash layer %d: %s != %s" % (l, p1["counts"][l], want))
for p in (p1, p3):
    for l in range(L):
        if sum(p["counts"][l]) != K * p["tokens"]: errors.append("layer %d adds %d, not top-%d per token" % (l, sum(p["counts"][l]), K))
print("ok" if not errors else "; ".join(errors))
EOF
)
[ "$check" = ok ] && ok || bad "profile counts: $check"

# placement: the rule recomputed from the profile
placement() {   # $1 = output of inspect; prints the per-layer GPU counts
    grep "routed experts on the GPU per layer" "$1" | sed 's/.*layer://'
}
for gb in 0.0052 0.0054 0.0056; do
    expect_ok "inspect --gpu-mem $gb profile" "$BIN" inspect -m "$T/m" --gpu-mem $gb --expert-profile "$T/p3.json"
    got=$(placement "$T/out")
    n_gpu=$(sed -n 's/.* and \([0-9]*\) of 48 routed experts.*/\1/p' "$T/out")
    want=$(python3 - "$T/p3.json" "$n_gpu" <<'EOF'
import json, sys
p, n = json.load(open(sys.argv[1])), int(sys.argv[2])
L, E = p["n_layers"], p["n_routed"]
order = sorted(((p["counts"][l][e], l * E + e) for l in range(L) for e in range(E)), key=lambda x: (-x[0], x[1]))
per = [0] * L
for c, i in order[:n]: per[i // E] += 1
print("".join(" %d:%d" % (l, per[l]) for l in range(L)))
EOF
)
    [ -n "$n_gpu" ] && [ "$got" = "$want" ] && ok || bad "placement at $gb GiB by profile: '$got' vs '$want'"
    grep -q "the most used by the routing profile" "$T/out" && ok || bad "placement does not say it used the profile"
done
# without a profile (the default file moved away): n / L per layer, the first n % L layers one more
mv "$T/m/expert_profile.json" "$T/saved.json"
expect_ok "inspect even" "$BIN" inspect -m "$T/m" --gpu-mem 0.0054
n_gpu=$(sed -n 's/.* and \([0-9]*\) of 48 routed experts.*/\1/p' "$T/out")
want=$(python3 -c "n=int('$n_gpu' or -1); print(''.join(' %d:%d' % (l, n // 6 + (l < n % 6)) for l in range(6)))")
[ "$(placement "$T/out")" = "$want" ] && grep -q "spread evenly" "$T/out" && ok || bad "even placement: $(placement "$T/out") vs $want"
# the profile next to the checkpoint is found by itself
cp "$T/p3.json" "$T/m/expert_profile.json"
expect_ok "inspect auto profile" "$BIN" inspect -m "$T/m" --gpu-mem 0.0054
grep -q "the most used by the routing profile" "$T/out" && ok || bad "DIR/expert_profile.json not used"
expect_ok "inspect all fits" "$BIN" inspect -m "$T/m" --gpu-mem 1
grep -q "48 of 48 routed experts.*everything fits" "$T/out" && ok || bad "a big budget keeps every expert: $(tail -2 "$T/out")"

# the bus share: of each layer's host experts (48 - n_gpu in all), the i-th goes to the bus when
# floor((i + 1) p / 100) > floor(i p / 100), i.e. floor(h p / 100) of a layer's h: recomputed here from the per-layer
# GPU counts
for share in 0.5 0.3 1; do
    expect_ok "inspect --bus-share $share" "$BIN" inspect -m "$T/m" --gpu-mem 0.0054 --bus-share $share
    want=$(python3 -c "
per = [int(x.split(':')[1]) for x in '''$(placement "$T/out")'''.split()]
p = round($share * 100)
bus = sum((8 - g) * p // 100 for g in per)
print('%d (' % (sum(8 - g for g in per) - bus), '%d (' % bus)")
    cpu=$(sed -n 's/.*host memory: \([0-9]* (\).*/\1/p' "$T/out"); gpu=$(sed -n 's/.*computed by the CPU, \([0-9]* (\).*/\1/p' "$T/out")
    [ "$cpu $gpu" = "$want" ] && ok || bad "bus share $share: '$cpu $gpu' vs '$want' ($(grep 'over the bus' "$T/out"))"
done
# the profile's routes over that placement (GPU / the host's cores / the bus), recomputed from the counts
expect_ok "inspect route shares" "$BIN" inspect -m "$T/m" --gpu-mem 0.0054 --bus-share 0.5 --expert-profile "$T/p3.json"
want=$(python3 - "$T/p3.json" "$(placement "$T/out")" <<'EOF2'
import json, sys
p, per = json.load(open(sys.argv[1])), [int(x.split(":")[1]) for x in sys.argv[2].split()]
L, E = p["n_layers"], p["n_routed"]
n = sum(per)
order = sorted(((p["counts"][l][e], l * E + e) for l in range(L) for e in range(E)), key=lambda x: (-x[0], x[1]))
gpu = set(i for c, i in order[:n])
by, experts = [0, 0, 0], [0, 0, 0]
for l in range(L):
    i = 0
    for e in range(E):
        if l * E + e in gpu: o = 0
        else:
            o = 2 if (i + 1) * 50 // 100 > i * 50 // 100 else 1
            i += 1
        by[o] += p["counts"][l][e]; experts[o] += 1
t = sum(by)
print("%.1f %% to experts on the GPU, %.1f %% to the host's cores, %.1f %% over the bus (uniform routing: %.1f / %.1f / %.1f %%)"
      % tuple([100 * (b / t) for b in by] + [100 * (x / (L * E)) for x in experts]))
EOF2
)
grep -qF "of the profile's routes: $want" "$T/out" && ok || bad "route shares: $(grep "profile's routes" "$T/out") vs $want"
expect_ok "inspect, no bus share" "$BIN" inspect -m "$T/m" --gpu-mem 0.0054 --bus-share 0
grep -q ", 0 (0 B, page-locked) by the GPU over the bus (--bus-share 0.00)" "$T/out" && ok || bad "--bus-share 0: $(grep 'over the bus' "$T/out")"
expect_err "bad --bus-share" "--bus-share must be a share from 0 to 1" "$BIN" inspect -m "$T/m" --gpu-mem 0.0054 --bus-share 1.5
expect_err "bus share without budget" "--bus-share needs --gpu-mem" "$BIN" inspect -m "$T/m" --bus-share 0.5
# the token split: the share of each token's routes (default 25 %, or --bus-share's), every host expert page-locked
expect_ok "inspect --bus-by-token" "$BIN" inspect -m "$T/m" --gpu-mem 0.0054 --bus-by-token
grep -q "of each token's routes to experts in host memory: 25 % over the bus to the GPU.*(--bus-by-token).*: fits" "$T/out" && ok ||
    bad "--bus-by-token: $(grep 'each token' "$T/out")"
expect_ok "inspect --bus-by-token --bus-share 0.4" "$BIN" inspect -m "$T/m" --gpu-mem 0.0054 --bus-by-token --bus-share 0.4
grep -q "each token's routes to experts in host memory: 40 % over the bus" "$T/out" && ok || bad "--bus-by-token at 0.4: $(grep 'each token' "$T/out")"
expect_err "token split without budget" "--bus-by-token needs --gpu-mem" "$BIN" inspect -m "$T/m" --bus-by-token

# a skewed synthetic router (bench --route-skew, config dsv4_route_skew): each non-hash layer's gate.bias is the
# unskewed model's (the same noise) minus s ln(1 + rank), the ranks a permutation of the experts; so the lowest
# ranks win the routing, which the profile must show
"$BIN" tiny -o "$T/sk" --preset flash-tiny --seed 7 --set dsv4_route_skew=5 >/dev/null 2>&1 || bad "tiny model with a skew"
expect_ok "profile, skewed" "$BIN" profile -m "$T/sk" --file "$T/prompts.txt" --out "$T/psk.json"
check=$(python3 - "$T/m" "$T/sk" "$T/psk.json" <<'EOF2'
import json, math, struct, sys
def tensor(mdir, name):
    wm = json.load(open(mdir + "/model.safetensors.index.json"))["weight_map"]
    f = open(mdir + "/" + wm[name], "rb")
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))[name]
    f.seek(8 + n + h["data_offsets"][0])
    raw = f.read(h["data_offsets"][1] - h["data_offsets"][0])
    return struct.unpack("<%df" % (len(raw) // 4), raw)
cfg = json.load(open(sys.argv[2] + "/config.json"))
prof = json.load(open(sys.argv[3]))
L, E, H, K = cfg["num_hidden_layers"], cfg["n_routed_experts"], cfg["num_hash_layers"], cfg["num_experts_per_tok"]
errors = [] if cfg.get("dsv4_route_skew") == 5 else ["config has no dsv4_route_skew 5"]
for l in range(H, L):
    plain, skew = tensor(sys.argv[1], "layers.%d.ffn.gate.bias" % l), tensor(sys.argv[2], "layers.%d.ffn.gate.bias" % l)
    ranks = [math.expm1((a - b) / 5.0) for a, b in zip(plain, skew)]
    if sorted(round(r) for r in ranks) != list(range(E)) or max(abs(r - round(r)) for r in ranks) > 1e-3:
        errors.append("layer %d: bias differences are not -5 ln(1 + rank): %s" % (l, ranks))
        continue
    low = set(e for e in range(E) if round(ranks[e]) < K)
    top = set(sorted(range(E), key=lambda e: -prof["counts"][l][e])[:K])
    if top != low: errors.append("layer %d: most routed %s, lowest ranks %s" % (l, sorted(top), sorted(low)))
print("ok" if not errors else "; ".join(errors))
EOF2
)
[ "$check" = ok ] && ok || bad "skewed router: $check"
expect_err "bad dsv4_route_skew" "dsv4_route_skew must be a number from 0 to 10" "$BIN" tiny -o "$T/sk2" --set dsv4_route_skew=-1
expect_err "bench --route-skew without --synthetic" "--route-skew needs --synthetic" "$BIN" bench -m "$T/m" --route-skew 0.1
expect_err "bench bad --route-skew" "--route-skew must be a number above 0" "$BIN" bench --synthetic small --route-skew 1e3
expect_err "bench --route-skew 0" "--route-skew must be a number above 0" "$BIN" bench --synthetic small --route-skew 0

# errors: one line each
printf '{"dsv4_expert_profile":1,"n_layers":6' >"$T/cut.json"
expect_err "truncated profile" "cut.json: not JSON" "$BIN" inspect -m "$T/m" --gpu-mem 0.0054 --expert-profile "$T/cut.json"
python3 -c "
import json; p = json.load(open('$T/p3.json')); p['counts'] = p['counts'][:5]; p['n_layers'] = 5
json.dump(p, open('$T/foreign.json', 'w'))"
expect_err "foreign profile" "the model has 6 x 8" "$BIN" inspect -m "$T/m" --gpu-mem 0.0054 --expert-profile "$T/foreign.json"
cp "$T/cut.json" "$T/m/expert_profile.json"
expect_err "damaged profile next to the checkpoint" "expert_profile.json: not JSON" "$BIN" inspect -m "$T/m" --gpu-mem 0.0054
expect_err "missing profile" "nope.json" "$BIN" inspect -m "$T/m" --gpu-mem 0.0054 --expert-profile "$T/nope.json"
expect_err "budget below the other weights" "the weights other than the routed experts need" "$BIN" inspect -m "$T/m" --gpu-mem 0.001 --expert-profile "$T/p3.json"
# the default bus share: 15 % where top-2 x the host's fraction of the 48 experts >= 2 (25 % from 4: not with top-2),
# i.e. all 48 on the host (a budget just above the other weights, read from the error): floor(8 x 15 / 100) = 1 of
# each layer's 8; none at 40 of 48 (0.0054 GiB, above)
fixed_mib=$(sed -n 's/.*routed experts need \([0-9.]*\) MiB.*/\1/p' "$T/err")
expect_ok "inspect at the other weights' size" "$BIN" inspect -m "$T/m" --expert-profile "" --gpu-mem "$(python3 -c "print(($fixed_mib + 0.01) / 1024)")"
grep -q "in host memory: 42 (.*) computed by the CPU, 6 (.*) by the GPU over the bus (--bus-share 0.15)" "$T/out" && ok ||
    bad "default bus share with every expert on the host: $(grep 'host memory' "$T/out" | tail -1)"
expect_ok "inspect default bus share" "$BIN" inspect -m "$T/m" --expert-profile "" --gpu-mem 0.0054
grep -q "(--bus-share 0.00)" "$T/out" && ok || bad "default bus share at 40 of 48 on the host: $(grep 'over the bus' "$T/out")"
# a few experts on the host (r = top-2 x 5 / 48 < 0.25): every one over the bus; 7 (r = 0.29): none
expect_ok "inspect default bus share, 5 on the host" "$BIN" inspect -m "$T/m" --expert-profile "" --gpu-mem 0.0071
grep -q "in host memory: 0 (0 B) computed by the CPU, 5 (.*) by the GPU over the bus (--bus-share 1.00)" "$T/out" &&
    grep -q "43 of 48 routed experts" "$T/out" && ok || bad "default bus share, 5 on the host: $(grep -E 'placement|over the bus' "$T/out")"
expect_ok "inspect default bus share, 7 on the host" "$BIN" inspect -m "$T/m" --expert-profile "" --gpu-mem 0.0070
grep -q "41 of 48 routed experts.*(--bus-share 0.00)" <(tr '\n' ' ' <"$T/out") && ok || bad "default bus share, 7 on the host: $(grep -E 'placement|over the bus' "$T/out")"
# with a profile, r comes from its routes: the least used experts on the host take fewer of them
for gb in 0.0058 0.0066; do
    expect_ok "inspect default bus share by profile at $gb" "$BIN" inspect -m "$T/m" --expert-profile "$T/p3.json" --gpu-mem $gb
    want=$(python3 - "$T/p3.json" "$(placement "$T/out")" <<'EOF2'
import json, sys
p, per = json.load(open(sys.argv[1])), [int(x.split(":")[1]) for x in sys.argv[2].split()]
L, E = p["n_layers"], p["n_routed"]
order = sorted(((p["counts"][l][e], l * E + e) for l in range(L) for e in range(E)), key=lambda x: (-x[0], x[1]))
gpu = set(i for c, i in order[:sum(per)])
off = sum(c for c, i in order if i not in gpu); r = 2 * off / sum(c for c, i in order)
print("1.00" if r < 0.25 else "0.25" if r >= 4 else "0.15" if r >= 2 else "0.00")
EOF2
)
    grep -q "(--bus-share $want)" "$T/out" && ok || bad "default bus share by profile at $gb: $(grep 'over the bus' "$T/out"), want $want"
done
expect_err "bad --gpu-mem" "--gpu-mem must be a positive number" "$BIN" inspect -m "$T/m" --gpu-mem lots
expect_err "zero --gpu-mem" "--gpu-mem must be a positive number" "$BIN" logits -m "$T/m" --tokens 1,2 --gpu-mem 0
expect_err "profile without budget" "--expert-profile needs --gpu-mem" "$BIN" inspect -m "$T/m" --expert-profile "$T/p3.json"
expect_err "profile: no prompts file" "missing --file" "$BIN" profile -m "$T/m"
printf '\n\n' >"$T/empty.txt"
expect_err "profile: empty prompts" "no prompts" "$BIN" profile -m "$T/m" --file "$T/empty.txt"
printf '1,2,99999\n' >"$T/badid.txt"
expect_err "profile: bad token id" "prompt 0" "$BIN" profile -m "$T/m" --file "$T/badid.txt" --out "$T/x.json"
[ ! -e "$T/x.json" ] && ok || bad "a failed profile left a file"
# a profile run ignores a damaged profile in the folder (it is about to replace it)
expect_ok "profile over a damaged one" "$BIN" profile -m "$T/m" --file "$T/prompts.txt"
cmp -s "$T/p1.json" "$T/m/expert_profile.json" && ok || bad "profile did not replace the damaged file"
finish
