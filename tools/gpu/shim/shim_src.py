"""Source rewriting shared by the shim scripts (shim_attention.sh, shim_indexer.sh, shim_mma16.sh): CUDA kernel
source -> C++ for tools/gpu/shim/cuda_shim.h, every GPU thread a fiber."""
import re


def poison_shared(text):
    """After each static __shared__ array's declaration, thread 0 poisons it (reads before writes show up)."""
    def poison(m):
        return m.group(0) + "\n    if (threadIdx.x == 0) shim_poison(%s, sizeof %s);" % (m.group(2), m.group(2))
    return re.sub(r"(__shared__[^;\n]*?\b(\w+)\[[^;\n]*;)", poison, text)


def split_top(s):
    """s split at its top-level commas (not inside () or [])."""
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([": depth += 1
        if ch in ")]": depth -= 1
        if ch == "," and depth == 0: parts.append(cur.strip()); cur = ""
        else: cur += ch
    parts.append(cur.strip())
    return parts


def launches(text, name=r"\w+"):
    """Every `kernel<<<grid, block, ...>>>(args);` (or `kernel<TEMPLATE ARGS><<<...`) whose kernel matches `name` as a
    shim_launch; returns (text, count)."""
    def launch(m):
        cfg = split_top(m.group(2))
        return "shim_launch(dim3(%s), dim3(%s), [&] { %s(%s); });" % (cfg[0], cfg[1], m.group(1), m.group(3))
    return re.subn(r"(%s(?:<[\w\s,*+]*>)?)<<<(.*?)>>>\((.*?)\);" % name, launch, text, flags=re.S)


def strip_asm(text):
    """Every __device__ function whose body holds inline assembly, removed (the preamble defines them in C++)."""
    out, pos = [], 0
    for m in re.finditer(r"(?:template <[^>]*>\s*)?__device__ __forceinline__[^;{]*?\b(\w+)\s*\([^{;]*\)\s*\{", text):
        if m.start() < pos: continue
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if "asm" in text[m.end():i]:
            out.append(text[pos:m.start()])
            pos = i
    out.append(text[pos:])
    return "".join(out)
