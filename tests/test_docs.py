"""The operator's pages (README.md, docs/*.md) hold together: every link between them
lands on a file and a heading that exist, the troubleshooting page explains every reason
the link can give and no reason it cannot, and the README keeps to a newcomer's length."""
import re
from pathlib import Path

from agent.base import reasons as journal

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def test_every_link_between_the_pages_lands():
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_troubleshooting_explains_every_reason_and_no_other():
    reasons = {v for k, v in vars(journal).items()
               if k.isupper() and isinstance(v, str) and re.fullmatch(r"[a-z-]+", v)}
    text = (REPO / "docs" / "troubleshooting.md").read_text()
    table = text[text.index("## The link's reasons"):text.index("## Uploads")]
    listed = set(re.findall(r"^\| `([a-z-]+)` \|", table, re.M))
    assert listed == reasons, f"missing: {reasons - listed}; not a reason: {listed - reasons}"


def test_the_readme_is_a_newcomers_length_and_names_the_pages():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 260
    for page in ("install", "configure", "operate", "screentinker", "upgrading",
                 "troubleshooting", "security", "PROTOCOL"):
        assert f"(docs/{page}.md)" in text, page
    # the two commands of the set-up, and what the tests need beside the clone
    assert "\n    scripts/demo\n" in text and "\n    scripts/test\n" in text
    assert "../shared/peers/" in text
