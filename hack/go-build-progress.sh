# Sourced by the build scripts: go builds that show what they do and how long they have taken.

# count_packages prints how many packages the given packages need, themselves included: what a
# build compiles with an empty cache.
count_packages() {
  CGO_ENABLED=0 go list -deps "$@" | wc -l
}

# go_build NAME OUT PACKAGE TOTAL [go build flags...] builds PACKAGE into OUT. It counts the
# packages compiled (go build -v names each) against TOTAL, those the scripts expect to compile,
# with the time elapsed: on a terminal in one line kept up to date, otherwise in a line every
# 30 seconds. Errors and downloads are shown as they come. The count and the time run on from
# one call to the next (PROGRESS_DONE, and the script's SECONDS).
go_build() {
  local name=$1 out=$2 pkg=$3 total=$4 done
  shift 4
  echo "building $name ($pkg) into $out" >&2
  if ! done=$(CGO_ENABLED=0 go build -v -trimpath "$@" -o "$out.tmp" "$pkg" 2>&1 | _progress "$name" "$total"); then
    rm -f "$out.tmp"
    echo "building $name failed after $(_elapsed)" >&2
    return 1
  fi
  mv "$out.tmp" "$out"
  PROGRESS_DONE=$done
  echo "built $name ($(_elapsed) so far)" >&2
}

PROGRESS_DONE=0

_elapsed() { printf '%dm%02ds' $((SECONDS / 60)) $((SECONDS % 60)); }

# _progress reads go build -v's output: package paths, and anything else (errors, downloads).
# It prints the count of packages compiled so far.
_progress() {
  local name=$1 total=$2 done=$PROGRESS_DONE last=$SECONDS line tty=
  [ -t 2 ] && tty=1
  while IFS= read -r line; do
    if [[ $line =~ ^[A-Za-z0-9._~/+-]+$ ]]; then
      done=$((done + 1))
      if [ -n "$tty" ]; then
        printf '\r\033[K  %s: %d of about %d packages compiled, %s' "$name" "$done" "$total" "$(_elapsed)" >&2
      elif ((SECONDS - last >= 30)); then
        printf '  %s: %d of about %d packages compiled, %s\n' "$name" "$done" "$total" "$(_elapsed)" >&2
        last=$SECONDS
      fi
    else
      if [ -n "$tty" ]; then printf '\r\033[K' >&2; fi
      printf '%s\n' "$line" >&2
    fi
  done
  if [ -n "$tty" ]; then printf '\r\033[K' >&2; fi
  echo "$done"
}
