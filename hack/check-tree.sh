#!/usr/bin/env bash
# Nothing built in the tree: fails when a file in git's index (what the next commit holds, and in a
# fresh clone what HEAD holds) is larger than MAX_FILE_BYTES (1 MiB by default) or is a compiled
# program or object, told by its first bytes whatever its mode: ELF, Mach-O (and fat/universal),
# PE/COFF and DOS executables, WebAssembly, and ar archives (static libraries, Go .a files).
# A script with #! and the x bit is text and passes.
set -euo pipefail
cd "$(dirname "$0")/.."
max=${MAX_FILE_BYTES:-1048576}

# kind_of HEX: the kind of binary whose first bytes (hex, no spaces) are HEX, or nothing.
kind_of() {
  local h=$1
  case $h in
    7f454c46*) echo "ELF executable or object" ;;
    feedface* | cefaedfe* | feedfacf* | cffaedfe*) echo "Mach-O executable or object" ;;
    cafebabe*) echo "Mach-O universal binary (or Java class file)" ;;
    0061736d*) echo "WebAssembly module" ;;
    213c617263683e0a*) echo "ar archive (static library or Go package archive)" ;;
    4d5a*)
      # "MZ": a DOS/PE executable when its header holds NUL bytes; a text file starting "MZ" has none.
      [[ ${h:4} =~ ^(..)*00 ]] && echo "PE/DOS executable" ;;
  esac
  return 0
}

tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
bad=0
count=0
# Every blob's size from one git process: "OBJECT SIZE PATH" for each file of the index. A submodule's
# entry (mode 160000) is a commit, not a file of this tree.
while IFS= read -r -d '' entry; do
  meta=${entry%%$'\t'*} path=${entry#*$'\t'}
  [ "${meta%% *}" = 160000 ] && continue
  count=$((count + 1))
  object=${meta#* } object=${object%% *}
  echo "$object $path"
done < <(git ls-files --stage -z) >"$tmp"
while read -r size path; do
  if (( size > max )); then
    echo "too large: $path ($size bytes, over $max)" >&2
    bad=1
  fi
done < <(git cat-file --batch-check='%(objectsize) %(rest)' <"$tmp")

# Only a blob git takes for binary (a NUL byte in its first 8000 bytes) can be a program or object:
# their headers all hold NULs. git diff against the empty tree says which ("-" for lines added).
empty_tree=$(git hash-object -t tree /dev/null)
while IFS= read -r -d '' entry; do
  [[ $entry == -$'\t'-$'\t'* ]] || continue
  path=${entry#-$'\t'-$'\t'}
  # head ends the pipe early by design; the pipe's status is of no interest.
  hex=$(git cat-file blob ":$path" | head -c 64 | od -An -v -tx1 | tr -d ' \n' || true)
  kind=$(kind_of "$hex")
  if [ -n "$kind" ]; then
    echo "built binary: $path ($kind)" >&2
    bad=1
  fi
done < <(git -c core.quotepath=off diff --cached --numstat --no-renames --no-ext-diff --no-textconv -z "$empty_tree")

# The Dockerfiles' pinned bases are the ones hack/lib.sh names (the scripts check for those).
source "$(dirname "$0")/lib.sh"
for pair in operator:distroless-static proxy:distroless-iptables; do
  file=Dockerfile.${pair%%:*} role=${pair#*:}
  for want in "GO_IMAGE=$(base_image golang)" "BASE_IMAGE=$(base_image "$role")"; do
    if ! grep -qxF "ARG $want" "$file"; then
      echo "$file: no line 'ARG $want' (hack/lib.sh base_image)" >&2
      bad=1
    fi
  done
done

if (( bad )); then
  echo "check-tree: fix the above (a file to drop from git: git rm --cached PATH; build output belongs in bin/ or dist/)" >&2
  exit 1
fi
echo "check-tree: $count tracked files, none over $max bytes, no built binaries"
