# Shared by scripts/*: create .venv at the repo root and install the project with extras.
# Re-installs only when the build inputs (pyproject.toml, setup.py, the C speedups) change
# or an extra is asked for the first time (a stamp file per extras set in .venv).

ringmaster_python() {
  local py="${PYTHON:-python3}"
  if ! command -v "$py" >/dev/null 2>&1; then
    echo "error: $py not found; install Python 3.11 or newer (or set PYTHON=/path/to/python3)" >&2
    exit 1
  fi
  if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "error: kafka-ringmaster needs Python >= 3.11; $py is $("$py" -V 2>&1)" >&2
    exit 1
  fi
  echo "$py"
}

ensure_venv() {
  local extras="$1"
  local py
  py="$(ringmaster_python)"
  if [ ! -x .venv/bin/python ]; then
    echo "creating .venv with $("$py" -V)" >&2
    "$py" -m venv .venv || { echo "error: '$py -m venv' failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
  fi
  local inputs
  inputs="$(cat pyproject.toml setup.py runtime/transport/_speedups.c | sha1sum | cut -c1-12)"
  local stamp=".venv/.installed-${inputs}-${extras//,/_}"
  if [ ! -f "$stamp" ]; then
    echo "installing kafka-ringmaster[$extras] into .venv" >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[$extras]" >&2
    # Stamps of older build inputs are stale; other extras of the same inputs stay valid.
    find .venv -maxdepth 1 -name '.installed-*' ! -name ".installed-${inputs}-*" -delete
    touch "$stamp"
  fi
  # An editable install is imported from this tree, which pip does not byte-compile; with
  # PYTHONDONTWRITEBYTECODE set nothing ever would, and every start (the supervisor's and each
  # spawned worker's) compiled ~100 modules again: ~0.45 s of CPU each. Only changed files
  # are compiled again (compileall compares the sources' times).
  .venv/bin/python -m compileall -q runtime workers >/dev/null || true
}

require_java() {
  if ! command -v java >/dev/null 2>&1 && [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then
    export PATH="$JAVA_HOME/bin:$PATH"
  fi
  if ! command -v java >/dev/null 2>&1; then
    # A fresh Debian/Ubuntu machine where we may install packages (root, or sudo without a
    # password): install a headless JRE rather than fail. Anywhere else, say what to do.
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo -n true 2>/dev/null && sudo="sudo -n"
    if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$sudo" ]; }; then
      echo "java not found: installing openjdk-17-jre-headless (apt-get)" >&2
      $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 \
        && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q openjdk-17-jre-headless >&2 \
        || echo "warning: installing Java with apt-get failed" >&2
    fi
  fi
  if ! command -v java >/dev/null 2>&1; then
    echo "error: Java 17+ is required for the Spark backend and its tests, and 'java' is not on PATH." >&2
    echo "       Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless; or set JAVA_HOME and PATH." >&2
    exit 1
  fi
  local version
  version="$(java -version 2>&1 | head -n 1)"
  echo "$version" >&2
  local major
  major="$(echo "$version" | sed -E 's/.*version "([0-9]+).*/\1/')"
  if [ "${major:-0}" -lt 17 ] 2>/dev/null; then
    echo "error: Java 17+ is required for PySpark 4; found: $version" >&2
    exit 1
  fi
}

require_maven() {
  # Apache Kafka, the reference broker of the tests (runtime/dev/kafkabroker.py), is resolved
  # from Maven Central with Maven on first use. Installed as require_java installs Java.
  if ! command -v mvn >/dev/null 2>&1; then
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo -n true 2>/dev/null && sudo="sudo -n"
    if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$sudo" ]; }; then
      echo "mvn not found: installing maven (apt-get)" >&2
      $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 \
        && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q maven >&2 \
        || echo "warning: installing Maven with apt-get failed" >&2
    fi
  fi
  if ! command -v mvn >/dev/null 2>&1; then
    echo "error: Maven is required to fetch Apache Kafka for the tests, and 'mvn' is not on PATH." >&2
    echo "       Debian/Ubuntu: apt-get install -y maven" >&2
    exit 1
  fi
}

require_apache_kafka() {
  # Java and Maven, then Kafka's jars into the cache (a no-op once there): a missing piece
  # is one line here, not a failed fixture in every test.
  require_java
  require_maven
  .venv/bin/python -c 'import sys
from runtime.errors import RingmasterError
from runtime.dev.kafkabroker import KAFKA_VERSION, cache_dir, resolve, resolved
if not resolved():
    print(f"resolving Apache Kafka {KAFKA_VERSION} with Maven into {cache_dir()}", file=sys.stderr)
try:
    resolve()
except RingmasterError as exc:
    sys.exit(f"error: {exc}")' || exit 1
}

require_chromium() {
  # The console's browser test (tests/integration/test_console_browser.py) drives Debian's
  # headless Chromium through its chromium-driver: installed as require_java installs Java. Where
  # it cannot be, the test skips itself with one line; nothing else needs it.
  if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    return 0
  fi
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo -n true 2>/dev/null && sudo="sudo -n"
  if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$sudo" ]; }; then
    echo "chromium not found: installing chromium and chromium-driver (apt-get), for the console's browser test" >&2
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 \
      && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >&2 \
      || echo "warning: installing Chromium with apt-get failed: the console's browser test will be skipped" >&2
  else
    echo "warning: no Chromium (apt-get install chromium chromium-driver): the console's browser test will be skipped" >&2
  fi
}
