#!/usr/bin/env bash
# Build the Kubernetes control plane of metis_dev (the local cluster and the tests) from Go modules.
#
# No Docker engine runs on our machines and no release binary can be
# downloaded, but the Go module proxy is reachable: the wrapper modules in
# metis_dev/go/ pin k8s.io/kubernetes and etcd, and this script builds
#   kube-apiserver kube-controller-manager kube-scheduler kubectl  (go/kube-bin)
#   etcd                                                           (go/etcd-bin)
#   kstatus (sigs.k8s.io/cli-utils' kstatus as a stdin → stdout checker) (go/kstatus)
# into a cache outside the repository, keyed by version, so only the first run
# on a machine pays for the build. Idempotent: a binary is rebuilt only when
# it is missing or its stamp (version + go.sum hash) does not match.
#
# Usage: metis_dev/build.sh [--print-dir]
#   --print-dir   print the asset directory and exit (builds nothing)
# Environment:
#   METIS_KUBE_ASSETS  asset directory (default ~/.cache/metis/kube/<k8s version>)
#   GO                 go command (default: go)
# On success the asset directory is the only line on stdout; progress goes to
# stderr.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
kube_mod="$here/go/kube-bin"
etcd_mod="$here/go/etcd-bin"
kstatus_mod="$here/go/kstatus"

# shellcheck source=../tools/progress.sh
source "$here/../tools/progress.sh"
die() { echo "build.sh: error: $*" >&2; exit 1; }
log() { echo "build.sh: $*" >&2; }

# Versions come from the committed go.mod files, the single source of truth.
mod_version() { # <go.mod> <module path>
  awk -v m="$2" '$1 == m && $2 ~ /^v/ {print $2; exit} $1 == "require" && $2 == m {print $3; exit}' "$1"
}
kube_version="$(mod_version "$kube_mod/go.mod" k8s.io/kubernetes)"
etcd_version="$(mod_version "$etcd_mod/go.mod" go.etcd.io/etcd/server/v3)"
[[ -n "$kube_version" ]] || die "cannot read the k8s.io/kubernetes version from $kube_mod/go.mod"
[[ -n "$etcd_version" ]] || die "cannot read the etcd version from $etcd_mod/go.mod"
kstatus_version="$(mod_version "$kstatus_mod/go.mod" sigs.k8s.io/cli-utils)"
[[ -n "$kstatus_version" ]] || die "cannot read the cli-utils version from $kstatus_mod/go.mod"

out="${METIS_KUBE_ASSETS:-${XDG_CACHE_HOME:-$HOME/.cache}/metis/kube/$kube_version}"
if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$out"
  exit 0
fi
[[ $# -eq 0 ]] || die "unknown argument: $1 (usage: build.sh [--print-dir])"

sum_of() { sha256sum "$1/go.sum" | cut -c1-16; }
kube_stamp="$kube_version $(sum_of "$kube_mod")"
etcd_stamp="$etcd_version $(sum_of "$etcd_mod")"
kstatus_stamp="$kstatus_version $(sum_of "$kstatus_mod") $(sha256sum "$kstatus_mod/main.go" | cut -c1-16)"
kube_bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl)

fresh() { # <binary> <stamp>: is the cached binary present and built from these pins?
  [[ -x "$out/$1" && -f "$out/.stamp-$1" && "$(cat "$out/.stamp-$1")" == "$2" ]]
}
missing_kube=()
for b in "${kube_bins[@]}"; do fresh "$b" "$kube_stamp" || missing_kube+=("$b"); done
missing_etcd=()
fresh etcd "$etcd_stamp" || missing_etcd=(etcd)
missing_kstatus=()
fresh kstatus "$kstatus_stamp" || missing_kstatus=(kstatus)

if [[ ${#missing_kube[@]} -eq 0 && ${#missing_etcd[@]} -eq 0 && ${#missing_kstatus[@]} -eq 0 ]]; then
  log "up to date: kubernetes $kube_version, etcd $etcd_version in $out"
  echo "$out"
  exit 0
fi

mkdir -p "$out"
# Two builders (CI and a pytest fixture, `metis-dev cluster up`, two pytest workers) must not race.
exec 9>"$out/.build.lock"
if ! flock -n 9; then
  take_lock 9 "$out/.build.lock" "the Kubernetes binaries in $out"
  exec 9>&-
  exec bash "$0" "$@"   # re-check: the other build probably finished the job
fi
take_lock 9 "$out/.build.lock" "the Kubernetes binaries in $out"

GO="${GO:-go}"
command -v "$GO" >/dev/null 2>&1 \
  || die "Go is not installed (needed once to build the local control plane into $out)"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
go_version="$("$GO" env GOVERSION)" || die "\"$GO env GOVERSION\" failed; is Go >= 1.24 installed?"
log "building into $out with $go_version (kubernetes $kube_version, etcd $etcd_version)"

tmp="$(mktemp -d "$out/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
t0=$SECONDS

if [[ ${#missing_kube[@]} -gt 0 ]]; then
  minor="${kube_version#v1.}"; minor="${minor%%.*}"
  ld=(-s -w)
  for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    ld+=(-X "$pkg.gitVersion=$kube_version" -X "$pkg.gitMajor=1" -X "$pkg.gitMinor=$minor"
         -X "$pkg.gitTreeState=clean"
         -X "$pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)")
  done
  pkgs=()
  for b in "${missing_kube[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  log "go build ${missing_kube[*]} ..."
  t=$SECONDS
  with_heartbeat "building ${missing_kube[*]}" \
    bash -c 'cd "$1" && shift && exec "$@"' _ "$kube_mod" \
    "$GO" build -trimpath -ldflags "${ld[*]}" -o "$tmp/" "${pkgs[@]}" \
    || die "go build of ${missing_kube[*]} ($kube_version) failed; see the output above"
  log "built ${missing_kube[*]} in $((SECONDS - t)) s"
  for b in "${missing_kube[@]}"; do
    mv -f "$tmp/$b" "$out/$b"
    echo "$kube_stamp" >"$out/.stamp-$b"
  done
fi

if [[ ${#missing_etcd[@]} -gt 0 ]]; then
  log "go build etcd ..."
  t=$SECONDS
  with_heartbeat "building etcd" bash -c 'cd "$1" && shift && exec "$@"' _ "$etcd_mod" \
    "$GO" build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3 \
    || die "go build of etcd ($etcd_version) failed; see the output above"
  log "built etcd in $((SECONDS - t)) s"
  mv -f "$tmp/etcd" "$out/etcd"
  echo "$etcd_stamp" >"$out/.stamp-etcd"
fi

if [[ ${#missing_kstatus[@]} -gt 0 ]]; then
  log "go build kstatus (cli-utils $kstatus_version) ..."
  t=$SECONDS
  (cd "$kstatus_mod" && "$GO" build -trimpath -ldflags "-s -w" -o "$tmp/kstatus" .) \
    || die "go build of the kstatus checker failed; see the output above"
  log "built kstatus in $((SECONDS - t)) s"
  mv -f "$tmp/kstatus" "$out/kstatus"
  echo "$kstatus_stamp" >"$out/.stamp-kstatus"
fi

log "build took $((SECONDS - t0)) s in all: the binaries are in $out"
"$out/kube-apiserver" --version >&2
"$out/etcd" --version 2>&1 | sed -n 1p >&2  # sed reads to the end: `head` could end first and SIGPIPE etcd (pipefail: exit 141)
echo "$out"
