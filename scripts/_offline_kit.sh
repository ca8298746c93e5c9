# Sourced by scripts/offline_vllm_kit.sh and scripts/offline_sglang_kit.sh: packing a site folder and a folder of
# small wheels into a kit that fits 64 MiB transfers, and the kit's stage.sh.
# start_kit KIT: from the checkout's root, KIT's absolute path in $kit (a kit in the checkout is not the project's:
# git ignores it there) and a scratch folder in $work, removed at exit.
start_kit() {
  local root=$PWD rel
  kit=$(realpath -m "$1")
  case $kit in
    "$root"/*) rel=${kit#"$root"/}; grep -qxF "/$rel/" .git/info/exclude 2>/dev/null || echo "/$rel/" >> .git/info/exclude ;;
  esac
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
}

# pack_kit SITE DEPS KIT NAME PART_MIB: SITE (an installed site, __pycache__ dropped here) as one tar.xz cut into
# parts of PART_MIB, DEPS's wheels as deps.tar, their sha256 in MANIFEST, and KIT/stage.sh, which stages them on the
# host under /tmp/NAME-*.
pack_kit() {
  local site=$1 deps=$2 kit=$3 name=$4 part_mib=$5 archive
  archive=$(dirname "$site")/site.tar.xz
  find "$site" -name __pycache__ -prune -exec rm -rf {} +
  echo "site: $(du -sm "$site" | cut -f1) MiB; packing (xz, about 10 minutes on 2 cores)"
  tar -C "$site" -cf - . | xz -T0 -6 -c > "$archive"
  rm -rf "$kit" && mkdir -p "$kit"
  split -b "${part_mib}M" -d -a 2 "$archive" "$kit/part-"
  (cd "$deps" && tar -cf "$kit/deps.tar" ./*.whl)
  (cd "$kit" && sha256sum part-* deps.tar && sha256sum < "$archive" | sed 's/-$/site.tar.xz/') > "$kit/MANIFEST"
  { printf '#!/usr/bin/env bash\nname=%s\n' "$name"; cat <<'EOS'
# On the host, from the checkout, in every call that brings a part: copies the parts carried to /tmp/$name-parts
# (each checked against MANIFEST); once all are there, unpacks the site into /tmp/$name-site and installs
# deps.tar's wheels into /tmp/$name-deps. Exit 0: ready; 2: parts still missing.
set -uo pipefail
kit=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
parts=/tmp/$name-parts site=/tmp/$name-site deps=/tmp/$name-deps
want=$(awk '$2 == "site.tar.xz" {print $1}' "$kit/MANIFEST")
if [ -f "$site/.ok" ] && [ "$(cat "$site/.ok")" = "$want" ] && [ -f "$deps/.ok" ]; then echo "$name kit ready"; exit 0; fi
mkdir -p "$parts"
sum() { sha256sum "$1" | cut -d' ' -f1; }
missing=()
while read -r s file; do
  [ "$file" = site.tar.xz ] && continue
  if [ -f "$parts/$file" ] && [ "$(sum "$parts/$file")" = "$s" ]; then continue; fi
  if [ -f "$kit/$file" ] && [ "$(sum "$kit/$file")" = "$s" ]; then
    cp "$kit/$file" "$parts/$file.tmp" && mv "$parts/$file.tmp" "$parts/$file" && echo "staged $file" && continue
  fi
  missing+=("$file")
done < "$kit/MANIFEST"
if [ ${#missing[@]} -gt 0 ]; then echo "$name kit: still missing ${missing[*]}"; exit 2; fi
if ! { [ -f "$site/.ok" ] && [ "$(cat "$site/.ok")" = "$want" ]; }; then
  joined=$parts/site.tar.xz
  awk '$2 ~ /^part-/ {print $2}' "$kit/MANIFEST" | sed "s|^|$parts/|" | xargs cat > "$joined"
  [ "$(sum "$joined")" = "$want" ] || { echo "joined archive does not match MANIFEST" >&2; rm -f "$joined"; exit 1; }
  rm -rf "$site" "$site.tmp" && mkdir -p "$site.tmp"
  tar -C "$site.tmp" -xJf "$joined" || { echo "unpacking failed" >&2; rm -rf "$site.tmp"; exit 1; }
  rm -f "$joined" && echo "$want" > "$site.tmp/.ok" && mv "$site.tmp" "$site"
fi
wheels=/tmp/$name-wheels
rm -rf "$deps" "$wheels" && mkdir -p "$wheels" && tar -C "$wheels" -xf "$parts/deps.tar" \
  && python3 -m pip install -q --no-index --no-deps --no-compile --target "$deps" "$wheels"/*.whl \
  && touch "$deps/.ok" && echo "$name kit ready"
EOS
  } > "$kit/stage.sh"
}

# run_head: the lines each kit's run.sh goes on with after its comment: the host's FlashInfer, Hydra and OmegaConf
# (.gpu), the kit's env.sh, and the project's wheel installed beside the engine (which finds its entry point there).
run_head() {
  cat <<'EOS'
set -uo pipefail
kit=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ -f .gpu/env.sh ] && { source .gpu/env.sh || exit 1; }  # the host's FlashInfer, Hydra and OmegaConf
source "$kit/env.sh" || exit 1
if ls dist/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/mstar-site dist/*.whl || exit 1
fi
export PYTHONPATH=/tmp/mstar-site:$PYTHONPATH
EOS
}
