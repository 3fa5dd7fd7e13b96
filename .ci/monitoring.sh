# Sourced by .ci/run: promtool and prometheus (Debian `prometheus`) for tests/it/monitoring.rs: the
# alerting rules of deploy/monitoring/ with their unit tests, and a real Prometheus scraping xcc.
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
    echo "== installing promtool (Debian prometheus)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
promtool --version | head -n 1
export XCC_REQUIRE_PROMETHEUS=1
