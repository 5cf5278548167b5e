#!/usr/bin/env bash
# Installs, via apt, the Debian packages `make run` and `make test` need, and only those missing.
# Checks commands rather than package names: node and npm may come from elsewhere (nodesource).
set -euo pipefail
PYTHON=${PYTHON:-python3}
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
# python-qpid-proton compiles its TLS layer only when pkg-config finds OpenSSL's headers.
pkg-config --exists openssl 2>/dev/null || missing+=(libssl-dev)
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
"$PYTHON" -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
"$PYTHON" -c 'import sysconfig, os; assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")' \
    2>/dev/null || missing+=(python3-dev)
# Spark (the analytics package) runs on a Java 17 JRE; Debian 12 packages no newer one.
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
# promtool checks and unit-tests the chart's alerting and recording rules (tests/chart).
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
# Headless Chromium screenshots the analytics report in its test (what a person sees).
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
# The web console's tests drive that Chromium through WebDriver (Selenium).
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
if [ "${SHOAL_NO_NODE:-}" != 1 ]; then
    command -v node >/dev/null 2>&1 || missing+=(nodejs)
    command -v npm >/dev/null 2>&1 || missing+=(npm)
fi
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing Debian packages: ${missing[*]}"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
