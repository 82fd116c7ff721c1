#!/usr/bin/env bash
# Rewrites the `run` script that ../shared/tools/gpu-bundle writes (RUN, default .gpubundle/run)
# so that a reused GPU machine never runs a stale bundle. The tool's `run` unpacks only when
# /tmp/gpubundle/lib is absent, so on a warm machine it keeps the previous bundle's binaries and
# libraries, and it copies the binaries into the tree only on that first unpack. After this:
#   - the unpack directory is ${GPUBUNDLE_DIR:-/tmp/gpubundle};
#   - it is replaced whenever it holds another bundle than this one (a checksum stamp), and the
#     binaries are copied into the tree whenever the tree's copy is not this bundle's;
#   - FERRY_CHECK_T0 (epoch seconds) is exported at the start, before unpacking, so that
#     scripts/gpu-check.sh counts the unpacking in its budget.
# Fails loudly when the tool's `run` no longer has the lines it rewrites.
#   scripts/gpu-bundle-refresh.sh [RUN]
set -euo pipefail
run=${1:-.gpubundle/run}
[[ -f $run ]] || { echo "gpu-bundle-refresh: $run not found" >&2; exit 2; }
unpack='if [[ ! -d /tmp/gpubundle/lib ]]; then'
grep -qxF "$unpack" "$run" || {
  echo "gpu-bundle-refresh: $run has no line '$unpack'; the packing tool changed, update me" >&2
  exit 2
}
python3 - "$run" <<'PY'
import sys
path = sys.argv[1]
lines = open(path).read().split("\n")
out = []
i = 0
while i < len(lines):
    line = lines[i]
    if line == "if [[ ! -d /tmp/gpubundle/lib ]]; then":
        # The tool's block: the if, one unpack-and-copy line, fi.
        assert lines[i + 2] == "fi", "unexpected unpack block"
        out += [
            '# A bundle is known by its checksum: a directory or a tree holding another is replaced.',
            'stamp=$(cksum < "$here/bundle.tar.xz")',
            'if [[ ! -d $GPUBUNDLE_DIR/lib || "$(cat "$GPUBUNDLE_DIR/.stamp" 2>/dev/null)" != "$stamp" ]]; then',
            '  rm -rf "$GPUBUNDLE_DIR" && mkdir -p "$GPUBUNDLE_DIR" &&',
            '    tar xJf "$here/bundle.tar.xz" -C "$GPUBUNDLE_DIR" && echo "$stamp" > "$GPUBUNDLE_DIR/.stamp" ||',
            '    { echo "gpubundle/run: could not unpack $here/bundle.tar.xz" >&2; exit 2; }',
            'fi',
            'if [[ "$(cat "$here/.unpacked" 2>/dev/null)" != "$stamp" ]]; then',
            '  cp -r "$GPUBUNDLE_DIR/tree/." "$root/" && echo "$stamp" > "$here/.unpacked" ||',
            '    { echo "gpubundle/run: could not copy the binaries into $root" >&2; exit 2; }',
            'fi',
        ]
        i += 3
        continue
    if line == "set -u":
        out += [line, 'export FERRY_CHECK_T0=${FERRY_CHECK_T0:-$(date +%s)}',
                'GPUBUNDLE_DIR=${GPUBUNDLE_DIR:-/tmp/gpubundle}']
        i += 1
        continue
    out.append(line.replace("/tmp/gpubundle", "$GPUBUNDLE_DIR"))
    i += 1
open(path, "w").write("\n".join(out))
PY
grep -q 'GPUBUNDLE_DIR/.stamp' "$run" && grep -q '^GPUBUNDLE_DIR=' "$run" || {
  echo "gpu-bundle-refresh: rewriting $run failed" >&2
  exit 2
}
echo "gpu-bundle-refresh: $run replaces a stale unpacked bundle"
