#!/usr/bin/env bash
# Azurite's blob service (the Azure Storage emulator, from the npm registry) for the tests.
#   bash servers/azurite.sh PORT        -> install azurite into .servers/ if missing, then run
#                                          the blob service on 127.0.0.1:PORT in the foreground
#                                          (objects kept in memory only)
#   bash servers/azurite.sh --install   -> install only
# The tests start it through a session fixture (tests/cloudkit.py) and stop it at the end.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix="${SHARDWISE_SERVERS:-$here/.servers}"
bin="$prefix/node_modules/.bin/azurite-blob"
# the version the suite runs with (3.36 and later need Node.js 22; the machines have 20)
version="3.35.0"
say() { echo "azurite.sh: $*" >&2; }

install() {
    [ -x "$bin" ] && [ -f "$prefix/node_modules/azurite/package.json" ] \
        && grep -q "\"version\": \"$version\"" "$prefix/node_modules/azurite/package.json" && return
    command -v npm >/dev/null 2>&1 || { say "npm is needed to install azurite (apt-get install npm)"; exit 3; }
    mkdir -p "$prefix"
    # one installer at a time (two test sessions may start at once)
    exec 9>"$prefix/.install.lock"
    flock 9
    say "installing azurite $version into $prefix (npm; once)"
    npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error "azurite@$version" >&2
    exec 9>&-
}

case "${1:-}" in
    --install) install ;;
    ""|-h|--help) sed -n 2,7p "${BASH_SOURCE[0]}" >&2; exit 2 ;;
    *)
        port="$1"
        install
        # --skipApiVersionCheck: obstore may speak a newer API version than this azurite knows
        exec "$bin" --blobHost 127.0.0.1 --blobPort "$port" \
            --inMemoryPersistence --silent --skipApiVersionCheck --disableProductStyleUrl ;;
esac
