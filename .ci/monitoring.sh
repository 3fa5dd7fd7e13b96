# Sourced by .ci/run: promtool (Debian `prometheus`) for tests/it/monitoring.rs, which checks the
# alerting rules of deploy/monitoring/ with their unit tests and parses every dashboard query.
if ! command -v promtool >/dev/null; then
    echo "== installing promtool (Debian prometheus)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
promtool --version | head -n 1
export XCC_REQUIRE_PROMTOOL=1
