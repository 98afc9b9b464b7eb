#!/bin/sh
# image_pull_layout.sh DIR TAG - write an OCI image layout of a 3-layer busybox image into DIR (for test_image_pull).
set -eu
dir=$1 tag=$2
work=$(mktemp -d "$dir.src-XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$dir/blobs/sha256" "$work/l1/bin" "$work/l2/etc" "$work/l3/data"
cp /bin/busybox "$work/l1/bin/busybox"
ln -s busybox "$work/l1/bin/sh"
echo "hello from layer 2" > "$work/l2/etc/motd"
head -c 200000 /dev/urandom > "$work/l3/data/blob"
put() { # file -> prints its digest hex, moves it into blobs
    h=$(sha256sum "$1" | cut -d' ' -f1); mv "$1" "$dir/blobs/sha256/$h"; echo "$h"
}
diffs="" layers=""
for i in 1 2 3; do
    tar -C "$work/l$i" --numeric-owner --owner=0 --group=0 --mtime=@0 --sort=name -cf "$work/t$i.tar" .
    d=$(sha256sum "$work/t$i.tar" | cut -d' ' -f1)
    gzip -n "$work/t$i.tar"
    s=$(stat -c %s "$work/t$i.tar.gz")
    h=$(put "$work/t$i.tar.gz")
    diffs="$diffs${diffs:+,}\"sha256:$d\""
    layers="$layers${layers:+,}{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar+gzip\",\"digest\":\"sha256:$h\",\"size\":$s}"
done
printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin"],"Cmd":["/bin/sh"]},"rootfs":{"type":"layers","diff_ids":[%s]}}' "$diffs" > "$work/config"
cs=$(stat -c %s "$work/config"); ch=$(put "$work/config")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[%s]}' "$ch" "$cs" "$layers" > "$work/manifest"
ms=$(stat -c %s "$work/manifest"); mh=$(put "$work/manifest")
printf '{"imageLayoutVersion":"1.0.0"}' > "$dir/oci-layout"
printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"org.opencontainers.image.ref.name":"%s"}}]}' "$mh" "$ms" "$tag" > "$dir/index.json"
echo "sha256:$mh"
