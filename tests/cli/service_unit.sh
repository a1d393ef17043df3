#!/usr/bin/env bash
# contrib/dsv4.service (issue 19): the sandboxing the README promises is there, systemd accepts the unit (when
# systemd-analyze is installed), and every option it passes to `dsv4 serve` is one serve documents (once this
# build has the serve command). Run from the repository root with DSV4_BIN set; prints "N passed, N failed".
. "$(dirname "$0")/lib.sh"
UNIT=${DSV4_ROOT:-.}/contrib/dsv4.service

for want in NoNewPrivileges=yes ProtectSystem=strict PrivateTmp=yes DynamicUser=yes CacheDirectory=dsv4 \
            ProtectHome=read-only; do
    grep -qx "$want" "$UNIT" && ok || bad "unit lacks $want"
done
# the server binds loopback unless told otherwise
grep -q 'DSV4_HOST=127.0.0.1' "$UNIT" && ok || bad "unit does not default to 127.0.0.1"

if command -v systemd-analyze >/dev/null; then
    # point ExecStart at this build's binary, drop the man: link (the page may not be installed here)
    sed -e "s|/usr/local/bin/dsv4|$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")|" -e '/^Documentation=/d' \
        "$UNIT" >"$T/dsv4.service"
    systemd-analyze verify "$T/dsv4.service" >"$T/v.out" 2>&1
    grep -v -e 'Failed to .* bus' -e 'System has not been booted' "$T/v.out" >"$T/v.err"
    [ ! -s "$T/v.err" ] && ok || bad "systemd-analyze verify: $(head -3 "$T/v.err")"
fi

# the options ExecStart passes to serve, against `dsv4 help serve`
opts=$(sed -n '/^ExecStart=/,/[^\\]$/p' "$UNIT" | grep -oE -- ' --?[a-z][a-z-]*' | sort -u)
[ -n "$opts" ] && ok || bad "no serve options found in ExecStart"
if "$BIN" help serve >"$T/serve.help" 2>/dev/null; then
    for o in $opts; do grep -qE -- "^  (-[a-z], )?$o(,| |$)" "$T/serve.help" && ok || bad "serve has no option $o"; done
fi
finish
