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
