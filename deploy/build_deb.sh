#!/usr/bin/env bash
# Packs already-built pscluster binaries into pscluster_<version>_amd64.deb: the binaries
# (stripped copies) in /usr/bin, the systemd units, the confs in /etc/pscluster (conffiles),
# the maintainer scripts and README.Debian from deploy/debian/, and the Python client
# (python/pscluster with its generated stubs) in /usr/lib/python3/dist-packages. Depends is
# computed with dpkg-shlibdeps. Prints the path of the .deb as its last line.
#
#   deploy/build_deb.sh --bin-dir DIR --out DIR [--version V]
#
# --bin-dir: a Bazel bin root (bazel info -c opt bazel-bin) of a CPU build, holding
# server/ps/ps_server, server/coordinator/ps_coordinator, worker/ps_worker, tools/psctl/psctl
# and python/pscluster/proto (bazel build -c opt //python:pscluster).
# --version: default, the content of VERSION at the repository root.
# Needs dpkg-dev (dpkg-shlibdeps) and binutils (strip).
set -euo pipefail
umask 022

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
debian=$here/debian
binaries=(server/coordinator/ps_coordinator server/ps/ps_server worker/ps_worker tools/psctl/psctl)

usage_line="usage: deploy/build_deb.sh --bin-dir DIR --out DIR [--version V]"
usage() {
  echo "$usage_line" >&2
  [[ -n ${1:-} ]] && echo "build_deb.sh: $1" >&2
  exit 2
}
die() { echo "build_deb.sh: $*" >&2; exit 1; }

bin_dir="" out="" version=""
while (($# > 0)); do
  case $1 in
    --bin-dir|--out|--version)
      if (($# < 2)) || [[ -z $2 ]]; then usage "$1 needs a value"; fi
      case $1 in --bin-dir) bin_dir=$2 ;; --out) out=$2 ;; --version) version=$2 ;; esac
      shift 2 ;;
    --bin-dir=*) bin_dir=${1#*=}; shift ;;
    --out=*) out=${1#*=}; shift ;;
    --version=*) version=${1#*=}; shift ;;
    -h|--help) echo "$usage_line"; exit 0 ;;
    *) usage "unknown argument '$1'" ;;
  esac
done
[[ -n $bin_dir ]] || usage "--bin-dir is required"
[[ -n $out ]] || usage "--out is required"
[[ -d $bin_dir ]] || usage "--bin-dir '$bin_dir' is not a directory"
if [[ -z $version ]]; then
  [[ -r $here/../VERSION ]] || die "no --version given and no VERSION file at the repository root"
  version=$(tr -d '[:space:]' <"$here/../VERSION")
fi
[[ $version =~ ^[0-9][A-Za-z0-9.+~-]*$ ]] || usage "version '$version' is not a Debian version"

for tool in dpkg-deb dpkg-shlibdeps strip du; do
  command -v "$tool" >/dev/null \
    || die "$tool is missing: apt-get install dpkg-dev binutils"
done

for b in "${binaries[@]}"; do
  [[ -f $bin_dir/$b && -x $bin_dir/$b ]] \
    || die "missing binary $bin_dir/$b (bazel build -c opt //${b%/*}:${b##*/})"
done
[[ -f $bin_dir/python/pscluster/proto/ps_pb2.py ]] \
  || die "missing the Python stubs in $bin_dir/python/pscluster/proto (bazel build -c opt //python:pscluster)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/root
install -d -m 0755 "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" \
  "$root/etc/pscluster" "$root/usr/share/doc/pscluster"

staged=()
for b in "${binaries[@]}"; do
  staged+=("$root/usr/bin/${b##*/}")
  install -m 0755 "$bin_dir/$b" "${staged[-1]}"
  strip --strip-unneeded "${staged[-1]}"
done
# The certificates-and-tokens maker (needs openssl, which the package recommends).
install -m 0755 "$here/make_certs.sh" "$root/usr/bin/pscluster-make-certs"
install -m 0644 "$debian"/pscluster-coordinator.service "$debian"/pscluster-ps@.service \
  "$debian"/pscluster-worker@.service "$debian"/pscluster.target "$root/lib/systemd/system/"
install -m 0644 "$debian"/{coordinator,ps,worker}.conf "$root/etc/pscluster/"
install -m 0644 "$debian/README.Debian" "$root/usr/share/doc/pscluster/"
install -m 0755 "$debian"/{postinst,prerm,postrm} "$root/DEBIAN/"
install -m 0644 "$debian/conffiles" "$root/DEBIAN/"
py=$root/usr/lib/python3/dist-packages/pscluster
install -d -m 0755 "$py/proto"
install -m 0644 "$here"/../python/pscluster/*.py "$py/"
install -m 0644 "$bin_dir"/python/pscluster/proto/*.py "$py/proto/"

# dpkg-shlibdeps wants a debian/control naming the package in its working directory.
mkdir -p "$work/src/debian"
printf 'Source: pscluster\n\nPackage: pscluster\nArchitecture: amd64\n' >"$work/src/debian/control"
# It fails on a library no Debian package provides ("no dependency information found").
if ! shlibs=$(cd "$work/src" && dpkg-shlibdeps -O "${staged[@]/#/-e}" 2>"$work/shlibdeps.err"); then
  cat "$work/shlibdeps.err" >&2
  grep -qE "cuda|cublas|nccl" "$work/shlibdeps.err" \
    && die "that is a CUDA build: build without --config=cuda (bazel build -c opt ...)"
  die "dpkg-shlibdeps failed on the staged binaries (a library from no Debian package?)"
fi
# Not actionable here: the staging tree is not installed, and the build links every absl
# library its targets list whether used or not.
grep -v -e "should already be installed in their package's directory" \
  -e "could avoid a useless dependency" "$work/shlibdeps.err" >&2 || true
depends=${shlibs#shlibs:Depends=}
[[ -n $depends && $shlibs == shlibs:Depends=* ]] || die "dpkg-shlibdeps printed no Depends: '$shlibs'"

installed_size=$(du -sk --apparent-size --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@INSTALLED_SIZE@/$installed_size/" \
  -e "s/@DEPENDS@/$depends, passwd/" "$debian/control.in" >"$root/DEBIAN/control"
chmod 0644 "$root/DEBIAN/control"

mkdir -p "$out"
deb=$(cd "$out" && pwd)/pscluster_${version}_amd64.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
