#!/usr/bin/env python3
"""Golden logits from Hugging Face transformers' DeepseekV4ForCausalLM on tiny random
checkpoints written in the exact official DeepSeek V4 release format.

For every configuration in CONFIGS this script
  1. draws random weights from a seed and rounds them to the official storage formats
     (FP8 E4M3 + UE8M0 128x128 block scales, packed FP4 E2M1 + one UE8M0 scale per 32
     inputs for routed experts, BF16, F32, I32 tid2eid with distinct experts per row);
  2. writes the checkpoint (official tensor names, 2 shards + model.safetensors.index.json,
     config.json with HF field names);
  3. loads exactly the dequantized values into transformers in float32 (eager attention,
     explicit layout), runs the no-cache forward on each token sequence and writes the
     per-position logits as float32 .npy [seq_len, vocab];
  4. checks the "(verify 5.17)" points of spec section 17 at run time and logs them.

Every top-k (lightning indexer and router) is replaced during the golden runs by a
stable sort that breaks exact ties toward the LOWER index (the rule used for the
official-code goldens and by dsv4).  Seeds are additionally searched so that no top-k
decision boundary of any golden run is an exact or near tie (see README.md).

Optional: --drift runs transformers' own cached decode against its no-cache forward and
localises any difference (tie breaking vs a real defect).

Runs on the lent GPU machine (torch + transformers + numpy there); the weight generation
and checkpoint writing need only numpy.  See tools/reference/README.md.
"""
import argparse
import io
import json
import math
import os
import struct
import sys
import tarfile
import time
import traceback

import numpy as np

# ---------------------------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------------------------

CONFIGS = {
    # Flash-like: sliding, sliding, CSA, HCA, CSA. Layers 0-2 hash-routed (layer 2 is a hash-routed
    # CSA layer), layers 3-4 bias-routed. Dims chosen so that several FP8 matrices have partial
    # 128x128 blocks (hidden 160, q_lora 96, G*o_lora 192).
    "flash5": dict(
        vocab_size=384, hidden_size=160, compress_ratios=[0, 0, 4, 128, 4],
        num_attention_heads=6, head_dim=128, q_lora_rank=96, o_groups=3, o_lora_rank=64,
        sliding_window=8, index_n_heads=8, index_head_dim=128, index_topk=8,
        n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, num_hash_layers=3,
        routed_scaling_factor=1.5, swiglu_limit=10.0,
        rope_scaling=dict(type="yarn", factor=16, original_max_position_embeddings=65536,
                          beta_fast=32, beta_slow=1),
        max_position_embeddings=1048576,
        sequences={"long": 300, "mid": 131, "short": 23},
        seeds=list(range(1000, 1016)),
    ),
    # Pro-like: HCA, HCA, CSA, HCA (no sliding-only layer). Layer 0 hash-routed, 1-3 bias-routed
    # (layer 2 is a bias-routed CSA layer). Different YaRN parameters, swiglu_limit 1.5 so the
    # clamps are active, 8 heads in 4 groups.
    "pro4": dict(
        vocab_size=576, hidden_size=128, compress_ratios=[128, 128, 4, 128],
        num_attention_heads=8, head_dim=128, q_lora_rank=64, o_groups=4, o_lora_rank=64,
        sliding_window=16, index_n_heads=6, index_head_dim=128, index_topk=12,
        n_routed_experts=6, num_experts_per_tok=3, moe_intermediate_size=64, num_hash_layers=1,
        routed_scaling_factor=2.5, swiglu_limit=1.5,
        rope_scaling=dict(type="yarn", factor=8, original_max_position_embeddings=2048,
                          beta_fast=32, beta_slow=1),
        max_position_embeddings=16384,
        sequences={"long": 270, "short": 40},
        seeds=list(range(2000, 2016)),
    ),
}

# Not a golden: the flash5 model with a single indexer head, where exact ties in the indexer
# scores are frequent (a query whose only head weight is negative scores every row <= 0).
# Used only by --drift to show what tie breaking does to transformers' cached decode.
DRIFT_ONLY = {
    "flash5_tieprone": dict(CONFIGS["flash5"], index_n_heads=1, sequences={"long": 300},
                            seeds=[1000]),
}

# Relative gap (|k-th - (k+1)-th| / max |score| of the row) below which a top-k decision is
# considered a near tie, i.e. one that a float32 implementation with another summation order
# could decide differently.
NEAR_TIE_REL = 2e-5

# ---------------------------------------------------------------------------------------------
# Number formats (numpy, exact)
# ---------------------------------------------------------------------------------------------


def _e4m3_table():
    vals = np.zeros(256, dtype=np.float64)
    for c in range(256):
        s = -1.0 if c & 0x80 else 1.0
        e = (c >> 3) & 15
        m = c & 7
        if e == 15 and m == 7:
            vals[c] = np.nan
        elif e == 0:
            vals[c] = s * 2.0 ** -6 * (m / 8.0)
        else:
            vals[c] = s * 2.0 ** (e - 7) * (1.0 + m / 8.0)
    return vals


E4M3 = _e4m3_table()
E4M3_POS = E4M3[:127]  # codes 0..126, ascending, 0 .. 448
FP4_POS = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _nearest_code(mag, table):
    """Index of the nearest table entry (table ascending); ties -> even index (RNE)."""
    hi = np.clip(np.searchsorted(table, mag, side="left"), 1, len(table) - 1)
    lo = hi - 1
    dlo = mag - table[lo]
    dhi = table[hi] - mag
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    return np.where(pick_hi, hi, lo)


def _pow2_exponent(amax, qmax):
    """Smallest integer e with amax / 2^e <= qmax (UE8M0 scale exponent)."""
    amax = np.maximum(amax, 1e-30)
    e = np.ceil(np.log2(amax / qmax)).astype(np.int64)
    # guard against log2 rounding
    e = np.where(amax / np.exp2(e) > qmax, e + 1, e)
    return np.clip(e, -127, 127)


def quant_fp8_block(w):
    """w [O, I] float -> (codes uint8 [O, I], scale bytes uint8 [ceil(O/128), ceil(I/128)],
    dequantized float32 [O, I])."""
    O, I = w.shape
    bo, bi = -(-O // 128), -(-I // 128)
    codes = np.zeros((O, I), dtype=np.uint8)
    sbytes = np.zeros((bo, bi), dtype=np.uint8)
    deq = np.zeros((O, I), dtype=np.float64)
    for a in range(bo):
        for b in range(bi):
            blk = w[a * 128:(a + 1) * 128, b * 128:(b + 1) * 128].astype(np.float64)
            e = int(_pow2_exponent(np.abs(blk).max(), 448.0))
            q = blk / 2.0 ** e
            mag = np.minimum(np.abs(q), 448.0)
            idx = _nearest_code(mag, E4M3_POS)
            c = idx.astype(np.uint8) | np.where((q < 0) & (idx > 0), 0x80, 0).astype(np.uint8)
            codes[a * 128:(a + 1) * 128, b * 128:(b + 1) * 128] = c
            sbytes[a, b] = e + 127
            deq[a * 128:(a + 1) * 128, b * 128:(b + 1) * 128] = E4M3[c] * 2.0 ** e
    return codes, sbytes, deq.astype(np.float32)


def quant_fp4_group(w):
    """w [O, I] (I % 32 == 0) -> (packed int8 [O, I/2], scale bytes uint8 [O, I/32],
    dequantized float32 [O, I]). Element 2i in the low nibble."""
    O, I = w.shape
    assert I % 32 == 0, I
    g = w.astype(np.float64).reshape(O, I // 32, 32)
    e = _pow2_exponent(np.abs(g).max(axis=2), 6.0)  # [O, I/32]
    q = g / np.exp2(e)[..., None]
    mag = np.minimum(np.abs(q), 6.0)
    idx = _nearest_code(mag, FP4_POS)
    code = (idx | np.where((q < 0) & (idx > 0), 8, 0)).astype(np.uint8).reshape(O, I)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).astype(np.uint8)
    val = np.where(code & 8, -1.0, 1.0) * FP4_POS[code & 7]
    deq = (val.reshape(O, I // 32, 32) * np.exp2(e)[..., None]).reshape(O, I)
    return packed.view(np.int8), (e + 127).astype(np.uint8), deq.astype(np.float32)


def to_bf16(x):
    """float -> (uint16 bf16 bits, float32 value), round to nearest even."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    back = (r.astype(np.uint32) << 16).view(np.float32)
    return r, back


# ---------------------------------------------------------------------------------------------
# safetensors writer (plain format: u64 header length, JSON header, raw little-endian data)
# ---------------------------------------------------------------------------------------------


def write_safetensors(path, tensors):
    """tensors: list of (name, dtype_str, shape, bytes)."""
    header = {}
    off = 0
    blobs = []
    for name, dt, shape, data in tensors:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    return off


def read_safetensors_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


# ---------------------------------------------------------------------------------------------
# Random official-format checkpoint
# ---------------------------------------------------------------------------------------------


class Ckpt:
    """Holds the official tensors (as stored) and their exact float32 values."""

    def __init__(self):
        self.stored = {}  # name -> (dtype_str, shape, bytes)
        self.values = {}  # name (without .scale) -> float32 / int array as the model sees it
        self.order = []

    def _put(self, name, dt, arr):
        arr = np.ascontiguousarray(arr)
        self.stored[name] = (dt, arr.shape, arr.tobytes())
        self.order.append(name)

    def bf16(self, name, x):
        bits, val = to_bf16(x)
        self._put(name, "BF16", bits)
        self.values[name] = val

    def f32(self, name, x):
        x = np.asarray(x, dtype=np.float32)
        self._put(name, "F32", x)
        self.values[name] = x

    def i32(self, name, x):
        x = np.asarray(x, dtype=np.int32)
        self._put(name, "I32", x)
        self.values[name] = x

    def fp8(self, prefix, w):
        codes, s, deq = quant_fp8_block(w)
        self._put(prefix + ".weight", "F8_E4M3", codes)
        self._put(prefix + ".scale", "F8_E8M0", s)
        self.values[prefix + ".weight"] = deq

    def fp4(self, prefix, w):
        packed, s, deq = quant_fp4_group(w)
        self._put(prefix + ".weight", "I8", packed)
        self._put(prefix + ".scale", "F8_E8M0", s)
        self.values[prefix + ".weight"] = deq


def block_gain(rng, shape, block):
    """Random power-of-two gain per block (2^-1, 1, 2) so that block scales differ."""
    O, I = shape
    bo, bi = -(-O // block[0]), -(-I // block[1])
    g = np.exp2(rng.integers(-1, 2, size=(bo, bi))).astype(np.float64)
    return np.kron(g, np.ones(block))[:O, :I]


def make_checkpoint(cfg, seed):
    rng = np.random.default_rng(seed)
    V, d = cfg["vocab_size"], cfg["hidden_size"]
    H, D = cfg["num_attention_heads"], cfg["head_dim"]
    ql, G, ol = cfg["q_lora_rank"], cfg["o_groups"], cfg["o_lora_rank"]
    E, k, I = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
    nI, cI = cfg["index_n_heads"], cfg["index_head_dim"]
    hc = 4
    ck = Ckpt()

    def normal(shape, std):
        return rng.standard_normal(shape) * std

    def fp8w(name, O, I_, std):
        ck.fp8(name, normal((O, I_), std) * block_gain(rng, (O, I_), (128, 128)))

    def fp4w(name, O, I_, std):
        ck.fp4(name, normal((O, I_), std) * block_gain(rng, (O, I_), (1, 32)))

    def normw(name, n):
        ck.bf16(name, 1.0 + normal(n, 0.2))

    ck.bf16("embed.weight", normal((V, d), 1.0))
    ck.bf16("head.weight", normal((V, d), 2.0 / math.sqrt(d)))
    normw("norm.weight", d)
    ck.f32("hc_head_fn", normal((hc, hc * d), 1.0 / math.sqrt(hc * d)))
    ck.f32("hc_head_base", normal(hc, 0.5))
    ck.f32("hc_head_scale", rng.uniform(0.5, 1.5, size=(1,)))

    for L, m in enumerate(cfg["compress_ratios"]):
        p = f"layers.{L}."
        normw(p + "attn_norm.weight", d)
        normw(p + "ffn_norm.weight", d)
        for site in ("hc_attn", "hc_ffn"):
            ck.f32(p + site + "_fn", normal((24, hc * d), 1.0 / math.sqrt(hc * d)))
            ck.f32(p + site + "_base", normal(24, 0.5))
            ck.f32(p + site + "_scale", rng.uniform(0.5, 1.5, size=(3,)))
        a = p + "attn."
        fp8w(a + "wq_a", ql, d, 1.0 / math.sqrt(d))
        normw(a + "q_norm.weight", ql)
        fp8w(a + "wq_b", H * D, ql, 1.0 / math.sqrt(ql))
        fp8w(a + "wkv", D, d, 1.0 / math.sqrt(d))
        normw(a + "kv_norm.weight", D)
        fp8w(a + "wo_a", G * ol, H * D // G, 1.0 / math.sqrt(H * D // G))
        fp8w(a + "wo_b", d, G * ol, 1.0 / math.sqrt(G * ol))
        ck.f32(a + "attn_sink", normal(H, 1.0))
        if m != 0:
            c = a + "compressor."
            co = 2 if m == 4 else 1
            ck.bf16(c + "wkv.weight", normal((co * D, d), 1.0 / math.sqrt(d)))
            ck.bf16(c + "wgate.weight", normal((co * D, d), 1.0 / math.sqrt(d)))
            ck.f32(c + "ape", normal((m, co * D), 1.0))
            normw(c + "norm.weight", D)
        if m == 4:
            x = a + "indexer."
            fp8w(x + "wq_b", nI * cI, ql, 1.0 / math.sqrt(ql))
            ck.bf16(x + "weights_proj.weight", normal((nI, d), 1.0 / math.sqrt(d)))
            ck.bf16(x + "compressor.wkv.weight", normal((2 * cI, d), 1.0 / math.sqrt(d)))
            ck.bf16(x + "compressor.wgate.weight", normal((2 * cI, d), 1.0 / math.sqrt(d)))
            ck.f32(x + "compressor.ape", normal((4, 2 * cI), 1.0))
            normw(x + "compressor.norm.weight", cI)
        f = p + "ffn."
        ck.bf16(f + "gate.weight", normal((E, d), 1.0 / math.sqrt(d)))
        if L < cfg["num_hash_layers"]:
            tid = np.stack([rng.permutation(E)[:k] for _ in range(V)])
            ck.i32(f + "gate.tid2eid", tid)
        else:
            ck.f32(f + "gate.bias", normal(E, 0.3))
        for e in range(E):
            fp4w(f + f"experts.{e}.w1", I, d, 1.0 / math.sqrt(d))
            fp4w(f + f"experts.{e}.w2", d, I, 1.0 / math.sqrt(I))
            fp4w(f + f"experts.{e}.w3", I, d, 1.0 / math.sqrt(d))
        fp8w(f + "shared_experts.w1", I, d, 1.0 / math.sqrt(d))
        fp8w(f + "shared_experts.w2", d, I, 1.0 / math.sqrt(I))
        fp8w(f + "shared_experts.w3", I, d, 1.0 / math.sqrt(d))
    return ck


def hf_config_json(cfg):
    n = len(cfg["compress_ratios"])
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": cfg["vocab_size"],
        "hidden_size": cfg["hidden_size"],
        "num_hidden_layers": n,
        "num_attention_heads": cfg["num_attention_heads"],
        "num_key_value_heads": 1,
        "head_dim": cfg["head_dim"],
        "qk_rope_head_dim": 64,
        "q_lora_rank": cfg["q_lora_rank"],
        "o_lora_rank": cfg["o_lora_rank"],
        "o_groups": cfg["o_groups"],
        "sliding_window": cfg["sliding_window"],
        "compress_ratios": list(cfg["compress_ratios"]),
        "compress_rope_theta": 160000.0,
        "rope_theta": 10000.0,
        "rope_scaling": dict(cfg["rope_scaling"]),
        "index_n_heads": cfg["index_n_heads"],
        "index_head_dim": cfg["index_head_dim"],
        "index_topk": cfg["index_topk"],
        "moe_intermediate_size": cfg["moe_intermediate_size"],
        "n_routed_experts": cfg["n_routed_experts"],
        "n_shared_experts": 1,
        "num_experts_per_tok": cfg["num_experts_per_tok"],
        "num_hash_layers": cfg["num_hash_layers"],
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "routed_scaling_factor": cfg["routed_scaling_factor"],
        "swiglu_limit": cfg["swiglu_limit"],
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-06,
        "num_nextn_predict_layers": 0,
        "rms_norm_eps": 1e-06,
        "max_position_embeddings": cfg["max_position_embeddings"],
        "bos_token_id": 0,
        "eos_token_id": 1,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "expert_dtype": "fp4",
        "quantization_config": {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "scale_fmt": "ue8m0",
            "weight_block_size": [128, 128],
        },
    }


def write_checkpoint(ck, cfg, outdir):
    os.makedirs(outdir, exist_ok=True)
    n = len(cfg["compress_ratios"])
    split = (n + 1) // 2  # layers < split (and globals) in shard 1
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    groups = [[], []]
    for name in ck.order:
        s = 0
        if name.startswith("layers."):
            s = 0 if int(name.split(".")[1]) < split else 1
        groups[s].append(name)
    weight_map = {}
    total = 0
    for s, names in enumerate(groups):
        total += write_safetensors(os.path.join(outdir, shards[s]),
                                   [(nm,) + ck.stored[nm] for nm in names])
        for nm in names:
            weight_map[nm] = shards[s]
    with open(os.path.join(outdir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
        f.write("\n")
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(hf_config_json(cfg), f, indent=1)
        f.write("\n")


def verify_written(ckdir, ck, torch=None):
    """Re-read the shards and dequantize them independently (numpy; and torch's own float8
    dtypes when torch is given); every value must equal what the model is loaded with."""
    idx = json.load(open(os.path.join(ckdir, "model.safetensors.index.json")))
    raw = {}
    for shard in sorted(set(idx["weight_map"].values())):
        path = os.path.join(ckdir, shard)
        hdr, base = read_safetensors_header(path)
        blob = open(path, "rb").read()
        for nm, info in hdr.items():
            if nm == "__metadata__":
                continue
            b0, b1 = info["data_offsets"]
            raw[nm] = (info["dtype"], info["shape"], blob[base + b0: base + b1])
    assert set(raw) == set(idx["weight_map"]), "index and shards disagree"
    npdt = {"BF16": np.uint16, "F32": np.float32, "F8_E4M3": np.uint8, "F8_E8M0": np.uint8,
            "I8": np.int8, "I32": np.int32}
    arr = {nm: np.frombuffer(b, dtype=npdt[dt]).reshape(sh) for nm, (dt, sh, b) in raw.items()}
    n_checked = 0
    for nm, (dt, sh, _) in raw.items():
        if nm.endswith(".scale"):
            continue
        want = ck.values[nm]
        a = arr[nm]
        if dt == "BF16":
            got = (a.astype(np.uint32) << 16).view(np.float32)
        elif dt in ("F32", "I32"):
            got = a
        elif dt == "F8_E4M3":
            s = np.exp2(arr[nm[:-7] + ".scale"].astype(np.float64) - 127)
            O, I = a.shape
            got = E4M3[a] * np.kron(s, np.ones((128, 128)))[:O, :I]
        elif dt == "I8":
            u = a.view(np.uint8)
            code = np.empty((u.shape[0], u.shape[1] * 2), dtype=np.uint8)
            code[:, 0::2] = u & 15
            code[:, 1::2] = u >> 4
            val = np.where(code & 8, -1.0, 1.0) * FP4_POS[code & 7]
            s = np.exp2(arr[nm[:-7] + ".scale"].astype(np.float64) - 127)
            got = val * np.repeat(s, 32, axis=1)
        else:
            raise RuntimeError(dt)
        if not np.array_equal(np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)):
            raise RuntimeError(f"{nm}: stored value differs from model value")
        n_checked += 1
    res = {"tensors": len(raw), "values_checked_numpy": n_checked}
    if torch is not None:
        from safetensors.torch import load_file
        td = {}
        for shard in sorted(set(idx["weight_map"].values())):
            td.update(load_file(os.path.join(ckdir, shard)))
        nt = 0
        for nm, t in td.items():
            if t.dtype == torch.float8_e4m3fn:
                s = td[nm[:-7] + ".scale"]
                assert s.dtype == torch.float8_e8m0fnu, s.dtype
                sf = s.to(torch.float32)
                O, I = t.shape
                sf = sf.repeat_interleave(128, 0).repeat_interleave(128, 1)[:O, :I]
                got = (t.to(torch.float32) * sf).numpy()
                if not np.array_equal(got, ck.values[nm]):
                    raise RuntimeError(f"{nm}: torch float8 decode differs")
                nt += 1
            elif t.dtype == torch.bfloat16:
                if not np.array_equal(t.to(torch.float32).numpy(), ck.values[nm]):
                    raise RuntimeError(f"{nm}: torch bf16 decode differs")
                nt += 1
            elif t.dtype == torch.int8 and nm.endswith(".weight"):
                s = td[nm[:-7] + ".scale"].to(torch.float32).numpy()
                u = t.numpy().view(np.uint8)
                lo = FP4_POS[u & 7] * np.where(u & 8, -1, 1)
                hi = FP4_POS[(u >> 4) & 7] * np.where(u & 128, -1, 1)
                val = np.stack([lo, hi], -1).reshape(u.shape[0], -1) * np.repeat(s, 32, axis=1)
                if not np.array_equal(val.astype(np.float32), ck.values[nm]):
                    raise RuntimeError(f"{nm}: torch fp4 decode differs")
                nt += 1
        res["values_checked_torch_float8"] = nt
    return res


# ---------------------------------------------------------------------------------------------
# Own YaRN frequencies (spec section 4.1) for cross-checking transformers
# ---------------------------------------------------------------------------------------------


def expected_inv_freq(base, rope_scaling, R=64):
    f = 1.0 / (base ** (np.arange(0, R, 2, dtype=np.float64) / R))
    if rope_scaling:
        L0 = rope_scaling["original_max_position_embeddings"]
        fac = rope_scaling["factor"]
        bf, bs = rope_scaling["beta_fast"], rope_scaling["beta_slow"]
        lo = max(math.floor(R * math.log(L0 / (bf * 2 * math.pi)) / (2 * math.log(base))), 0)
        hi = min(math.ceil(R * math.log(L0 / (bs * 2 * math.pi)) / (2 * math.log(base))), R - 1)
        if lo == hi:
            hi += 0.001
        i = np.arange(R // 2, dtype=np.float64)
        ramp = np.clip((i - lo) / (hi - lo), 0, 1)
        smooth = 1 - ramp
        f = f / fac * (1 - smooth) + f * smooth
    return f


# ---------------------------------------------------------------------------------------------
# transformers side
# ---------------------------------------------------------------------------------------------


class TopkPatch:
    """Replaces torch.topk / Tensor.topk by a stable lower-index-first version (when enabled)
    and records the decision-boundary gaps of every call."""

    def __init__(self, torch, n_experts):
        self.torch = torch
        self.orig_fn = torch.topk
        self.orig_m = torch.Tensor.topk
        self.n_experts = n_experts
        self.stable = True
        self.record = True
        self.reset()

    def reset(self):
        self.stats = {"router": [1e30, 0, 0], "indexer": [1e30, 0, 0]}  # min rel gap, ties, calls

    def topk(self, x, k, dim=-1, largest=True, sorted=True, **kw):
        torch = self.torch
        if self.record and k < x.shape[dim]:
            with torch.no_grad():
                v = torch.sort(x.detach().double(), dim=dim, descending=largest, stable=True).values
                v = v.movedim(dim, -1)
                a, b = v[..., k - 1], v[..., k]
                fin = torch.isfinite(a) & torch.isfinite(b)
                finite_vals = torch.where(torch.isfinite(v), v.abs(), torch.zeros_like(v))
                scale = finite_vals.amax(dim=-1).clamp_min(1e-30)
                rel = ((a - b).abs() / scale)[fin]
                kind = "router" if (x.dim() == 2 and x.shape[-1] == self.n_experts) else "indexer"
                st = self.stats[kind]
                if rel.numel():
                    st[0] = min(st[0], float(rel.min()))
                    st[1] += int((rel == 0).sum())
                st[2] += int(fin.sum())
        if not self.stable:
            return self.orig_m(x, k, dim=dim, largest=largest, sorted=sorted)
        vals, idx = torch.sort(x, dim=dim, descending=largest, stable=True)
        return torch.return_types.topk((vals.narrow(dim, 0, k), idx.narrow(dim, 0, k)))

    def install(self):
        patch = self

        def fn(input, k, dim=-1, largest=True, sorted=True, **kw):
            return patch.topk(input, k, dim=dim, largest=largest, sorted=sorted)

        def meth(self_, k, dim=-1, largest=True, sorted=True, **kw):
            return patch.topk(self_, k, dim=dim, largest=largest, sorted=sorted)

        self.torch.topk = fn
        self.torch.Tensor.topk = meth


def hf_state_dict(ck, cfg, model_keys, torch):
    """Map official tensor values to transformers parameter names (spec 17.4)."""
    V = ck.values
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))
    sd = {
        "model.embed_tokens.weight": t(V["embed.weight"]),
        "lm_head.weight": t(V["head.weight"]),
        "model.norm.weight": t(V["norm.weight"]),
        "model.hc_head.hc_fn": t(V["hc_head_fn"]),
        "model.hc_head.hc_base": t(V["hc_head_base"]),
        "model.hc_head.hc_scale": t(V["hc_head_scale"]),
    }
    E = cfg["n_routed_experts"]
    for L, m in enumerate(cfg["compress_ratios"]):
        o, h = f"layers.{L}.", f"model.layers.{L}."
        sd[h + "input_layernorm.weight"] = t(V[o + "attn_norm.weight"])
        sd[h + "post_attention_layernorm.weight"] = t(V[o + "ffn_norm.weight"])
        for os_, hs in (("hc_attn", "attn_hc"), ("hc_ffn", "ffn_hc")):
            for suf in ("fn", "base", "scale"):
                sd[h + f"{hs}.{suf}"] = t(V[o + f"{os_}_{suf}"])
        a, sa = o + "attn.", h + "self_attn."
        for ow, hw in (("wq_a", "q_a_proj"), ("q_norm", "q_a_norm"), ("wq_b", "q_b_proj"),
                       ("wkv", "kv_proj"), ("kv_norm", "kv_norm"), ("wo_a", "o_a_proj"),
                       ("wo_b", "o_b_proj")):
            sd[sa + hw + ".weight"] = t(V[a + ow + ".weight"])
        sd[sa + "sinks"] = t(V[a + "attn_sink"])
        if m != 0:
            for ow, hw in (("wkv.weight", "kv_proj.weight"), ("wgate.weight", "gate_proj.weight"),
                           ("ape", "position_bias"), ("norm.weight", "kv_norm.weight")):
                sd[sa + "compressor." + hw] = t(V[a + "compressor." + ow])
        if m == 4:
            ix = sa + "compressor.indexer."
            sd[ix + "q_b_proj.weight"] = t(V[a + "indexer.wq_b.weight"])
            cands = [kk for kk in model_keys if kk.startswith(ix) and kk.endswith("weights_proj.weight")]
            assert len(cands) == 1, cands
            sd[cands[0]] = t(V[a + "indexer.weights_proj.weight"])
            for ow, hw in (("wkv.weight", "kv_proj.weight"), ("wgate.weight", "gate_proj.weight"),
                           ("ape", "position_bias"), ("norm.weight", "kv_norm.weight")):
                sd[ix + hw] = t(V[a + "indexer.compressor." + ow])
        f, mm = o + "ffn.", h + "mlp."
        sd[mm + "gate.weight"] = t(V[f + "gate.weight"])
        if L < cfg["num_hash_layers"]:
            sd[mm + "gate.tid2eid"] = t(V[f + "gate.tid2eid"].astype(np.int64))
        else:
            sd[mm + "gate.e_score_correction_bias"] = t(V[f + "gate.bias"])
        sd[mm + "experts.gate_up_proj"] = t(np.stack([
            np.concatenate([V[f + f"experts.{e}.w1.weight"], V[f + f"experts.{e}.w3.weight"]], 0)
            for e in range(E)]))
        sd[mm + "experts.down_proj"] = t(np.stack([V[f + f"experts.{e}.w2.weight"] for e in range(E)]))
        sd[mm + "shared_experts.gate_proj.weight"] = t(V[f + "shared_experts.w1.weight"])
        sd[mm + "shared_experts.up_proj.weight"] = t(V[f + "shared_experts.w3.weight"])
        sd[mm + "shared_experts.down_proj.weight"] = t(V[f + "shared_experts.w2.weight"])
    return sd


class HF:
    def __init__(self, log):
        import torch
        import transformers
        self.torch = torch
        self.transformers = transformers
        self.log = log
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        want = os.environ.get("HF_GOLDEN_DEVICE")
        self.dev = torch.device(want or ("cuda" if torch.cuda.is_available() else "cpu"))
        from transformers.models.deepseek_v4 import modeling_deepseek_v4 as M
        from transformers.models.deepseek_v4 import configuration_deepseek_v4 as C
        self.M, self.C = M, C

    def build_config(self, cfg_json, cfg):
        C = self.C
        d = dict(cfg_json)
        d.pop("quantization_config", None)
        d.pop("architectures", None)
        d.pop("model_type", None)
        how = "DeepseekV4Config(**config.json minus quantization_config)"
        try:
            conf = C.DeepseekV4Config(**d)
        except Exception as ex:  # noqa
            self.log(f"config from config.json failed: {ex!r}; using explicit kwargs")
            how = "explicit layer_types/mlp_layer_types/rope_parameters"
            conf = None
        ok, why = (self.check_config(conf, cfg) if conf is not None else (False, "n/a"))
        if not ok:
            self.log(f"config.json route rejected: {why}")
            lt = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
            d2 = dict(d)
            for kk in ("compress_ratios", "num_hash_layers", "rope_scaling", "qk_rope_head_dim",
                       "topk_method", "expert_dtype", "torch_dtype"):
                d2.pop(kk, None)
            n = len(cfg["compress_ratios"])
            d2["layer_types"] = [lt[r] for r in cfg["compress_ratios"]]
            d2["mlp_layer_types"] = ["hash_moe" if i < cfg["num_hash_layers"] else "moe" for i in range(n)]
            rs = cfg["rope_scaling"]
            d2["rope_parameters"] = {"rope_type": "yarn", "factor": float(rs["factor"]),
                                     "original_max_position_embeddings": rs["original_max_position_embeddings"],
                                     "beta_fast": float(rs["beta_fast"]), "beta_slow": float(rs["beta_slow"])}
            d2["partial_rotary_factor"] = 64 / cfg["head_dim"]
            conf = C.DeepseekV4Config(**d2)
            ok, why = self.check_config(conf, cfg)
            if not ok:
                raise RuntimeError("cannot build a matching DeepseekV4Config: " + why)
        conf._attn_implementation = "eager"
        try:
            conf._experts_implementation = "eager"
        except Exception as ex:  # noqa
            self.log(f"cannot set _experts_implementation: {ex!r}")
        try:
            conf.attn_implementation = "eager"
        except Exception:
            pass
        return conf, how

    def check_config(self, conf, cfg):
        lt = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
        n = len(cfg["compress_ratios"])
        want_lt = [lt[r] for r in cfg["compress_ratios"]]
        want_mlp = ["hash_moe" if i < cfg["num_hash_layers"] else "moe" for i in range(n)]
        errs = []
        if list(conf.layer_types) != want_lt:
            errs.append(f"layer_types {conf.layer_types}")
        if list(conf.mlp_layer_types) != want_mlp:
            errs.append(f"mlp_layer_types {conf.mlp_layer_types}")
        rates = getattr(conf, "compress_rates", None)
        if rates != {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}:
            errs.append(f"compress_rates {rates}")
        if getattr(conf, "qk_rope_head_dim", None) != 64:
            errs.append(f"qk_rope_head_dim {getattr(conf, 'qk_rope_head_dim', None)}")
        rp = getattr(conf, "rope_parameters", None)
        try:
            comp, main = rp["compress"], rp["main"]
            if comp.get("rope_type") != "yarn":
                errs.append(f"compress rope {comp}")
            if main.get("rope_type", "default") != "default":
                errs.append(f"main rope {main}")
        except Exception as ex:
            errs.append(f"rope_parameters {rp!r} ({ex!r})")
        for kk in ("sliding_window", "index_topk", "index_n_heads", "o_groups", "swiglu_limit",
                   "routed_scaling_factor", "num_experts_per_tok", "n_routed_experts", "tie_word_embeddings"):
            want = cfg.get(kk, False if kk == "tie_word_embeddings" else None)
            if getattr(conf, kk, None) != want:
                errs.append(f"{kk} {getattr(conf, kk, None)} != {want}")
        return (not errs), "; ".join(errs)

    def build_model(self, conf, ck, cfg):
        torch = self.torch
        torch.manual_seed(0)
        model = self.M.DeepseekV4ForCausalLM(conf).to(torch.float32)
        model.eval()
        keys = list(model.state_dict().keys())
        sd = hf_state_dict(ck, cfg, keys, torch)
        missing, unexpected = model.load_state_dict(sd, strict=False)
        missing = [k for k in missing if "rotary" not in k and "inv_freq" not in k]
        if missing or unexpected:
            raise RuntimeError(f"state dict mismatch: missing={missing} unexpected={unexpected}")
        # every loaded tensor must be bit-identical in the model
        msd = model.state_dict()
        for k, v in sd.items():
            if not torch.equal(msd[k].cpu(), v.to(msd[k].dtype)):
                raise RuntimeError(f"parameter {k} differs after load")
        model.to(self.dev)
        return model

    def check_rope(self, model, cfg):
        rot = model.model.rotary_emb
        out = {}
        for lt, base, rs in (("main", 10000.0, None), ("compress", 160000.0, cfg["rope_scaling"])):
            got = getattr(rot, f"{lt}_inv_freq").double().cpu().numpy()
            want = expected_inv_freq(base, rs)
            scl = getattr(rot, f"{lt}_attention_scaling")
            out[lt] = {"max_rel_diff_vs_spec": float(np.max(np.abs(got - want) / want)),
                       "attention_scaling": float(scl), "n": int(got.size)}
        return out

    def logits(self, model, ids):
        torch = self.torch
        with torch.no_grad():
            x = torch.tensor([ids], dtype=torch.long, device=self.dev)
            out = model(input_ids=x, use_cache=False)
            return out.logits[0].float().cpu().numpy()

    def cached_logits(self, model, ids, k):
        """transformers' own cache: prefill k tokens, then one token at a time."""
        torch = self.torch
        rows = []
        with torch.no_grad():
            x = torch.tensor([ids], dtype=torch.long, device=self.dev)
            pos = torch.arange(len(ids), device=self.dev)[None]
            out = model(input_ids=x[:, :k], position_ids=pos[:, :k], use_cache=True)
            pkv = out.past_key_values
            rows.append(out.logits[0].float().cpu().numpy())
            for p in range(k, len(ids)):
                out = model(input_ids=x[:, p:p + 1], position_ids=pos[:, p:p + 1],
                            past_key_values=pkv, use_cache=True)
                pkv = out.past_key_values
                rows.append(out.logits[0].float().cpu().numpy())
        return np.concatenate(rows, 0)


def mask_checks(hf, model, ids, cfg):
    """Capture masks/biases in the no-cache forward and check them against spec section 10."""
    torch = hf.torch
    W = cfg["sliding_window"]
    seen = {}
    hooks = []
    for L, layer in enumerate(model.model.layers):
        def pre(mod, args, kwargs, L=L):
            am = kwargs.get("attention_mask")
            seen.setdefault(("mask", L), None if am is None else am.detach().cpu())
        hooks.append(layer.self_attn.register_forward_pre_hook(pre, with_kwargs=True))
        comp = layer.self_attn.compressor
        if comp is not None:
            def post(mod, args, out, L=L):
                bb = out[1]
                seen[("bias", L)] = None if bb is None else bb.detach().cpu()
                seen[("rows", L)] = out[0].shape[2]
            hooks.append(comp.register_forward_hook(post))
    try:
        hf.logits(model, ids)
    finally:
        for h in hooks:
            h.remove()
    S = len(ids)
    res = {}
    q = np.arange(S)[:, None]
    t = np.arange(S)[None, :]
    want_win = (t <= q) & (t > q - W)
    for L, r in enumerate(cfg["compress_ratios"]):
        am = seen.get(("mask", L))
        if am is None:
            res[f"layer{L}.window_mask"] = "attention_mask is None"
        else:
            vis = (am[0, 0] > -1e30).numpy() if am.dtype != torch.bool else am[0, 0].numpy()
            res[f"layer{L}.window_mask"] = ("matches (q-W, q]" if vis.shape == want_win.shape and
                                            bool((vis == want_win).all()) else f"DIFFERS shape {vis.shape}")
        if r:
            bb = seen.get(("bias", L))
            nrows = seen.get(("rows", L))
            if bb is None:
                res[f"layer{L}.block_bias"] = "None"
                continue
            vis = (bb[0, 0] > -1e30).numpy()
            k_idx = np.arange(nrows)[None, :]
            causal = (k_idx + 1) * r <= q + 1
            if r == 128:
                res[f"layer{L}.block_bias"] = ("HCA: matches (k+1)*128 <= q+1" if bool((vis == causal).all())
                                               else "HCA: DIFFERS")
            else:
                cnt = vis.sum(1)
                want = np.minimum(cfg["index_topk"], (np.arange(S) + 1) // 4)
                inside = bool((vis <= causal).all())
                res[f"layer{L}.block_bias"] = (f"CSA: per-query count == min(topk, (q+1)//4): {bool((cnt == want).all())}, "
                                               f"selected rows causal: {inside}")
    return res


def drift_experiment(hf, model, ids, cfg, patch, log):
    """Cached decode vs no-cache forward, with torch's own topk and with the stable patch;
    localise the first difference through the indexer's scorer outputs and selections."""
    torch = hf.torch
    rep = {"seq_len": len(ids), "index_topk": cfg["index_topk"],
           "first_pos_rows_gt_topk": 4 * (cfg["index_topk"] + 1) - 1}
    M = hf.M
    idx_mods = [(L, l.self_attn.compressor.indexer) for L, l in enumerate(model.model.layers)
                if l.self_attn.compressor is not None and hasattr(l.self_attn.compressor, "indexer")]
    rec = {}
    hooks = []
    for L, ix in idx_mods:
        def sc_hook(mod, args, out, L=L):
            rec.setdefault(("score", L), []).append(out.detach().double().cpu())
        def ix_hook(mod, args, out, L=L):
            rec.setdefault(("sel", L), []).append(out.detach().cpu())
        hooks.append(ix.scorer.register_forward_hook(sc_hook) if hasattr(ix, "scorer") else None)
        hooks.append(ix.register_forward_hook(ix_hook))
    hooks = [h for h in hooks if h is not None]
    try:
        for stable in (False, True):
            patch.stable = stable
            tag = "stable_topk" if stable else "torch_topk"
            rec.clear()
            nc = hf.logits(model, ids)
            nc_rec = dict(rec)
            if stable:
                rep["nocache_torch_topk_vs_stable_max_abs"] = float(np.abs(nc - nc_torch).max())
            else:
                nc_torch = nc
            for k in (1, 37):
                rec.clear()
                cd = hf.cached_logits(model, ids, k)
                cd_rec = dict(rec)
                ref = nc
                diff = np.abs(cd - ref).max(axis=1)
                first = int(np.argmax(diff > 1e-4)) if (diff > 1e-4).any() else None
                r = {"max_abs_dlogit": float(diff.max()), "first_pos_abs_gt_1e-4": first,
                     "argmax_agree": float((cd.argmax(1) == ref.argmax(1)).mean())}
                # localisation at the indexer
                loc = {}
                for L, _ in idx_mods:
                    sel_nc = nc_rec.get(("sel", L))
                    sc_nc = nc_rec.get(("score", L))
                    sel_cd = cd_rec.get(("sel", L))
                    sc_cd = cd_rec.get(("score", L))
                    if not sel_nc or not sel_cd:
                        continue
                    sel_nc, sc_nc = sel_nc[0][0], (sc_nc[0][0] if sc_nc else None)
                    # decode calls: call 0 is the prefill of k tokens, call j>0 is position k-1+j
                    first_diff = None
                    max_sc = 0.0
                    nties = 0
                    ndiff = 0
                    for j in range(1, len(sel_cd)):
                        p = k - 1 + j
                        a = set(int(v) for v in sel_cd[j][0, -1].tolist() if v >= 0)
                        b = set(int(v) for v in sel_nc[p].tolist() if v >= 0)
                        if sc_cd is not None and sc_nc is not None:
                            s_dec = sc_cd[j][0, -1]
                            s_ref = sc_nc[p, :s_dec.shape[0]]
                            fin = torch.isfinite(s_ref) & torch.isfinite(s_dec)
                            if fin.any():
                                max_sc = max(max_sc, float((s_dec[fin] - s_ref[fin]).abs().max()))
                        if a != b:
                            ndiff += 1
                            is_tie = None
                            if sc_nc is not None:
                                s = sc_nc[p, :(p + 1) // 4]
                                sd_rows = sorted(a ^ b)
                                vals = [float(s[i]) for i in sd_rows]
                                kth = float(torch.sort(s[torch.isfinite(s)], descending=True).values[
                                    min(cfg["index_topk"], int(torch.isfinite(s).sum())) - 1])
                                is_tie = all(abs(v - kth) <= 1e-6 * max(1.0, abs(kth)) for v in vals)
                                nties += int(is_tie)
                                if first_diff is None:
                                    first_diff = {"pos": p, "rows_only_in_decode": sorted(a - b),
                                                  "rows_only_in_nocache": sorted(b - a),
                                                  "their_nocache_scores": vals, "kth_score": kth,
                                                  "exact_tie": is_tie}
                            elif first_diff is None:
                                first_diff = {"pos": p}
                    loc[f"layer{L}"] = {"positions_with_different_selection": ndiff,
                                        "of_which_ties": nties,
                                        "max_abs_score_diff_decode_vs_nocache": max_sc,
                                        "first": first_diff}
                r["indexer"] = loc
                rep[f"{tag}.prefill{k}"] = r
                log(f"drift {tag} prefill {k}: {json.dumps(r)[:600]}")
    finally:
        for h in hooks:
            h.remove()
        patch.stable = True
    return rep


def dump_sources(hf, outdir):
    import inspect
    import importlib
    os.makedirs(outdir, exist_ok=True)
    mods = ["transformers.models.deepseek_v4.modeling_deepseek_v4",
            "transformers.models.deepseek_v4.configuration_deepseek_v4",
            "transformers.modeling_rope_utils", "transformers.masking_utils", "transformers.cache_utils",
            "transformers.conversion_mapping"]
    for name in mods:
        try:
            m = importlib.import_module(name)
            src = inspect.getsource(m)
            with open(os.path.join(outdir, name.split(".")[-1] + ".py.txt"), "w") as f:
                f.write(src)
        except Exception as ex:  # noqa
            with open(os.path.join(outdir, name.split(".")[-1] + ".ERROR.txt"), "w") as f:
                f.write(repr(ex))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="output root; writes <out>/tests/data/hf/<config>/")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--drift-only-configs", default=",".join(DRIFT_ONLY))
    ap.add_argument("--drift", action="store_true", help="run the cached-vs-no-cache experiment")
    ap.add_argument("--dump-sources", default=None, help="folder for the installed transformers sources")
    ap.add_argument("--cpu-check", action="store_true", help="also run the goldens on CPU and compare")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--write-only", action="store_true", help="no transformers: write checkpoints only")
    args = ap.parse_args()

    report = {}
    logf = open(os.path.join(args.out, "golden_log.txt"), "a")

    def log(msg):
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    hf = None
    if args.device:
        os.environ["HF_GOLDEN_DEVICE"] = args.device
    if not args.write_only:
        hf = HF(log)
        report["versions"] = {"transformers": hf.transformers.__version__, "torch": hf.torch.__version__,
                              "numpy": np.__version__, "device": str(hf.dev),
                              "gpu": hf.torch.cuda.get_device_name(0) if hf.torch.cuda.is_available() else None}
        log(f"versions {report['versions']}")
        if args.dump_sources:
            dump_sources(hf, args.dump_sources)

    names = [n for n in args.configs.split(",") if n]
    if args.drift and hf is not None:
        names += [n for n in args.drift_only_configs.split(",") if n]
    for name in names:
        try:
            run_config(name, args, hf, report, log)
        except Exception:
            report[name] = "ERROR " + traceback.format_exc()
            log(report[name])
        with open(os.path.join(args.out, "golden_report.json"), "w") as f:
            json.dump(report, f, indent=1, default=str)
    log("done")


def run_config(name, args, hf, report, log):
    if True:
        golden = name in CONFIGS
        cfg = CONFIGS[name] if golden else DRIFT_ONLY[name]
        log(f"=== {name}")
        srng = np.random.default_rng(sum(map(ord, name)) * 7919)
        seqs = {}
        for sname, n in cfg["sequences"].items():
            seqs[sname] = [int(v) for v in srng.integers(0, cfg["vocab_size"], size=n)]
        if "long" in seqs:  # repeat a token so hash routing sees the same token twice
            seqs["long"][5] = seqs["long"][2]
        cj = hf_config_json(cfg)
        rep = {"sequences": {k: len(v) for k, v in seqs.items()}}
        chosen = None
        if hf is not None:
            conf, how = hf.build_config(cj, cfg)
            rep["config_route"] = how
            patch = TopkPatch(hf.torch, cfg["n_routed_experts"])
            patch.install()
            tries = []
            best = None
            for seed in cfg["seeds"]:
                ck = make_checkpoint(cfg, seed)
                model = hf.build_model(conf, ck, cfg)
                patch.reset()
                patch.stable, patch.record = True, True
                logits = {s: hf.logits(model, ids) for s, ids in seqs.items()}
                st = {k: list(v) for k, v in patch.stats.items()}
                ok = all(v[0] >= NEAR_TIE_REL and v[1] == 0 for v in st.values() if v[2])
                score = min(v[0] for v in st.values() if v[2])
                tries.append({"seed": seed, "router": st["router"], "indexer": st["indexer"], "ok": ok})
                log(f"seed {seed}: router min rel gap {st['router'][0]:.3g} ties {st['router'][1]} "
                    f"decisions {st['router'][2]}; indexer min rel gap {st['indexer'][0]:.3g} "
                    f"ties {st['indexer'][1]} decisions {st['indexer'][2]}")
                if best is None or score > best[0]:
                    best = (score, seed, ck, model, logits, st)
                if ok:
                    break
                del model
            score, seed, ck, model, logits, st = best
            chosen = seed
            rep["seed_search"] = tries
            rep["seed"] = seed
            rep["topk_stats"] = {k: {"min_rel_gap": v[0], "exact_ties": v[1], "decisions": v[2]}
                                 for k, v in st.items()}
            if not golden:
                if args.drift:
                    try:
                        rep["drift"] = drift_experiment(hf, model, seqs["long"], cfg, patch, log)
                    except Exception:
                        rep["drift"] = "ERROR " + traceback.format_exc()[-1500:]
                        log(rep["drift"])
                report[name] = rep
                return
            rep["rope"] = hf.check_rope(model, cfg)
            log(f"rope check {rep['rope']}")
            # unpatched torch.topk must give the same logits when the runs are tie-free
            patch.stable, patch.record = False, False
            l2 = {s: hf.logits(model, ids) for s, ids in seqs.items()}
            patch.stable, patch.record = True, True
            rep["torch_topk_vs_stable_max_abs"] = max(float(np.abs(l2[s] - logits[s]).max()) for s in seqs)
            # run-to-run determinism
            l3 = {s: hf.logits(model, ids) for s, ids in seqs.items()}
            rep["rerun_max_abs"] = max(float(np.abs(l3[s] - logits[s]).max()) for s in seqs)
            try:
                rep["mask_checks"] = mask_checks(hf, model, seqs[max(seqs, key=lambda s: len(seqs[s]))], cfg)
            except Exception:
                rep["mask_checks"] = "ERROR " + traceback.format_exc()[-800:]
            log(f"mask checks {rep['mask_checks']}")
            if args.cpu_check and hf.dev.type == "cuda":
                try:
                    mc = model.to("cpu")
                    dev = hf.dev
                    hf.dev = hf.torch.device("cpu")
                    lc = {s: hf.logits(mc, ids) for s, ids in seqs.items()}
                    hf.dev = dev
                    model.to(dev)
                    rep["cpu_vs_gpu"] = {s: {"max_abs": float(np.abs(lc[s] - logits[s]).max()),
                                             "max_rel": float((np.abs(lc[s] - logits[s]).max(1) /
                                                               np.abs(logits[s]).max(1)).max())}
                                         for s in seqs}
                except Exception:
                    rep["cpu_vs_gpu"] = "ERROR " + traceback.format_exc()[-800:]
                log(f"cpu vs gpu {rep['cpu_vs_gpu']}")
            if args.drift:
                try:
                    rep["drift"] = drift_experiment(hf, model, seqs[max(seqs, key=lambda s: len(seqs[s]))],
                                                    cfg, patch, log)
                except Exception:
                    rep["drift"] = "ERROR " + traceback.format_exc()[-1500:]
                    log(rep["drift"])
        else:
            chosen = cfg["seeds"][0]
            ck = make_checkpoint(cfg, chosen)
            logits = None

        if not golden:
            report[name] = rep
            return
        outdir = os.path.join(args.out, "tests", "data", "hf", name)
        write_checkpoint(ck, cfg, os.path.join(outdir, "checkpoint"))
        rep["checkpoint_verify"] = verify_written(os.path.join(outdir, "checkpoint"), ck,
                                                  hf.torch if hf is not None else None)
        log(f"checkpoint verify {rep['checkpoint_verify']}")
        files = {}
        if logits is not None:
            for s, arr in logits.items():
                fn = f"hf-{s}.npy"
                np.save(os.path.join(outdir, fn), np.ascontiguousarray(arr, dtype=np.float32))
                files[s] = fn
        st = rep.get("topk_stats", {})
        notes = (
            f"transformers {report.get('versions', {}).get('transformers')} DeepseekV4ForCausalLM, float32, "
            f"eager attention, no-cache forward (use_cache=False) of each whole sequence on "
            f"{report.get('versions', {}).get('gpu')}; TF32 off. Weights drawn with seed {chosen} by "
            f"tools/reference/make_hf_golden.py and rounded to the official formats first, so the model saw "
            f"exactly the dequantized checkpoint values (EXACT mode: no activation quantization, no KV/indexer "
            f"QAT simulation). Layout compress_ratios={cfg['compress_ratios']}, window {cfg['sliding_window']}, "
            f"index_topk {cfg['index_topk']}, hash layers < {cfg['num_hash_layers']}. Every top-k (indexer and "
            f"router) was a stable sort breaking exact ties toward the lower index; the seed was chosen so that no "
            f"top-k boundary is an exact or near tie: smallest relative gap between the k-th and (k+1)-th score "
            f"over all runs: indexer {st.get('indexer', {}).get('min_rel_gap')}, router "
            f"{st.get('router', {}).get('min_rel_gap')}. YaRN on compressed layers per rope_scaling "
            f"(factor {cfg['rope_scaling']['factor']}, original {cfg['rope_scaling']['original_max_position_embeddings']}), "
            f"no mscale; sliding layers plain RoPE base 10000. Row i = logits after tokens[0..i]."
        )
        runs = {"config": name, "sequences": seqs, "files": files, "notes": notes}
        with open(os.path.join(outdir, "runs.json"), "w") as f:
            json.dump(runs, f, indent=1)
            f.write("\n")
        rep["bytes"] = sum(os.path.getsize(os.path.join(dp, fn)) for dp, _, fns in os.walk(outdir) for fn in fns)
        report[name] = rep
        log(f"{name}: wrote {outdir} ({rep['bytes']} bytes)")


if __name__ == "__main__":
    main()
