"""Where the shared real corpora are: `../shared/data` next to the repository."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parents[4].parent / "shared" / "data"
TORTURE = DATA / "torture"
PERF = DATA / "perf"

_TIKA = TORTURE / "apache-tika-test-documents/tika-parsers/tika-parsers-standard"
_TIKA_MODULES = _TIKA / "tika-parsers-standard-modules"
_RESOURCES = "src/test/resources/test-documents"
TIKA_DOCS = _TIKA / "tika-parsers-standard-integration-tests" / _RESOURCES
TIKA_HTML = _TIKA_MODULES / "tika-parser-html-module" / _RESOURCES
TIKA_PDF = _TIKA_MODULES / "tika-parser-pdf-module" / _RESOURCES
TIKA_WORD = _TIKA_MODULES / "tika-parser-microsoft-module" / _RESOURCES
POI = TORTURE / "apache-poi-test-data/test-data"
CHARDET = TORTURE / "chardet-test-files/tests"
BAT = TORTURE / "bat-test-examples/tests/examples"
READABILITY = TORTURE / "readability-test-pages/test/test-pages"
