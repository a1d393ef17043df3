#!/usr/bin/env bash
# make install / uninstall as a C library (issue 19). Stages an install with DESTDIR=$T/stage PREFIX=/usr, then:
# the file list, soname and symlinks; only the API of include/dsv4.h is exported from libdsv4.so (nm -D);
# the examples compiled against the staged install through pkg-config, linked shared and static, run on a tiny
# model and agree with the installed dsv4 binary; make uninstall leaves the staging folder empty and spares
# files it did not install. Builds in the normal build/ folder (reusing its objects).
# Run from the repository root with DSV4_BIN set; prints "N passed, N failed".
. "$(dirname "$0")/lib.sh"
ROOT=$(cd "${DSV4_ROOT:-.}" && pwd)
STAGE=$T/stage
CC=${CC:-cc}
# a clean sub-make: not the suite's BUILD (build-asan under make test-asan) nor a parent make's job server
unset MAKEFLAGS MFLAGS MAKELEVEL BUILD
# The commit already baked into build/ (mk/install.mk's build_info.h), passed back as GIT_COMMIT: the other tests run
# build/dsv4 beside this one, and a commit or an edited tracked file since the build would otherwise make this
# sub-make rewrite build_info.h and relink build/dsv4 (removing build/libdsv4.a first) under them — which is how
# profile.sh and prefix_cache.sh once failed in a local `make test` (2026-12-07).
BAKED=$(sed -n 's/^#define DSV4_BUILD_COMMIT "\(.*\)"$/\1/p' "$ROOT/build/gen/build_info.h" 2>/dev/null)
mk() { make -C "$ROOT" -j2 --no-print-directory BUILD=build ${BAKED:+GIT_COMMIT=$BAKED} DESTDIR="$STAGE" PREFIX=/usr "$@" >>"$T/make.log" 2>&1; }

V=$(sed -n 's/^#define DSV4_VERSION "\(.*\)"$/\1/p' "$ROOT/include/dsv4.h")
MAJOR=${V%%.*}
if ! mk install; then bad "make install failed: $(tail -5 "$T/make.log")"; finish; exit 1; fi

# ---- the files ---------------------------------------------------------------------------------------------
L=$STAGE/usr/lib
for f in usr/bin/dsv4 usr/lib/libdsv4.a "usr/lib/libdsv4.so.$V" usr/include/dsv4.h usr/lib/pkgconfig/dsv4.pc \
         usr/share/man/man1/dsv4.1; do
    [ -f "$STAGE/$f" ] && [ ! -L "$STAGE/$f" ] && ok || bad "not installed as a file: $f"
done
[ "$(readlink "$L/libdsv4.so.$MAJOR")" = "libdsv4.so.$V" ] && ok || bad "libdsv4.so.$MAJOR -> $(readlink "$L/libdsv4.so.$MAJOR")"
[ "$(readlink "$L/libdsv4.so")" = "libdsv4.so.$MAJOR" ] && ok || bad "libdsv4.so -> $(readlink "$L/libdsv4.so")"
[ -x "$STAGE/usr/bin/dsv4" ] && ok || bad "dsv4 not executable"
cmp -s "$STAGE/usr/include/dsv4.h" "$ROOT/include/dsv4.h" && ok || bad "installed dsv4.h differs"
readelf -d "$L/libdsv4.so.$V" | grep -q "SONAME.*\[libdsv4.so.$MAJOR\]" && ok || bad "soname: $(readelf -d "$L/libdsv4.so.$V" | grep SONAME)"
grep -q "dsv4 $V" "$STAGE/usr/share/man/man1/dsv4.1" && ! grep -q '@VERSION@' "$STAGE/usr/share/man/man1/dsv4.1" && ok || bad "man page version not filled in"
[ "$(find "$STAGE" -type f -o -type l | wc -l)" -eq 8 ] && ok || bad "expected 8 installed entries: $(cd "$STAGE" && find . -type f -o -type l)"

# ---- exported symbols: exactly the DSV4_API declarations of dsv4.h -------------------------------------------
grep -E '^DSV4_API ' "$ROOT/include/dsv4.h" | grep -oE 'dsv4_[a-z0-9_]+\(' | tr -d '(' | sort -u >"$T/api"
nm -D --defined-only "$L/libdsv4.so.$V" | awk '{print $NF}' | sort -u >"$T/exported"
[ "$(wc -l <"$T/api")" -gt 20 ] && ok || bad "only $(wc -l <"$T/api") API functions found in dsv4.h"
cmp -s "$T/api" "$T/exported" && ok || bad "exported != dsv4.h API: $(diff "$T/api" "$T/exported" | grep '^[<>]' | tr '\n' ' ')"
# internal functions exist in the library (static archive) but cannot be linked from outside the shared one
nm "$L/libdsv4.a" 2>/dev/null | grep -q ' T dsv4_fail$' && ok || bad "dsv4_fail not found in libdsv4.a (update this check)"
printf 'int dsv4_fail(void);\nint main(void) { return dsv4_fail(); }\n' >"$T/internal.c"
$CC -o "$T/internal" "$T/internal.c" -L"$L" -ldsv4 >/dev/null 2>&1 && bad "an internal function links against libdsv4.so" || ok

# ---- pkg-config: compile against the staged install ------------------------------------------------------------
export PKG_CONFIG_PATH=$L/pkgconfig PKG_CONFIG_SYSROOT_DIR=$STAGE
[ "$(pkg-config --modversion dsv4)" = "$V" ] && ok || bad "pkg-config --modversion: $(pkg-config --modversion dsv4 2>&1)"
pkg-config --print-requires-private dsv4 | tr '\n' ' ' | grep -q 'jansson libpcre2-8 libxxhash' && ok || bad "Requires.private"
CFLAGS_PC=$(pkg-config --cflags dsv4)
LIBS_SHARED=$(pkg-config --libs dsv4)
LIBS_STATIC=$(pkg-config --static --libs dsv4 | sed 's/-ldsv4\b/-l:libdsv4.a/')
for ex in simple streams; do
    $CC -std=c11 -O1 -o "$T/${ex}_shared" "$ROOT/examples/$ex.c" $CFLAGS_PC $LIBS_SHARED 2>"$T/cc.err" && ok || bad "$ex shared: $(head -3 "$T/cc.err")"
    $CC -std=c11 -O1 -o "$T/${ex}_static" "$ROOT/examples/$ex.c" $CFLAGS_PC $LIBS_STATIC 2>"$T/cc.err" && ok || bad "$ex static: $(head -3 "$T/cc.err")"
done
readelf -d "$T/simple_shared" 2>/dev/null | grep -q "NEEDED.*libdsv4.so.$MAJOR" && ok || bad "simple_shared does not need libdsv4.so.$MAJOR"
readelf -d "$T/simple_static" 2>/dev/null | grep -q "NEEDED.*libdsv4" && bad "simple_static needs libdsv4.so" || ok
printf '#include <dsv4.h>\n#include <stdio.h>\n#include <string.h>\nint main(void) { puts(dsv4_version()); return strcmp(dsv4_version(), DSV4_VERSION) != 0; }\n' >"$T/ver.c"
$CC -o "$T/ver" "$T/ver.c" $CFLAGS_PC $LIBS_SHARED 2>"$T/cc.err" && LD_LIBRARY_PATH=$L "$T/ver" >"$T/ver.out" && [ "$(cat "$T/ver.out")" = "$V" ] && ok || bad "dsv4_version() through the shared library: $(cat "$T/ver.out" "$T/cc.err" 2>/dev/null)"

# ---- the installed binary and the examples on a tiny model -------------------------------------------------------
IBIN=$STAGE/usr/bin/dsv4
expect_ok "installed --version" "$IBIN" --version
[ "$(head -1 "$T/out")" = "dsv4 $V" ] && ok || bad "installed --version: $(head -1 "$T/out")"
expect_ok "installed tiny" "$IBIN" tiny -o "$T/m" --set "compress_ratios=[0,4,128]" --set num_hidden_layers=3
expect_ok "installed generate" "$IBIN" generate -m "$T/m" --tokens 1,2,3 -n 10 --ids
want=$(cat "$T/out")
[ -n "$want" ] && ok || bad "generate printed nothing"
expect_ok "simple (shared)" env LD_LIBRARY_PATH="$L" "$T/simple_shared" "$T/m" 10 1 2 3
[ "$(cat "$T/out")" = "$want" ] && ok || bad "simple (shared) '$(cat "$T/out")' != generate '$want'"
expect_ok "simple (static)" "$T/simple_static" "$T/m" 10 1 2 3
[ "$(cat "$T/out")" = "$want" ] && ok || bad "simple (static) '$(cat "$T/out")' != generate '$want'"
expect_ok "streams (shared)" env LD_LIBRARY_PATH="$L" "$T/streams_shared" "$T/m" 10
cp "$T/out" "$T/streams.out"
grep -qx "restored: identical" "$T/streams.out" && ok || bad "streams: $(tail -1 "$T/streams.out")"
i=0
for p in 1,2,3 4,5,6,7 8; do   # the example's prompts: batched streams == each prompt alone
    expect_ok "generate $p" "$IBIN" generate -m "$T/m" --tokens $p -n 10 --ids
    grep -qx "stream $i: $(cat "$T/out")" "$T/streams.out" && ok || bad "stream $i differs from generate --tokens $p"
    i=$((i + 1))
done
expect_ok "streams (static)" "$T/streams_static" "$T/m" 10
cmp -s "$T/out" "$T/streams.out" && ok || bad "streams static and shared differ"
# make examples: the same programs built in the tree against build/libdsv4.a
if mk examples; then ok; else bad "make examples: $(tail -3 "$T/make.log")"; fi
expect_ok "make examples: simple" "$ROOT/build/examples/simple" "$T/m" 10 1 2 3
[ "$(cat "$T/out")" = "$want" ] && ok || bad "build/examples/simple differs"

# ---- uninstall: exactly what was installed --------------------------------------------------------------------
if mk uninstall; then ok; else bad "make uninstall failed: $(tail -5 "$T/make.log")"; fi
[ -z "$(find "$STAGE" -mindepth 1)" ] && ok || bad "left after uninstall: $(cd "$STAGE" && find . -mindepth 1 | tr '\n' ' ')"
# a file that was there before install survives uninstall, and so does its folder
mkdir -p "$STAGE/usr/lib" && echo keep >"$STAGE/usr/lib/other.txt"
mk install && mk uninstall && ok || bad "second install/uninstall: $(tail -3 "$T/make.log")"
[ "$(cd "$STAGE" && find . -mindepth 1 | sort | tr '\n' ' ')" = "./usr ./usr/lib ./usr/lib/other.txt " ] && ok || \
    bad "uninstall touched what it did not install: $(cd "$STAGE" && find . -mindepth 1 | tr '\n' ' ')"
finish
