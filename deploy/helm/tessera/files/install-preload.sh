# Installs the preload library to $TESSERA_PRELOAD_DIR/$TESSERA_PRELOAD_VERSION/
# (libtessera.so from $TESSERA_LIBRARY, and ld.so.preload naming
# $TESSERA_CONTAINER_LIBRARY). Each file is written under a temporary name,
# flushed, and hard-linked to its final name: link(2) is atomic and fails
# when the name exists, so a reader sees a whole file or none, and an
# installed file is never replaced (running pods map it). An existing file
# with the same content is kept; a different one is an error.
set -eu
umask 022
for var in TESSERA_LIBRARY TESSERA_PRELOAD_DIR TESSERA_PRELOAD_VERSION TESSERA_CONTAINER_LIBRARY; do
  eval "value=\${$var:-}"
  if [ -z "$value" ]; then
    echo "install-preload: error: $var is not set" >&2
    exit 1
  fi
done
case "$TESSERA_PRELOAD_VERSION" in
  */* | . | .. | .*)
    echo "install-preload: error: version $TESSERA_PRELOAD_VERSION is not a directory name" >&2
    exit 1
    ;;
esac
dir="$TESSERA_PRELOAD_DIR/$TESSERA_PRELOAD_VERSION"
mkdir -p "$dir"
# place NAME: $dir/.NAME.tmp (already written) becomes $dir/NAME.
place() {
  name=$1
  tmp="$dir/.$name.tmp"
  chmod 0644 "$tmp"
  sync
  if ln "$tmp" "$dir/$name" 2>/dev/null; then
    rm -f "$tmp"
    echo "install-preload: installed $dir/$name"
  elif [ -f "$dir/$name" ] && cmp -s "$tmp" "$dir/$name"; then
    rm -f "$tmp"
    echo "install-preload: $dir/$name is already installed"
  else
    rm -f "$tmp"
    echo "install-preload: error: $dir/$name exists and differs from this image's; running pods may map it, so it is never replaced: a changed library needs a new version (image tag)" >&2
    exit 1
  fi
}
if [ ! -f "$TESSERA_LIBRARY" ]; then
  echo "install-preload: error: $TESSERA_LIBRARY (the library in the image) is missing" >&2
  exit 1
fi
rm -f "$dir/.libtessera.so.tmp" "$dir/.ld.so.preload.tmp"
cp "$TESSERA_LIBRARY" "$dir/.libtessera.so.tmp"
place libtessera.so
printf '%s\n' "$TESSERA_CONTAINER_LIBRARY" > "$dir/.ld.so.preload.tmp"
place ld.so.preload
