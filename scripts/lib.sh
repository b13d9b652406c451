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

# lavapipe_vars: "VK_DRIVER_FILES=... VK_ICD_FILENAMES=..." (one a line) naming the newer lavapipe
# that scripts/fetch-lavapipe unpacked, for `env` in front of the native tests; nothing when there
# is none or CERA_SYSTEM_VULKAN=1 (then the Vulkan loader picks among the system's drivers, e.g. a
# real GPU's). Only the native tests take it: the browser's WebGPU runs on its own SwiftShader.
lavapipe_vars() {
  local icd="${XDG_CACHE_HOME:-$HOME/.cache}/cera-web/lavapipe/lvp.json"
  if [ "${CERA_SYSTEM_VULKAN:-0}" != 1 ] && [ -f "$icd" ]; then
    printf 'VK_DRIVER_FILES=%s\nVK_ICD_FILENAMES=%s\n' "$icd" "$icd"
  fi
}

# count_cargo LOG [SKIPDOC]: "passed failed ignored" summed over every `test result:` line of a
# cargo/wasm-bindgen-test log; with SKIPDOC=1 it stops at the doc tests.
count_cargo() {
  awk '/Doc-tests/ && skipdoc { exit }
       /^test result:/ {
         for (i = 1; i <= NF; i++) {
           if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) g += $i
         }
       } END { printf "%d %d %d\n", p, f, g }' skipdoc="${2:-0}" "$1"
}

# sum_results DIR PHASE...: the phases' DIR/PHASE.result files (a line "passed failed ignored
# ok", ok 0 when the phase passed, then its summary line) summed, for phases that ran side by side:
# each summary line, then "TOTAL passed failed ignored status" (status 1 if any phase failed). A
# phase without its file (it crashed, or was killed) is a failure, named.
sum_results() {
  local dir="$1" p rp rf rg rok line tp=0 tf=0 tg=0 st=0; shift
  for p in "$@"; do
    if [ -f "$dir/$p.result" ] && { read -r rp rf rg rok && read -r line; } < "$dir/$p.result"; then
      echo "$line"
      tp=$((tp + rp)); tf=$((tf + rf)); tg=$((tg + rg)); [ "$rok" = 0 ] || st=1
    else
      echo "$p: ended without its figures"; tf=$((tf + 1)); st=1
    fi
  done
  echo "TOTAL $tp $tf $tg $st"
}

# count_tap LOG: "passed failed skipped" from node's TAP summary ("# pass N", "# fail N",
# "# cancelled N", "# skipped N", "# todo N"); cancelled counts as failed, todo as skipped.
count_tap() {
  awk '/^# pass / { p = $3 } /^# (fail|cancelled) / { f += $3 } /^# (skipped|todo) / { g += $3 }
       END { printf "%d %d %d\n", p, f, g }' "$1"
}

# phase_figures NAME RC P F G: a phase's "passed failed ignored" as the summary counts them; exits
# 1 when the phase failed. A non-zero exit with no failed test (a build error, a crash) counts as
# one failure, and so does a phase that ran no test at all (a filter that matched nothing, a
# runner that found no test files). Ignored or skipped tests fail the whole run (scripts/test).
phase_figures() {
  local name="$1" rc="$2" p="$3" f="$4" g="$5" ok=0
  if [ "$rc" -ne 0 ]; then ok=1; [ "$f" -eq 0 ] && f=1; fi
  if [ $((p + f + g)) -eq 0 ]; then echo "[test] $name ran no tests" >&2; f=1; ok=1; fi
  echo "$p $f $g"
  return $ok
}
