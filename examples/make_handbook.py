"""Writes the handbook's PDF and DOCX (committed; run again after editing the text here).

The PDF is written by hand (a text layer in Helvetica, one page per section), so
no PDF library beyond what the indexer already reads with is needed; the DOCX
uses python-docx's built-in heading styles and core properties.

    .venv/bin/python examples/make_handbook.py
"""

from __future__ import annotations

from pathlib import Path

import docx

HERE = Path(__file__).resolve().parent / "handbook"

TRAVEL = [
    (
        "Travel policy",
        [
            "Book work travel in the travel tool, at least two weeks ahead.",
            "Take the train for trips under five hours; otherwise fly economy.",
            "Business class is paid only for flights longer than eight hours.",
        ],
    ),
    (
        "Hotels and per diem",
        [
            "A hotel night is paid up to 180 EUR, or 250 EUR in capital cities.",
            "The per diem for meals while travelling is 45 EUR a day.",
            "Keep every receipt and claim it within 60 days in the finance tool.",
        ],
    ),
]

ONBOARDING = [
    (
        "Your first day",
        [
            "On your first day your manager meets you at the front desk at 9:30.",
            "The IT desk gives you your laptop and hardware key before lunch.",
        ],
    ),
    (
        "Your buddy",
        [
            "Every newcomer gets a buddy from another team for the first six weeks.",
            "Your buddy answers the questions you would rather not ask your manager.",
        ],
    ),
]


def _pdf_text(s: str) -> str:
    return s.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def write_pdf(path: Path, pages: list[tuple[str, list[str]]]) -> None:
    """A minimal PDF 1.4: a catalog, a page tree, one content stream per page."""
    objects: list[bytes] = []
    font_id = 3
    page_ids = [4 + 2 * i for i in range(len(pages))]
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    kids = " ".join(f"{p} 0 R" for p in page_ids)
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode())
    objects.append(
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"
    )
    for i, (heading, lines) in enumerate(pages):
        ops = [
            "BT",
            "/F1 18 Tf",
            "72 720 Td",
            f"({_pdf_text(heading)}) Tj",
            "/F1 11 Tf",
            "0 -30 Td",
        ]
        for line in lines:
            ops += [f"({_pdf_text(line)}) Tj", "0 -16 Td"]
        ops.append("ET")
        stream = "\n".join(ops).encode("cp1252")
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {page_ids[i] + 1} "
            f"0 R /Resources << /Font << /F1 {font_id} 0 R >> >> >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for off in offsets:
        out += b"%010d 00000 n \n" % off
    out += b"trailer\n<< /Size %d /Root 1 0 R /Info << /Title (Travel policy) >> >>\n" % (
        len(objects) + 1
    )
    out += b"startxref\n%d\n%%%%EOF\n" % xref
    path.write_bytes(bytes(out))


def write_docx(path: Path) -> None:
    document = docx.Document()
    document.core_properties.title = "Onboarding guide"
    document.core_properties.author = "People team"
    document.add_heading("Onboarding guide", level=1)
    document.add_paragraph("Welcome to Astraeus. This guide walks you through your first weeks.")
    for heading, paragraphs in ONBOARDING:
        document.add_heading(heading, level=2)
        for p in paragraphs:
            document.add_paragraph(p)
    document.save(str(path))


def main() -> None:
    write_pdf(HERE / "travel.pdf", TRAVEL)
    write_docx(HERE / "onboarding.docx")
    print(f"wrote {HERE / 'travel.pdf'} and {HERE / 'onboarding.docx'}")


if __name__ == "__main__":
    main()
