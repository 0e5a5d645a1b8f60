#!/bin/sh
# Installs the `llm` command on this box: a `deno` binary and the single-file bundle `llm.js` (built by
# `deno task bundle`) under PREFIX/lib/llm, and a PREFIX/bin/llm that runs the one with the other. Nothing is
# downloaded. With --systemd it also installs the head and worker units and their env files (Linux), with
# --launchd the worker's LaunchAgent (macOS). docs/RUNBOOK.md says what comes next.
#
#   deploy/install.sh [--prefix /usr/local] [--deno PATH] [--bundle PATH] [--systemd | --launchd]
#
# Defaults: --deno is the checkout's node_modules/.bin/deno, else the `deno` on PATH; --bundle is the
# checkout's out/llm.js. Re-running it upgrades the binary and bundle and keeps existing env files.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
prefix=/usr/local
deno=""
bundle="$root/out/llm.js"
service=""

die() { echo "install.sh: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || die "--prefix needs a folder"; prefix=$2; shift 2 ;;
    --deno) [ $# -ge 2 ] || die "--deno needs the path of a deno binary"; deno=$2; shift 2 ;;
    --bundle) [ $# -ge 2 ] || die "--bundle needs the path of llm.js"; bundle=$2; shift 2 ;;
    --systemd) service=systemd; shift ;;
    --launchd) service=launchd; shift ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1: see --help" ;;
  esac
done

if [ -z "$deno" ]; then
  if [ -x "$root/node_modules/.bin/deno" ]; then deno="$root/node_modules/.bin/deno"
  elif command -v deno >/dev/null 2>&1; then deno=$(command -v deno)
  else die "no deno binary: pass --deno PATH (Deno 2.9.x for this box's OS and CPU)"
  fi
fi
[ -f "$bundle" ] || die "no bundle at $bundle: run \`deno task bundle\` in the checkout, or pass --bundle PATH"
# Follow the npm shim's symlink to the real binary, so that the copy is the binary itself.
while [ -L "$deno" ]; do
  link=$(readlink "$deno")
  case "$link" in /*) deno=$link ;; *) deno=$(dirname "$deno")/$link ;; esac
done
"$deno" --version >/dev/null 2>&1 || die "$deno does not run on this box: give a deno for its OS and CPU"

lib="$prefix/lib/llm"
mkdir -p "$lib" "$prefix/bin"
# Copy to temporary names and rename, so that a running `llm` keeps its files during an upgrade.
cp "$deno" "$lib/.deno.new" && chmod 755 "$lib/.deno.new" && mv -f "$lib/.deno.new" "$lib/deno"
cp "$bundle" "$lib/.llm.js.new" && chmod 644 "$lib/.llm.js.new" && mv -f "$lib/.llm.js.new" "$lib/llm.js"
cat > "$prefix/bin/.llm.new" <<SH
#!/bin/sh
# Installed by deploy/install.sh: the bundle carries everything, so no config, lock, npm or remote imports.
exec "$lib/deno" run -A --no-config --no-lock --no-remote --no-npm "$lib/llm.js" "\$@"
SH
chmod 755 "$prefix/bin/.llm.new" && mv -f "$prefix/bin/.llm.new" "$prefix/bin/llm"
echo "installed $prefix/bin/llm: $("$prefix/bin/llm" --version)"

case "$service" in
  systemd)
    id llm >/dev/null 2>&1 || useradd --system --home-dir /var/lib/llm --shell /usr/sbin/nologin llm
    mkdir -p /etc/llm
    for f in head worker; do
      sed "s#/usr/local/bin/llm#$prefix/bin/llm#" "$here/systemd/llm-$f.service" > "/etc/systemd/system/llm-$f.service"
      if [ ! -f "/etc/llm/$f.env" ]; then
        # The env files hold the link key (and the head's API key): root only; systemd reads them as root.
        install -m 600 -o root -g root "$here/systemd/$f.env" "/etc/llm/$f.env"
        echo "wrote /etc/llm/$f.env: edit it (model, layers, keys) before starting llm-$f"
      fi
    done
    systemctl daemon-reload
    echo "next: edit /etc/llm/head.env or worker.env, then systemctl enable --now llm-head (or llm-worker)"
    ;;
  launchd)
    agents="$HOME/Library/LaunchAgents"
    conf="$HOME/.config/llm"
    mkdir -p "$agents" "$conf"
    sed -e "s#/usr/local/bin/llm#$prefix/bin/llm#" -e "s#__HOME__#$HOME#g" \
      "$here/launchd/dev.llm.worker.plist" > "$agents/dev.llm.worker.plist"
    if [ ! -f "$conf/worker.env" ]; then
      (umask 077 && cp "$here/systemd/worker.env" "$conf/worker.env")
      echo "wrote $conf/worker.env (mode 600): edit it before loading the agent"
    fi
    echo "next: launchctl bootstrap gui/$(id -u) $agents/dev.llm.worker.plist"
    ;;
esac
