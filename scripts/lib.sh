# Shared by the scripts: read wasm-pack.toml (the one place for packaging settings).
# shellcheck shell=bash

# toml_get SECTION KEY: a string value ("x") from wasm-pack.toml.
toml_get() {
  awk -v sec="[$1]" -v key="$2" '
    /^\[/ { insec = ($0 == sec) }
    insec && $1 == key { sub(/^[^=]*= *"/, ""); sub(/".*$/, ""); print; exit }
  ' wasm-pack.toml
}

# toml_list SECTION KEY: the strings of a multi-line array, one per line.
toml_list() {
  awk -v sec="[$1]" -v key="$2" '
    function strings(s,   m) { while (match(s, /"[^"]*"/)) { print substr(s, RSTART + 1, RLENGTH - 2); s = substr(s, RSTART + RLENGTH) } }
    /^\[/ && !inarr { insec = ($0 == sec) }
    insec && !inarr && $1 == key { rest = $0; sub(/^[^=]*=/, "", rest); strings(rest); if (rest ~ /\]/) exit; inarr = 1; next }
    inarr && /^[ \t]*\]/ { exit }
    inarr { sub(/#.*/, ""); strings($0) }
  ' wasm-pack.toml
}

# The webdriver capabilities for wasm-bindgen-test, generated from [browser] chrome-args.
write_webdriver_json() {
  local out="$1" args
  args="$(toml_list browser chrome-args | sed 's/.*/"&"/' | paste -sd, -)"
  mkdir -p "$(dirname "$out")"
  printf '{"goog:chromeOptions":{"args":[%s]}}\n' "$args" > "$out"
}

gpu_env() {
  export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/cera-xdg-$(id -u)}"
  mkdir -p -m 700 "$XDG_RUNTIME_DIR"
}
