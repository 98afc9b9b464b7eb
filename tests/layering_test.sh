#!/bin/sh
# layering_test.sh - the layering the code keeps, checked over the source tree (no build needed):
#  - every .c and .h opens with its one-line purpose, "/* NAME - what it is";
#  - bus/ is the only code that includes nats.c (bench/ measures raw nats.c as its baselines),
#    codecs/ the only code that includes msgpack-c or protobuf-c;
#  - a module includes project headers only from the modules below it:
#      common -> dsec; codecs -> dsec; bus -> dsec; backends -> dsec;
#      client -> bus, codecs; runtime -> bus, codecs; actors -> runtime, backends, bus, codecs;
#      sim -> actors, runtime, bus, codecs;
#      tools -> client, actors, runtime, backends, bus, codecs, sim (each also its own, and dsec/);
#      nothing outside tests/, bench/ and fuzz/ includes from them;
#  - the generated protobuf types (Dsec__V1__*) stay in codecs/ (and its tests and fuzz harnesses);
#  - no CMake file guards a part with if(EXISTS ...): a missing file fails the configure.
# usage: layering_test.sh SOURCE_DIR
set -u
cd "$1" || exit 2
fail=0
out=$(mktemp -d /tmp/dsec-layering.XXXXXX) || exit 2
trap 'rm -rf "$out"' EXIT
bad() {
  echo "layering: $*"
  fail=1
}
files=$(find . \( -path ./build -o -path ./.git -o -path '*/node_modules' \) -prune -o \
  \( -name '*.c' -o -name '*.h' \) -type f -print | sed 's|^\./||' | sort)
[ -n "$files" ] || { echo "layering: no sources under $1"; exit 2; }

# shellcheck disable=SC2086 # $files is a list of paths without spaces
awk 'FNR == 1 {
       n = split(FILENAME, p, "/"); want = "/* " p[n] " - "
       if (substr($0, 1, length(want)) != want || length($0) == length(want))
         printf "layering: %s: the first line is not \"/* %s - <its purpose>\"\n", FILENAME, p[n]
     }' $files > "$out/purpose"
if [ -s "$out/purpose" ]; then cat "$out/purpose"; fail=1; fi
rm -f "$out/purpose"

# module -> the modules whose headers it may include (besides its own and dsec/)
allowed() {
  case "$1" in
    common | codecs | bus | backends) echo "" ;;
    client | runtime) echo "bus codecs" ;;
    actors) echo "runtime backends bus codecs" ;;
    sim) echo "actors runtime bus codecs" ;;
    tools) echo "client actors runtime backends bus codecs sim" ;;
    *) echo "*" ;;
  esac
}

# every "file dependency" pair, from one pass over the sources
pairs=$(awk 'match($0, /^[ \t]*#[ \t]*include[ \t]*"[a-z_]+\//) {
               d = substr($0, RSTART, RLENGTH); sub(/.*"/, "", d); sub(/\/$/, "", d)
               print FILENAME, d
             }' $files | sort -u)
echo "$pairs" | while read -r f dep; do
  [ -n "$f" ] || continue
  mod=${f%%/*}
  [ "$mod" = "$f" ] && mod=.
  case "$mod" in tests | bench | fuzz) continue ;; esac
  [ "$dep" = "$mod" ] || [ "$dep" = dsec ] && continue
  case "$dep" in
    tests | bench | fuzz) echo "layering: $f includes from $dep/"; continue ;;
  esac
  ok=$(allowed "$mod")
  [ "$ok" = "*" ] && continue
  case " $ok " in
    *" $dep "*) ;;
    *) echo "layering: $f ($mod/) includes from $dep/, which $mod/ may not use (allowed: ${ok:-only dsec/})" ;;
  esac
done > "$out/deps"
if [ -s "$out/deps" ]; then cat "$out/deps"; fail=1; fi
rm -f "$out/deps"

for f in $(grep -El '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]nats/' $files); do
  case "$f" in
    bus/* | bench/raw_nats.c | bench/bus.c) ;;
    *) bad "$f includes nats.c: only bus/ speaks NATS" ;;
  esac
done
for f in $(grep -El '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"](msgpack|protobuf-c/)' $files); do
  case "$f" in
    codecs/*) ;;
    *) bad "$f includes msgpack-c or protobuf-c: only codecs/ knows the wire formats" ;;
  esac
done

# the generated protobuf types and codecs/record-pb.h stay in codecs/ (and its tests and fuzz
# harnesses): everyone else uses the plain structs of codecs/record.h
for f in $(grep -lE 'Dsec__V1__|codecs/record-pb\.h' $files); do
  case "$f" in codecs/* | tests/* | fuzz/*) continue ;; esac
  bad "$f uses the generated protobuf types (Dsec__V1__* or codecs/record-pb.h), which stay in codecs/"
done

for f in $(find . \( -path ./build -o -path ./.git \) -prune -o \
  \( -name CMakeLists.txt -o -name '*.cmake' \) -type f -print); do
  grep -Eqi '^[[:space:]]*if[[:space:]]*\([[:space:]]*(NOT[[:space:]]+)?EXISTS' "$f" &&
    bad "$f guards a part with if(EXISTS ...): name what the build needs, and let it fail"
done

[ "$fail" = 0 ] && echo "layering: $(echo "$files" | wc -l) files keep the layering"
exit "$fail"
