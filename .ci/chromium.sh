# Sourced by .ci/run: headless Chromium (Debian `chromium`) for tests/it/dashboard.rs, which
# drives the `xcc dashboard` page over the DevTools protocol and writes its screenshots to
# target/screenshots/ (kept as CI artefacts).
if ! command -v chromium >/dev/null; then
    echo "== installing chromium (Debian chromium)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
# Debian's launcher script prints a harmless shell warning on some machines; the version is what counts.
chromium --version 2>/dev/null | head -n 1
export XCC_REQUIRE_CHROMIUM=1
