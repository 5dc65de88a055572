"""The configuration as an operator reads it, held to the schema (agent/config/load.py
SCHEMA): the package's defaults file (debian/agent.toml), docs/configure.md and the man
page's CONFIGURATION section are made from it by devtools/configref.py, and each is read
back here on its own terms: every key present once, its default the schema's, no key
that does not exist (issue #43)."""
import re
import tomllib

from agent.config import load as C
from devtools import configref as ref

OPERATOR_KEYS = {f"{s}.{k}" for s, k, _ in ref.keys() if s not in ref.HIDDEN_SECTIONS}
ALL_KEYS = {f"{s}.{k}" for s, k, _ in ref.keys()}


def test_every_file_is_what_the_schema_makes():
    assert ref.TOML_PATH.read_text() == ref.render_toml(), \
        "debian/agent.toml differs from the schema: python -m devtools.configref --write"
    assert ref.MD_PATH.read_text() == ref.render_markdown(), \
        "docs/configure.md differs from the schema: python -m devtools.configref --write"
    page = ref.MAN_PATH.read_text()
    assert ref.with_man_section(page) == page, \
        "the man page's CONFIGURATION differs from the schema: python -m devtools.configref --write"


def test_every_key_has_its_words_and_no_words_name_a_key_that_is_gone():
    assert set(ref.DOCS) == ALL_KEYS, set(ref.DOCS) ^ ALL_KEYS
    assert set(ref.SECTIONS) == set(C.SCHEMA)
    unset = {f"{s}.{k}" for s, k, spec in ref.keys() if ref.unset(spec)} & OPERATOR_KEYS
    assert set(ref.EXAMPLES) == unset, set(ref.EXAMPLES) ^ unset


def _shipped() -> dict[str, str]:
    """{key: the value text} from the shipped file's `# key = value` lines."""
    section, found = None, {}
    for line in ref.TOML_PATH.read_text().splitlines():
        m = re.fullmatch(r"\[([a-z.]+)\]", line)
        if m:
            section = m.group(1)
            continue
        m = re.fullmatch(r"# ([a-z_]+) = (.*)", line)
        if m:
            assert section, line
            name = f"{section}.{m.group(1)}"
            assert name not in found, f"{name} twice"
            found[name] = m.group(2)
    return found


def test_the_shipped_agent_toml_lists_every_key_at_its_default_and_none_that_does_not_exist():
    shipped = _shipped()
    assert set(shipped) == OPERATOR_KEYS, set(shipped) ^ OPERATOR_KEYS
    for section, key, spec in ref.keys():
        name = f"{section}.{key}"
        if name not in shipped:
            continue
        value = tomllib.loads(f"v = {shipped[name]}")["v"]   # a comment after it is TOML too
        if ref.unset(spec):
            assert re.search(r"# (unset|required) by default; an example$", shipped[name]), name
        else:
            assert value == spec.default, (name, value, spec.default)
    for needed in ("server.profile", "update.allow_downgrade", "commands.allow"):
        assert needed in shipped
    # the allow list's words name every command a screen may allow, configure included
    assert "configure" in ref.DOCS["commands.allow"] and "update" in ref.DOCS["commands.allow"]


def test_configure_md_documents_every_key_and_no_key_that_does_not_exist():
    section, rows = None, set()
    for line in ref.MD_PATH.read_text().splitlines():
        m = re.fullmatch(r"## \[([a-z.]+)\]", line)
        if m:
            section = m.group(1)
        m = re.match(r"\| `([a-z_]+)` \| ([^|]+) \|", line)
        if m:
            name = f"{section}.{m.group(1)}"
            assert name not in rows, f"{name} twice"
            rows.add(name)
            spec = C.SCHEMA[section][m.group(1)]
            default = m.group(2).strip()
            if not ref.unset(spec):
                assert tomllib.loads(f"v = {default.strip('`')}")["v"] == spec.default, name
    assert rows == ALL_KEYS, rows ^ ALL_KEYS


def test_the_man_page_lists_every_key_an_operator_may_set():
    page = ref.MAN_PATH.read_text()
    body = page[page.index(ref.MAN_BEGIN):page.index(ref.MAN_END)]
    section, listed = None, set()
    for line in body.splitlines():
        m = re.fullmatch(r"\.SS \[(.+)\]", line)
        if m:
            section = m.group(1).replace("\\-", "-")
        m = re.fullmatch(r"\.B (.+)", line)
        if m and section:
            listed.add(f"{section}.{m.group(1).replace(chr(92) + '-', '-')}")
    assert listed == OPERATOR_KEYS, listed ^ OPERATOR_KEYS


def test_dedupe_is_said_one_way_wherever_it_is_said():
    """The shipped file said identical content is not re-queued; the queue, README and
    man page say a duplicate is a key, never equal content alone."""
    for path in (ref.TOML_PATH, ref.MD_PATH, ref.MAN_PATH, ref.REPO / "README.md"):
        text = path.read_text()
        assert "identical content" not in text and "not re-queued" not in text, path
    said = "equal content alone never is"
    assert said in ref.DOCS["uploads.dedupe_window_s"]
    assert said in " ".join(ref.TOML_PATH.read_text().replace("\n#   ", " ").split())
