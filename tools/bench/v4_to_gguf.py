#!/usr/bin/env python3
"""Convert an official-format DeepSeek V4 checkpoint (config.json + safetensors shards, as published and as
`dsv4 bench --synthetic flash-2g` writes it) into a GGUF for llama.cpp / ik_llama.cpp's `deepseek4` architecture,
for the side-by-side CPU comparison of tools/bench/llamacpp_compare.sh (issue 17).

Why our own converter: ik_llama.cpp's convert_hf_to_gguf.py only exports the MTP companion of a V4 model (its
main-model path expects the GGUFs made by mainline llama.cpp's converter, which is not available here), and both
need a torch with float8 dtypes. This one needs numpy only, plus the gguf-py package of the llama.cpp tree
(--gguf-py DIR, put on sys.path) for the file writer and its bit-exact Q8_0 quantizer.

The recipe is the issue's: FP8 (E4M3, UE8M0 per 128x128 block) linears -> Q8_0 (dequantized exactly to f32 first:
an E4M3 value times a power of two is exact in f32), FP4 (E2M1, UE8M0 per 32) routed experts -> MXFP4 (a lossless
repack: the same 4-bit codes and the same per-32 exponent, only the nibble order differs), BF16 matrices kept BF16,
F32 kept F32, 1-D BF16 vectors (norm weights) widened to F32 (ggml's element-wise ops want F32 there, as mainline's
converter does). The tensor names and GGML shapes are those ik_llama.cpp's create_deepseek4_tensors() loads
(mainline's layout: the official [out, in] matrices become ne = (in, out), nothing permuted). There is no tokenizer:
tokenizer.ggml.model = "none" with deepseek4.vocab_size dummy tokens (llama-bench and a token-id driver need none).

Usage: v4_to_gguf.py --gguf-py IK_TREE/gguf-py CHECKPOINT_DIR OUT.gguf
"""
import argparse, json, os, re, struct, sys
import numpy as np

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--gguf-py", required=True, help="the gguf-py folder of the llama.cpp tree")
ap.add_argument("model")
ap.add_argument("out")
args = ap.parse_args()
sys.path.insert(0, args.gguf_py)
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402

cfg = json.load(open(os.path.join(args.model, "config.json")))
ARCH = "deepseek4"

# ---------------------------------------------------------------- safetensors, read with numpy (memory-mapped)
ST_DTYPE = {"BF16": np.uint16, "F32": np.float32, "I32": np.int32, "F8_E4M3": np.uint8, "F8_E8M0": np.uint8,
            "I8": np.uint8, "U8": np.uint8, "F16": np.float16}
tensors = {}  # name -> (file, dtype string, shape, offset)
for fn in sorted(f for f in os.listdir(args.model) if f.endswith(".safetensors")):
    path = os.path.join(args.model, fn)
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        tensors[k] = (path, v["dtype"], tuple(v["shape"]), 8 + n + v["data_offsets"][0])
maps = {}


def load(name):
    path, dt, shape, off = tensors[name]
    if path not in maps:
        maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
    npdt = np.dtype(ST_DTYPE[dt])
    count = int(np.prod(shape)) if shape else 1
    return np.frombuffer(maps[path], dtype=npdt, count=count, offset=off).reshape(shape), dt


# ---------------------------------------------------------------- number formats
def e4m3_table():
    t = np.zeros(256, np.float32)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        v = (m / 8.0) * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
        if e == 15 and m == 7:
            v = float("nan")
        t[b] = -v if s else v
    return t


E4M3 = e4m3_table()


def fp8_dequant(w, s):
    """[O, I] E4M3 codes with [ceil(O/128), ceil(I/128)] UE8M0 block scales -> f32 (exact)."""
    O, I = w.shape
    sc = np.ldexp(np.float32(1), s.astype(np.int32) - 127).astype(np.float32)
    sc = np.repeat(np.repeat(sc, 128, axis=0)[:O], 128, axis=1)[:, :I]
    return E4M3[w] * sc


def fp4_to_mxfp4(w, s):
    """[O, I/2] E2M1 pairs (low nibble = even element) + [O, I/32] UE8M0 -> GGML block_mxfp4 rows [O, I/32*17]:
    byte 0 = the exponent, then 16 bytes whose low nibble is element j and high nibble element j+16 of the block.
    GGML's table is 2x E2M1 and its scale 2^(e-128): the same value, so the repack is lossless."""
    O, half = w.shape
    nb = half * 2 // 32
    b = w.reshape(O, nb, 16)
    codes = np.stack((b & 15, b >> 4), axis=-1).reshape(O, nb, 32)
    qs = (codes[:, :, :16] | (codes[:, :, 16:] << 4)).astype(np.uint8)
    return np.concatenate((s.reshape(O, nb, 1).astype(np.uint8), qs), axis=-1).reshape(O, nb * 17)


# ---------------------------------------------------------------- name map: official -> GGUF
ROOT = {"embed.weight": "token_embd.weight", "head.weight": "output.weight", "norm.weight": "output_norm.weight",
        "hc_head_fn": "output_hc_fn.weight", "hc_head_base": "output_hc_base.weight",
        "hc_head_scale": "output_hc_scale.weight"}
LAYER = {
    "attn_norm.weight": "attn_norm.weight", "ffn_norm.weight": "ffn_norm.weight",
    "hc_attn_fn": "hc_attn_fn.weight", "hc_attn_base": "hc_attn_base.weight", "hc_attn_scale": "hc_attn_scale.weight",
    "hc_ffn_fn": "hc_ffn_fn.weight", "hc_ffn_base": "hc_ffn_base.weight", "hc_ffn_scale": "hc_ffn_scale.weight",
    "attn.wq_a.weight": "attn_q_a.weight", "attn.q_norm.weight": "attn_q_a_norm.weight",
    "attn.wq_b.weight": "attn_q_b.weight", "attn.wkv.weight": "attn_kv.weight",
    "attn.kv_norm.weight": "attn_kv_a_norm.weight", "attn.wo_a.weight": "attn_output_a.weight",
    "attn.wo_b.weight": "attn_output_b.weight", "attn.attn_sink": "attn_sinks.weight",
    "attn.compressor.wkv.weight": "attn_compressor_kv.weight",
    "attn.compressor.wgate.weight": "attn_compressor_gate.weight",
    "attn.compressor.ape": "attn_compressor_ape.weight", "attn.compressor.norm.weight": "attn_compressor_norm.weight",
    "attn.indexer.wq_b.weight": "indexer.attn_q_b.weight", "attn.indexer.weights_proj.weight": "indexer.proj.weight",
    "attn.indexer.compressor.wkv.weight": "indexer_compressor_kv.weight",
    "attn.indexer.compressor.wgate.weight": "indexer_compressor_gate.weight",
    "attn.indexer.compressor.ape": "indexer_compressor_ape.weight",
    "attn.indexer.compressor.norm.weight": "indexer_compressor_norm.weight",
    "ffn.gate.weight": "ffn_gate_inp.weight", "ffn.gate.bias": "exp_probs_b.bias",
    "ffn.gate.tid2eid": "ffn_gate_tid2eid.weight",
    "ffn.shared_experts.w1.weight": "ffn_gate_shexp.weight", "ffn.shared_experts.w2.weight": "ffn_down_shexp.weight",
    "ffn.shared_experts.w3.weight": "ffn_up_shexp.weight",
}
EXPERT = {"1": "ffn_gate_exps.weight", "2": "ffn_down_exps.weight", "3": "ffn_up_exps.weight"}
L, E = cfg["num_hidden_layers"], cfg["n_routed_experts"]

# a plan: (gguf name, producer) in a fixed order; the producer returns (array, raw_dtype or None)
plan = []


def plain(src):
    _, dt, shape, _ = tensors[src]
    if dt == "BF16" and len(shape) == 1:
        meta = (shape, np.dtype(np.float32), None)
    elif dt == "BF16":
        meta = (shape, np.dtype(np.uint16), QT.BF16)
    else:
        meta = (shape, np.dtype(ST_DTYPE[dt]), None)

    def f():
        a, dt = load(src)
        if dt == "BF16":
            if a.ndim == 1:  # vectors widened to F32
                return (a.astype(np.uint32) << 16).view(np.float32), None
            return np.ascontiguousarray(a), QT.BF16
        if dt in ("F32", "I32", "F16"):
            return np.ascontiguousarray(a), None
        raise ValueError(f"{src}: unexpected dtype {dt}")
    return f, meta


def fp8(src):
    O, I = tensors[src][2]

    def f():
        w, _ = load(src)
        s, _ = load(src[: -len(".weight")] + ".scale")
        return gguf.quants.quantize(fp8_dequant(w, s), QT.Q8_0), QT.Q8_0
    return f, ((O, I // 32 * 34), np.dtype(np.uint8), QT.Q8_0)


def experts(l, p):
    O, half = tensors[f"layers.{l}.ffn.experts.0.w{p}.weight"][2]

    def f():
        rows = []
        for e in range(E):
            base = f"layers.{l}.ffn.experts.{e}.w{p}"
            w, dt = load(base + ".weight")
            s, _ = load(base + ".scale")
            assert dt in ("I8", "U8"), f"{base}: expected packed FP4, got {dt}"
            rows.append(fp4_to_mxfp4(w, s))
        return np.stack(rows), QT.MXFP4
    return f, ((E, O, half * 2 // 32 * 17), np.dtype(np.uint8), QT.MXFP4)


for k in ROOT:
    plan.append((ROOT[k], *plain(k)))
for l in range(L):
    for k, g in LAYER.items():
        src = f"layers.{l}.{k}"
        if src not in tensors:
            continue
        scaled = src.endswith(".weight") and src[: -len(".weight")] + ".scale" in tensors
        plan.append((f"blk.{l}.{g}", *(fp8(src) if scaled else plain(src))))
    for p in ("1", "2", "3"):
        plan.append((f"blk.{l}.{EXPERT[p]}", *experts(l, p)))
known = set(ROOT) | {f"layers.{l}.{k}" for l in range(L) for k in LAYER} | \
    {f"layers.{l}.{k}".replace("weight", "scale") for l in range(L) for k in LAYER}
left = [k for k in tensors if k not in known and not re.match(r"layers\.\d+\.ffn\.experts\.", k)]
if left:
    sys.exit(f"v4_to_gguf: tensors this converter does not map: {left[:8]}")

# ---------------------------------------------------------------- metadata (the keys ik_llama.cpp's loader reads)
w = gguf.GGUFWriter(args.out, ARCH)
w.add_name("dsv4-" + os.path.basename(os.path.normpath(args.model)))
w.add_uint32(f"{ARCH}.vocab_size", cfg["vocab_size"])
w.add_context_length(cfg["max_position_embeddings"])
w.add_embedding_length(cfg["hidden_size"])
w.add_block_count(L)
w.add_feed_forward_length(cfg["moe_intermediate_size"])
w.add_head_count(cfg["num_attention_heads"])
w.add_head_count_kv(cfg.get("num_key_value_heads", 1))
w.add_key_length(cfg["head_dim"])
w.add_value_length(cfg["head_dim"])
w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
w.add_q_lora_rank(cfg["q_lora_rank"])
w.add_rope_dimension_count(cfg["qk_rope_head_dim"])
w.add_rope_freq_base(cfg["rope_theta"])
rs = cfg.get("rope_scaling") or {}
if rs.get("type", rs.get("rope_type")) == "yarn":
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rs["factor"])
    w.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
    w.add_float32(f"{ARCH}.rope.scaling.yarn_beta_fast", float(rs.get("beta_fast", 32)))
    w.add_float32(f"{ARCH}.rope.scaling.yarn_beta_slow", float(rs.get("beta_slow", 1)))
w.add_leading_dense_block_count(0)
w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
w.add_expert_count(E)
w.add_expert_used_count(cfg["num_experts_per_tok"])
w.add_expert_shared_count(cfg["n_shared_experts"])
w.add_expert_weights_scale(cfg["routed_scaling_factor"])
w.add_expert_weights_norm(bool(cfg["norm_topk_prob"]))
assert cfg["scoring_func"] == "sqrtsoftplus"
w.add_expert_gating_func(gguf.ExpertGatingFuncType.SQRTSOFTPLUS)
w.add_array(f"{ARCH}.swiglu_clamp_exp", [float(cfg["swiglu_limit"])] * L)
w.add_array(f"{ARCH}.swiglu_clamp_shexp", [float(cfg["swiglu_limit"])] * L)
w.add_sliding_window(cfg["sliding_window"])
w.add_uint32(f"{ARCH}.attention.output_group_count", cfg["o_groups"])
w.add_uint32(f"{ARCH}.attention.output_lora_rank", cfg["o_lora_rank"])
w.add_array(f"{ARCH}.attention.compress_ratios", [int(r) for r in cfg["compress_ratios"][:L]])
w.add_float32(f"{ARCH}.attention.compress_rope_freq_base", float(cfg["compress_rope_theta"]))
w.add_uint32(f"{ARCH}.hyper_connection.count", cfg["hc_mult"])
w.add_uint32(f"{ARCH}.hyper_connection.sinkhorn_iterations", cfg["hc_sinkhorn_iters"])
w.add_float32(f"{ARCH}.hyper_connection.epsilon", float(cfg["hc_eps"]))
w.add_uint32(f"{ARCH}.hash_layer_count", cfg.get("num_hash_layers", 0))
w.add_uint32(f"{ARCH}.attention.indexer.head_count", cfg["index_n_heads"])
w.add_uint32(f"{ARCH}.attention.indexer.key_length", cfg["index_head_dim"])
w.add_uint32(f"{ARCH}.attention.indexer.top_k", cfg["index_topk"])
w.add_uint32(f"{ARCH}.nextn_predict_layers", 0)
w.add_tokenizer_model("none")
w.add_bos_token_id(cfg.get("bos_token_id", 0))
w.add_eos_token_id(cfg.get("eos_token_id", 1))

# ---------------------------------------------------------------- the tensor table from the shapes, then the data
# in the same order, one tensor in memory at a time
for name, make, (shape, dtype, raw) in plan:
    w.add_tensor_info(name, shape, dtype, int(np.prod(shape)) * dtype.itemsize, raw_dtype=raw)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_ti_data_to_file()
for name, make, (shape, dtype, raw) in plan:
    a, r = make()
    assert a.shape == tuple(shape) and a.dtype == dtype and r == raw, (name, a.shape, a.dtype, r, shape, dtype, raw)
    w.write_tensor_data(np.ascontiguousarray(a))
w.close()
print(f"v4_to_gguf: wrote {len(plan)} tensors to {args.out} ({os.path.getsize(args.out) / 1e9:.3f} GB)")
