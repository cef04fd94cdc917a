# Sourced by the fake tools in this folder (POSIX sh builtins only, so PATH may hold nothing else).
# Each tool reads FAKE_<TOOL>: empty = print the normal capture, "hang" = never finish,
# "garbage" = print nonsense and exit 0, "fail" = print an error and exit 3; some tools know more.
DATA="${0%/*}/../data/probes"
cat_file() { while IFS= read -r line || [ -n "$line" ]; do printf '%s\n' "$line"; done < "$1"; }
fake_mode() {
  case "$1" in
    hang) while :; do :; done ;;
    garbage) printf '\001\002garbage {{ not the format }} 12abc\n'; exit 0 ;;
    fail) printf 'fake failure\n' >&2; exit 3 ;;
  esac
}
